"""Tests of interpkit.papers.g_effect: the risk against HF's own loss, G-effects against finite differences of HF's loss along
gradients written out here from the objectives' definitions (float64), parameter groups, batching and the official moving
average, the objectives' limits (WGA beta=0, TNPO/NPO/WTNPO at the reference, KL to itself, NPO at small beta),
instance-wise G-effects, the step check, the unlearning loop against a hand SGD step, the synthetic QA data, typed errors,
GPT-2 and bfloat16, one parameter's gradient in hand at a time and the user's .grad kept, the model left untouched, and the old spellings (argument order, names moved to interpkit.demos.g_effect) still working with a FutureWarning."""
import copy, math, os
import numpy as np, pandas as pd, pytest, torch
import torch.nn.functional as F
from torch import nn
from interpkit.errors import ConfigError, NotFiniteError, ShapeError
from interpkit.models import encode_queries, tiny_lm, tiny_tokenizer
from interpkit.papers.g_effect import (GEffect, ParamGroups, Unlearning, _coefs, answer_logprobs, forget_term, g_effect, instance_g_effects, objective,
                                       param_groups, plot_g_effects, qa_metrics, retain_at, retain_term, risk_term, step_check, unlearn)
from interpkit.demos.g_effect import ATTRIBUTES, IDK_ANSWERS, QA_LM, author_qa, load_qa_lm, qa_tokenizer, train_qa_lm

os.environ.setdefault('HF_HUB_OFFLINE', '1')
torch.set_num_threads(1)  # 2 threads on a shared 2-core machine oversubscribe badly

QA = author_qa(n_authors=10, forget_frac=0.2, seed=0)
TOK = qa_tokenizer(QA)
def enc(idx): return encode_queries(TOK, *QA.pairs(idx))
FORGET, RETAIN = enc(QA.forget[:4]), enc(QA.retain[::7][:5])

def lm(arch='llama', seed=0, double=True, n_layers=2):
    m = tiny_lm(arch, n_layers=n_layers, d_model=32, n_heads=4, vocab_size=TOK.vocab_size, seed=seed)
    return m.double() if double else m

def perturbed(m, scale=0.3, seed=1):
    "A copy of `m` with Gaussian noise (relative `scale`) on every weight: a reference that differs from the model."
    r = copy.deepcopy(m); g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in r.parameters(): p.add_(scale * p.std().nan_to_num(0.02).clamp(min=1e-3) * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return r

def params(m): return [p for p in m.parameters() if p.requires_grad]

# ---------------------------------------------------------------- references written out here

def hf_nll(m, d):
    "HF's own mean NLL of the labelled tokens (its shift and its ignore_index)."
    return m(input_ids=d['input_ids'], attention_mask=d['attention_mask'], labels=d['labels']).loss

def nll(m, d):
    "The same mean NLL in the model's own dtype (HF's loss upcasts to float32, which is too coarse for float64 finite differences)."
    logits = m(input_ids=d['input_ids'], attention_mask=d['attention_mask']).logits[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1), d['labels'][:, 1:].flatten(), ignore_index=-100)

def token_lp(m, d, hidden=None):
    "log p of each next (labelled) token (B, T-1), its mask, and hidden_states[hidden]."
    out = m(input_ids=d['input_ids'], attention_mask=d['attention_mask'], output_hidden_states=hidden is not None)
    lab = d['labels'][:, 1:]; keep = lab != -100
    lp = out.logits[:, :-1].log_softmax(-1).gather(-1, lab.clamp(min=0)[..., None])[..., 0] * keep
    return lp, keep, (out.hidden_states[hidden] if hidden is not None else None)

def my_loss(name, m, ref, forget, retain=None, beta=None, alpha=None, c=None, layer=None, seed=0, reg=None, weight=1.0):
    "The objectives from their definitions, over the whole data in one pass."
    lp, keep, h = token_lp(m, forget, hidden=layer if name == 'rmu' else None)
    mean = lambda x: (x * keep).sum() / keep.sum()
    if name == 'ga': L = mean(lp)
    elif name == 'wga': L = mean(lp.detach().exp() ** beta * lp)
    elif name in ('tnpo', 'wtnpo'):
        with torch.no_grad(): lr_ = token_lp(ref, forget)[0]
        p, q = lp.detach().exp(), lr_.exp()
        w = 2 * p ** beta / (p ** beta + q ** beta)
        if name == 'wtnpo': w = w * p ** alpha
        L = mean(w * lp)
    elif name == 'npo':
        with torch.no_grad(): ell_ref = -token_lp(ref, forget)[0].sum(1)
        ell = -lp.sum(1)
        L = -(2 / beta) * torch.log(torch.sigmoid(beta * (ell - ell_ref))).mean()
    elif name == 'rmu':   # the official code's (dataloader.py): hidden_states[l][..., :-1, :] where labels[..., 1:] != -100
        u = c * torch.rand(h.shape[-1], generator=torch.Generator().manual_seed(seed)).to(h.dtype)
        L = ((h[:, :-1] - u) ** 2).mean(-1)[keep].mean()
    if reg == 'gd':
        lpr, kr, _ = token_lp(m, retain)
        L = L - weight * (lpr * kr).sum() / kr.sum()
    elif reg == 'kl':
        real = retain['attention_mask'].bool()
        logp = m(input_ids=retain['input_ids'], attention_mask=retain['attention_mask']).logits.log_softmax(-1)
        with torch.no_grad(): logq = ref(input_ids=retain['input_ids'], attention_mask=retain['attention_mask']).logits.log_softmax(-1)
        kl = (logq.exp() * (logq - logp)).sum(-1)
        L = L + weight * kl[real].sum() / real.sum()
    return L

def grad(loss, m):
    ps = params(m)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(ps, torch.autograd.grad(loss, ps, allow_unused=True))]
def dot(a, b): return float(sum((x * y).sum() for x, y in zip(a, b)))
def norm(a): return math.sqrt(dot(a, a))

def risk_at(m, g, eta, d):
    "The NLL on `d` at theta - eta * g, on a copy."
    w = copy.deepcopy(m)
    with torch.no_grad():
        for p, x in zip(params(w), g): p.sub_(eta * x)
        return float(nll(w, d).detach())

# ---------------------------------------------------------------- the risk

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_risk_term_equals_hf_loss(arch, untouched):
    m = lm(arch, double=False)
    qs, ans = QA.pairs(QA.retain[:6])
    d = encode_queries(TOK, qs, ans)
    assert (d['attention_mask'] == 0).any()  # right padding is present
    with untouched(m), torch.no_grad():
        s, n = risk_term(m, d)
        want = hf_nll(m, d)
        assert float(nll(m, d).detach()) == pytest.approx(float(want), rel=1e-6)
        assert n == int((d['labels'][:, 1:] != -100).sum())
        assert float(s) / n == pytest.approx(float(want), rel=1e-5)
        lp, mask, _ = answer_logprobs(m, d)
        assert torch.equal(mask, d['labels'][:, 1:] != -100)
        torch.testing.assert_close(lp[mask].float(), token_lp(m, d)[0][mask].float(), atol=1e-5, rtol=1e-5)
    # longer answers (several labelled tokens per row) and a row alone, padded vs unpadded
    d2 = encode_queries(TOK, qs[:3], ['a b c d', 'x', 'Lisbon Oslo'])
    with torch.no_grad():
        s, n = risk_term(m, d2); assert float(s) / n == pytest.approx(float(hf_nll(m, d2).detach()), rel=1e-5)
        one = {k: v[1:2, :int(d2['attention_mask'][1].sum())] for k, v in d2.items()}
        lp_pad = answer_logprobs(m, d2)[0][1]; lp_one = answer_logprobs(m, one)[0][0]
        torch.testing.assert_close(lp_pad[:lp_one.shape[0]], lp_one, atol=1e-5, rtol=1e-5)

# ---------------------------------------------------------------- G-effects against finite differences

CASES = {  # objective -> (my_loss keywords, whether the reference differs from the model)
    'ga': (dict(), False),
    'npo': (dict(beta=0.5), True),
    'wga': (dict(beta=2.0), False),
    'tnpo': (dict(beta=4.0), True),
    'rmu': (dict(c=2.0, layer=1), False),
    'ga+kl': (dict(reg='kl'), True),
}

def module_objective(key):
    kw, _ = CASES[key]
    if key == 'ga+kl': return objective('ga', regularizer='kl')
    return objective(key, **{k: v for k, v in kw.items() if k in ('beta', 'alpha', 'c', 'layer')})

@pytest.mark.parametrize('arch', ['gpt2', 'llama'])
@pytest.mark.parametrize('key', list(CASES))
def test_g_effect_against_finite_differences(key, arch, untouched):
    m = lm(arch, seed=0)
    kw, differs = CASES[key]
    ref = perturbed(m) if differs else m
    name = key.split('+')[0]
    g = grad(my_loss(name, m, ref, FORGET, RETAIN, **kw), m)
    gu, gr = grad(nll(m, FORGET), m), grad(nll(m, RETAIN), m)
    e_u, e_r = dot(g, gu), dot(g, gr)
    if arch == 'gpt2':
        # the first-order change of the risks along -g by central differences over a step of length 1e-5. GPT-2 is float64
        # throughout; Llama's RMSNorm computes in float32 even in a float64 model, too coarse for such differences
        eta = 1e-5 / norm(g)
        for d, e in ((FORGET, e_u), (RETAIN, e_r)):
            fd = (risk_at(m, g, eta, d) - risk_at(m, g, -eta, d)) / (2 * eta)
            assert fd == pytest.approx(-e, rel=1e-3, abs=1e-7 * norm(g) * norm(gu))
    with untouched(m, ref): ge = g_effect(m, module_objective(key), FORGET, RETAIN, ref=None if not differs else ref)
    assert ge.unlearning == pytest.approx(e_u, rel=1e-6)
    assert ge.retention == pytest.approx(e_r, rel=1e-6, abs=1e-9 * abs(e_u))
    assert ge.loss == pytest.approx(float(my_loss(name, m, ref, FORGET, RETAIN, **kw).detach()), rel=1e-8)

