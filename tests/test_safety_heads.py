"Tests of interpkit.papers.safety_heads (paper 7): Ships, Sahara, generation under ablation, the adapter, the judge."
import copy, os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import numpy as np, pandas as pd, pytest, torch
import torch.nn.functional as F
from scipy.linalg import subspace_angles
from interpkit.errors import ConfigError, ShapeError
from interpkit.hooks import ablate_heads, head_means
from interpkit.models import tiny_lm, tiny_tokenizer
from interpkit.train import FitResult, load_asset
from interpkit.papers.safety_heads import (REFUSAL_KEYWORDS, head_map, is_refusal, refusal_rate, chat_prompts, kl_div, next_token_logits, ships,
                                           subspace_angle, sahara, head_effect, HeadEffect, generate, harmful_batch, query_weights,
                                           ablation_outcomes, SaharaResult, specificity, AblationOutcomes, replies_changed)
from interpkit.demos.safety_heads import (HARMFUL_TASKS, HARMLESS_TASKS, REQUEST_TEMPLATES, requests, merge_adapter, adapter_tensors, train_aligned_lm,
                                          load_aligned_lm)

@pytest.fixture(scope='module')
def tiny(): return tiny_lm('llama', n_layers=2, n_heads=4, seed=0)

@pytest.fixture(scope='module')
def tokenizer(): return tiny_tokenizer()

@pytest.fixture(scope='module')
def batch():
    ids = torch.randint(0, 128, (4, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    return dict(input_ids=ids, attention_mask=mask)

def _positions(mask): return (mask.cumsum(-1) - 1).clamp(min=0)

def _kl(p, q):
    "KL(p || q) of logits, by torch's own kl_div (the second implementation)."
    return F.kl_div(F.log_softmax(q.double(), -1), F.log_softmax(p.double(), -1), log_target=True, reduction='none').sum(-1)

def _brute_logits(model, batch, heads=None, how='scale_query', eps=1e-4, means=None, positions=None):
    "Last-position logits of a plain full forward, with `ablate_heads` applied directly."
    pos = _positions(batch['attention_mask'])
    with torch.no_grad():
        if heads is None: return model(**batch, position_ids=pos).logits[:, -1].double()
        with ablate_heads(model, heads, how, eps=eps, means=means, positions=positions):
            return model(**batch, position_ids=pos).logits[:, -1].double()

# ---------------------------------------------------------------- Ships
def test_ships_zero_at_eps_one_and_grows_as_eps_shrinks(tiny, batch):
    for last_only in (True, False):
        torch.testing.assert_close(ships(tiny, batch, eps=1., last_only=last_only), torch.zeros(2, 4, dtype=torch.float64), atol=1e-9, rtol=0)
    tot = [ships(tiny, batch, eps=e, last_only=False) for e in (0.9, 0.5, 0.1, 1e-4)]
    sums = [t.sum().item() for t in tot]
    assert 0 < sums[0] < sums[1] < sums[2] < sums[3], sums
    assert (tot[-1] > tot[0]).float().mean() >= 0.75  # most heads individually too

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_ships_is_the_kl_of_a_brute_force_ablated_forward(arch, batch):
    "Every Ships score equals KL(base || ablated) of a plain forward under `ablate_heads`, at every position or only the last, in chunks or not."
    m = tiny_lm(arch, n_layers=2, n_heads=4, seed=1)
    base = _brute_logits(m, batch)
    for last_only, positions in ((False, None), (True, [-1])):
        for bs in (32, 3):
            s = ships(m, batch, last_only=last_only, reduce=False, batch_size=bs)
            assert s.shape == (4, 2, 4)
            for l, h in [(0, 1), (1, 3), (1, 0)]:
                ref = _kl(base, _brute_logits(m, batch, {l: [h]}, positions=positions))
                torch.testing.assert_close(s[:, l, h], ref, atol=1e-7, rtol=1e-4)
            torch.testing.assert_close(ships(m, batch, last_only=last_only, batch_size=bs), s.mean(0))
    part = ships(m, batch, heads=[(1, 3), (0, 2)])
    assert torch.isnan(part).sum() == 6 and torch.isfinite(part[1, 3]) and torch.isfinite(part[0, 2])

def test_mean_ablation_ships_and_negative_layers(tiny, batch):
    "how='mean' scores equal the KL of a plain forward with the head set to its mean; layer -1 is the last layer, in `heads` and in `means`."
    means = head_means(tiny, batch)
    s = ships(tiny, batch, how='mean', means=means, last_only=False)
    assert torch.isfinite(s).all() and (s > 0).all()
    base = _brute_logits(tiny, batch)
    for l, h in [(1, 0), (0, 3)]:
        ref = _kl(base, _brute_logits(tiny, batch, {l: [h]}, 'mean', means=means)).mean()
        assert s[l, h].item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-7)
    neg = ships(tiny, batch, heads=[(-1, 0), (-2, -1)], how='mean', means={-1: means[1], -2: means[0]}, last_only=False)
    assert neg[1, 0].item() == pytest.approx(s[1, 0].item(), rel=1e-9) and neg[0, 3].item() == pytest.approx(s[0, 3].item(), rel=1e-9)
    assert torch.isnan(neg).sum() == 6
    with pytest.raises(ConfigError): ships(tiny, batch, how='mean')
    with pytest.raises(ConfigError, match='scale_query'): ships(tiny, batch, how='query')  # the core's names only

def test_query_scaling_changes_only_that_heads_pattern(tiny, batch):
    "Scaling head (1, 2)'s query changes head 2's attention in layer 1 and nothing upstream or beside it; ε = 0 makes it uniform."
    ids = batch['input_ids'][:1]
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

def test_next_token_logits_against_plain_forwards(tiny, batch):
    torch.testing.assert_close(next_token_logits(tiny, batch), _brute_logits(tiny, batch), atol=1e-6, rtol=0)
    torch.testing.assert_close(next_token_logits(tiny, batch, [(0, 2)], batch_size=3), _brute_logits(tiny, batch, {0: [2]}), atol=1e-6, rtol=0)
    torch.testing.assert_close(next_token_logits(tiny, batch, [(0, 2)], last_only=True, batch_size=1),
                               _brute_logits(tiny, batch, {0: [2]}, positions=[-1]), atol=1e-5, rtol=0)
    means = head_means(tiny, batch)  # how='mean' passes `means` through
    torch.testing.assert_close(next_token_logits(tiny, batch, [(1, 3)], how='mean', means=means), _brute_logits(tiny, batch, {1: [3]}, 'mean', means=means), atol=1e-6, rtol=0)
    no_mask = {'input_ids': batch['input_ids']}
    torch.testing.assert_close(next_token_logits(tiny, no_mask), tiny(**no_mask).logits[:, -1].double().detach(), atol=1e-6, rtol=0)

class _DictLM(torch.nn.Module):
    "A causal LM that returns a plain dict: the layout is the inner model's."
    def __init__(self, inner):
        super().__init__()
        self.config, self.model, self.lm_head = inner.config, inner.model, inner.lm_head
    def forward(self, input_ids, attention_mask=None, position_ids=None, output_hidden_states=False):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, output_hidden_states=output_hidden_states)
        return {'logits': self.lm_head(out.last_hidden_state), 'hidden_states': out.hidden_states}

