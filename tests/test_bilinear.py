"""Tests of interpkit.papers.bilinear against brute-force loops, closed forms, constructed cases and by-hand forward passes."""
import copy, math, os
import pytest, torch
from torch import nn
import torch.nn.functional as F
from interpkit.papers.bilinear import (Bilinear, BilinearClassifier, interaction_matrix, bilinear_form, class_interactions, classifier_inputs,
                                       eigen, project, truncate, truncated_logits, effective_rank, topk_accuracy, eigen_attack,
                                       to_bilinear, mlp_interaction, token_interaction, token_readout, nudge_probs, train_char_lm,
                                       load_char_lm, CHAR_LM)
from interpkit.errors import ConfigError, ShapeError, NotFiniteError
from interpkit.models import tiny_lm

os.environ.setdefault('HF_HUB_OFFLINE', '1')

def state(m): return {k: v.clone() for k, v in m.state_dict().items()}
def same(a, b): return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

# ---------------------------------------------------------------- the identity x^T B_u x = u . g(x)

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_identity_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    d_in, d_out = 4, 5
    W, V, u = (torch.randn(d_out, d_in, generator=g, dtype=torch.float64), torch.randn(d_out, d_in, generator=g, dtype=torch.float64),
               torch.randn(d_out, generator=g, dtype=torch.float64))
    # B element by element with plain loops
    B_loop = torch.zeros(d_in, d_in, dtype=torch.float64)
    for i in range(d_in):
        for j in range(d_in):
            B_loop[i, j] = sum(u[k] * (W[k, i] * V[k, j] + W[k, j] * V[k, i]) / 2 for k in range(d_out))
    B = interaction_matrix(W, V, u)
    assert torch.allclose(B, B_loop, atol=1e-12)
    for _ in range(5):
        x = torch.randn(d_in, generator=g, dtype=torch.float64)
        ug = sum(u[k] * sum(W[k, i] * x[i] for i in range(d_in)) * sum(V[k, j] * x[j] for j in range(d_in)) for k in range(d_out))
        xBx = sum(x[i] * B_loop[i, j] * x[j] for i in range(d_in) for j in range(d_in))
        assert float(bilinear_form(B, x[None])[0]) == pytest.approx(float(ug), abs=1e-10)
        assert float(xBx) == pytest.approx(float(ug), abs=1e-10)

def test_identity_layer_float32():
    torch.manual_seed(0)
    layer = Bilinear(16, 32)
    U, x = torch.randn(3, 32), torch.randn(50, 16)
    with torch.no_grad(): want = layer(x) @ U.T
    got = bilinear_form(interaction_matrix(layer.w.weight, layer.v.weight, U), x)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)

@pytest.mark.parametrize('space', ['input', 'hidden'])
def test_classifier_logits_are_quadratic_forms(space):
    clf = BilinearClassifier(d_input=9, d_hidden=7, n_classes=4, seed=3).double()
    x = torch.randn(20, 9, dtype=torch.float64)
    with torch.no_grad():
        h = x @ clf.embed.weight.T
        want = ((h @ clf.layer.w.weight.T) * (h @ clf.layer.v.weight.T)) @ clf.head.weight.T
    assert torch.allclose(bilinear_form(class_interactions(clf, space), classifier_inputs(clf, x, space)), want, atol=1e-10)

# ---------------------------------------------------------------- eigendecomposition and truncation

def test_full_reconstruction_reproduces_logits():
    clf = BilinearClassifier(d_input=8, d_hidden=12, n_classes=5, seed=1)
    x = torch.randn(30, 8)
    with torch.no_grad(): logits = clf(x)
    e = eigen(class_interactions(clf))
    assert torch.allclose(truncate(e, x), logits, atol=1e-4)
    assert torch.allclose(truncated_logits(clf, x, None), logits, atol=1e-4)
    assert torch.allclose(truncated_logits(clf, x, 8), logits, atol=1e-4)

def test_truncation_error_falls_with_k_psd():
    # W = V and u > 0 make B positive semi-definite: the residual sum_{i>k} lam_i (q_i.x)^2 >= 0 shrinks with k for every input
    g = torch.Generator().manual_seed(0)
    W = torch.randn(20, 10, generator=g, dtype=torch.float64)
    B = interaction_matrix(W, W, torch.rand(20, generator=g, dtype=torch.float64) + .1)
    e = eigen(B)
    assert (e.vals > -1e-12).all()
    x = torch.randn(100, 10, generator=g, dtype=torch.float64)
    full = bilinear_form(B, x)
    errs = torch.stack([(full - truncate(e, x, k)).abs() for k in range(1, 11)])
    assert (errs.diff(dim=0) <= 1e-10).all() and errs[-1].max() < 1e-10 and errs[0].mean() > 0