def test_g_effect_gd_and_wtnpo_and_idk_against_own_gradients():
    m = lm(seed=2); ref = perturbed(m, seed=3)
    idk = encode_queries(TOK, QA.pairs(QA.forget[:4])[0], [IDK_ANSWERS[i % len(IDK_ANSWERS)] for i in range(4)])
    gu, gr = grad(nll(m, FORGET), m), grad(nll(m, RETAIN), m)
    cases = [(objective('ga', regularizer='gd', weight=0.5), my_loss('ga', m, m, FORGET, RETAIN, reg='gd', weight=0.5), None, None),
             (objective('wtnpo', beta=3.0, alpha=1.5), my_loss('wtnpo', m, ref, FORGET, beta=3.0, alpha=1.5), ref, None),
             (objective('idk'), -my_loss('ga', m, m, idk), None, idk)]
    for obj, L, r, i in cases:
        g = grad(L, m)
        ge = g_effect(m, obj, FORGET, RETAIN, ref=r, idk=i)
        assert ge.unlearning == pytest.approx(dot(g, gu), rel=1e-4), obj.label
        assert ge.retention == pytest.approx(dot(g, gr), rel=1e-4), obj.label

# ---------------------------------------------------------------- groups

def test_groups_sum_to_total_and_names(untouched):
    m = lm(seed=0)
    assert not m.config.tie_word_embeddings and m.lm_head.weight is not m.model.embed_tokens.weight  # tiny_lm's Llama is untied
    with untouched(m):
        ge = g_effect(m, 'ga', FORGET, RETAIN)
        assert isinstance(ge, GEffect) and ge.objective == 'GA'
        assert list(ge.groups.index) == ['embed', 'layer 0', 'layer 1', 'final norm', 'lm_head']
        assert ge.groups['unlearning'].sum() == pytest.approx(ge.unlearning, rel=1e-12)
        assert ge.groups['retention'].sum() == pytest.approx(ge.retention, rel=1e-12)
        # per group against the own gradients restricted to the group's parameters
        g, gu = grad(my_loss('ga', m, m, FORGET), m), grad(nll(m, FORGET), m)
        names = [n for n, p in m.named_parameters() if p.requires_grad]
        which = lambda n: 'embed' if 'embed_tokens' in n else 'lm_head' if n.startswith('lm_head') else 'final norm' if n == 'model.norm.weight' else f"layer {n.split('.')[2]}"
        for grp in ge.groups.index:
            want = sum(float((a * b).sum()) for n, a, b in zip(names, g, gu) if which(n) == grp)
            assert ge.groups.loc[grp, 'unlearning'] == pytest.approx(want, rel=1e-4), grp
        # a callable
        ge_c = g_effect(m, 'ga', FORGET, RETAIN, groups=lambda n: 'mlp' if '.mlp.' in n else 'rest')
        assert set(ge_c.groups.index) == {'mlp', 'rest'}
        assert ge_c.unlearning == pytest.approx(ge.unlearning, rel=1e-12)
        mlp = sum(float((a * b).sum()) for n, a, b in zip(names, g, gu) if '.mlp.' in n)
        assert ge_c.groups.loc['mlp', 'unlearning'] == pytest.approx(mlp, rel=1e-4)

def test_groups_of_two_layers_merge_pairs():
    m = lm(seed=0, n_layers=4)
    one, two = g_effect(m, 'ga', FORGET, RETAIN), g_effect(m, 'ga', FORGET, RETAIN, groups=2)
    layers = [g for g in two.groups.index if g.startswith('layer')]
    assert len(layers) == 2 and set(two.groups.index) - set(layers) == {'embed', 'final norm', 'lm_head'}
    for col in ('unlearning', 'retention'):
        assert two.groups[col].sum() == pytest.approx(one.groups[col].sum(), rel=1e-12)
        assert two.groups.loc[layers[0], col] == pytest.approx(one.groups.loc['layer 0', col] + one.groups.loc['layer 1', col], rel=1e-10)
        assert two.groups.loc[layers[1], col] == pytest.approx(one.groups.loc['layer 2', col] + one.groups.loc['layer 3', col], rel=1e-10)
    pg = param_groups(m, 2)
    assert pg['model.layers.1.mlp.up_proj.weight'] == pg['model.layers.0.self_attn.q_proj.weight'] != pg['model.layers.2.mlp.up_proj.weight']

def test_gpt2_tied_groups_sum():
    m = lm('gpt2', double=True)
    ge = g_effect(m, 'ga', FORGET, RETAIN)
    g, gu = grad(my_loss('ga', m, m, FORGET), m), grad(nll(m, FORGET), m)
    assert ge.unlearning == pytest.approx(dot(g, gu), rel=1e-4)
    assert ge.groups['unlearning'].sum() == pytest.approx(ge.unlearning, rel=1e-12)
    assert {'layer 0', 'layer 1', 'final norm'} <= set(ge.groups.index)

# ---------------------------------------------------------------- batching and smoothing

@pytest.mark.parametrize('obj', ['ga', 'npo', 'rmu'])
def test_batch_size_does_not_change_g_effect(obj):
    m = lm(seed=1)
    a, b = g_effect(m, obj, FORGET, RETAIN, batch_size=1), g_effect(m, obj, FORGET, RETAIN, batch_size=64)
    for k in ('unlearning', 'retention', 'loss'):
        assert getattr(a, k) == pytest.approx(getattr(b, k), rel=1e-10, abs=1e-14), k

def test_batch_size_does_not_change_g_effect_float32():
    "The same in float32, to float32 precision (the scaling of the batches is not a float64 matter)."
    m = lm(seed=1, double=False)
    a, b, c = (g_effect(m, 'ga', FORGET, RETAIN, batch_size=bs) for bs in (1, 3, 64))
    for x in (a, c): assert x.unlearning == pytest.approx(b.unlearning, rel=1e-4)

def test_coefs_unrolled_moving_average():
    for n in (1, 2, 5):
        w = _coefs(n, 0.6)
        assert sum(w) == pytest.approx(1.0, abs=1e-12)
        # g <- 0.6 g + 0.4 g_b, starting from the first batch's gradient, with symbolic gradients as unit vectors
        gs = np.eye(n); g = gs[0].copy()
        for b in range(1, n): g = 0.6 * g + 0.4 * gs[b]
        np.testing.assert_allclose(w, g, atol=1e-12)
    assert _coefs(3, None) is None  # the exact mean
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ConfigError): _coefs(3, bad)

def test_smoothing_single_batch_equals_exact_and_several_differ():
    m = lm(seed=1)
    exact = g_effect(m, 'ga', FORGET, RETAIN, batch_size=64)
    one = g_effect(m, 'ga', FORGET, RETAIN, batch_size=64, smoothing=0.6)
    assert one.unlearning == pytest.approx(exact.unlearning, rel=1e-10) and one.retention == pytest.approx(exact.retention, rel=1e-10)
    sm = g_effect(m, 'ga', FORGET, RETAIN, batch_size=1, smoothing=0.6)
    assert abs(sm.unlearning - exact.unlearning) > 1e-3 * abs(exact.unlearning)
    # against the moving average of the per-example gradients (each row alone: one batch of batch_size=1)
    rows = [{k: v[i:i+1] for k, v in FORGET.items()} for i in range(4)]
    gl = [grad(my_loss('ga', m, m, r), m) for r in rows]; gr = [grad(nll(m, r), m) for r in rows]
    def avg(gs):
        g = [x.clone() for x in gs[0]]
        for gb in gs[1:]: g = [0.6 * a + 0.4 * b for a, b in zip(g, gb)]
        return g
    assert sm.unlearning == pytest.approx(dot(avg(gl), avg(gr)), rel=1e-4)
    with pytest.raises(ConfigError): g_effect(m, 'ga', FORGET, RETAIN, smoothing=1.0)

# ---------------------------------------------------------------- limits of the objectives

def ft_grad(obj, m, d, ref=None):
    s, c = forget_term(m, objective(**obj) if isinstance(obj, dict) else obj, d, ref if ref is not None else m)
    return grad(s / c, m)

def close(a, b, rtol=1e-5):
    for x, y in zip(a, b): torch.testing.assert_close(x, y, rtol=rtol, atol=rtol * max(float(y.abs().max()), 1e-12))

