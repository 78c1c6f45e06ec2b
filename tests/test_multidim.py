"""Tests of interpkit.papers.multidim: the two irreducibility indices on synthetic clouds (with margins, against
second implementations, invariances), circularity, the coordinate replacement, clustering of a planted circle,
the day-arithmetic prompts and hooks on a tiny Llama (model untouched), and a short run of the SAE training recipe."""
import copy, math, os
import numpy as np, pytest, torch
from interpkit.errors import ConfigError, ShapeError
from interpkit.models import tiny_lm
from interpkit.data import CharTokenizer
from interpkit.sae import SAE
from interpkit.papers.multidim import (synthetic_cloud, separability_index, mixture_index, irreducibility, normalize_points, rotate,
    circularity, circularity_null, replace_coords, pca_project, cluster_features, rank_clusters, word_states, day_math_prompts,
    train_lm_sae, sae_tokens, DAYS)

os.environ.setdefault('HF_HUB_OFFLINE', '1')
torch.set_num_threads(1)

CLOUDS = {k: synthetic_cloud(k, 2000, seed=7) for k in ('circle', 'independent', 'mixture', 'gaussian')}

def test_indices_classify_the_synthetic_clouds_with_margins():
    r = {k: irreducibility(v) for k, v in CLOUDS.items()}
    assert r['circle'].irreducible and r['circle'].separability > 0.6 and r['circle'].mixture < 0.28
    assert not r['independent'].irreducible and r['independent'].separability < 0.05      # separable
    assert not r['gaussian'].irreducible and r['gaussian'].separability < 0.08
    assert not r['mixture'].irreducible and r['mixture'].mixture > 0.45                   # a mixture of two lines

def _mi_sklearn(a, b, bins, bound):
    from sklearn.metrics import mutual_info_score
    edges = np.linspace(-bound, bound, bins + 1)[1:-1]
    return mutual_info_score(np.digitize(a, edges), np.digitize(b, edges)) / math.log(2)

def test_separability_matches_a_loop_with_sklearn_mutual_information():
    for k in ('circle', 'independent', 'mixture'):
        x = normalize_points(CLOUDS[k]).numpy()
        ref = min(_mi_sklearn(*(x @ np.array([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]])).T, 10, 3.) for t in np.arange(90) * (math.pi / 2) / 90)
        assert abs(separability_index(CLOUDS[k]) - ref) < 1e-6, k

@pytest.mark.parametrize('angle', [0.3, 1.1, 2.5, -0.8])
def test_separability_is_invariant_to_rotating_the_input(angle):
    for k in ('circle', 'independent', 'mixture'):
        a, b = separability_index(CLOUDS[k], n_angles=180), separability_index(rotate(CLOUDS[k], angle), n_angles=180)
        assert abs(a - b) < 0.02 + 0.05 * a, (k, a, b)

def _mixture_by_gradient(x, epsilon=0.1, steps=1500, restarts=4, seed=0):
    "The paper's approach: maximise a sigmoid-smoothed fraction in the band by gradient ascent, annealing the temperature."
    x = normalize_points(x).float()
    g, best = torch.Generator().manual_seed(seed), 0.
    for _ in range(restarts):
        a = torch.randn(2, generator=g).requires_grad_(); b = torch.zeros((), requires_grad=True)
        opt = torch.optim.Adam([a, b], lr=0.05)
        for i in range(steps):
            temp = max(1 - i / steps, 0.01) * 0.5
            z = x @ a + b; z = z / z.pow(2).mean().sqrt()
            loss = -torch.sigmoid((epsilon - z.abs()) / temp).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        with torch.no_grad():
            z = x @ a + b; z = z / z.pow(2).mean().sqrt()
            best = max(best, (z.abs() < epsilon).float().mean().item())
    return best

def test_mixture_index_agrees_with_gradient_ascent():
    for k in ('mixture', 'circle'):
        grid, grad = mixture_index(CLOUDS[k]), _mixture_by_gradient(CLOUDS[k])
        assert grid >= grad - 0.02, (k, grid, grad)   # the exhaustive grid finds at least what gradient ascent finds
        assert abs(grid - grad) < 0.06, (k, grid, grad)