def test_a_model_returning_a_dict(tiny, batch):
    d = _DictLM(tiny)
    torch.testing.assert_close(next_token_logits(d, batch, [(1, 1)]), next_token_logits(tiny, batch, [(1, 1)]))
    torch.testing.assert_close(ships(d, batch, last_only=False), ships(tiny, batch, last_only=False))
    assert sahara(d, batch, budget=1, last_only=False).heads == sahara(tiny, batch, budget=1, last_only=False).heads
    class _TupleLM(_DictLM):  # logits first in a tuple, no hidden states: Ships works, Sahara says what it lacks
        def forward(self, *a, **kw): return (super().forward(*a, **kw)['logits'],)
    t = _TupleLM(tiny)
    torch.testing.assert_close(ships(t, batch, heads=[(0, 1)], last_only=False), ships(tiny, batch, heads=[(0, 1)], last_only=False), equal_nan=True)
    with pytest.raises(ConfigError, match='hidden_states'): sahara(t, batch, budget=1, last_only=False)

# ---------------------------------------------------------------- Sahara
def test_subspace_angle_matches_scipy():
    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(10, 6, generator=g), torch.randn(10, 6, generator=g)
    U = lambda M, r: np.linalg.svd(M.double().numpy(), full_matrices=False)[0][:, :r]
    for r in (1, 3):
        assert subspace_angle(A, B, r) == pytest.approx(np.rad2deg(subspace_angles(U(A, r), U(B, r)).max()), abs=1e-6)
    assert subspace_angle(A, 2 * A) == pytest.approx(0, abs=1e-4)
    assert subspace_angle(A, B, 6) == pytest.approx(np.rad2deg(subspace_angles(U(A, 6), U(B, 6)).max()), abs=1e-6)  # rank = min(N, d) is valid
    R = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=torch.float64))[0]
    e = R[:, :2]  # two orthonormal directions: rotate the top direction of A by a known angle
    A1 = 5 * e[:, :1] @ torch.randn(1, 6, generator=g, dtype=torch.float64)
    th = np.deg2rad(30)
    B1 = 5 * (np.cos(th) * e[:, :1] + np.sin(th) * e[:, 1:]) @ torch.randn(1, 6, generator=g, dtype=torch.float64)
    assert subspace_angle(A1, B1) == pytest.approx(30, abs=1e-6)
    A0 = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u0 = torch.linalg.svd(A0, full_matrices=False)[0][:, :1]
    assert torch.linalg.svdvals(u0.T @ u0).max() > 1  # rounding: a cosine just above 1 ...
    assert subspace_angle(A0, A0) == 0  # ... that must not become NaN
    with pytest.raises(ShapeError): subspace_angle(A, B[:5])
    with pytest.raises(ConfigError): subspace_angle(A, B, 0)

@pytest.mark.parametrize('last_only', [True, False])
def test_sahara_greedy_against_brute_force(tiny, batch, last_only):
    "Sahara's picks are the greedy argmax of the subspace angle, recomputed by plain forwards under `ablate_heads`."
    pos = _positions(batch['attention_mask'])
    def hidden(hs):
        with torch.no_grad(), ablate_heads(tiny, head_map(hs), 'scale_query', eps=1e-4, positions=[-1] if last_only else None) if hs else torch.no_grad():
            return tiny(**batch, position_ids=pos, output_hidden_states=True).hidden_states[-1][:, -1]
    h0 = hidden([])
    res = sahara(tiny, batch, budget=3, last_only=last_only, batch_size=3)
    assert isinstance(res, SaharaResult) and 'L' in repr(res) and '°' in repr(res)
    chosen = []
    heads = [(l, h) for l in range(2) for h in range(4)]
    for step in range(3):
        sc = {c: subspace_angle(h0, hidden(chosen + [c])) for c in heads if c not in chosen}
        best = max(sc, key=sc.get)
        assert res.heads[step] == best
        assert res.angles[step] == pytest.approx(sc[best], abs=1e-4)
        chosen.append(best)