def test_wga_beta0_equals_ga():
    m = lm(seed=3)
    close(ft_grad(dict(name='wga', beta=0.0), m, FORGET), ft_grad(dict(name='ga'), m, FORGET), 1e-10)
    close(ft_grad(dict(name='ga'), m, FORGET), grad(my_loss('ga', m, m, FORGET), m))
    a, b = g_effect(m, objective('wga', beta=0.0), FORGET, RETAIN), g_effect(m, 'ga', FORGET, RETAIN)
    assert a.unlearning == pytest.approx(b.unlearning, rel=1e-10) and a.retention == pytest.approx(b.retention, rel=1e-10)

@pytest.mark.parametrize('beta', [0.1, 4.0])
def test_tnpo_and_npo_at_the_reference(beta):
    m = lm(seed=3)
    # TNPO at theta = ref: weights 2 sigma(0) = 1, so GA
    close(ft_grad(dict(name='tnpo', beta=beta), m, FORGET), ft_grad(dict(name='ga'), m, FORGET))
    a, b = g_effect(m, objective('tnpo', beta=beta), FORGET, RETAIN, ref=copy.deepcopy(m)), g_effect(m, 'ga', FORGET, RETAIN)
    assert a.unlearning == pytest.approx(b.unlearning, rel=1e-6)
    # NPO at theta = ref: -mean_x grad ell_x with ell the sequence-summed NLL (= GA on sequence sums), for any beta
    lp, keep, _ = token_lp(m, FORGET)
    want = grad(lp.sum(1).mean(), m)
    close(ft_grad(dict(name='npo', beta=beta), m, FORGET), want)
    ge = g_effect(m, objective('npo', beta=beta), FORGET, RETAIN)
    assert ge.unlearning == pytest.approx(dot(want, grad(nll(m, FORGET), m)), rel=1e-5)
    assert ge.loss == pytest.approx(-(2 / beta) * math.log(0.5), rel=1e-10)

def test_wtnpo_at_reference_equals_wga_alpha():
    m = lm(seed=4)
    close(ft_grad(dict(name='wtnpo', beta=4.0, alpha=1.5), m, FORGET), ft_grad(dict(name='wga', beta=1.5), m, FORGET))
    close(ft_grad(dict(name='wga', beta=1.5), m, FORGET), grad(my_loss('wga', m, m, FORGET, beta=1.5), m))

def test_kl_to_itself_is_zero():
    m = lm(seed=5)
    obj = objective('ga', regularizer='kl')
    s, c = retain_term(m, obj, RETAIN, m)
    assert c == int(RETAIN['attention_mask'].sum())
    assert abs(float(s.detach())) < 1e-10
    assert max(float(x.abs().max()) for x in grad(s / c, m)) < 1e-10
    a, b = g_effect(m, obj, FORGET, RETAIN), g_effect(m, 'ga', FORGET, RETAIN)
    assert a.unlearning == pytest.approx(b.unlearning, rel=1e-8) and a.retention == pytest.approx(b.retention, rel=1e-8)

def test_npo_small_beta_approaches_ga_on_sequence_sums():
    m = lm(seed=6); ref = perturbed(m, seed=7)
    lp, _, _ = token_lp(m, FORGET)
    ga_seq = grad(lp.sum(1).mean(), m)
    small = ft_grad(dict(name='npo', beta=1e-4), m, FORGET, ref)
    big = ft_grad(dict(name='npo', beta=2.0), m, FORGET, ref)
    err = lambda g: norm([a - b for a, b in zip(g, ga_seq)]) / norm(ga_seq)
    assert err(small) < 1e-3 < err(big)

# ---------------------------------------------------------------- instance-wise G-effects

@pytest.mark.parametrize('obj', ['ga', 'npo'])
def test_instance_g_effects_rows(obj, untouched):
    m = lm(seed=8)
    with untouched(m): inst = instance_g_effects(m, obj, FORGET, RETAIN, batch_size=3)
    assert list(inst.index) == [0, 1, 2, 3] and {'unlearning', 'retention', 'loss'} <= set(inst.columns)
    for i in range(4):
        one = {k: v[i:i+1] for k, v in FORGET.items()}
        # retention: g_effect with the single example as the forget set; unlearning: the same with the whole forget set as the retain data
        assert inst.loc[i, 'retention'] == pytest.approx(g_effect(m, obj, one, RETAIN).retention, rel=1e-6)
        assert inst.loc[i, 'unlearning'] == pytest.approx(g_effect(m, obj, one, FORGET).retention, rel=1e-6)
    # NPO averages over sequences; GA over tokens (one token per answer here): the mean of the rows is the total
    assert inst['unlearning'].mean() == pytest.approx(g_effect(m, obj, FORGET, RETAIN).unlearning, rel=1e-6)

# ---------------------------------------------------------------- step check

def test_step_check_predicts_small_steps(untouched):
    m = lm(seed=9)
    ge = g_effect(m, 'ga', FORGET, RETAIN)
    lr = 1e-3 / math.sqrt(abs(ge.unlearning))  # a step of length ~1e-3 along the gradient
    with untouched(m): sc = step_check(m, 'ga', FORGET, RETAIN, lr=lr)
    assert list(sc.index) == ['forget', 'retain']
    assert sc.loc['forget', 'g_effect'] == pytest.approx(ge.unlearning, rel=1e-10)
    for k in ('forget', 'retain'): assert sc.loc[k, 'predicted'] == pytest.approx(sc.loc[k, 'actual'], rel=1e-2), k
    # the actual change against HF's loss after the step, written here
    g = grad(my_loss('ga', m, m, FORGET), m)
    assert sc.loc['forget', 'actual'] == pytest.approx(risk_at(m, g, lr, FORGET) - float(nll(m, FORGET).detach()), rel=1e-4)
    big = step_check(m, 'ga', FORGET, RETAIN, lr=3e3 * lr)
    assert big.loc['forget', 'predicted'] != pytest.approx(big.loc['forget', 'actual'], rel=0.1)

# ---------------------------------------------------------------- the unlearning loop

COLS = ['step', 'unlearning', 'retention', 'forget_nll', 'forget_acc', 'retain_nll', 'retain_acc']

def test_unlearn_history_and_untouched(untouched):
    m = lm(seed=10)
    with untouched(m): run = unlearn(m, objective('npo', beta=0.5, regularizer='gd'), FORGET, RETAIN, steps=4, lr=0.05, optimizer='adamw',
                                     measure_every=2, g_effect_every=2)
    assert isinstance(run, Unlearning) and run.objective.label == 'NPO+GD'
    assert list(run.history.columns) == COLS and list(run.history['step']) == [0, 2, 4]
    assert run.model is not m and any(not torch.equal(a, b) for a, b in zip(run.model.parameters(), m.parameters()))
    ge = g_effect(m, objective('npo', beta=0.5, regularizer='gd'), FORGET, RETAIN)
    assert run.history.loc[0, 'unlearning'] == pytest.approx(ge.unlearning, rel=1e-6)
    assert run.history.loc[0, 'retention'] == pytest.approx(ge.retention, rel=1e-6)
    assert run.history.loc[0, 'forget_nll'] == pytest.approx(float(nll(m, FORGET).detach()), rel=1e-5)
    assert run.history['forget_nll'].iloc[-1] > run.history['forget_nll'].iloc[0]
    assert set(run.groups['step']) == {0, 2, 4} and {'group', 'unlearning', 'retention'} <= set(run.groups.columns)
    # the final checkpoint measures the returned model
    assert run.history['retain_nll'].iloc[-1] == pytest.approx(float(nll(run.model, RETAIN).detach()), rel=1e-5)
    again = unlearn(m, objective('npo', beta=0.5, regularizer='gd'), FORGET, RETAIN, steps=4, lr=0.05, optimizer='adamw', measure_every=2, g_effect_every=2)
    pd.testing.assert_frame_equal(again.history, run.history)
    # mini-batches of 2 of the 4 forget rows: the seed picks them
    h0, h0b, h1 = (unlearn(m, 'ga', FORGET, RETAIN, steps=2, lr=0.05, batch_size=2, g_effect_every=None, seed=s).history for s in (0, 0, 1))
    pd.testing.assert_frame_equal(h0, h0b)
    assert not np.allclose(h0['forget_nll'].to_numpy()[1:], h1['forget_nll'].to_numpy()[1:])

def test_unlearn_one_sgd_step_against_hand_gradient():
    m = lm(seed=11)
    lr = 0.1
    run = unlearn(m, 'ga', FORGET, RETAIN, steps=1, lr=lr, optimizer='sgd', batch_size=8, g_effect_every=None)
    g = grad(my_loss('ga', m, m, FORGET), m)  # batch_size >= the forget set: the step's batch is all of it
    for (n, a), b, x in zip(run.model.named_parameters(), m.parameters(), g):
        torch.testing.assert_close(a - b, -lr * x, rtol=1e-5, atol=1e-9 * lr, msg=n)
    assert run.history['unlearning'].isna().all()

def test_unlearn_stop_at():
    m = lm(seed=12)
    full = unlearn(m, 'ga', FORGET, RETAIN, steps=8, lr=0.5, measure_every=1, g_effect_every=None).history
    assert full['forget_nll'].is_monotonic_increasing or full['forget_nll'].iloc[-1] > full['forget_nll'].iloc[0]
    target = float(full['forget_nll'].iloc[3])
    stop = unlearn(m, 'ga', FORGET, RETAIN, steps=8, lr=0.5, measure_every=1, g_effect_every=None, stop_at=target).history
    first = int(full.index[full['forget_nll'] >= target][0])
    assert list(stop['step']) == list(full['step'][:first + 1])
    pd.testing.assert_frame_equal(stop, full.iloc[:first + 1])