def test_truncation_error_closed_form():
    # x ~ N(0, I): z_i = q_i.x are iid N(0,1), so E[(sum_{i>k} lam_i z_i^2)^2] = 2 sum lam_i^2 + (sum lam_i)^2 over i > k
    g = torch.Generator().manual_seed(1)
    A = torch.randn(6, 6, generator=g, dtype=torch.float64)
    B = (A + A.T) / 2
    e = eigen(B)
    x = torch.randn(200_000, 6, generator=g, dtype=torch.float64)
    full = bilinear_form(B, x)
    for k in (1, 3, 5):
        rest = e.vals[k:]
        want = 2 * (rest ** 2).sum() + rest.sum() ** 2
        got = ((full - truncate(e, x, k)) ** 2).mean()
        assert float(got) == pytest.approx(float(want), rel=0.03)

def test_eigen_sorted_orthonormal_and_top():
    A = torch.randn(3, 5, 5, dtype=torch.float64)
    B = A + A.mT
    e = eigen(B)
    assert torch.allclose(e.vecs @ e.vecs.mT, torch.eye(5, dtype=torch.float64).expand(3, 5, 5), atol=1e-10)
    assert torch.allclose(torch.einsum('cki,ck,ckj->cij', e.vecs, e.vals, e.vecs), B, atol=1e-10)
    assert (e.vals.abs().diff(dim=-1) <= 0).all()
    ref = torch.linalg.eigvalsh(B)
    assert torch.allclose(e.top(2, 'pos').vals, ref.flip(-1)[:, :2])
    assert torch.allclose(e.top(2, 'neg').vals, ref[:, :2])
    q = e.top(1, 'neg').vecs[:, 0]
    assert torch.allclose(torch.einsum('ci,cij->cj', q, B), ref[:, :1] * q, atol=1e-10)   # really an eigenvector

def test_project():
    E = torch.randn(7, 3)     # nn.Linear(3, 7).weight layout: hidden x input
    v = torch.randn(2, 7)
    assert torch.allclose(project(v, E), torch.stack([sum(v[r, h] * E[h] for h in range(7)) for r in range(2)]), atol=1e-5)
    emb = nn.Embedding(11, 7)
    assert torch.allclose(project(v[0], emb), emb.weight.detach() @ v[0], atol=1e-5)
    with pytest.raises(ShapeError, match='embedding maps'): project(torch.randn(2, 5), E)

# ---------------------------------------------------------------- effective rank and accuracy

def test_effective_rank_closed_forms():
    for n in (1, 2, 5, 64): assert float(effective_rank(torch.ones(n))) == pytest.approx(n)
    assert float(effective_rank(torch.tensor([1., -1., 0., 0.]))) == pytest.approx(2)          # signs and zeros
    assert float(effective_rank(torch.tensor([2., 1., 1.]))) == pytest.approx(2 ** 1.5)        # exp(1.5 ln 2)
    assert float(effective_rank(torch.tensor([5., 1e-12]))) == pytest.approx(1, abs=1e-6)
    assert torch.allclose(effective_rank(torch.tensor([[1., 1.], [1., 0.]])), torch.tensor([2., 1.]))
    with pytest.raises(NotFiniteError, match='all zeros'): effective_rank(torch.zeros(2, 3))

def test_topk_accuracy_and_model_unchanged():
    clf = BilinearClassifier(d_input=6, d_hidden=8, n_classes=3, seed=2).train()
    x = torch.randn(40, 6)
    with torch.no_grad(): y = clf(x).argmax(-1)
    before = state(clf)
    df = topk_accuracy(clf, x, y, [1, 6])
    assert list(df.k) == [1, 6] and df.accuracy.iloc[-1] == 1.0
    eigen_attack(clf, x, 1.0)
    assert same(before, state(clf)) and clf.training

def test_digits_train_quick():
    from interpkit.data import digits
    from interpkit.train import fit
    x_tr, y_tr, x_te, y_te = digits()
    clf = BilinearClassifier()
    fit(clf, [(x_tr, y_tr)], lambda m, b: F.cross_entropy(m(b[0]), b[1]), steps=150, lr=1e-2, weight_decay=0.5, progress=False)
    with torch.no_grad(): acc = (clf(x_te).argmax(-1) == y_te).float().mean().item()
    assert acc > 0.9