def test_mixture_index_exact_cases_and_invariances():
    # 60% of the points exactly on one line, the rest spread: M >= 0.6
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.stack([torch.randn(600, generator=g, dtype=torch.float64), torch.zeros(600, dtype=torch.float64)], -1),
                   torch.randn(400, 2, generator=g, dtype=torch.float64) * 3])
    m = mixture_index(x)
    assert m >= 0.6
    assert abs(mixture_index(rotate(x, 0.77) * 5 + 3) - m) < 0.02  # shift, scale and rotation change nothing (up to the grid)

def test_circularity_and_its_null():
    k = torch.arange(12) * 2 * math.pi / 12
    p = torch.stack([k.cos(), k.sin()], -1) * 2 + 1
    c = circularity(p)
    assert abs(c['R'] - 1) < 1e-9 and c['neighbours'] == 12
    perm = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 10]
    assert circularity(p[perm])['neighbours'] == 9    # 9->11, 11->10, 10->0 break the chain
    null = circularity_null(12, n=300)
    assert null.mean() < 0.6 and np.quantile(null, 0.95) < 0.8
    with pytest.raises(ShapeError): circularity(torch.zeros(5, 3))

def test_replace_coords():
    g = torch.Generator().manual_seed(1)
    h, mu = torch.randn(6, 10, generator=g), torch.randn(10, generator=g)
    B = torch.linalg.qr(torch.randn(10, 2, generator=g)).Q.T
    c = torch.randn(6, 2, generator=g)
    new = replace_coords(h, mu, B, c)
    torch.testing.assert_close((new - mu) @ B.T, c, atol=1e-5, rtol=1e-5)
    P = torch.eye(10) - B.T @ B
    torch.testing.assert_close(new @ P, h @ P, atol=1e-5, rtol=1e-5)

def test_planted_circle_cluster_ranks_first():
    d, g = 16, torch.Generator().manual_seed(11)
    Q = torch.linalg.qr(torch.randn(d, d, generator=g)).Q.T
    ang = torch.arange(7) * 2 * math.pi / 7
    dirs = torch.cat([1.5 * Q[2] + torch.cos(ang)[:, None] * Q[0] + torch.sin(ang)[:, None] * Q[1],
                      Q[3:][torch.arange(20) % 13] * torch.where(torch.arange(20) < 13, 1., -1.)[:, None]])
    sae = SAE(d, 27)
    with torch.no_grad(): sae.W_dec.copy_(dirs)
    n = 2000
    t = torch.rand(n, generator=g) * 7
    k0, w = t.floor().long() % 7, t - t.floor()
    codes = torch.zeros(2 * n, 27)
    codes[torch.arange(n), k0] = 1 - w; codes[torch.arange(n), (k0 + 1) % 7] = w
    codes[n + torch.arange(n), 7 + torch.randint(0, 20, (n,), generator=g)] = torch.rand(n, generator=g) + 0.5
    lab = cluster_features(sae.directions.detach(), 6, seed=0)
    assert len(set(lab[:7])) == 1 and not (set(lab[7:]) & set(lab[:7]))
    ranked = rank_clusters(sae, codes, lab, min_points=50)
    assert ranked.cluster[0] == lab[0] and ranked.irreducible.sum() == 1

def test_day_prompts():
    P = day_math_prompts()
    assert len(P) == 42 and set(P.n) == set(range(1, 7))
    for _, r in P.iterrows():
        assert DAYS[r.day] in r.text and DAYS.index(DAYS[(r.day + r.n) % 7]) == r.answer

class _CharTok:
    def encode(self, t, add_special_tokens=False): return [ord(c) % 128 for c in t]