def test_unlearn_that_raises_leaves_model_untouched(untouched):
    m = lm(seed=13)
    with untouched(m), pytest.raises(NotFiniteError):
        unlearn(m, 'ga', FORGET, RETAIN, steps=3, lr=1e300, optimizer='sgd', measure_every=100, g_effect_every=None)  # inf weights: a NaN loss at step 1
    with untouched(m), pytest.raises(ConfigError, match='lr=inf'): unlearn(m, 'ga', FORGET, RETAIN, steps=3, lr=math.inf)   # refused before any step
    with untouched(m), pytest.raises(ConfigError, match='idk'):
        unlearn(m, 'idk', FORGET, RETAIN, steps=1)
    with untouched(m), pytest.raises(ConfigError): unlearn(m, 'ga', FORGET, RETAIN, optimizer='adam')

def test_qa_metrics_by_hand():
    m = lm(seed=14, double=False)
    d = encode_queries(TOK, *QA.pairs(QA.retain[:5]))
    with torch.no_grad(): logits = m(input_ids=d['input_ids'], attention_mask=d['attention_mask']).logits
    nll, hit, n = 0.0, 0, 0
    for i in range(len(d['input_ids'])):
        for t in range(1, d['input_ids'].shape[1]):
            y = int(d['labels'][i, t])
            if y == -100: continue
            row = logits[i, t - 1].double()
            nll += float(torch.logsumexp(row, 0) - row[y]); hit += int(int(row.argmax()) == y); n += 1
    got = qa_metrics(m, d, batch_size=2)
    assert got['nll'] == pytest.approx(nll / n, rel=1e-5) and got['acc'] == pytest.approx(hit / n)

# ---------------------------------------------------------------- bad input

def test_bad_input_typed_errors(untouched):
    m = lm(seed=15, double=False)
    empty = {k: v[:0] for k, v in FORGET.items()}
    unlabelled = {**FORGET, 'labels': torch.full_like(FORGET['labels'], -100)}
    with untouched(m):
        with pytest.raises(ConfigError, match='Did you mean'): g_effect(m, 'npoo', FORGET, RETAIN)
        with pytest.raises(ConfigError, match='Did you mean'): objective('ga', regularizer='kll')
        with pytest.raises(ShapeError, match='batch >= 1'): g_effect(m, 'ga', empty, RETAIN)
        with pytest.raises(ConfigError, match='no labelled token'): g_effect(m, 'ga', unlabelled, RETAIN)
        with pytest.raises(ShapeError, match='retain'): g_effect(m, 'ga', FORGET, {k: v[:0] for k, v in RETAIN.items()})
        with pytest.raises(ShapeError, match='encode_queries'): g_effect(m, 'ga', FORGET['input_ids'], RETAIN)
        with pytest.raises(ShapeError): instance_g_effects(m, 'ga', FORGET, [1, 2])
        with pytest.raises(ConfigError, match='idk='): g_effect(m, 'idk', FORGET, RETAIN)
        with pytest.raises(ConfigError, match='idk='): instance_g_effects(m, 'idk', FORGET, RETAIN)
        with pytest.raises(ConfigError, match='beta'): objective('ga', beta=1.0)
        with pytest.raises(ConfigError, match='beta'): objective('npo', beta=0.0)
        with pytest.raises(ConfigError, match='layer'): objective('npo', layer=1)
        with pytest.raises(ConfigError, match='layer'): g_effect(m, objective('rmu', layer=9), FORGET, RETAIN)
        with pytest.raises(ConfigError): g_effect(m, 'ga', FORGET, RETAIN, groups=0)
        with pytest.raises(ConfigError): g_effect(m, 'ga', FORGET, RETAIN, groups='blocks')
        with pytest.raises(ConfigError): g_effect(m, 'ga', FORGET, RETAIN, batch_size=0)
    nan = copy.deepcopy(m)
    with torch.no_grad(): nan.model.layers[0].mlp.up_proj.weight[0, 0] = math.inf  # NaN activations (a NaN weight would fail `untouched`: NaN != NaN)
    with untouched(nan):
        with pytest.raises(NotFiniteError): g_effect(nan, 'ga', FORGET, RETAIN)
        with pytest.raises(NotFiniteError): unlearn(nan, 'ga', FORGET, RETAIN, steps=1)
    frozen = copy.deepcopy(m).requires_grad_(False)
    with untouched(frozen):
        with pytest.raises(ConfigError, match='requires_grad'): g_effect(frozen, 'ga', FORGET, RETAIN)
        with pytest.raises(ConfigError, match='requires_grad'): unlearn(frozen, 'ga', FORGET, RETAIN, steps=1)

# ---------------------------------------------------------------- GPT-2, bfloat16

def test_gpt2_and_bfloat16(untouched):
    m = lm('gpt2', double=False)
    g, gu = grad(my_loss('npo', m, m, FORGET, beta=0.5), m), grad(nll(m, FORGET), m)
    with untouched(m): ge = g_effect(m, objective('npo', beta=0.5), FORGET, RETAIN)
    assert ge.unlearning == pytest.approx(dot(g, gu), rel=1e-3)
    for arch in ('llama', 'gpt2'):
        b = lm(arch, double=False).to(torch.bfloat16)
        with untouched(b):
            for obj in ('ga', objective('wtnpo'), objective('rmu'), objective('ga', regularizer='kl')):
                ge = g_effect(b, obj, FORGET, RETAIN)
                assert math.isfinite(ge.unlearning) and math.isfinite(ge.retention) and ge.unlearning != 0, (arch, obj)
            assert np.isfinite(instance_g_effects(b, 'ga', FORGET, RETAIN).values).all()
        ref32 = g_effect(lm(arch, double=False).to(torch.bfloat16).float(), 'ga', FORGET, RETAIN)
        assert g_effect(b, 'ga', FORGET, RETAIN).unlearning == pytest.approx(ref32.unlearning, rel=0.1)

# ---------------------------------------------------------------- data and the demo's model

def test_author_qa_split():
    for n, frac, seed in ((40, 0.1, 0), (20, 0.25, 3)):
        qa = author_qa(n_authors=n, forget_frac=frac, seed=seed)
        assert len(qa.questions) == len(qa.answers) == len(qa.author) == n * len(ATTRIBUTES) and len(qa.authors) == n
        assert sorted(qa.forget + qa.retain) == list(range(len(qa.questions))) and not set(qa.forget) & set(qa.retain)
        fa, ra = {qa.author[i] for i in qa.forget}, {qa.author[i] for i in qa.retain}
        assert not fa & ra and len(fa) == round(frac * n)  # whole authors
        assert all(sum(qa.author[i] == a for i in qa.forget) == len(ATTRIBUTES) for a in fa)
        assert all(qa.authors.loc[qa.author[i], 'name'] in qa.questions[i] for i in range(len(qa.questions)))
        assert all(qa.answers[i] in {v for _, vs in ATTRIBUTES.values() for v in vs} for i in qa.forget)
        again = author_qa(n_authors=n, forget_frac=frac, seed=seed)
        assert again.questions == qa.questions and again.answers == qa.answers and again.forget == qa.forget
    assert author_qa(seed=1).forget != author_qa(seed=0).forget or author_qa(seed=1).questions != author_qa(seed=0).questions
    qa = author_qa(); q, a = qa.pairs(qa.forget[:2])
    assert q == [qa.questions[i] for i in qa.forget[:2]] and a == [qa.answers[i] for i in qa.forget[:2]]

def test_train_qa_lm_reduces_nll():
    "A short version of the shipped training (the demo's 4-layer Llama): the answer NLL falls, by HF's loss."
    qa = author_qa(n_authors=10, forget_frac=0.2, seed=0)
    model, tok, res = train_qa_lm(qa, steps=60, batch_size=16, progress=False)
    d = encode_queries(tok, qa.questions, qa.answers)
    init = tiny_lm('llama', vocab_size=tok.vocab_size, seed=0, **QA_LM)
    with torch.no_grad(): before, after = float(hf_nll(init, d).detach()), float(hf_nll(model, d).detach())
    assert after < before - 1.0, (before, after)
    assert not model.training and tok.vocab == qa_tokenizer(qa).vocab

def test_load_qa_lm_memorised():
    model, tok, meta = load_qa_lm()
    qa = author_qa(**meta['author_qa'])
    assert tok.vocab == qa_tokenizer(qa).vocab
    d = encode_queries(tok, *qa.pairs(qa.forget + qa.retain[:40]))
    with torch.no_grad(): loss = float(hf_nll(model, d).detach())
    m = qa_metrics(model, d)
    assert m['nll'] == pytest.approx(loss, rel=1e-4) and loss < 0.5 and m['acc'] > 0.8

def test_retain_at_interpolates():
    h = pd.DataFrame(dict(forget_nll=[1.0, 2.0, 4.0], retain_nll=[0.5, 0.7, 1.5]))
    assert retain_at(h, 3.0) == pytest.approx(0.7 + 0.5 * 0.8)
    assert retain_at(h, 0.5) == 0.5 and retain_at(h, 2.0) == pytest.approx(0.7)
    assert math.isnan(retain_at(h, 5.0))