# ---------------------------------------------------------------- adversarial directions on constructed cases

def toy(head):
    m = BilinearClassifier(d_input=2, d_hidden=2, n_classes=len(head))
    with torch.no_grad():
        for p in (m.embed.weight, m.layer.w.weight, m.layer.v.weight): p.copy_(torch.eye(2))
        m.head.weight.copy_(torch.tensor(head))
    return m

def test_attack_away_constructed():
    m = toy([[1., -1.], [0., 0.]])     # logit0 = x1^2 - x2^2, logit1 = 0; at (1, .5) class 0 wins by .75
    x = torch.tensor([[1., .5]])
    # the most negative eigenvector of diag(1, -1) is e2, moved with the sign of x2: flips when (.5 + eps)^2 > 1
    assert eigen_attack(m, x, .49).flip_eigen == 0.
    r = eigen_attack(m, x, .51)
    assert r.flip_eigen == 1. and torch.allclose(r.x_adv, torch.tensor([[1., 1.01]])) and r.pred_adv.item() == 1
    x2 = torch.tensor([[1., -.5]])     # the sign follows the input: x2 is pushed further negative
    assert torch.allclose(eigen_attack(m, x2, .6).x_adv, torch.tensor([[1., -1.1]]))

def test_attack_towards_target_constructed():
    m = toy([[1., -1.], [0., .5], [0., 0.]])   # logit1 = .5 x2^2: target 1 flips when 1.5 (.5 + eps)^2 > 1
    x = torch.tensor([[1., .5]])
    thr = math.sqrt(2 / 3) - .5
    assert eigen_attack(m, x, thr - .01, target=1).flip_eigen == 0.
    r = eigen_attack(m, x, thr + .01, target=1)
    assert r.flip_eigen == 1. and r.pred_adv.item() == 1

def test_random_directions_have_norm_eps():
    clf = BilinearClassifier(d_input=6, d_hidden=8, n_classes=3)
    x = torch.randn(25, 6)
    r = eigen_attack(clf, x, 0.7, k=2)
    assert torch.allclose((r.x_adv - x).norm(dim=-1), torch.full((25,), 0.7), atol=1e-5)
    assert 0 <= r.flip_random <= 1

def test_nudge_probs():
    m = toy([[1., -1.], [0., 0.]])
    p = nudge_probs(m, torch.tensor([1., .5]), torch.tensor([0., 5.]), .6)     # direction normalised
    with torch.no_grad(): want = m(torch.tensor([[1., 1.1]])).softmax(-1)[0]
    assert torch.allclose(p, want)

# ---------------------------------------------------------------- the bilinear Llama MLP

def test_to_bilinear_copies_and_matches_by_hand():
    lm = tiny_lm('llama', n_layers=2, d_model=16, n_heads=2, vocab_size=30)
    before, act = state(lm), type(lm.model.layers[0].mlp.act_fn)
    blm = to_bilinear(lm)
    assert same(before, state(lm)) and all(type(l.mlp.act_fn) is act for l in lm.model.layers) and lm.config.hidden_act == 'silu'
    assert blm.config.hidden_act == 'linear' and blm is not lm
    z = torch.randn(3, 4, 16)
    for l in range(2):
        mlp = blm.model.layers[l].mlp
        G, Uw, D = mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach(), mlp.down_proj.weight.detach()
        by_hand = torch.zeros(3, 4, 16)
        for k in range(G.shape[0]): by_hand += ((z @ G[k]) * (z @ Uw[k]))[..., None] * D[:, k]
        with torch.no_grad(): assert torch.allclose(mlp(z), by_hand, atol=1e-5)
    # a model rebuilt from the copy's config is bilinear too
    import transformers
    rebuilt = transformers.AutoModelForCausalLM.from_config(blm.config)
    assert type(rebuilt.model.layers[0].mlp.act_fn).__name__ == 'LinearActivation'

def test_mlp_interaction_through_norm_and_down_proj():
    blm = to_bilinear(tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, vocab_size=30, seed=4))
    blk = blm.model.layers[0]
    with torch.no_grad(): blk.post_attention_layernorm.weight.uniform_(.5, 1.5); blm.model.norm.weight.uniform_(.5, 1.5)
    r = torch.randn(6, 16) * 3                                   # residual stream entering the MLP's norm
    z = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + blm.config.rms_norm_eps)
    u = torch.randn(16)
    with torch.no_grad(): want = blk.mlp(blk.post_attention_layernorm(r)) @ u
    assert torch.allclose(bilinear_form(mlp_interaction(blm, u), z), want, atol=1e-4, rtol=1e-4)
    t = 7
    u_t = blm.lm_head.weight[t].detach() * blm.model.norm.weight.detach()
    assert torch.allclose(token_interaction(blm, t), mlp_interaction(blm, u_t, 0))