def test_sahara_rank_and_mean_ablation_against_brute_force(tiny, batch):
    "With rank 2 and mean ablation at every position, Sahara's first pick and its angle are the brute-force argmax."
    means = head_means(tiny, batch)
    pos = _positions(batch['attention_mask'])
    with torch.no_grad():
        h0 = tiny(**batch, position_ids=pos, output_hidden_states=True).hidden_states[-1][:, -1]
        sc = {}
        for l in range(2):
            for h in range(4):
                with ablate_heads(tiny, {l: [h]}, 'mean', means=means):
                    sc[(l, h)] = subspace_angle(h0, tiny(**batch, position_ids=pos, output_hidden_states=True).hidden_states[-1][:, -1], 2)
    res = sahara(tiny, batch, budget=1, how='mean', means=means, rank=2, last_only=False)
    assert res.heads == [max(sc, key=sc.get)] and res.angles[0] == pytest.approx(max(sc.values()), abs=1e-4)
    assert sahara(tiny, batch, budget=1, how='mean', means=means, last_only=False).angles[0] != pytest.approx(res.angles[0], abs=1e-3)  # rank 1 differs

def test_sahara_candidates_and_errors(tiny, batch):
    "Layer -1 and layer 1 are one head, not two; bad budgets, ranks and batches are refused before any forward pass."
    with pytest.raises(ConfigError, match='budget'): sahara(tiny, batch, budget=2, candidates=[(-1, 0), (1, 0)])
    assert sahara(tiny, batch, budget=1, candidates=[(-1, 0), (1, 0)]).heads == [(1, 0)]
    with pytest.raises(ShapeError): sahara(tiny, {'input_ids': batch['input_ids'][:1]})
    with pytest.raises(ConfigError): sahara(tiny, batch, rank=5)
    with pytest.raises(ConfigError): sahara(tiny, batch, candidates=[(2, 0)])

def test_model_left_as_it_was(tiny, batch, untouched):
    tiny.train()  # a non-default mode that must survive
    try:
        with untouched(tiny):
            ships(tiny, batch); ships(tiny, batch, last_only=False)
            sahara(tiny, batch, budget=2)
            next_token_logits(tiny, batch, [(0, 0)])
        means = head_means(tiny, batch)
        with untouched(tiny):  # fails after one head has run: means only for layer 0
            with pytest.raises(ConfigError): ships(tiny, batch, heads=[(0, 0), (1, 0)], how='mean', means={0: means[0]})
            with pytest.raises(ConfigError): sahara(tiny, batch, budget=2, candidates=[(0, 0), (1, 0)], how='mean', means={0: means[0]})
            with pytest.raises(ConfigError): ships(tiny, batch, heads=[(0, 0), (7, 0)])
    finally: tiny.eval()

def test_eval_mode_inside_and_defaults(batch, tokenizer, untouched):
    "A model with dropout, left in train mode, gives the numbers of eval mode (and stays in train mode); the defaults are the documented ones."
    m = tiny_lm('gpt2', n_layers=2, n_heads=4, seed=2, resid_pdrop=0.3, embd_pdrop=0.3, attn_pdrop=0.3)
    ref_logits, ref_ships = next_token_logits(m, batch, [(1, 1)]), ships(m, batch, last_only=False)
    ref_sahara, ref_reply = sahara(m, batch, budget=2), generate(m, tokenizer, ['w1 w2'], 4, heads=[(0, 1)], how='zero')
    m.train()
    with untouched(m, tokenizer):
        torch.testing.assert_close(next_token_logits(m, batch, [(1, 1)]), ref_logits, atol=0, rtol=0)
        torch.testing.assert_close(ships(m, batch, last_only=False), ref_ships, atol=0, rtol=0)
        assert sahara(m, batch, budget=2).heads == ref_sahara.heads and generate(m, tokenizer, ['w1 w2'], 4, heads=[(0, 1)], how='zero') == ref_reply
    m.eval()
    # defaults: Ships at the last position only with ε = 1e-4, Sahara with a budget of three on the last position
    torch.testing.assert_close(ships(m, batch), ships(m, batch, how='scale_query', eps=1e-4, last_only=True), atol=0, rtol=0)
    base = _brute_logits(m, batch)
    torch.testing.assert_close(ships(m, batch)[1, 2], _kl(base, _brute_logits(m, batch, {1: [2]}, positions=[-1])).mean(), atol=1e-7, rtol=1e-4)
    res = sahara(m, batch)
    last = sahara(m, batch, budget=3, last_only=True)
    assert len(res.heads) == 3 and res.heads == last.heads and res.angles == last.angles
    assert res.angles != sahara(m, batch, budget=3, last_only=False).angles  # so the default is not every position
    two = {k: v[:2] for k, v in batch.items()}  # two queries are enough, and rank may reach their number
    assert len(sahara(m, two, budget=1, rank=2).heads) == 1

# ---------------------------------------------------------------- masked LMs are refused
@pytest.mark.parametrize('call', ['ships', 'ships_all_positions', 'sahara', 'next_token_logits', 'generate', 'head_effect', 'ablation_outcomes'])
def test_masked_lm_is_refused(call, tokenizer):
    bert = tiny_lm('bert')
    b = {'input_ids': torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))}
    f = {'ships': lambda: ships(bert, b), 'ships_all_positions': lambda: ships(bert, b, last_only=False), 'sahara': lambda: sahara(bert, b, last_only=False),
         'next_token_logits': lambda: next_token_logits(bert, b), 'generate': lambda: generate(bert, tokenizer, ['w1']),
         'head_effect': lambda: head_effect(bert, tokenizer, 'w1', 0, 0), 'ablation_outcomes': lambda: ablation_outcomes(bert, tokenizer, ['w1'], {'none': []})}[call]
    with pytest.raises(ConfigError, match='needs a causal language model'): f()