def test_plot_g_effects():
    import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt
    m = lm(seed=16, double=False)
    runs = {o: unlearn(m, o, FORGET, RETAIN, steps=2, lr=1e-2, g_effect_every=1) for o in ('ga', 'npo')}
    fig = plot_g_effects(runs)
    assert [len(a.lines) for a in fig.axes] == [3, 3]  # two runs and the zero line
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), runs['ga'].history['unlearning'])
    fig2 = plot_g_effects(runs, group='lm_head')
    with pytest.raises(ConfigError): plot_g_effects(runs, group='nope')
    plt.close('all')

def test_a_local_path_or_hub_id_is_loaded(tmp_path):
    "A model given by path goes through `load_lm`: the same G-effects as the object it was saved from."
    m = lm(double=False)
    m.save_pretrained(tmp_path / 'tiny'); tiny_tokenizer(TOK.vocab_size).save_pretrained(tmp_path / 'tiny')   # load_lm loads a tokenizer too
    a, b = g_effect(m, 'npo', FORGET, RETAIN), g_effect(str(tmp_path / 'tiny'), 'npo', FORGET, RETAIN)
    assert math.isclose(a.unlearning, b.unlearning, rel_tol=1e-5) and math.isclose(a.retention, b.retention, rel_tol=1e-5)
    assert math.isclose(qa_metrics(tmp_path / 'tiny', FORGET)['nll'], qa_metrics(m, FORGET)['nll'], rel_tol=1e-6)

# ---------------------------------------------------------------- from mutation testing

def test_unlearn_defaults_and_adamw_first_step():
    "The documented defaults (30 steps, every step measured, G-effects every 5, batches of 8, AdamW at 1e-3 without weight decay, seed 0)."
    m = lm(seed=20)
    run = unlearn(m, 'ga', FORGET, RETAIN)
    assert list(run.history['step']) == list(range(31))
    assert list(run.history.dropna(subset=['unlearning'])['step']) == [0, 5, 10, 15, 20, 25, 30]
    assert run.objective == objective('ga')
    # AdamW's first step in closed form: m_hat = g, v_hat = g^2, so theta -= lr * g / (|g| + eps); no weight decay
    one = unlearn(m, 'ga', FORGET, RETAIN, steps=1, g_effect_every=None)
    g = grad(my_loss('ga', m, m, FORGET), m)   # 4 forget rows < the default batch of 8: the step's batch is all of it
    for (n, a), b, x in zip(one.model.named_parameters(), m.parameters(), g):
        torch.testing.assert_close(a - b, -1e-3 * x / (x.abs() + 1e-8), rtol=1e-6, atol=1e-12, msg=n)   # weight decay 0.01 would add 1e-5 * theta
    sgd = unlearn(m, 'ga', FORGET, RETAIN, steps=1, optimizer='sgd', g_effect_every=None)
    assert not torch.equal(next(sgd.model.parameters()), next(one.model.parameters()))
    zero = unlearn(m, 'ga', FORGET, RETAIN, steps=0)
    assert list(zero.history['step']) == [0] and len(zero.groups)

def test_unlearn_inplace_uses_a_frozen_reference():
    "inplace=True trains the model itself, against a copy of it as it was: the same weights as a run on a copy."
    m = lm(seed=21, double=False)
    kw = dict(steps=3, lr=1e-2, g_effect_every=None)
    on_copy = unlearn(m, 'npo', FORGET, RETAIN, **kw)
    before = copy.deepcopy(m)
    in_place = unlearn(m, 'npo', FORGET, RETAIN, inplace=True, **kw)
    assert in_place.model is m and any(not torch.equal(a, b) for a, b in zip(m.parameters(), before.parameters()))
    for a, b in zip(m.parameters(), on_copy.model.parameters()): torch.testing.assert_close(a, b)
    assert all(p.grad is None for p in m.parameters())
    pd.testing.assert_frame_equal(in_place.history, on_copy.history)

def test_unlearn_idk_and_bad_settings_name_the_setting(untouched):
    m = lm(seed=22, double=False)
    qs, _ = QA.pairs(QA.forget[:4])
    idk = encode_queries(TOK, qs, IDK_ANSWERS[:4])
    run = unlearn(m, 'idk', FORGET, RETAIN, steps=2, lr=1e-2, idk=idk, g_effect_every=2)
    assert run.history['forget_nll'].notna().all() and run.history.loc[0, 'unlearning'] == pytest.approx(g_effect(m, 'idk', FORGET, RETAIN, idk=idk).unlearning, rel=1e-5)
    for bad, word in ((dict(steps=-1), 'steps=-1'), (dict(measure_every=0), 'measure_every=0'), (dict(g_effect_every=0), 'g_effect_every=0'),
                      (dict(steps=2.5), 'steps=2.5'), (dict(steps=True), 'steps=True'), (dict(optimizer='adam'), 'optimizer')):
        with untouched(m), pytest.raises(ConfigError, match=word): unlearn(m, 'ga', FORGET, RETAIN, **bad)
    with untouched(m), pytest.raises(ShapeError, match='retain'): unlearn(m, 'ga', FORGET, [1, 2])
    with untouched(m), pytest.raises(ShapeError, match='forget'): unlearn(m, 'ga', [1, 2], RETAIN)

def test_step_check_passes_ref_idk_and_the_regulariser():
    "step_check of NPO against a reference, of GA+GD and of IDK: the same G-effect as g_effect with those arguments, and the step it takes."
    m, r = lm(seed=23), None
    r = perturbed(m)
    qs, _ = QA.pairs(QA.forget[:4])
    idk = encode_queries(TOK, qs, IDK_ANSWERS[:4])
    for obj, kw in (('npo', dict(ref=r)), (objective('ga', regularizer='gd'), {}), ('idk', dict(idk=idk))):
        sc = step_check(m, obj, FORGET, RETAIN, lr=1e-4, **kw)
        ge = g_effect(m, obj, FORGET, RETAIN, **kw)
        assert sc.loc['forget', 'g_effect'] == pytest.approx(ge.unlearning, rel=1e-10) and sc.loc['retain', 'g_effect'] == pytest.approx(ge.retention, rel=1e-10)
        for k in ('forget', 'retain'): assert sc.loc[k, 'actual'] == pytest.approx(sc.loc[k, 'predicted'], rel=2e-2), (obj, k)
    assert step_check(m, 'ga', FORGET, RETAIN).loc['forget', 'predicted'] == pytest.approx(-1e-3 * g_effect(m, 'ga', FORGET, RETAIN).unlearning)

def test_rmu_layer_range():
    "RMU's layer indexes hidden_states (n_layers + 1 of them): -n-1..n are valid, and the default is the middle block."
    m = lm(seed=24, n_layers=2)
    for layer in (-3, 0, 2): forget_term(m, objective('rmu', layer=layer), FORGET)
    for layer in (-4, 3):
        with pytest.raises(ConfigError, match='hidden_states'): forget_term(m, objective('rmu', layer=layer), FORGET)
    h = m(input_ids=FORGET['input_ids'], attention_mask=FORGET['attention_mask'], output_hidden_states=True).hidden_states[1]
    mask = FORGET['labels'][:, 1:] != -100       # the positions whose next token is an answer token
    u = 2.0 * torch.rand(h.shape[-1], generator=torch.Generator().manual_seed(0), dtype=torch.float32).to(h.dtype)
    s, c = forget_term(m, objective('rmu'), FORGET)
    assert c == int(mask.sum()) and float(s.detach()) == pytest.approx(float((h[:, :-1][mask] - u).pow(2).mean(-1).sum().detach()), rel=1e-10)

# ---------------------------------------------------------------- RMU against the official code's definition

def ragged():
    "Forget questions with answers of 5, 1, 4 and 1 tokens: right padding, and answers ending at different positions."
    qs, ans = QA.pairs(QA.forget[:4])
    return encode_queries(TOK, qs, [IDK_ANSWERS[0], ans[1], IDK_ANSWERS[4], ans[3]])

def rmu_loop(m, d, layer, c=2.0, seed=0, at_answer=False):
    """The official RMU loss (tmlr-group/G-effect, dataloader.py, the `rmu_` branches of compute_loss), written as loops: for every
    row i and every position t >= 1 whose label is set, the mean over the hidden dimension of (hidden_states[layer][i, t-1] - c*u)^2,
    then the plain mean over all those (i, t) of the batch. `at_answer=True`: the state at t itself (the definition this module had before)."""
    hs = m(input_ids=d['input_ids'], attention_mask=d['attention_mask'], output_hidden_states=True).hidden_states[layer]
    u = (c * torch.rand(hs.shape[-1], generator=torch.Generator().manual_seed(seed))).to(hs.dtype)   # c*u drawn in float32, as the official code
    terms = []
    for i in range(d['input_ids'].shape[0]):
        for t in range(1, d['input_ids'].shape[1]):
            if int(d['labels'][i, t]) != -100:
                x = hs[i, t if at_answer else t - 1]
                terms.append(sum((x[k] - u[k]) ** 2 for k in range(len(u))) / len(u))
    return sum(terms) / len(terms)

