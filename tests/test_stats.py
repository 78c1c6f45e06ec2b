"""interpkit.stats against independent references: the effective rank against scipy's entropy and against its definition
on eigenvalues and singular values; the linear probe against the same penalised objective minimised by torch's L-BFGS,
against a scikit-learn pipeline written out by hand, and against scikit-learn's own split sizes."""
import math, warnings
import numpy as np, pytest, torch
import torch.nn.functional as F
from scipy.stats import entropy
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from interpkit.errors import ConfigError, NotFiniteError, ShapeError
from interpkit.stats import Probe, effective_rank, linear_probe

def _blobs(n=150, d=6, classes=3, spread=2.0, seed=0):
    "Gaussian blobs: labels cycle through the classes, centres drawn at random (float64)."
    g = torch.Generator().manual_seed(seed)
    centers = 3 * torch.randn(classes, d, generator=g, dtype=torch.float64)
    y = torch.arange(n) % classes
    return centers[y] + spread * torch.randn(n, d, generator=g, dtype=torch.float64), y

# ---- effective rank ----

def test_effective_rank_matches_scipy_entropy():
    s = torch.rand(7, 20, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = torch.tensor([math.exp(entropy(r)) for r in s.numpy()], dtype=torch.float64)
    torch.testing.assert_close(effective_rank(s), ref, rtol=1e-12, atol=0)

def test_effective_rank_closed_forms_and_bounds():
    torch.testing.assert_close(effective_rank(torch.ones(9)), torch.tensor(9.))
    torch.testing.assert_close(effective_rank(torch.tensor([0., 0, 5, 0])), torch.tensor(1.))
    # two values a, b: exp(H(a/(a+b), b/(a+b)))
    a, b = 3.0, 1.0
    p = torch.tensor([a, b], dtype=torch.float64) / (a + b)
    torch.testing.assert_close(effective_rank(torch.tensor([a, b], dtype=torch.float64)), torch.exp(-(p * p.log()).sum()))
    s = torch.rand(100, 12, generator=torch.Generator().manual_seed(1))
    r = effective_rank(s)
    assert ((r >= 1 - 1e-6) & (r <= 12 + 1e-5)).all()

def test_effective_rank_uses_magnitudes_and_is_scale_and_order_free():
    s = torch.randn(15, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.testing.assert_close(effective_rank(s), effective_rank(s.abs()))
    torch.testing.assert_close(effective_rank(s), effective_rank(7.5 * s.flip(0)))

def test_effective_rank_of_a_symmetric_matrix_is_the_same_from_eigenvalues_and_singular_values():
    M = torch.randn(10, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    B = M + M.T
    torch.testing.assert_close(effective_rank(torch.linalg.svdvals(B)), effective_rank(torch.linalg.eigvalsh(B)), rtol=1e-10, atol=0)

def test_effective_rank_batches_dtypes_and_inputs():
    s = torch.rand(2, 3, 5, generator=torch.Generator().manual_seed(4))
    r = effective_rank(s)
    assert r.shape == (2, 3) and r.dtype == torch.float32
    torch.testing.assert_close(r[1, 2], effective_rank(s[1, 2]))
    assert effective_rank(s.double()).dtype == torch.float64 and effective_rank(s.bfloat16()).dtype == torch.float32
    assert effective_rank(torch.tensor([1, 1, 2])).dtype == torch.float32   # integers become float32
    torch.testing.assert_close(effective_rank(np.ones(4)), torch.tensor(4., dtype=torch.float64))

def test_effective_rank_bad_input():
    with pytest.raises(NotFiniteError, match='all zeros'): effective_rank(torch.zeros(2, 3))
    with pytest.raises(NotFiniteError, match='NaN'): effective_rank(torch.tensor([1., float('inf')]))
    with pytest.raises(ShapeError, match=r'shape \(\)'): effective_rank(torch.tensor(1.))
    with pytest.raises(ShapeError): effective_rank(torch.zeros(3, 0))

# ---- linear probe ----

def _torch_probe(Z, y, C=1.0):
    "The same objective, C Σ CE + ½‖W‖² (intercepts free), minimised from zero by torch's L-BFGS in float64."
    k = int(y.max()) + 1
    W = torch.zeros(k, Z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(k, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=2000, tolerance_grad=1e-13, tolerance_change=1e-16, line_search_fn='strong_wolfe')
    def closure():
        opt.zero_grad()
        loss = C * F.cross_entropy(Z @ W.T + b, y, reduction='sum') + 0.5 * W.pow(2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return W.detach(), b.detach()

@pytest.mark.parametrize('standardize', [True, False])
def test_probe_matches_an_independent_lbfgs_on_the_same_objective(standardize):
    x, y = _blobs()
    p = linear_probe(x, y, test_frac=0.3, standardize=standardize, C=0.5, seed=1)
    fit_rows = torch.as_tensor(np.setdiff1d(np.arange(len(x)), p.test_rows.numpy()))
    Z = x[fit_rows]
    if standardize: Z = (Z - Z.mean(0)) / Z.std(0, unbiased=False)
    W, b = _torch_probe(Z, y[fit_rows], C=0.5)
    clf = p.model[-1] if standardize else p.model
    Ws, bs = torch.as_tensor(clf.coef_), torch.as_tensor(clf.intercept_)
    objective = lambda W, b: (0.5 * F.cross_entropy(Z @ W.T + b, y[fit_rows], reduction='sum') + 0.5 * W.pow(2).sum()).item()
    # scikit-learn stops at its tolerance (1e-4 on the gradient): its objective is the optimum's to 1e-4, its weights to about 1e-2
    assert objective(Ws, bs) == pytest.approx(objective(W, b), rel=1e-4) and objective(Ws, bs) >= objective(W, b) - 1e-9
    torch.testing.assert_close(Ws, W, atol=1e-2, rtol=1e-2)
    # the intercepts of a softmax are defined up to a common shift
    torch.testing.assert_close(bs - bs.mean(), b - b.mean(), atol=5e-2, rtol=5e-2)   # raw features: the intercepts are the least determined
    Zt = x[p.test_rows]
    if standardize: Zt = (Zt - x[fit_rows].mean(0)) / x[fit_rows].std(0, unbiased=False)
    pred = (Zt @ W.T + b).argmax(-1)
    assert torch.equal(p.predict(x[p.test_rows]), pred)
    assert p.accuracy == pytest.approx((pred == y[p.test_rows]).double().mean().item())

def test_probe_has_converged_its_gradient_vanishes():
    x, y = _blobs(n=240, d=8, classes=4, seed=5)
    p = linear_probe(x, y, test_frac=0.25, seed=0)
    fit_rows = torch.as_tensor(np.setdiff1d(np.arange(len(x)), p.test_rows.numpy()))
    Z = torch.as_tensor(p.model[0].transform(x[fit_rows].numpy()))
    clf = p.model[-1]
    W, b = torch.tensor(clf.coef_, requires_grad=True), torch.tensor(clf.intercept_, requires_grad=True)
    (F.cross_entropy(Z @ W.T + b, y[fit_rows], reduction='sum') + 0.5 * W.pow(2).sum()).backward()
    # at L-BFGS's stop the projected gradient is below tol = 1e-4 times a scale: a small multiple of that, against rows' terms of order 1
    assert W.grad.abs().max() < 0.05 and b.grad.abs().max() < 0.05, (W.grad.abs().max(), b.grad.abs().max())
    assert p.n_iter < 10_000

def test_probe_equals_the_pipeline_written_out():
    "The probe graphnorm used: a seeded permutation, StandardScaler on the fit rows, LogisticRegression(max_iter=2000)."
    x, y = _blobs(n=101, seed=6)
    for seed in (0, 1):
        idx = np.random.default_rng(seed).permutation(101); m = int(0.5 * 101)
        sc = StandardScaler().fit(x[idx[:m]].numpy())
        clf = LogisticRegression(max_iter=2000).fit(sc.transform(x[idx[:m]].numpy()), y[idx[:m]].numpy())
        ref = clf.score(sc.transform(x[idx[m:]].numpy()), y[idx[m:]].numpy())
        p = linear_probe(x, y, test_frac=0.5, seed=seed)
        assert p.accuracy == pytest.approx(ref, abs=0) and sorted(p.test_rows.tolist()) == sorted(idx[m:].tolist())

def test_probe_split_sizes_follow_scikit_learn():
    x, y = _blobs(n=35)
    for frac in (0.1, 0.25, 0.5, 0.7):
        _, te = train_test_split(np.arange(35), test_size=frac, random_state=0)
        p = linear_probe(x, y, test_frac=frac)
        assert len(p.test_rows) == len(te) and len(set(p.test_rows.tolist())) == len(te)
    assert len(linear_probe(x, y).test_rows) == math.ceil(0.25 * 35)

def test_probe_seed_moves_only_the_split():
    x, y = _blobs()
    a, b, c = linear_probe(x, y, seed=0), linear_probe(x, y, seed=0), linear_probe(x, y, seed=1)
    assert torch.equal(a.test_rows, b.test_rows) and a.accuracy == b.accuracy and not torch.equal(a.test_rows, c.test_rows)

def test_probe_with_a_test_set_and_its_methods():
    x, y = _blobs(n=200, seed=7)
    p = linear_probe(x[:150], y[:150], x[150:], y[150:])
    assert isinstance(p, Probe) and p.test_rows is None
    assert p.accuracy == pytest.approx(p.score(x[150:], y[150:])) and p.train_accuracy == pytest.approx(p.score(x[:150], y[:150]))
    assert p.predict(x[150:]).shape == (50,) and 'accuracy=' in repr(p)
    # labels of any kind scikit-learn classifies
    names = np.array(['a', 'b', 'c'])[y.numpy()]
    q = linear_probe(x[:150], names[:150], x[150:], names[150:])
    assert q.accuracy == pytest.approx(p.accuracy)

def test_probe_separable_classes_are_found():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(80, 3, generator=g)
    y = (x[:, 0] > 0).long()
    x[:, 0] += torch.where(y == 1, 1.0, -1.0)   # a margin of 2 along the first feature
    p = linear_probe(x, y, x, y, C=100.)
    assert p.accuracy == 1.0 and p.train_accuracy == 1.0

def test_probe_reads_any_device_and_dtype_alike():
    x, y = _blobs()
    a = linear_probe(x, y, seed=2)
    b = linear_probe(x.float(), y, seed=2)
    assert torch.equal(a.test_rows, b.test_rows) and a.accuracy == pytest.approx(b.accuracy, abs=1 / len(a.test_rows))
    c = linear_probe(x.numpy(), y.numpy(), seed=2)
    assert c.accuracy == a.accuracy

def test_probe_few_shot_many_classes_does_not_warn():
    x, y = _blobs(n=60, classes=30, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        p = linear_probe(x, y, x, y)
    assert 0 <= p.accuracy <= 1

def test_probe_bad_input():
    x, y = _blobs(n=30)
    with pytest.raises(ShapeError, match='labels have shape'): linear_probe(x, y[:4])
    with pytest.raises(ShapeError, match=r'shape \(30,\)'): linear_probe(x[:, 0], y)
    with pytest.raises(ShapeError, match='2 features'): linear_probe(x, y, x[:, :2], y)
    with pytest.raises(ConfigError, match='test_frac=1.0'): linear_probe(x, y, test_frac=1.0)
    with pytest.raises(ConfigError, match='test_frac=0'): linear_probe(x, y, test_frac=0)
    with pytest.raises(ConfigError, match='both given'): linear_probe(x, y, x, y, test_frac=0.2)
    with pytest.raises(ConfigError, match='without acts_test'): linear_probe(x, y, y_test=y)
    with pytest.raises(ConfigError, match='without y_test'): linear_probe(x, y, x)
    with pytest.raises(ConfigError, match='only one class'): linear_probe(x, torch.zeros(30))
    with pytest.raises(ConfigError, match='C=-1'): linear_probe(x, y, C=-1)
    with pytest.raises(ConfigError, match='max_iter'): linear_probe(x, y, max_iter=0)
    with pytest.raises(ConfigError, match='did not converge'): linear_probe(x, y, max_iter=1)
    with pytest.raises(NotFiniteError, match='acts holds NaN'): linear_probe(x.masked_fill(x > 2, float('nan')), y)
    with pytest.raises(ConfigError, match='all 3 rows'): linear_probe(x[:3], y[:3], test_frac=0.9)