# ---------------------------------------------------------------- generation
def _greedy(model, tokenizer, text, n, heads=None, how='zero', eps=1e-4, means=None):
    "A greedy reply by hand: one full forward per new token, no cache, stopping after the end-of-sequence id."
    ids = torch.tensor([tokenizer(chat_prompts(tokenizer, [text])[0], add_special_tokens=False)['input_ids']])
    eos = model.generation_config.eos_token_id
    new = []
    with torch.no_grad(), (ablate_heads(model, heads, how, eps=eps, means=means) if heads else torch.no_grad()):
        for _ in range(n):
            t = model(input_ids=ids).logits[0, -1].argmax().item()
            new.append(t)
            ids = torch.cat([ids, torch.tensor([[t]])], 1)
            if t == eos: break
    return tokenizer.decode(new, skip_special_tokens=True)

def test_generate_against_a_greedy_loop(tiny, tokenizer, untouched):
    texts = ['w1 w2 w3', 'w4', 'w5 w6']  # different lengths: left padding in a batch
    with untouched(tiny, tokenizer):
        for heads in (None, {1: [2], 0: [0]}):
            ref = [_greedy(tiny, tokenizer, t, 5, heads) for t in texts]
            for bs in (1, 2, 32):
                assert generate(tiny, tokenizer, texts, 5, heads=heads or (), how='zero', batch_size=bs) == ref
            if heads: assert ref != [_greedy(tiny, tokenizer, t, 5) for t in texts]  # the ablation changes some reply
        assert generate(tiny, tokenizer, texts, 5, heads={1: [2]}, eps=1.) == generate(tiny, tokenizer, texts, 5)  # scale_query with ε = 1: no ablation
        means = head_means(tiny, torch.randint(0, 128, (4, 6), generator=torch.Generator().manual_seed(2)))
        ref = [_greedy(tiny, tokenizer, t, 5, {1: [2]}, 'mean', means=means) for t in texts]
        assert generate(tiny, tokenizer, texts, 5, heads=[(-1, 2)], how='mean', means=means) == ref
        assert generate(tiny, tokenizer, texts, 5, heads=[(1, 2)], how='mean', means={-1: means[1]}) == ref  # means keyed by a negative layer
    with pytest.raises(ConfigError): generate(tiny, tokenizer, 'w1')
    with pytest.raises(ConfigError): generate(tiny, tokenizer, ['w1'], batch_size=0)

def test_head_effect(tiny, tokenizer):
    "Every field against a hand-made greedy loop, with judges that tell the two replies apart both ways (so swapping them fails)."
    base, abl = _greedy(tiny, tokenizer, 'w1 w2 w3', 5), _greedy(tiny, tokenizer, 'w1 w2 w3', 5, {1: [2]})
    assert base != abl
    e = head_effect(tiny, tokenizer, 'w1 w2 w3', -1, -2, max_new_tokens=5, how='zero', judge=lambda r: r == base)
    assert isinstance(e, HeadEffect) and 'HeadEffect(' in repr(e)
    assert (e.request, e.layer, e.head, e.base, e.ablated) == ('w1 w2 w3', 1, 2, base, abl)   # negative indices as valid ones
    assert e.base_refuses is True and e.ablated_refuses is False
    f = head_effect(tiny, tokenizer, 'w1 w2 w3', 1, 2, max_new_tokens=5, how='zero', judge=lambda r: r == abl)
    assert (f.base, f.ablated, f.base_refuses, f.ablated_refuses) == (base, abl, False, True)
    g = head_effect(tiny, tokenizer, 'w1 w2 w3', 1, 2, max_new_tokens=5, how='zero')   # the default judge: `is_refusal`; the tiny model never refuses
    assert (g.base_refuses, g.ablated_refuses) == (False, False)
    same = head_effect(tiny, tokenizer, 'w1 w2', 1, 2, max_new_tokens=5, eps=1.)
    assert same.base == same.ablated
    with pytest.raises(ConfigError): head_effect(tiny, tokenizer, 'w1', 2, 0)

def test_head_effect_with_a_known_base_generates_once(tiny, tokenizer, monkeypatch):
    "A given unablated reply is used as it is (judged too), and only the ablated reply is generated."
    import interpkit.papers.safety_heads as sh
    calls = []
    real = sh.generate
    monkeypatch.setattr(sh, 'generate', lambda *a, **kw: calls.append(kw.get('heads')) or real(*a, **kw))
    e = head_effect(tiny, tokenizer, 'w1 w2 w3', -1, 2, max_new_tokens=5, how='zero', base="I cannot do that")
    assert calls == [[(1, 2)]]
    assert e.base == "I cannot do that" and e.ablated == _greedy(tiny, tokenizer, 'w1 w2 w3', 5, {1: [2]})
    assert e.base_refuses is True and e.ablated_refuses is False   # the given reply is judged (a refusal), the generated one too (not one)
    with pytest.raises(ConfigError, match='base is a list'): head_effect(tiny, tokenizer, 'w1', 0, 0, base=['w1'])