def test_token_readout_brute_force():
    blm = to_bilinear(tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, vocab_size=30, seed=5))
    v = torch.randn(16)
    E = blm.model.embed_tokens.weight.detach()
    scores = torch.tensor([float(E[t] / E[t].pow(2).mean().add(blm.config.rms_norm_eps).sqrt() @ v) for t in range(30)])
    df = token_readout(blm, v, n=5)
    assert list(df.id) == scores.abs().argsort(descending=True)[:5].tolist()
    assert torch.allclose(torch.tensor(df.score.tolist()), scores[df.id.tolist()], atol=1e-5)
    df = token_readout(blm, v, n=3, tokens=[1, 2, 3, 4])
    assert set(df.id) <= {1, 2, 3, 4}

def test_train_char_lm_short_and_deterministic():
    m1, r1 = train_char_lm(steps=30, n_tokens=20_000, batch=8)
    m2, _ = train_char_lm(steps=30, n_tokens=20_000, batch=8)
    assert same(state(m1), state(m2))
    h = r1.history['loss']
    assert h.iloc[-5:].mean() < h.iloc[:5].mean() - 0.3
    assert isinstance(m1.model.layers[0].mlp.act_fn, nn.Identity) and not m1.training

def test_shipped_char_lm():
    lm, meta = load_char_lm()
    assert meta['tiny_lm'] == CHAR_LM and meta['steps'] == 1000
    assert isinstance(lm.model.layers[0].mlp.act_fn, nn.Identity)
    e = eigen(token_interaction(lm, ord('\n')))
    assert e.vals.shape == (64,)

# ---------------------------------------------------------------- bad input

def test_bad_input():
    layer = Bilinear(4, 6)
    with pytest.raises(ShapeError, match=r'u has shape \(5,\)'): interaction_matrix(layer.w.weight, layer.v.weight, torch.randn(5))
    with pytest.raises(ShapeError, match='equal'): interaction_matrix(torch.randn(6, 4), torch.randn(6, 3), torch.randn(6))
    with pytest.raises(ShapeError, match='x must be'): bilinear_form(torch.eye(4), torch.randn(3, 5))
    with pytest.raises(ConfigError, match='BilinearClassifier'): class_interactions(nn.Linear(3, 3))
    clf = BilinearClassifier(d_input=6, d_hidden=5, n_classes=3)
    with pytest.raises(ConfigError, match="'input', 'hidden'"): class_interactions(clf, 'pixel')
    with pytest.raises(ConfigError, match='not symmetric'): eigen(torch.tensor([[1., 2.], [0., 1.]]))
    with pytest.raises(ShapeError, match='square'): eigen(torch.randn(3, 4))
    e = eigen(class_interactions(clf))
    with pytest.raises(ConfigError, match='k=7 is out of range'): e.top(7)
    with pytest.raises(ConfigError, match='sign'): e.top(1, 'up')
    with pytest.raises(ShapeError, match=r'Valid: \(n, 6\)'): truncate(e, torch.randn(2, 5))
    with pytest.raises(ConfigError, match='target=3'): eigen_attack(clf, torch.randn(2, 6), 1., target=3)
    with pytest.raises(ConfigError, match='negative'): eigen_attack(clf, torch.randn(2, 6), -1.)
    with pytest.raises(ShapeError, match='same number'): nudge_probs(clf, torch.randn(6), torch.randn(5), 1.)
    with pytest.raises(ConfigError, match='no gated MLP'): to_bilinear(tiny_lm('gpt2'))
    lm = tiny_lm('llama', n_layers=1, d_model=16, n_heads=2)
    with pytest.raises(ConfigError, match='activation is SiLU'): mlp_interaction(lm, torch.randn(16))
    blm = to_bilinear(lm)
    with pytest.raises(ShapeError, match='residual-stream direction'): mlp_interaction(blm, torch.randn(15))
    with pytest.raises(ConfigError, match='layer=3'): mlp_interaction(blm, torch.randn(16), layer=3)
    with pytest.raises(ConfigError, match='token=500'): token_interaction(blm, 500)