def test_word_states_match_hidden_states_and_leave_model_alone():
    m = tiny_lm('llama', n_layers=3, seed=3).train()  # 3 layers: hidden_states[-1] has the final norm applied
    m.model.layers[1].eval()
    flags = {n: mod.training for n, mod in m.named_modules()}
    sd = copy.deepcopy(m.state_dict())
    st = word_states(m, _CharTok(), ['cat', 'do'], [0, 1], ["a {w}.", "the {w} ran"])
    ref_m = copy.deepcopy(m).eval()
    with torch.no_grad():
        hs = ref_m(torch.tensor([_CharTok().encode("the do ran")]), output_hidden_states=True).hidden_states
    torch.testing.assert_close(st[1][1, 1], hs[2][0, 5], atol=1e-5, rtol=1e-5)  # 'o' is character 5
    assert {n: mod.training for n, mod in m.named_modules()} == flags
    assert all(torch.equal(v, sd[k]) for k, v in m.state_dict().items())
    assert all(len(mod._forward_hooks) == 0 for mod in m.modules())
    with pytest.raises(ConfigError): word_states(m, _CharTok(), ['x'], [0], ["two {w} {w}"])
    assert {n: mod.training for n, mod in m.named_modules()} == flags

def test_sae_training_recipe_short_run():
    m = tiny_lm('llama', n_layers=2, seed=0)
    sae, res, met = train_lm_sae(m, CharTokenizer(), site='resid_post(0)', n_tokens=64 * 24, d_sae=64, k=4, steps=60, batch_size=128, lr=3e-3, forward_batch=8, progress=False)
    assert met.n >= 2 and met.l0 == 4
    assert res.history.nmse.iloc[-10:].mean() < 0.7 * res.history.nmse.iloc[:3].mean()
    rows = sae_tokens(CharTokenizer(), 64 * 10, calendar_frac=0.3)
    assert rows.shape == (10, 64)

def test_typed_errors():
    with pytest.raises(ShapeError): separability_index(torch.zeros(50, 3))
    with pytest.raises(ConfigError): separability_index(torch.randn(5, 2))
    with pytest.raises(ConfigError): mixture_index(torch.randn(50, 2), epsilon=2.)
    with pytest.raises(ConfigError): synthetic_cloud('square')
    with pytest.raises(ConfigError): sae_tokens(CharTokenizer(), 640, calendar_frac=1.5)
    with pytest.raises(ConfigError): cluster_features(torch.randn(5, 4), 9)

class _WordTok:
    "A word-level tokenizer (' word' is one token) with ids assigned on first sight: day names are single tokens."
    def __init__(self): self.vocab = {}
    def encode(self, text, add_special_tokens=False):
        import re
        return [self.vocab.setdefault(w, len(self.vocab) % 128) for w in re.findall(r' ?[^ ]+', text)]

def test_day_intervention_plumbing_on_a_tiny_model_leaves_it_alone():
    from interpkit.papers.multidim import day_logits, circle_intervention
    m = tiny_lm('llama', n_layers=3, seed=5).train()
    m.model.layers[2].eval()
    flags = {n: mod.training for n, mod in m.named_modules()}
    sd = copy.deepcopy(m.state_dict())
    tok, P = _WordTok(), day_math_prompts()
    base = day_logits(m, tok, P)
    same = day_logits(m, tok, P, layer=1, new_state=lambda h, r: h)        # replacing a state by itself changes nothing
    torch.testing.assert_close(same, base, atol=1e-5, rtol=1e-5)
    moved = day_logits(m, tok, P, layer=1, new_state=lambda h, r: h.flip(0))  # swapping states across prompts does
    assert (moved - base).abs().max() > 1e-4
    res = circle_intervention(m, tok, layer=1)
    assert list(res.method) == ['none', 'circle (top-2 PCs)', 'random plane', 'whole state'] and res.tv_moved.iloc[0] == 0
    assert ((res.p_intended > 0) & (res.p_intended < 1)).all()
    with pytest.raises(RuntimeError): day_logits(m, tok, P, layer=1, new_state=lambda h, r: h[:3])  # wrong shape: fails inside the hook
    assert {n: mod.training for n, mod in m.named_modules()} == flags
    assert all(torch.equal(v, sd[k]) for k, v in m.state_dict().items())
    assert all(len(mod._forward_hooks) == 0 and len(mod._forward_pre_hooks) == 0 for mod in m.modules())
    with pytest.raises(ConfigError): day_logits(m, CharTokenizer(), P)  # day names are not single characters