def test_ablation_outcomes_against_hand_counts(tiny, tokenizer, untouched):
    harmful, harmless = ['w1 w2', 'w3', 'w4 w5 w6', 'w7'], ['w8 w9', 'w30 w31', 'w40']
    sets = {'none': [], 'one': [(1, 2)], 'two': {0: [0], -1: [3]}}
    judge = lambda r: r.startswith('w15 w51')  # a stand-in judge, true for some harmful and some harmless replies of the tiny model
    with untouched(tiny, tokenizer):
        out = ablation_outcomes(tiny, tokenizer, harmful, sets, harmless=harmless, max_new_tokens=4, how='zero', judge=judge, batch_size=3)
    heads = {'none': None, 'one': {1: [2]}, 'two': {0: [0], 1: [3]}}
    own = [_greedy(tiny, tokenizer, t, 4) for t in harmless]
    n_params = sum(p.numel() for p in tiny.parameters())
    for name, hs in heads.items():
        harm = [_greedy(tiny, tokenizer, t, 4, hs) for t in harmful]
        safe = [_greedy(tiny, tokenizer, t, 4, hs) for t in harmless]
        row = out.table.loc[name]
        assert out.replies[name] == {'harmful': harm, 'harmless': safe}
        assert row['answered harmful'] == pytest.approx(np.mean([not judge(r) for r in harm]))
        assert row['refused harmless'] == pytest.approx(np.mean([judge(r) for r in safe]))
        assert row['harmless changed'] == pytest.approx(np.mean([a != b for a, b in zip(safe, own)]))
        k = sum(map(len, hs.values())) if hs else 0
        assert row['heads'] == k
        assert row['param fraction'] == pytest.approx(k * tiny.model.layers[0].self_attn.q_proj.weight.numel() / 4 / n_params)
    assert (out.table['answered harmful'] < 1).all()  # the judge calls some harmful replies refusals in every set: 1 - rate differs from 1 + rate
    assert out.table['refused harmless'].nunique() > 1
    assert 0 < out.table.loc['one', 'harmless changed'] < 1   # some harmless replies changed, not all: a fraction, not 'any'
    assert 'refused harmless' not in ablation_outcomes(tiny, tokenizer, harmful, {'one': [(1, 2)]}, max_new_tokens=2).table
    means = head_means(tiny, torch.randint(0, 128, (4, 6), generator=torch.Generator().manual_seed(2)))
    mean_out = ablation_outcomes(tiny, tokenizer, harmful, {'one': [(1, 2)]}, max_new_tokens=4, how='mean', means=means, batch_size=3)
    assert mean_out.replies['one']['harmful'] == [_greedy(tiny, tokenizer, t, 4, {1: [2]}, 'mean', means=means) for t in harmful]
    with pytest.raises(ConfigError): ablation_outcomes(tiny, tokenizer, harmful, {})

def test_ablation_outcomes_with_known_own_replies(tiny, tokenizer, monkeypatch):
    "The model's own harmless replies, given, are not generated again and count as the reference of 'harmless changed'."
    import interpkit.papers.safety_heads as sh
    harmful, harmless, sets = ['w1 w2', 'w3'], ['w8 w9', 'w10'], {'none': [], 'one': [(1, 2)]}
    kw = dict(max_new_tokens=4, how='zero', batch_size=3)
    ref = ablation_outcomes(tiny, tokenizer, harmful, sets, harmless=harmless, **kw)
    calls = []
    real = sh.generate
    monkeypatch.setattr(sh, 'generate', lambda m, t, texts, *a, **k: calls.append(list(texts)) or real(m, t, texts, *a, **k))
    got = ablation_outcomes(tiny, tokenizer, harmful, sets, harmless=harmless, own=ref.replies['none']['harmless'], **kw)
    assert calls == [harmful, harmful, harmless]   # the harmful requests per set, the harmless ones once (ablated), never unablated
    pd.testing.assert_frame_equal(got.table, ref.table)
    assert got.replies == ref.replies
    fake = ablation_outcomes(tiny, tokenizer, harmful, sets, harmless=harmless, own=['x', 'y'], **kw)
    assert fake.replies['none']['harmless'] == ['x', 'y'] and fake.table.loc['one', 'harmless changed'] == 1.0
    for bad, msg in ((['x'], '1 replies for 2'), ('xy', 'a string')):
        with pytest.raises(ConfigError, match=msg): ablation_outcomes(tiny, tokenizer, harmful, sets, harmless=harmless, own=bad, **kw)
    with pytest.raises(ConfigError, match='for no harmless'): ablation_outcomes(tiny, tokenizer, harmful, sets, own=['x', 'y'], **kw)

def _table(rows, index):
    return pd.DataFrame(rows, index=index, columns=['heads', 'param fraction', 'answered harmful', 'refused harmless', 'harmless changed'])

def test_specificity_by_hand():
    "Refusals removed, harmless changed, harmless refusals added and their difference, computed by hand; most specific first."
    t = _table([[0, 0., .25, .5, 0.], [1, .1, .75, 0., .25], [3, .3, .5, 1., 1.], [1, .1, .25, .5, 0.]], ['none', 'a', 'b', 'c'])
    sp = specificity(t)
    assert list(sp.index) == ['a', 'c', 'b']   # specificities .25, 0, -.75
    want = pd.DataFrame({'heads': [1, 1, 3], 'refusals removed': [.5, 0., .25], 'harmless changed': [.25, 0., 1.],
                         'harmless refusals added': [-.5, 0., .5], 'specificity': [.25, 0., -.75]}, index=['a', 'c', 'b'])
    pd.testing.assert_frame_equal(sp, want, check_dtype=False)
    out = AblationOutcomes(t.rename(index={'none': 'aligned'}), {})
    pd.testing.assert_frame_equal(specificity(out, base='aligned'), want, check_dtype=False)   # an AblationOutcomes, another base row
    with pytest.raises(ConfigError, match="No row 'none'"): specificity(out)
    with pytest.raises(ConfigError, match='no harmless columns'): specificity(t.drop(columns=['refused harmless', 'harmless changed']))
    t.loc['c', 'harmless changed'] = np.nan   # a set measured on harmful requests only
    with pytest.raises(ConfigError, match=r"\['c'\] have no harmless"): specificity(t)
    with pytest.raises(ConfigError): specificity([1, 2])