@pytest.mark.parametrize('arch,layer', [('llama', 1), ('llama', 2), ('gpt2', 0), ('gpt2', -1)])
def test_rmu_against_the_official_loss_as_loops(arch, layer, untouched):
    "The loss, its count and its G-effects against the loops above, on ragged answers, at the embeddings, a middle and the last state."
    m, d = lm(arch, seed=28), ragged()
    assert len({int(r.sum()) for r in d['attention_mask']}) > 1 and (d['labels'] != -100).sum(1).tolist() == [5, 1, 4, 1]
    obj = objective('rmu', layer=layer, c=3.0, seed=4)
    with untouched(m):
        s, n = forget_term(m, obj, d)
        ge = g_effect(m, obj, d, RETAIN, batch_size=3)    # two batches of unequal counts
    want = rmu_loop(m, d, layer, c=3.0, seed=4)
    assert n == 11 and float(s.detach()) / n == pytest.approx(float(want.detach()), rel=1e-10)
    assert ge.loss == pytest.approx(float(want.detach()), rel=1e-10)
    g = grad(want, m)
    gu, gr = grad(nll(m, d), m), grad(nll(m, RETAIN), m)
    assert ge.unlearning == pytest.approx(dot(g, gu), rel=1e-6)
    assert ge.retention == pytest.approx(dot(g, gr), rel=1e-6)
    # the old definition (the states at the answer tokens) is a different number: the comparison can tell them apart
    assert abs(float(rmu_loop(m, d, layer, c=3.0, seed=4, at_answer=True).detach()) - float(want.detach())) > 1e-4 * float(want.detach())

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_rmu_does_not_see_the_last_answer_token_but_sees_the_one_before_the_first(arch):
    """With causal attention the state at t-1, which predicts token t, does not depend on token t: changing only a row's last answer
    token leaves the official RMU loss as it was (up to float64 rounding), while changing the token before its first answer token (the
    one whose state predicts it) moves it. The states at the answer tokens (the old definition) do see the last one."""
    m, d = lm(arch, seed=29), ragged()
    obj = objective('rmu', layer=1)
    loss = lambda b: float(forget_term(m, obj, b)[0].detach()) / forget_term(m, obj, b)[1]
    old = lambda b: float(rmu_loop(m, b, 1, at_answer=True).detach())
    base, base_old = loss(d), old(d)
    for i in range(len(d['input_ids'])):
        pos = (d['labels'][i] != -100).nonzero()[:, 0]
        first, last = int(pos.min()), int(pos.max())
        for where, moves in ((last, False), (first - 1, True)):
            b = {k: v.clone() for k, v in d.items()}
            tok = int(b['input_ids'][i, where])
            b['input_ids'][i, where] = 5 + (tok - 5 + 7) % (TOK.vocab_size - 5)   # another real word
            assert int(b['input_ids'][i, where]) != tok
            if moves: assert abs(loss(b) - base) > 1e-6 * base, (i, where)
            else:
                assert loss(b) == pytest.approx(base, rel=1e-12, abs=0), (i, where)
                assert abs(old(b) - base_old) > 1e-6 * base_old, (i, where)

def test_retain_at_crossings():
    h = pd.DataFrame(dict(forget_nll=[0.0, 2.0, 2.0, 6.0], retain_nll=[0.1, 0.3, 0.9, 1.3]))
    assert retain_at(h, 0.0) == 0.1                      # already there at the start
    assert retain_at(h, 1.0) == pytest.approx(0.2)       # crossed between the first two checkpoints
    assert retain_at(h, 2.0) == pytest.approx(0.3)       # reached exactly: the first checkpoint that reaches it
    assert retain_at(h, 4.0) == pytest.approx(1.1)

def test_author_qa_defaults_and_bounds():
    qa = author_qa()
    assert len(qa.questions) == 200 and len(qa.forget) == 20 and len(qa.authors) == 40
    assert qa.questions == author_qa(40, 0.1, 0).questions and qa.questions != author_qa(seed=1).questions
    assert len(set(qa.questions)) == 200                                  # every question is about one author: no duplicates
    assert len(author_qa(n_authors=2).authors) == 2 and len(author_qa(n_authors=400).authors) == 400
    for bad in (dict(n_authors=1), dict(n_authors=401), dict(n_authors=2.0), dict(forget_frac=0), dict(forget_frac=1), dict(forget_frac=1.5)):
        with pytest.raises(ConfigError): author_qa(**bad)
    assert len({author_qa(n_authors=2, forget_frac=0.99).author[i] for i in author_qa(n_authors=2, forget_frac=0.99).forget}) == 1  # never all authors
    assert len({author_qa(n_authors=10, forget_frac=0.01).author[i] for i in author_qa(n_authors=10, forget_frac=0.01).forget}) == 1  # at least one

def test_group_order():
    from interpkit.papers.g_effect import _group_order
    assert _group_order(['lm_head', 'layer 10', 'other', 'final norm', 'layer 2', 'embed', 'layer 0', 'lm_head']) == \
        ['embed', 'layer 0', 'layer 2', 'layer 10', 'other', 'final norm', 'lm_head']
    assert _group_order(['layers 2-3', 'final norm', 'layers 0-1', 'embed']) == ['embed', 'layers 0-1', 'layers 2-3', 'final norm']

def test_param_groups_of_a_model_of_ones_own():
    "A model the library has no layout for: the output embeddings by identity (whatever their path), the rest by the first numbered module."
    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.blocks, self.out = nn.Embedding(10, 4), nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]), nn.Linear(4, 10)
        def get_output_embeddings(self): return self.out
    torch.manual_seed(0)   # the weights play no part in the names; seeded all the same
    g = param_groups(Wrapped())
    assert g == {'emb.weight': 'embed', 'blocks.0.weight': 'blocks.0', 'blocks.0.bias': 'blocks.0', 'blocks.1.weight': 'blocks.1',
                 'blocks.1.bias': 'blocks.1', 'out.weight': 'lm_head', 'out.bias': 'lm_head'}
    assert set(param_groups(lm(double=False), groups=1).values()) == set(param_groups(lm(double=False)).values())

def test_a_reference_in_training_mode_is_run_in_eval_mode():
    "The reference model's dropout is off when it is run: KL to a train-mode copy of oneself is 0 and TNPO at it is GA."
    m = tiny_lm('llama', n_layers=2, d_model=32, n_heads=4, vocab_size=TOK.vocab_size, seed=25, attention_dropout=0.5).double()
    ref = copy.deepcopy(m).train()
    kl = objective('ga', regularizer='kl')
    s, _ = retain_term(m, kl, RETAIN, ref)
    assert abs(float(s.detach())) < 1e-10 and ref.training
    assert float(forget_term(m, objective('tnpo'), FORGET, ref)[0].detach()) == pytest.approx(float(forget_term(m, objective('ga'), FORGET)[0].detach()), rel=1e-10)
    # without an attention mask every position counts
    nomask = {k: v for k, v in RETAIN.items() if k != 'attention_mask'}
    s2, c2 = retain_term(m, kl, nomask, perturbed(m))
    assert c2 == RETAIN['input_ids'].numel() and float(s2.detach()) > 0

def test_g_effect_runs_in_eval_mode_orders_groups_and_checks_its_data(untouched):
    m = tiny_lm('llama', n_layers=2, d_model=32, n_heads=4, vocab_size=TOK.vocab_size, seed=26, attention_dropout=0.5).double()
    ev = g_effect(m, 'ga', FORGET, RETAIN)
    with untouched(m.train()): tr = g_effect(m, 'ga', FORGET, RETAIN)                 # dropout is off while measuring, and back on after
    assert tr.unlearning == pytest.approx(ev.unlearning, rel=1e-12) and m.training
    assert list(ev.groups.index) == ['embed', 'layer 0', 'layer 1', 'final norm', 'lm_head']
    with pytest.raises(ShapeError, match='labels'): g_effect(m, 'ga', {k: v for k, v in FORGET.items() if k != 'labels'}, RETAIN)
    # smoothing=0: the moving average keeps only the last batch
    last = {k: v[-1:] for k, v in FORGET.items()}
    assert g_effect(m.eval(), 'ga', FORGET, RETAIN, batch_size=1, smoothing=0.0).unlearning == pytest.approx(
        float(sum((a * b).sum() for a, b in zip(grad(my_loss('ga', m, m, last), m), grad(nll(m, last), m)))), rel=1e-8)

def test_objective_hyper_parameters_and_defaults():
    assert objective() == objective('ga') and objective().name == 'ga'
    o = objective('wtnpo', alpha=1.0)
    assert (o.beta, o.alpha) == (4.0, 1.0)                                  # alpha alone, beta left at its default
    assert objective('wtnpo', beta=2.0, alpha=0.5) .alpha == 0.5 and objective('rmu', c=3).c == 3.0 and objective('rmu', seed=3).seed == 3
    for name in ('tnpo', 'wtnpo', 'wga'):
        with pytest.raises(ConfigError, match='beta'): objective(name, beta=-1)
    assert objective('wga', beta=0).beta == 0.0
    with pytest.raises(ConfigError, match='objective'): objective('gaa')
    with pytest.raises(ConfigError, match='regularizer'): objective('ga', regularizer='kll')

