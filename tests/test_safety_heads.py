"Tests of interpkit.papers.safety_heads (paper 7): Ships, Sahara, the adapter, the judge."
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import numpy as np, pytest, torch
import torch.nn.functional as F
from scipy.linalg import subspace_angles
from interpkit.errors import ConfigError, ShapeError, SiteError
from interpkit.hooks import ablate_heads
from interpkit.models import tiny_lm
from interpkit.papers.safety_heads import (REFUSAL_KEYWORDS, head_map, is_refusal, refusal_rate, requests, kl_div, next_token_logits,
                                           ships, subspace_angle, sahara, merge_adapter, align, lm_loss, head_effect, generate, HARMFUL_TASKS, HARMLESS_TASKS)

@pytest.fixture(scope='module')
def tiny(): return tiny_lm('llama', n_layers=2, n_heads=4, seed=0)

@pytest.fixture(scope='module')
def enc():
    ids = torch.randint(0, 128, (4, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    return dict(input_ids=ids, attention_mask=mask)

def _positions(mask): return (mask.cumsum(-1) - 1).clamp(min=0)

def test_ships_zero_at_eps_one_and_grows_as_eps_shrinks(tiny, enc):
    for last_only in (True, False):
        torch.testing.assert_close(ships(tiny, enc, eps=1., last_only=last_only), torch.zeros(2, 4, dtype=torch.float64), atol=1e-9, rtol=0)
    tot = [ships(tiny, enc, eps=e, last_only=False) for e in (0.9, 0.5, 0.1, 1e-4)]
    sums = [t.sum().item() for t in tot]
    assert 0 < sums[0] < sums[1] < sums[2] < sums[3], sums
    assert (tot[-1] > tot[0]).float().mean() >= 0.75  # most heads individually too

def test_ships_is_the_kl_of_a_brute_force_ablated_forward(tiny, enc):
    "Every Ships score equals KL(base || ablated) computed by a plain forward pass under `ablate_heads`."
    pos = _positions(enc['attention_mask'])
    with torch.no_grad():
        base = tiny(**enc, position_ids=pos).logits[:, -1].double()
        for last_only, positions in ((False, None), (True, [-1])):
            s = ships(tiny, enc, last_only=last_only, reduce=False)
            for l, h in [(0, 1), (1, 3)]:
                with ablate_heads(tiny, {l: [h]}, 'scale_query', eps=1e-4, positions=positions):
                    abl = tiny(**enc, position_ids=pos).logits[:, -1].double()
                ref = F.kl_div(F.log_softmax(abl, -1), F.log_softmax(base, -1), log_target=True, reduction='none').sum(-1)
                torch.testing.assert_close(s[:, l, h], ref, atol=1e-6, rtol=1e-4)

def test_mean_ablation_ships(tiny, enc):
    "how='mean' scores equal the KL of a plain forward with the head's output set to its mean by `ablate_heads`."
    from interpkit.hooks import head_means
    means = head_means(tiny, enc)
    s = ships(tiny, enc, how='mean', means=means, last_only=False)
    assert torch.isfinite(s).all() and (s > 0).all()
    pos = _positions(enc['attention_mask'])
    with torch.no_grad():
        base = tiny(**enc, position_ids=pos).logits[:, -1]
        with ablate_heads(tiny, {1: [0]}, 'mean', means=means): abl = tiny(**enc, position_ids=pos).logits[:, -1]
    ref = (base.softmax(-1) * (base.log_softmax(-1) - abl.log_softmax(-1))).sum(-1).mean().double()
    assert s[1, 0].item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-6)  # float32 log-softmax of two paths: ~1e-7 per term
    with pytest.raises(ConfigError): ships(tiny, enc, how='mean')

def test_query_scaling_changes_only_that_heads_pattern(tiny, enc):
    "Scaling head (1, 2)'s query changes head 2's attention in layer 1 and nothing upstream or beside it; ε = 0 makes it uniform."
    ids = enc['input_ids'][:1]
    with torch.no_grad():
        base = tiny(input_ids=ids, output_attentions=True).attentions
        for eps in (0.3, 0.):
            with ablate_heads(tiny, head_map([(1, 2)]), 'scale_query', eps=eps):
                abl = tiny(input_ids=ids, output_attentions=True).attentions
            torch.testing.assert_close(abl[0], base[0], atol=0, rtol=0)  # layer 0: untouched
            for h in (0, 1, 3): torch.testing.assert_close(abl[1][:, h], base[1][:, h], atol=1e-6, rtol=0)
            assert (abl[1][:, 2] - base[1][:, 2]).abs().max() > 1e-3
        T = ids.shape[1]
        uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
        torch.testing.assert_close(abl[1][0, 2], uniform, atol=1e-6, rtol=0)

def _snapshot(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, {m: m.training for m in model.modules()})

def _transformers_own(f):
    "transformers' lazily installed hooks that collect hidden states and attentions (not ours)."
    return 'output_capturing_hook' in getattr(f, '__qualname__', '')

def _assert_same(model, snap):
    sd, flags = snap
    for k, v in model.state_dict().items(): assert torch.equal(v, sd[k]), k
    for m in model.modules():
        assert m.training == flags[m]
        assert not [f for f in [*m._forward_hooks.values(), *m._forward_pre_hooks.values()] if not _transformers_own(f)], type(m).__name__

def test_model_left_as_it_was(tiny, enc):
    tiny.train()  # a non-default mode that must survive
    try:
        snap = _snapshot(tiny)
        ships(tiny, enc); ships(tiny, enc, last_only=False)
        sahara(tiny, enc, budget=2)
        next_token_logits(tiny, enc, [(0, 0)])
        _assert_same(tiny, snap)
        with pytest.raises(SiteError): ships(tiny, enc, heads=[(0, 0), (7, 0)])  # fails after one head has run
        with pytest.raises(ConfigError): sahara(tiny, enc, budget=2, candidates=[(0, 0), (0, 9)])
        _assert_same(tiny, snap)
    finally: tiny.eval()

def test_subspace_angle_matches_scipy():
    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(10, 6, generator=g), torch.randn(10, 6, generator=g)
    U = lambda M, r: np.linalg.svd(M.double().numpy(), full_matrices=False)[0][:, :r]
    for r in (1, 3):
        assert subspace_angle(A, B, r) == pytest.approx(np.rad2deg(subspace_angles(U(A, r), U(B, r)).max()), abs=1e-6)
    assert subspace_angle(A, 2 * A) == pytest.approx(0, abs=1e-4)
    with pytest.raises(ShapeError): subspace_angle(A, B[:5])
    with pytest.raises(ConfigError): subspace_angle(A, B, 0)

def test_sahara_greedy_against_brute_force(tiny, enc):
    "Sahara's picks are the greedy argmax of the subspace angle, recomputed by plain forwards under `ablate_heads`."
    pos = _positions(enc['attention_mask'])
    def hidden(hs):
        with torch.no_grad(), ablate_heads(tiny, head_map(hs), 'scale_query', eps=1e-4, positions=[-1]) if hs else torch.no_grad():
            return tiny(**enc, position_ids=pos, output_hidden_states=True).hidden_states[-1][:, -1]
    h0 = hidden([])
    res = sahara(tiny, enc, budget=2)
    chosen = []
    heads = [(l, h) for l in range(2) for h in range(4)]
    for step in range(2):
        sc = {c: subspace_angle(h0, hidden(chosen + [c])) for c in heads if c not in chosen}
        best = max(sc, key=sc.get)
        assert res.heads[step] == best
        assert res.angles[step] == pytest.approx(sc[best], abs=1e-4)
        chosen.append(best)

def test_judge_and_requests():
    assert is_refusal("I’m sorry, but I can’t help with that.") and is_refusal('As an AI, I cannot do this')
    assert not is_refusal('Sure! First, preheat the oven.') and not is_refusal('Here is a guide to tying a tie:')
    assert refusal_rate(['I cannot do that.', 'Sure.', 'Okay', "I won't"]) == 0.5
    assert not set(HARMFUL_TASKS['train']) & set(HARMFUL_TASKS['test']) and not set(HARMLESS_TASKS['train']) & set(HARMLESS_TASKS['test'])
    assert len(requests('harmless', 'test')) == len(HARMLESS_TASKS['test']) * 2
    assert head_map([(3, 1), (1, 0), (3, 0)]) == {1: [0], 3: [0, 1]}
    with pytest.raises(ConfigError): head_map([3])

def test_kl_div_reference():
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(5, 11, generator=g), torch.randn(5, 11, generator=g)
    ref = (p.softmax(-1) * (p.log_softmax(-1) - q.log_softmax(-1))).sum(-1).double()
    torch.testing.assert_close(kl_div(p, q), ref, atol=1e-6, rtol=1e-5)
    with pytest.raises(ShapeError): kl_div(p, q[:, :3])

def test_short_align_and_merge_matches_peft():
    "A two-step run of the training recipe on a tiny model; merging its adapter by hand gives peft's own forward."
    peft = pytest.importorskip('peft')
    from interpkit.models import load_lm
    _, tok = load_lm()
    tiny = tiny_lm('llama', n_layers=2, d_model=32, n_heads=4, vocab_size=len(tok), seed=0, max_len=128)
    snap = _snapshot(tiny)
    tensors, hist, info = align(tiny, tok, steps=2, rank=2, lr=1e-2, batch_size=4, answer_tokens=3,
                                harmful=requests('harmful')[:4], harmless=requests('harmless')[:4])
    _assert_same(tiny, snap)
    assert len(hist) == 2 and np.isfinite(hist['loss']).all()
    assert len(tensors) == 2 * 4 * 2  # A and B, four projections, two layers
    assert any(v.abs().sum() > 0 for k, v in tensors.items() if k.endswith('lora_B'))  # B moved off its zero init
    merged = merge_adapter(tiny, tensors, info['scaling'])
    pm = peft.get_peft_model(tiny_lm('llama', n_layers=2, d_model=32, n_heads=4, vocab_size=len(tok), seed=0, max_len=128),
                             peft.LoraConfig(r=2, lora_alpha=info['alpha'], target_modules=info['targets'], lora_dropout=0.0))
    for name, mod in pm.named_modules():
        if isinstance(mod, peft.tuners.lora.LoraLayer):
            p = name.removeprefix('base_model.model.')
            with torch.no_grad():
                mod.lora_A['default'].weight.copy_(tensors[f'{p}.lora_A']); mod.lora_B['default'].weight.copy_(tensors[f'{p}.lora_B'])
    ids = torch.randint(0, len(tok), (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(): torch.testing.assert_close(merged(input_ids=ids).logits, pm.eval()(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    _assert_same(tiny, snap)  # merge_adapter works on a copy
    # head_effect: eps = 1 is no ablation, so both replies agree; a zeroed head changes the reply's distribution
    e = head_effect(merged, tok, 'How can I bake bread?', 1, 2, max_new_tokens=4, eps=1.)
    assert e['base'] == e['ablated'] and e['base_refuses'] == is_refusal(e['base'])
    assert len(generate(merged, tok, ['Hi', 'How can I bake bread?'], 3)) == 2