def test_replies_changed_by_hand():
    own = ["I'm sorry, I cannot", 'Making pancakes is fun', 'Sure, here it is']
    new = ["I'm sorry, I cannot", 'Making pancakes is easy', "I'm an AI designed"]
    assert replies_changed(new, own) == pytest.approx(2 / 3)
    assert replies_changed(new, own, words=3) == pytest.approx(1 / 3)   # 'Making pancakes is' is kept
    assert replies_changed(new, own, words=4) == pytest.approx(2 / 3)
    assert replies_changed(own, own) == 0 and replies_changed(['a  b'], ['a b'], words=2) == 0 and replies_changed(['a  b'], ['a b']) == 1
    for bad in ((new, own[:2]), ([], []), ('abc', 'abd')):
        with pytest.raises(ConfigError): replies_changed(*bad)
    with pytest.raises(ConfigError, match='words=0'): replies_changed(new, own, words=0)

def test_specificity_of_measured_outcomes(tiny, tokenizer):
    "On the tiny model: the unablated row is left out and each row is its set's answered rate minus the unablated one's, minus its harmless changes."
    judge = lambda r: r.startswith('w15 w51')
    out = ablation_outcomes(tiny, tokenizer, ['w1 w2', 'w3', 'w4 w5 w6', 'w7'], {'none': [], 'one': [(1, 2)], 'two': {0: [0], 1: [3]}},
                            harmless=['w8 w9', 'w30 w31', 'w40'], max_new_tokens=4, how='zero', judge=judge, batch_size=3)
    sp, t = specificity(out), out.table
    assert sorted(sp.index) == ['one', 'two']
    for n in ('one', 'two'):
        assert sp.loc[n, 'specificity'] == pytest.approx(t.loc[n, 'answered harmful'] - t.loc['none', 'answered harmful'] - t.loc[n, 'harmless changed'])

@pytest.mark.parametrize('arch', ['llama', 'gpt2', 'neox'])
def test_query_weights_count_the_query_projection(arch):
    "n_heads heads' query weights fill the query projection (for GPT-2, the first third of the fused c_attn)."
    m = tiny_lm(arch, n_layers=2, n_heads=4)
    blk = {'llama': lambda: m.model.layers[0].self_attn.q_proj.weight.numel(), 'gpt2': lambda: m.transformer.h[0].attn.c_attn.weight.numel() / 3,
           'neox': lambda: m.gpt_neox.layers[0].attention.query_key_value.weight.numel() / 3}[arch]()
    assert query_weights(m) * 4 == blk

# ---------------------------------------------------------------- judge, requests, helpers
def test_judge_and_requests(tokenizer):
    assert is_refusal("I’m sorry, but I can’t help with that.") and is_refusal('As an AI, I cannot do this')
    assert not is_refusal('Sure! First, preheat the oven.') and not is_refusal('Here is a guide to tying a tie:')
    assert all(is_refusal(k.upper()) for k in REFUSAL_KEYWORDS)
    assert refusal_rate(['I cannot do that.', 'Sure.', 'Okay', "I won't"]) == 0.5
    assert refusal_rate(['a', 'bb', 'ccc'], judge=lambda r: len(r) > 1) == pytest.approx(2 / 3)
    with pytest.raises(ConfigError): refusal_rate([])
    assert not set(HARMFUL_TASKS['train']) & set(HARMFUL_TASKS['test']) and not set(HARMLESS_TASKS['train']) & set(HARMLESS_TASKS['test'])
    assert requests('harmful') == [tp.replace('{t}', t) for tp in REQUEST_TEMPLATES['train'] for t in HARMFUL_TASKS['train']]  # default split: train
    test = requests('harmless', 'test')
    assert test == [tp.replace('{t}', t) for tp in REQUEST_TEMPLATES['test'] for t in HARMLESS_TASKS['test']]
    assert test[0] == 'Please explain how to build a birdhouse.' and test[-1] == 'What steps should I follow to fold a shirt?'
    assert head_map([(3, 1), (1, 0), (3, 0), (3, 1)]) == {1: [0], 3: [0, 1]} and head_map({2: 1}) == {2: [1]}
    with pytest.raises(ConfigError): head_map([3])
    with pytest.raises(ConfigError): head_map(3)
    assert chat_prompts(tokenizer, ['w1 w2', 'w3']) == [tokenizer.apply_chat_template([{'role': 'user', 'content': t}], tokenize=False, add_generation_prompt=True) for t in ['w1 w2', 'w3']]
    b = harmful_batch(tokenizer, ['w1 w2 w3', 'w4'])
    assert b['input_ids'].tolist() == [tokenizer(chat_prompts(tokenizer, ['w1 w2 w3'])[0], add_special_tokens=False)['input_ids'], [1, 1] + tokenizer(chat_prompts(tokenizer, ['w4'])[0], add_special_tokens=False)['input_ids']]
    assert set(b) == {'input_ids', 'attention_mask'}  # no position ids: the runners count them from the mask
    assert b['attention_mask'].tolist() == [[1] * 6, [0, 0] + [1] * 4]  # left padding, with the end-of-sequence id (1): the tiny tokenizer has no pad token