def test_param_group_names_with_uneven_groups_and_loose_parameters():
    m = lm(double=False, n_layers=3)
    assert set(param_groups(m, 2).values()) == {'embed', 'layers 0-1', 'layers 2-2', 'final norm', 'lm_head'}
    class Loose(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale, self.proj = nn.Parameter(torch.ones(3)), nn.Linear(3, 3)
    torch.manual_seed(0)   # the weights play no part in the names; seeded all the same
    assert param_groups(Loose()) == {'scale': 'other', 'proj.weight': 'proj', 'proj.bias': 'proj'}

def test_counts_of_npo_rmu_and_kl_on_longer_answers():
    "NPO averages over sequences, RMU over every position whose next token is labelled, KL over real positions: checked where tokens, rows and positions differ."
    m = lm(seed=27)
    qs, _ = QA.pairs(QA.forget[:4])
    long_ = encode_queries(TOK, qs, IDK_ANSWERS[:4])                     # answers of 4 and 5 tokens, so tokens != rows
    a, b = (g_effect(m, 'npo', long_, RETAIN, batch_size=bs) for bs in (1, 64))
    assert a.unlearning == pytest.approx(b.unlearning, rel=1e-10) and a.loss == pytest.approx(b.loss, rel=1e-10)
    from interpkit.models import encode_texts
    texts = encode_texts(TOK, ['Where was Avel born ?', 'Lisbon'])      # every token labelled, the first one too
    s, c = forget_term(m, objective('rmu'), texts)
    assert c == int(texts['attention_mask'].sum()) - 2                  # no state predicts a row's first token
    g1, g64 = (g_effect(m, 'rmu', texts, RETAIN, batch_size=bs) for bs in (1, 64))
    assert g1.loss == pytest.approx(float(s.detach()) / c, rel=1e-10) == g64.loss
    nomask = {k: v for k, v in RETAIN.items() if k != 'attention_mask'}
    kl = g_effect(m, objective('ga', regularizer='kl'), FORGET, nomask, ref=perturbed(m))
    assert math.isfinite(kl.unlearning) and math.isfinite(kl.loss)

# ---------------------------------------------------------------- the vocabulary: renamed and moved names keep working, with a FutureWarning

def test_forget_and_retain_term_take_the_model_first_and_the_old_order_warns():
    "forget_term/retain_term(model, objective, batch, ref); the old (objective, model, batch, ref) and obj= still work, with a FutureWarning."
    m = lm(seed=30); ref = perturbed(m)
    for fn, obj, d in ((forget_term, objective('npo'), FORGET), (retain_term, objective('ga', regularizer='kl'), RETAIN)):
        s, c = fn(m, obj, d, ref)
        with pytest.warns(FutureWarning, match='the model comes first'): s_old, c_old = fn(obj, m, d, ref)
        assert float(s_old.detach()) == float(s.detach()) and c_old == c
        with pytest.warns(FutureWarning, match='obj= is now called objective='): s_kw, _ = fn(m, obj=obj, batch=d, ref=ref)
        assert float(s_kw.detach()) == float(s.detach())
    # a name is resolved with `objective`: the same as its Objective
    assert float(forget_term(m, 'wga', FORGET)[0].detach()) == float(forget_term(m, objective('wga'), FORGET)[0].detach())

@pytest.mark.parametrize('name', ['FIRST_NAMES', 'LAST_NAMES', 'ATTRIBUTES', 'IDK_ANSWERS', 'AuthorQA', 'author_qa', 'QA_LM', 'qa_tokenizer', 'train_qa_lm', 'load_qa_lm'])
def test_demo_names_moved_to_the_demo_module(name):
    import interpkit.papers.g_effect as paper, interpkit.demos.g_effect as demo
    with pytest.warns(FutureWarning, match=f'g_effect.{name} is now interpkit.demos.g_effect.{name}'):
        assert getattr(paper, name) is getattr(demo, name)
    assert name not in paper.__all__ and name in demo.__all__

def test_loader_and_trainer_shapes():
    from interpkit.train import Shipped, Trained
    s = load_qa_lm()
    assert isinstance(s, Shipped) and s.model is s[0] and s.meta['author_qa'] == dict(n_authors=40, forget_frac=0.1, seed=0)
    ids = encode_queries(s.tokenizer, ['Where was Jora Rowan born ?'], ['Hanoi'])['input_ids'][0].tolist()
    assert s.tokenizer.convert_ids_to_tokens(ids) == ['<s>', 'Where', 'was', 'Jora', 'Rowan', 'born', '?', 'Hanoi']   # the asset's words, one token each
    t = train_qa_lm(author_qa(n_authors=4, forget_frac=0.25), steps=2, batch_size=4, progress=False)
    assert isinstance(t, Trained) and len(t.fit.history) == 2 and t.tokenizer.get_vocab() == qa_tokenizer(author_qa(n_authors=4, forget_frac=0.25)).get_vocab()

def test_param_groups_is_a_mapping():
    m = lm(double=False)
    pg = param_groups(m)
    assert isinstance(pg, ParamGroups) and pg == pg.groups and dict(pg) == pg.groups and len(pg) == sum(p.requires_grad for p in m.parameters())
    assert pg.order == ['embed', 'layer 0', 'layer 1', 'final norm', 'lm_head'] and set(pg.values()) == set(pg.order)
    assert pg['model.layers.1.mlp.up_proj.weight'] == 'layer 1' and 'model.norm.weight' in pg
    assert param_groups(m, lambda n: 'all') == {n: 'all' for n, _ in m.named_parameters()}

# ---------------------------------------------------------------- issue 51: padding, models of one's own, other vocabularies

def left(d):
    "The same rows padded on the left: each row rolled right by its number of padding positions."
    n = (d['attention_mask'] == 0).sum(1)
    return {k: torch.stack([r.roll(int(s)) for r, s in zip(v, n)]) for k, v in d.items()}

def unpadded_risk(m, d):
    "The mean answer NLL, each row run alone on its real tokens (no mask, no padding)."
    rows = [{k: v[i:i + 1, d['attention_mask'][i].bool()] for k, v in d.items()} for i in range(len(d['input_ids']))]
    total = sum(int((r['labels'][:, 1:] != -100).sum()) for r in rows)
    loss = sum(F.cross_entropy(logits_of_(m(input_ids=r['input_ids']))[0, :-1], r['labels'][0, 1:], ignore_index=-100, reduction='sum') for r in rows) / total
    return loss

def unpadded_risk_grad(m, d): return grad(unpadded_risk(m, d), m)

def logits_of_(out): return out if torch.is_tensor(out) else out.logits

@pytest.mark.parametrize('arch,rel', [('gpt2', 1e-9), ('llama', 1e-6)])   # Llama's RMSNorm computes in float32 even in a float64 model
def test_left_padding_gives_the_unpadded_g_effect(arch, rel, untouched):
    m = lm(arch)
    fl, rl = left(FORGET), left(RETAIN)
    assert (fl['attention_mask'][:, 0] == 0).any() and (rl['attention_mask'][:, 0] == 0).any()
    gf, gr = unpadded_risk_grad(m, FORGET), unpadded_risk_grad(m, RETAIN)
    with untouched(m): ge = g_effect(m, 'ga', fl, rl, batch_size=3)
    assert ge.unlearning == pytest.approx(-dot(gf, gf), rel=rel) and ge.retention == pytest.approx(-dot(gf, gr), rel=rel)   # GA: grad L = -grad R(forget)
    obj = objective('npo', regularizer='kl')
    ref = perturbed(m)
    a, b = g_effect(m, obj, FORGET, RETAIN, ref=ref), g_effect(m, obj, fl, rl, ref=ref)
    assert (b.unlearning, b.retention, b.loss) == pytest.approx((a.unlearning, a.retention, a.loss), rel=rel)
    assert qa_metrics(m, fl).to_numpy() == pytest.approx(qa_metrics(m, FORGET).to_numpy(), rel=rel)
    ia, ib = instance_g_effects(m, 'wga', FORGET, RETAIN), instance_g_effects(m, 'wga', fl, rl)
    assert ib.to_numpy() == pytest.approx(ia.to_numpy(), rel=rel)
    ua, ub = (unlearn(m, 'ga', f, r, steps=2, lr=1e-3, g_effect_every=2, batch_size=2).history for f, r in ((FORGET, RETAIN), (fl, rl)))
    assert ub.to_numpy() == pytest.approx(ua.to_numpy(), rel=1e-6, nan_ok=True)

def test_left_padding_of_the_reported_case_gpt2_float32():
    "The issue's case: a GPT-2's forget G-effect on left-padded rows moved by 0.1% (no position ids); now it is the unpadded one."
    m = tiny_lm('gpt2', vocab_size=TOK.vocab_size, seed=0)
    gf = unpadded_risk_grad(m, FORGET)
    assert g_effect(m, 'ga', left(FORGET), RETAIN).unlearning == pytest.approx(-dot(gf, gf), rel=1e-4)

class Plain(nn.Module):
    "A causal LM of one's own: forward(input_ids, attention_mask) -> logits; each position reads the masked running mean of the embeddings."
    def __init__(self, n, d=16):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb, self.mix, self.out = nn.Embedding(n, d), nn.Linear(d, d), nn.Linear(d, n)
        with torch.no_grad():
            for p in self.parameters(): p.copy_(0.5 * torch.randn(p.shape, generator=g))
        self.double()
    def forward(self, input_ids, attention_mask=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        x = self.emb(input_ids) * mask[..., None]
        h = x.cumsum(1) / mask.cumsum(1).clamp(min=1)[..., None]
        return self.out(torch.tanh(self.mix(h)))

def test_a_plain_module_with_forward_of_ids_and_mask(untouched):
    m = Plain(TOK.vocab_size)
    gf, gr = unpadded_risk_grad(m, FORGET), unpadded_risk_grad(m, RETAIN)
    with untouched(m):
        ge = g_effect(m, 'ga', FORGET, RETAIN)
        assert ge.unlearning == pytest.approx(-dot(gf, gf), rel=1e-9) and ge.retention == pytest.approx(-dot(gf, gr), rel=1e-9)
        assert set(ge.groups.index) == {'embed', 'mix', 'out'} and ge.groups.sum().to_numpy() == pytest.approx([ge.unlearning, ge.retention], rel=1e-9)
        assert g_effect(m, 'ga', left(FORGET), left(RETAIN)).unlearning == pytest.approx(ge.unlearning, rel=1e-9)
        assert retain_term(m, objective('ga', regularizer='kl'), RETAIN, ref=m)[0].item() == pytest.approx(0, abs=1e-12)
        assert qa_metrics(m, FORGET)['nll'] == pytest.approx(float(unpadded_risk(m, FORGET).detach()), rel=1e-9)
        assert len(unlearn(m, 'npo', FORGET, RETAIN, steps=1, g_effect_every=1).history) == 2
        with pytest.raises(ConfigError, match='RMU .*Plain.*Use another objective'): g_effect(m, 'rmu', FORGET, RETAIN)

def test_a_plain_module_without_attention_mask():
    class IdsOnly(Plain):
        def forward(self, input_ids): return super().forward(input_ids)
    m = IdsOnly(TOK.vocab_size)
    with pytest.raises(ConfigError, match='padded, but IdsOnly.forward takes no attention_mask.*rows of one length'): g_effect(m, 'ga', FORGET, RETAIN)
    one = {k: v[:1, FORGET['attention_mask'][0].bool()] for k, v in FORGET.items()}   # one row, no padding: it runs
    assert g_effect(m, 'ga', one, one).unlearning == pytest.approx(-dot(*[unpadded_risk_grad(m, one)] * 2), rel=1e-9)

def test_another_vocabulary_is_a_config_error_naming_both(untouched):
    top = int(FORGET['input_ids'].max())
    small = tiny_lm('llama', n_layers=1, d_model=16, vocab_size=top, seed=0)   # misses the forget data's largest id
    m = lm()
    with untouched(small), untouched(m):
        with pytest.raises(ConfigError, match=rf'the forget data holds token id\(s\) \[{top}\], but LlamaForCausalLM embeds ids 0 to {top - 1}'): g_effect(small, 'ga', FORGET, RETAIN)
        with pytest.raises(ConfigError, match=r'the forget data \(for the reference model\) holds token id'): g_effect(m, 'npo', FORGET, RETAIN, ref=small)
        with pytest.raises(ConfigError, match='the forget data holds token id'): unlearn(small, 'ga', FORGET, RETAIN, steps=1)
        with pytest.raises(ConfigError, match='the forget data holds token id'): instance_g_effects(small, 'ga', FORGET, RETAIN)
        with pytest.raises(ConfigError, match='^data holds token id'): qa_metrics(small, FORGET)
        with pytest.raises(ConfigError, match='input_ids holds token id'): risk_term(small, FORGET)
        bad = dict(FORGET, labels=FORGET['labels'].masked_fill(FORGET['labels'] == FORGET['labels'].max(), TOK.vocab_size + 3))
        with pytest.raises(ConfigError, match=rf"the forget data's labels holds token id\(s\) \[{TOK.vocab_size + 3}\]"): g_effect(m, 'ga', bad, RETAIN)
        with pytest.raises(ConfigError, match=rf"^data's labels holds token id\(s\) \[{TOK.vocab_size + 3}\], but LlamaForCausalLM embeds"): qa_metrics(m, bad)
        with pytest.raises(ConfigError, match=rf'labels hold token id\(s\) \[{TOK.vocab_size + 3}\], but LlamaForCausalLM predicts'): risk_term(m, bad)
        wide = tiny_lm('llama', n_layers=1, d_model=32, vocab_size=TOK.vocab_size + 5, seed=0).double()   # reads the ids, predicts 5 more tokens
        with pytest.raises(ConfigError, match='KL needs one vocabulary'): g_effect(m, objective('ga', regularizer='kl'), FORGET, RETAIN, ref=wide)
        with pytest.raises(ConfigError, match='needs a reference model'): retain_term(m, objective('ga', regularizer='kl'), RETAIN)

def test_values_that_meant_something_else_are_typed_errors(untouched):
    "A NaN weight made every loss NaN, lr=nan made step_check's columns NaN, stop_at=nan never stopped, a NaN or missing column in retain_at went unsaid, and qa_metrics without labels raised a KeyError."
    m = lm(double=False)
    with untouched(m):
        for bad in (float('nan'), -1.0, 'one', True):
            with pytest.raises(ConfigError, match=r"weight=.*finite number >= 0"): objective('ga', regularizer='gd', weight=bad)
        assert objective('ga', regularizer='gd', weight=np.float32(0.5)).weight == 0.5 and objective('ga', regularizer='kl', weight=0).weight == 0.0
        for bad in (float('nan'), 0, float('inf')):
            with pytest.raises(ConfigError, match=r'lr=.*finite, non-zero step size'): step_check(m, 'ga', FORGET, RETAIN, lr=bad)
        for bad in (float('nan'), -1e-3, 0.0):
            with pytest.raises(ConfigError, match=r'lr=.*learning rate > 0'): unlearn(m, 'ga', FORGET, RETAIN, steps=1, lr=bad)
        with pytest.raises(ConfigError, match=r'stop_at=nan.*or None'): unlearn(m, 'ga', FORGET, RETAIN, steps=1, stop_at=float('nan'))
        with pytest.raises(ShapeError, match='data has no labels'): qa_metrics(m, {k: v for k, v in FORGET.items() if k != 'labels'})
        with pytest.raises(ShapeError, match='data is a list'): qa_metrics(m, [1, 2])
    h = pd.DataFrame(dict(forget_nll=[0.5, 1.0, 3.0], retain_nll=[0.1, 0.5, 1.5]))
    assert retain_at(h, 2.0) == pytest.approx(1.0)   # by hand: halfway from 1 to 3 nats, halfway from 0.5 to 1.5
    with pytest.raises(ConfigError, match='no column forget_nll, retain_nll'): retain_at(pd.DataFrame(), 1.0)
    with pytest.raises(ConfigError, match='forget_nll=nan'): retain_at(h, float('nan'))

def test_qa_tokenizer_and_trainer_name_what_they_were_given():
    "qa_tokenizer and train_qa_lm given the questions alone (or nothing) raised an AttributeError."
    for bad in (None, QA.questions):
        with pytest.raises(ConfigError, match=rf'qa_tokenizer got a {type(bad).__name__}.*AuthorQA'): qa_tokenizer(bad)
        with pytest.raises(ConfigError, match='author_qa'): train_qa_lm(bad, steps=1, progress=False)

# ---------------------------------------------------------------- memory: no gradient kept beyond the accumulator

def test_g_effect_holds_one_gradient_at_a_time_and_keeps_grads(monkeypatch):
    "Each parameter's gradient is used and freed before the next one is complete (never a whole model's gradient in .grad), and a .grad the user had is left as it was."
    import interpkit.papers.g_effect as ge_mod
    m = lm(seed=1)
    ps = params(m)
    want = g_effect(m, objective('npo', regularizer='gd'), FORGET, RETAIN, batch_size=2)
    live, dot, add = [], ge_mod._dot, ge_mod._add_into
    def count(f):
        def g(*a, **kw): live.append(sum(p.grad is not None for p in ps)); return f(*a, **kw)
        return g
    monkeypatch.setattr(ge_mod, '_dot', count(dot)); monkeypatch.setattr(ge_mod, '_add_into', count(add))
    mine = [torch.full_like(p, 7.0) for p in ps]
    for p, g in zip(ps, mine): p.grad = g                         # gradients the user accumulated
    got = g_effect(m, objective('npo', regularizer='gd'), FORGET, RETAIN, batch_size=2)
    assert len(live) >= 3 * len(ps) and max(live) == 1             # only the gradient in hand
    assert all(p.grad is g for p, g in zip(ps, mine)) and all(bool((g == 7).all()) for g in mine)
    for k in ('unlearning', 'retention', 'loss'): assert getattr(got, k) == pytest.approx(getattr(want, k), rel=1e-12), k
    pd.testing.assert_frame_equal(got.groups, want.groups, rtol=1e-10)

def test_chunked_dot_and_add_cover_every_element_in_float64():
    "The G-effect's dots and accumulations go `n` elements at a time (no whole-tensor copies): every element counts, and the dot sums in float64."
    from interpkit.papers.g_effect import _add_into, _dot
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(7, 3, generator=g), torch.randn(7, 3, generator=g)
    for n in (1, 2, 4, 5, 21, 2**20):
        assert abs(_dot(x, y, n=n) - float((x.double() * y.double()).sum())) < 1e-12
        a = torch.zeros(7, 3, dtype=torch.float32); _add_into(a, y.to(torch.bfloat16), n=n)
        assert torch.equal(a, y.to(torch.bfloat16).float())
    big = torch.tensor([1e8, 1., -1e8, 1.])   # float32 sums lose the ones
    assert _dot(big, torch.ones(4), n=4) == 2.0 and _dot(big, torch.ones(4), n=1) == 2.0