def test_kl_div_reference():
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(5, 11, generator=g), torch.randn(5, 11, generator=g)
    ref = sum(p.softmax(-1)[:, i] * (p.softmax(-1)[:, i].log() - q.softmax(-1)[:, i].log()) for i in range(11)).double()
    torch.testing.assert_close(kl_div(p, q), ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kl_div(p, p), torch.zeros(5, dtype=torch.float64))
    p3, q3 = p.reshape(5, 1, 11).expand(5, 3, 11), q.reshape(5, 1, 11).expand(5, 3, 11)  # (batch, pos, vocab): the sum runs over the last axis
    torch.testing.assert_close(kl_div(p3, q3), ref[:, None].expand(5, 3), atol=1e-6, rtol=1e-5)
    with pytest.raises(ShapeError): kl_div(p, q[:, :3])

# ---------------------------------------------------------------- adapters
def _peft_model(base, targets, seed=0):
    peft = pytest.importorskip('peft')
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets, init_lora_weights=False))  # random B: a real update
    return pm.eval()

@pytest.mark.parametrize('arch,targets', [('gpt2', ['attn.c_proj']), ('gpt2', ['c_attn']), ('gpt2', ['c_attn', 'c_fc', 'mlp.c_proj']),
                                          ('llama', ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'down_proj'])])
def test_merge_adapter_matches_peft(arch, targets, untouched):
    "The merged copy gives peft's own adapted logits (float64: to 1e-9), also for GPT-2's Conv1D layers (square c_proj and rectangular c_attn, c_fc); the base is not changed."
    base = tiny_lm(arch, n_layers=2, d_model=32, n_heads=4, seed=0).double()
    pm = _peft_model(base, targets)
    x = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(): want, before = pm(input_ids=x).logits, base(input_ids=x).logits
    assert (want - before).abs().max() > 0.1  # the adapter does move the logits
    tensors = adapter_tensors(pm)
    peft = pytest.importorskip('peft')
    assert len(tensors) == 2 * sum(isinstance(mod, peft.tuners.lora.LoraLayer) for mod in pm.modules())  # A and B of every adapted layer
    with untouched(base): merged = merge_adapter(base, tensors, 4 / 2)
    with torch.no_grad(): got = merged(input_ids=x).logits
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
    b32 = tiny_lm(arch, n_layers=2, d_model=32, n_heads=4, seed=0)
    p32 = _peft_model(b32, targets)
    with torch.no_grad(): torch.testing.assert_close(merge_adapter(b32, adapter_tensors(p32), 2.)(input_ids=x).logits, p32(input_ids=x).logits, atol=1e-5, rtol=0)

def test_merge_adapter_errors_leave_the_model(untouched):
    base = tiny_lm('gpt2', n_layers=2, d_model=32, n_heads=4)
    t = adapter_tensors(_peft_model(base, ['c_attn']))
    p = 'transformer.h.0.attn.c_attn'
    with untouched(base):
        with pytest.raises(ShapeError): merge_adapter(base, {**t, f'{p}.lora_A': t[f'{p}.lora_A'].T.contiguous(), f'{p}.lora_B': t[f'{p}.lora_B'].T.contiguous()}, 2.)
        with pytest.raises(ConfigError): merge_adapter(base, {k: v for k, v in t.items() if k != f'{p}.lora_B'}, 2.)
        with pytest.raises(ConfigError): merge_adapter(base, {'transformer.h.9.attn.c_attn.lora_A': t[f'{p}.lora_A'], 'transformer.h.9.attn.c_attn.lora_B': t[f'{p}.lora_B']}, 2.)
        with pytest.raises(ConfigError): merge_adapter(base, {'transformer.h.0.ln_1.lora_A': torch.zeros(2, 32), 'transformer.h.0.ln_1.lora_B': torch.zeros(32, 2)}, 2.)
    with pytest.raises(ConfigError): adapter_tensors(base)
    with pytest.raises(ConfigError): adapter_tensors({'a': 1})

def test_merge_adapter_by_hand_in_bfloat16():
    "W + s B A, computed in float32 and rounded once: the Conv1D weight (in, out) receives (B A)^T."
    base = tiny_lm('gpt2', n_layers=2, d_model=32, n_heads=4).to(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(2, 32, generator=g), torch.randn(96, 2, generator=g)
    m = merge_adapter(base, {'transformer.h.1.attn.c_attn.lora_A': A, 'transformer.h.1.attn.c_attn.lora_B': B}, 0.5)
    w0 = base.transformer.h[1].attn.c_attn.weight
    assert torch.equal(m.transformer.h[1].attn.c_attn.weight, (w0.float() + 0.5 * (B @ A).T).to(torch.bfloat16))
    assert torch.equal(m.transformer.h[0].attn.c_attn.weight, base.transformer.h[0].attn.c_attn.weight)

def test_train_aligned_lm_short_run(tokenizer, untouched):
    "Two steps of the recipe on a tiny model: a FitResult, the adapter read back from its optimizer, a merged copy that gives peft's forward, the same numbers for the same seed."
    peft = pytest.importorskip('peft')
    tiny = tiny_lm('llama', n_layers=2, d_model=32, n_heads=4, seed=0, max_len=128)
    kw = dict(steps=2, batch_size=4, lr=1e-2, rank=2, answer_tokens=3, progress=False, harmful=['w1 w2', 'w3 w4 w5'], harmless=['w6', 'w7 w8'])
    with untouched(tiny, tokenizer): aligned, returned, res = train_aligned_lm(tiny, tokenizer, **kw)
    assert returned is tokenizer and isinstance(res, FitResult) and len(res.history) == 2 and np.isfinite(res.history['loss']).all()
    tensors = adapter_tensors(res)
    assert len(tensors) == 2 * 4 * 2  # A and B, four projections, two layers
    assert all(v.abs().sum() > 0 for k, v in tensors.items() if k.endswith('lora_B'))  # B moved off its zero init
    pm = peft.get_peft_model(copy.deepcopy(tiny), peft.LoraConfig(r=2, lora_alpha=8., target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj'], lora_dropout=0.0))
    for name, mod in pm.named_modules():
        if isinstance(mod, peft.tuners.lora.LoraLayer):
            p = name.removeprefix('base_model.model.')
            with torch.no_grad(): mod.lora_A['default'].weight.copy_(tensors[f'{p}.lora_A']); mod.lora_B['default'].weight.copy_(tensors[f'{p}.lora_B'])
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(): torch.testing.assert_close(aligned(input_ids=ids).logits, pm.eval()(input_ids=ids).logits, atol=1e-6, rtol=0)
    again = adapter_tensors(train_aligned_lm(tiny, tokenizer, **kw)[2])
    assert all(torch.equal(again[k], v) for k, v in tensors.items())
    with pytest.raises(ConfigError): train_aligned_lm(tiny, None, **kw)
    with pytest.raises(ConfigError): train_aligned_lm(tiny, tokenizer, **{**kw, 'batch_size': 1})
    with pytest.raises(ConfigError): train_aligned_lm(tiny, tokenizer, **{**kw, 'harmful': []})

def test_load_aligned_lm_merges_the_shipped_adapter():
    "The shipped model is SmolLM2 plus scaling · B A in one projection, checked by hand, and it refuses a held-out harmful request."
    from interpkit.models import load_lm
    model, tokenizer, meta = load_aligned_lm()
    base, _ = load_lm()
    tensors, _ = load_asset('safety_heads_smollm2_lora')
    p = 'model.layers.17.self_attn.v_proj'
    want = base.get_submodule(p).weight + meta['scaling'] * tensors[f'{p}.lora_B'] @ tensors[f'{p}.lora_A']
    torch.testing.assert_close(model.get_submodule(p).weight, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(model.model.layers[3].mlp.up_proj.weight, base.model.layers[3].mlp.up_proj.weight, atol=0, rtol=0)
    assert not model.training and meta['scaling'] == meta['alpha'] / meta['rank']
    assert is_refusal(generate(model, tokenizer, [requests('harmful', 'test')[0]], 8)[0])
    assert not is_refusal(generate(base, tokenizer, [requests('harmful', 'test')[0]], 8)[0])

def test_sweep_asset_is_consistent():
    "The shipped sweep (tools/make_safety_heads_assets.py sweep): each rate recounted from its stored replies with the keyword judge, its ranking from its Ships tensor, its sets as the notebook names them."
    tensors, meta = load_asset('safety_heads_head_sweep')
    S = tensors['ships']
    assert S.shape == (30, 9) and torch.isfinite(S).all() and (S >= 0).all()
    assert meta['harmful'] == requests('harmful', 'test') and meta['harmless'] == requests('harmless', 'test')
    order = sorted(((l, h) for l in range(30) for h in range(9)), key=lambda lh: -S[lh].item())
    assert meta['order'] == [list(lh) for lh in order[:meta['k']]]
    assert all(meta['heads'][f'L{l}H{h}'] == [[l, h]] for l, h in order[:meta['k']]) and meta['heads']['Ships top-3'] == sorted(map(list, order[:3]))
    own = meta['replies']['none']['harmless']
    assert set(meta['table']) == set(meta['replies']) == set(meta['heads'])
    for name, row in meta['table'].items():
        r = meta['replies'][name]
        assert len(r['harmful']) == len(meta['harmful']) and len(r['harmless']) == len(meta['harmless'])
        assert row['answered harmful'] == pytest.approx(np.mean([not is_refusal(x) for x in r['harmful']]), abs=1e-12)
        assert row['refused harmless'] == pytest.approx(np.mean([is_refusal(x) for x in r['harmless']]), abs=1e-12)
        assert row['harmless changed'] == pytest.approx(np.mean([a != b for a, b in zip(r['harmless'], own)]), abs=1e-12)
        assert row['heads'] == len(meta['heads'][name]) and row['param fraction'] == pytest.approx(len(meta['heads'][name]) * 64 * 576 / 134_515_008)


def test_old_import_paths_of_the_demo_names_warn():
    import interpkit.papers.safety_heads as sh, interpkit.demos.safety_heads as demo
    for name in ('HARMFUL_TASKS', 'HARMLESS_TASKS', 'REQUEST_TEMPLATES', 'REFUSALS', 'requests', 'train_aligned_lm', 'adapter_tensors', 'merge_adapter',
                 'ALIGNED_LM_ASSET', 'load_aligned_lm'):
        with pytest.warns(FutureWarning, match=f'safety_heads.{name} is now interpkit.demos.safety_heads.{name}'):
            assert getattr(sh, name) is getattr(demo, name)
    with pytest.raises(AttributeError): sh.no_such_name

def test_loader_and_trainer_return_the_named_tuples():
    from interpkit.train import Shipped
    shipped = load_aligned_lm()
    assert isinstance(shipped, Shipped) and shipped.meta['scaling'] == shipped.meta['alpha'] / shipped.meta['rank']
