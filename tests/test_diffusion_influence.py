"""Tests of paper 14 (diffusion influence): per-example gradients against autograd for every measurement and prediction type;
K-FAC of the GGN against the exact GGN from torch.func where K-FAC is exact (one linear layer, one convolution; the diagonal
blocks of a deep linear net); influence with the exact inverse on least squares against the closed-form leave-one-out change;
the LDS and the retraining ceiling against scipy's Spearman on hand-made numbers; measurements against a direct computation;
the training recipe; the shipped asset; models left untouched; typed errors."""
import math
import numpy as np, pytest, torch
from scipy.stats import spearmanr
from torch import nn
from diffusers import DDIMScheduler, DDPMScheduler
from interpkit.errors import ConfigError, NotFiniteError, ShapeError
import interpkit.papers.diffusion_influence as di
import interpkit.demos.diffusion_influence as demo
from interpkit.diffusion import denoiser_forward
from interpkit.grads import grad_modules as influence_modules, project_flat
from interpkit.papers.diffusion_influence import (CURVATURES, DDPM_SCHEDULER, MEASUREMENTS, draws, elbo_weights, measurement_grads, ggn_curvature,
                                                  influence_params, influence_scores, lds, measure, noised, precondition,
                                                  retrain_ceiling, spearman, top_influences, trak_scores)
from interpkit.demos.diffusion_influence import tiny_ddpm, train_influence_demo as train_ddpm

torch.set_num_threads(1)
SCHED = DDPMScheduler(**DDPM_SCHEDULER)

def sched_of(kind):
    return DDPMScheduler(**{**DDPM_SCHEDULER, 'prediction_type': kind})

def ref_terms(model, sched, x, t, eps, measurement):
    "One image's per-draw terms written out from the formulas (float64)."
    ab = sched.alphas_cumprod.double()[t].view(-1, 1, 1, 1)
    xt = ab.sqrt() * x + (1 - ab).sqrt() * eps
    pred = model(xt.to(next(model.parameters()).dtype), t).sample.double()
    kind = sched.config.prediction_type
    if measurement == 'square_norm': return pred.pow(2).mean((1, 2, 3))
    target = {'epsilon': eps, 'sample': x.expand_as(eps), 'v_prediction': ab.sqrt() * eps - (1 - ab).sqrt() * x}[kind]
    if measurement == 'loss': return (pred - target).pow(2).mean((1, 2, 3))
    eps_hat = {'epsilon': pred, 'sample': (xt - ab.sqrt() * pred) / (1 - ab).sqrt(), 'v_prediction': (1 - ab).sqrt() * xt + ab.sqrt() * pred}[kind]
    beta = sched.betas.double()[t]; alpha = 1 - beta
    w = 1000 * beta / (2 * alpha * (1 - ab.flatten()))
    if measurement == 'simplified_elbo': w = w * (t > 0)
    return w * (eps_hat - eps).pow(2).sum((1, 2, 3))

@pytest.mark.parametrize('kind', ['epsilon', 'sample', 'v_prediction'])
@pytest.mark.parametrize('measurement', MEASUREMENTS)
def test_example_grads_equal_autograd(kind, measurement, untouched):
    m = tiny_ddpm(1).double()
    sched = sched_of(kind)
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    k = 6
    seed = next(s for s in range(10_000) if (draws(3, k, (1, 8, 8), 1000, seed=s)[0][:, 0] == 0).any())   # a draw at t = 0: the reconstruction term appears in the ELBO only
    t, eps = draws(3, k, (1, 8, 8), 1000, seed=seed)
    assert (t == 0).any()
    params = influence_params(influence_modules(m))
    with untouched(m):
        got = measurement_grads(m, sched, x, measurement, n_draws=k, seed=seed, batch_size=2 * k)
        vals = measure(m, sched, x, measurement, n_draws=k, seed=4, batch_size=5)
    for i in range(3):
        terms = ref_terms(m, sched, x[i:i + 1], t[i], eps[i].double(), measurement)
        ref = torch.cat([p.flatten() for p in torch.autograd.grad(terms.mean(), params)])
        torch.testing.assert_close(got[i], ref, rtol=1e-9, atol=1e-12 * ref.abs().max().item())
    t2, e2 = draws(3, k, (1, 8, 8), 1000, seed=4)   # measure's own draws
    ref_vals = torch.stack([ref_terms(m, sched, x[i:i + 1], t2[i], e2[i].double(), measurement).mean() for i in range(3)])
    torch.testing.assert_close(vals, ref_vals.detach(), rtol=1e-10, atol=1e-12)

def _conditional_unet():
    "The demo's UNet with two class embeddings (seed 3)."
    from diffusers import UNet2DModel
    from interpkit.train import seeded
    with seeded(3): return UNet2DModel(**{**demo._DIGIT_UNET, **demo.DDPM_UNET, 'num_class_embeds': 2})

def test_conditional_model_gradients_measure_and_curvature(untouched):
    "A class-conditional UNet: each image's label reaches the model in every function."
    m = _conditional_unet().double()
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    y = torch.tensor([0, 1, 1])
    t, eps = draws(3, 4, (1, 8, 8), 1000, seed=0)
    params = influence_params(influence_modules(m))
    with untouched(m):
        got = measurement_grads(m, SCHED, x, 'loss', n_draws=4, batch_size=8, cond=y)
        vals = measure(m, SCHED, x, 'loss', n_draws=4, cond=y)
        other = measure(m, SCHED, x, 'loss', n_draws=4, cond=1 - y)
        op = ggn_curvature(m, SCHED, x, 'kfac', n_draws=2, cond=y)
    for i in range(3):
        ab = SCHED.alphas_cumprod.double()[t[i]].view(-1, 1, 1, 1)
        xt = ab.sqrt() * x[i] + (1 - ab).sqrt() * eps[i].double()
        terms = (m(xt, t[i], class_labels=y[i].expand(4)).sample - eps[i].double()).pow(2).mean((1, 2, 3))
        torch.testing.assert_close(got[i], torch.cat([p.flatten() for p in torch.autograd.grad(terms.mean(), params)]), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(vals[i], terms.mean().detach(), rtol=1e-10, atol=1e-12)
    assert not torch.allclose(vals, other) and op.shape[1] == got.shape[1]
    with pytest.raises(ShapeError, match='one row per image'): measure(m, SCHED, x, cond=y[:2])
    trained = _conditional_unet()
    before = [p.clone() for p in trained.parameters()]
    from interpkit.diffusion import train_ddpm as core_train_ddpm   # the general trainer: any denoiser, scheduler, condition
    out, _, _ = core_train_ddpm(trained, SCHED, x, y, common_draws=True, steps=2, batch_size=None, lr=3e-3, progress=False)
    assert out is trained and not all(torch.equal(a, b) for a, b in zip(before, trained.parameters()))

def test_example_grads_batching_and_chunks_agree():
    m = tiny_ddpm(2)
    x = torch.randn(5, 1, 8, 8)
    a = measurement_grads(m, SCHED, x, 'loss', n_draws=4, seed=1, batch_size=4)    # one image per pass
    b = measurement_grads(m, SCHED, x, 'loss', n_draws=4, seed=1, batch_size=64)   # all at once
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert a.shape == (5, sum(p.numel() for p in influence_params(influence_modules(m))))

def test_draws_stratified_and_independent_of_batching():
    t, e = draws(6, 10, (2, 3), 1000, seed=5)
    assert ((t // 100) == torch.arange(10)).all() and t.dtype == torch.long
    t2, e2 = draws(3, 10, (2, 3), 1000, seed=5, start=3)
    assert torch.equal(t[3:], t2) and torch.equal(e[3:], e2)
    t3, _ = draws(6, 10, (2, 3), 1000, seed=6)
    assert not torch.equal(t, t3)
    assert torch.equal(draws(1, 1000, (1,), 1000)[0][0], torch.arange(1000))   # k = T: every timestep once, the last included
    big = draws(1, 4000, (1,), 1000, seed=0)[0].double()
    assert abs(big.mean().item() - 499.5) < 2 and big.min() >= 0 and big.max() <= 999

def test_elbo_weights_closed_form():
    w = elbo_weights(SCHED)
    beta = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    ab = torch.cumprod(1 - beta, 0)
    torch.testing.assert_close(w, beta / (2 * (1 - beta) * (1 - ab)), rtol=2e-4, atol=0)   # diffusers keeps ᾱ in float32: 1 − ᾱ_0 = β_0 to 1.7e-4
    torch.testing.assert_close(w, beta / (2 * (1 - beta) * (1 - SCHED.alphas_cumprod.double())), rtol=1e-6, atol=0)
    assert abs(w[0].item() / (0.5 / (1 - 1e-4)) - 1) < 2e-4   # t = 0: β/(2αβ) = 1/(2α)

def test_measure_elbo_vs_simplified_differ_by_t0_terms():
    m = tiny_ddpm(3)
    x = torch.randn(2, 1, 8, 8)
    k = 1000   # stratified: every timestep once, t = 0 included
    el, se = measure(m, SCHED, x, 'elbo', n_draws=k), measure(m, SCHED, x, 'simplified_elbo', n_draws=k)
    t, eps = draws(2, k, (1, 8, 8), 1000, seed=0)
    assert (t[:, 0] == 0).all()
    with torch.no_grad():
        r0 = torch.stack([ref_terms(m, SCHED, x[i:i + 1], t[i, :1], eps[i, :1], 'elbo')[0] for i in range(2)]) / k
    torch.testing.assert_close(el - se, r0.double(), rtol=1e-4, atol=1e-6)

def exact_ggn(model, forward, x, t, eps):
    "The GGN of the mean MSE over rows and outputs, (2 / (R D)) Σ_r J_rᵀ J_r, by torch.func."
    from torch.func import functional_call, jacrev
    params = dict(model.named_parameters())
    xt = noised(SCHED, x, t, eps)
    def out(p): return forward_f(p).flatten()
    def forward_f(p): return functional_call(model, p, (xt,)).flatten(1)
    J = jacrev(out)(params)
    J = torch.cat([J[n].flatten(1) for n in params], 1)   # (R·D, P)
    R, D = xt.shape[0], xt[0].numel()
    return 2 * J.T @ J / (R * D)

def _linear_denoiser():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.Unflatten(1, (1, 4, 4))).double()

def _conv_denoiser():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 1, 3, padding=1)).double()

def _deep_linear():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.Linear(6, 16), nn.Unflatten(1, (1, 4, 4))).double()

def _rows(n, samples, seed=2):
    x = torch.randn(n, 1, 4, 4, dtype=torch.float64)
    t, eps = draws(n, samples, (1, 4, 4), 1000, seed=seed)
    return x, x.repeat_interleave(samples, 0), t.flatten(), eps.flatten(0, 1).double()

fwd = lambda model, x, t: model(x)

@pytest.mark.parametrize('make', [_linear_denoiser, _conv_denoiser])
def test_kfac_type2_equals_exact_ggn_for_one_layer(make, untouched):
    m = make()
    x, xr, t, eps = _rows(5, 3)
    with untouched(m):
        op = ggn_curvature(m, SCHED, x, 'kfac', n_draws=3, fisher_type='type-2', seed=2, forward=fwd, batch_size=4)
        dense = op @ torch.eye(op.shape[1], dtype=torch.float64)
    G = exact_ggn(m, fwd, xr, t, eps)
    torch.testing.assert_close(dense, G, rtol=1e-10, atol=1e-12 * G.abs().max().item())
    ek = ggn_curvature(m, SCHED, x, 'ekfac', n_draws=3, fisher_type='type-2', seed=2, forward=fwd, batch_size=4)
    torch.testing.assert_close(ek @ torch.eye(op.shape[1], dtype=torch.float64), G, rtol=1e-8, atol=1e-10 * G.abs().max().item())   # EK-FAC refits eigenvalues: still exact here

def test_kfac_exact_on_the_diagonal_blocks_of_a_deep_linear_net():
    m = _deep_linear()
    x, xr, t, eps = _rows(6, 2)
    op = ggn_curvature(m, SCHED, x, 'kfac', n_draws=2, fisher_type='type-2', seed=2, forward=fwd)
    dense = op @ torch.eye(op.shape[1], dtype=torch.float64)
    G = exact_ggn(m, fwd, xr, t, eps)
    b = 16 * 6 + 6   # first layer's weight and bias
    torch.testing.assert_close(dense[:b, :b], G[:b, :b], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(dense[b:, b:], G[b:, b:], rtol=1e-9, atol=1e-12)
    assert dense[:b, b:].abs().max() == 0 and G[:b, b:].abs().max() > 1e-3   # K-FAC drops the cross-layer blocks

def test_kfac_mc_estimates_the_ggn():
    "One sampled target per row: for one linear layer K-FAC-MC is A ⊗ B̂ against the GGN's A ⊗ B, B̂/B a Wishart(R, I_D)/R matrix."
    from scipy.stats import chi2
    m = _linear_denoiser()
    x, xr, t, eps = _rows(200, 4)
    op = ggn_curvature(m, SCHED, x, 'kfac', n_draws=4, fisher_type='mc', seed=2, forward=fwd, batch_size=256)
    dense = op @ torch.eye(op.shape[1], dtype=torch.float64)
    G = exact_ggn(m, fwd, xr, t, eps)
    R, D = len(xr), 16
    rel = (dense - G).norm() / G.norm()   # = ‖Ŝ − I‖_F / √D for Ŝ ~ Wishart(R, I)/R: rel² has mean (D + 1)/R (rel ≈ 0.146 on average)
    # R‖Ŝ − I‖²_F / 2 is close to χ² with D(D+1)/2 = 136 degrees of freedom (a simulation of 1e5 draws agrees to 1% at the
    # 1e-4 quantile): a correct estimator gives rel > 0.2 with probability about 2e-9
    assert rel < 0.2, rel
    ratio = (dense.trace() / G.trace()).item()   # tr Ŝ / D is exactly χ²_(RD) / (RD)
    lo, hi = chi2(R * D).ppf(5e-8) / (R * D), chi2(R * D).isf(5e-8) / (R * D)   # [0.935, 1.068]: outside with probability 1e-7
    assert lo < ratio < hi, ratio

def test_influence_with_exact_inverse_matches_leave_one_out_least_squares(untouched):
    "Least squares y = w·x: the first-order change score_i / N equals the exact leave-one-out change of a query's loss."
    from curvlinops import KFACLinearOperator
    g = torch.Generator().manual_seed(0)
    N, d = 400, 4
    X = torch.randn(N, d, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1., -2., 0.5, 3.], dtype=torch.float64) + 0.5 * torch.randn(N, generator=g, dtype=torch.float64)
    w = torch.linalg.solve(X.T @ X, X.T @ y)
    xq, yq = torch.randn(d, generator=g, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)
    r = X @ w - y
    train_grads = 2 * r[:, None] * X   # ∇ (w·x_i − y_i)²
    query_grads = (2 * (xq @ w - yq) * xq)[None]
    H = 2 * X.T @ X / N   # Hessian of the mean loss (= its GGN)
    scores = influence_scores(query_grads, train_grads, H, damping=1e-12)[0]
    lin = nn.Linear(d, 1, bias=False).double()
    with torch.no_grad(): lin.weight.copy_(w[None])
    with untouched(lin):
        op = KFACLinearOperator(lin, nn.MSELoss(), [lin.weight], [(X, y[:, None])], fisher_type='type-2', check_deterministic=False)
    torch.testing.assert_close(influence_scores(query_grads, train_grads, op, damping=1e-12)[0], scores, rtol=1e-8, atol=1e-10)   # K-FAC is exact here
    exact = []
    for i in range(N):
        keep = torch.arange(N) != i
        wi = torch.linalg.solve(X[keep].T @ X[keep], X[keep].T @ y[keep])
        exact.append((xq @ wi - yq) ** 2 - (xq @ w - yq) ** 2)
    exact = torch.stack(exact)
    pred = scores / N
    assert spearmanr(pred, exact).statistic > 0.999
    torch.testing.assert_close(pred, exact, rtol=0.05, atol=0.02 * exact.abs().max().item())   # first order: the leverage terms are O(1/N)

def test_precondition_identity_dense_and_kfac_agree_on_one_layer():
    m = _linear_denoiser()
    x, xr, t, eps = _rows(4, 3)
    op = ggn_curvature(m, SCHED, x, 'kfac', n_draws=3, fisher_type='type-2', seed=2, forward=fwd)
    G = exact_ggn(m, fwd, xr, t, eps)
    v = torch.randn(3, G.shape[0], dtype=torch.float64)
    for lam in (1e-4, 1e-1):
        ref = torch.linalg.solve(G + lam * torch.eye(len(G), dtype=G.dtype), v.T).T
        torch.testing.assert_close(precondition(op, v, lam), ref, rtol=1e-6, atol=1e-8 * ref.abs().max().item())
        torch.testing.assert_close(precondition(G, v, lam), ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(precondition(None, v, 0.5), v / 0.5)

def test_trak_scores_match_a_direct_computation():
    g = torch.Generator().manual_seed(1)
    gq, gt = torch.randn(3, 50, generator=g), torch.randn(7, 50, generator=g)
    lam = 0.3
    for dim in (4, 16):   # fewer dimensions than examples, and more (the N × N form)
        Pm = torch.randn(50, dim, generator=torch.Generator().manual_seed(5 * 1_000_003), dtype=torch.float64) / math.sqrt(dim)   # the projection: one chunk
        phi, phq = gt.double() @ Pm, gq.double() @ Pm
        ref = phq @ torch.linalg.inv(phi.T @ phi + lam * torch.eye(dim, dtype=torch.float64)) @ phi.T
        torch.testing.assert_close(trak_scores(gq, gt, dim=dim, damping=lam, seed=5), ref, rtol=1e-8, atol=1e-10)

def test_project_preserves_inner_products_and_rows():
    g = torch.randn(4, 300, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    p = project_flat(g, dim=6000, seed=3)
    ref = g @ g.T
    # Johnson-Lindenstrauss: E[R Rᵀ] / dim = I, and the error of a projected u·v has variance (|u|²|v|² + (u·v)²) / dim; its exact
    # law (a difference of two scaled χ²_dim) exceeds 6 standard deviations with probability below 4e-9 for dim = 6000
    n2 = g.norm(dim=1) ** 2
    sd = ((n2[:, None] * n2[None] + ref ** 2) / 6000).sqrt()
    assert ((p @ p.T - ref).abs() < 6 * sd).all(), ((p @ p.T - ref) / sd).abs().max()
    torch.testing.assert_close(project_flat(g[2:], dim=6000, seed=3), p[2:])   # a row's projection does not depend on the others
    assert not torch.equal(project_flat(g, dim=6000, seed=4), p)
    ref = g[:1] @ torch.linalg.inv(g.T @ g + 0.5 * torch.eye(300, dtype=torch.float64)) @ g.T   # dim=None: the gradients as they are
    torch.testing.assert_close(trak_scores(g[:1], g, dim=None, damping=0.5), ref, rtol=1e-8, atol=1e-10)

def test_spearman_lds_and_ceiling_against_scipy():
    g = np.random.default_rng(0)
    a, b = g.normal(size=(12, 3)), g.normal(size=(12, 3))
    b[:, 1] = np.round(b[:, 1])   # ties
    got = spearman(torch.tensor(a), torch.tensor(b))
    for q in range(3): assert abs(got[q].item() - spearmanr(a[:, q], b[:, q]).statistic) < 1e-12
    assert abs(spearman(torch.tensor(a[:, 0]), torch.tensor(b[:, 0])).item() - got[0].item()) < 1e-12   # vectors
    assert spearman(torch.tensor(a[:, :1]), torch.tensor(b[:, :1])).shape == (1,)   # one column
    assert abs(spearman(torch.tensor([1., 2.]), torch.tensor([3., 1.])).item() + 1) < 1e-12   # two points
    with pytest.raises(ShapeError): spearman(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ShapeError): spearman(torch.zeros(1), torch.zeros(1))
    scores = torch.tensor([[1., 0., 3., -1.], [0.5, 2., 0., 0.]])
    keep = torch.tensor([[True, False, True, False], [False, True, True, True], [True, True, False, False], [False, False, True, True], [True, True, True, False]])
    actual = torch.tensor([[3., 1.], [0., 4.], [5., 0.], [2., 2.], [1., 1.5]])
    r = lds(scores, keep, actual)
    pred = np.array([[-1., 2.], [1., 0.5], [2., 0.], [1., 2.5], [-1., 0.]])   # sums of left-out scores, by hand
    np.testing.assert_allclose(r.predicted.numpy(), pred)
    ref = [spearmanr(pred[:, q], actual[:, q].numpy()).statistic for q in range(2)]
    np.testing.assert_allclose(r.per_query.numpy(), ref, atol=1e-12)
    assert abs(r.score - np.mean(ref)) < 1e-12
    seeds = torch.stack([actual, actual + torch.tensor([[0.1, 0.], [0., 0.], [0., 0.2], [0.3, 0.], [0., 0.]]), actual.flip(0)])
    assert abs(lds(scores, keep, seeds).score - lds(scores, keep, seeds.mean(0)).score) < 1e-12
    seeds = torch.tensor(g.normal(size=(3, 9, 2)))   # no ties: a mean of other seeds' values can break a tie by round-off
    c = retrain_ceiling(seeds)
    refc = np.mean([[spearmanr(seeds[s, :, q], (seeds.sum(0) - seeds[s])[:, q] / 2).statistic for q in range(2)] for s in range(3)])
    assert abs(c.score - refc) < 1e-12

def test_top_influences_and_scores_identity():
    gq, gt = torch.randn(2, 9), torch.randn(6, 9)
    s = influence_scores(gq, gt, None, damping=2.)
    torch.testing.assert_close(s, (gq.double() @ gt.double().T) / 2)
    pos, neg = top_influences(s, 1, top_k=3)
    assert pos.tolist() == s[1].argsort(descending=True)[:3].tolist() and neg.tolist() == s[1].argsort()[:3].tolist()

def test_train_ddpm_learns_and_keeps_common_noise():
    x = demo.demo_images()[:40]
    before = measure(tiny_ddpm(0), SCHED, x[:8], 'loss', n_draws=16)
    m1, tok, res = train_ddpm(x, steps=60, lr=3e-3, progress=False)
    assert tok is None and not m1.training
    after = measure(m1, SCHED, x[:8], 'loss', n_draws=16)
    assert after.mean() < 0.5 * before.mean(), (before.mean(), after.mean())
    assert res.history['loss'].iloc[-10:].mean() < res.history['loss'].iloc[:10].mean()
    keep = torch.arange(40) % 3 != 0
    a = train_ddpm(x, keep, steps=4, seed=1, progress=False)[0]
    b = train_ddpm(x[keep], None, steps=4, seed=1, progress=False)[0]   # same rows, but other draws: the draws are per image index
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    x2 = x.clone(); x2[~keep] = 0.
    c = train_ddpm(x2, keep, steps=4, seed=1, progress=False)[0]   # rows left out never matter
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    d = train_ddpm(x, keep, steps=4, seed=1, batch_size=5, progress=False)[0]
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), d.parameters()))

def test_tool_recipe_reproduces_a_shipped_retraining():
    "Subset 0 with seed 1 for 600 steps, as the tool trains it, against the asset's measurement of that model."
    import sys
    sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parent.parent / 'tools'))
    import make_diffusion_influence_assets as tool
    res, meta = demo.load_retraining(), demo.load_influence_demo()[2]
    x = demo.demo_images()
    assert torch.equal(tool.keep_masks(len(x)), res.keep)
    m = train_ddpm(x, res.keep[0], steps=meta['steps'], lr=meta['lr'], seed=1, progress=False)[0]
    got = measure(m, SCHED, res.queries[:4], 'loss', n_draws=meta['measure_k'], seed=meta['measure_seed'], batch_size=1024)
    torch.testing.assert_close(got.float(), res.subsets['loss'][1, 0, :4], rtol=2e-3, atol=1e-5)   # measured: equal with AVX-512, within 1.6e-7 (relative) with AVX2 or no vector instructions

def test_shipped_asset_reproduces_a_measurement():
    unet, tok, meta = demo.load_influence_demo()
    t, sched, x = demo.load_retraining(), DDPMScheduler(**meta['scheduler']), demo.demo_images()
    assert tok is None
    assert t.keep.shape == (meta['subsets'], len(x)) and (t.keep.sum(1) == len(x) // 2).all()
    full = measure(unet, sched, t.queries[:3], 'loss', n_draws=meta['measure_k'], seed=meta['measure_seed'], batch_size=1024)
    torch.testing.assert_close(full.float(), t.full['loss'][0, :3], rtol=1e-4, atol=1e-6)   # the seed-0 model's measurement, recomputed (measured: equal with AVX-512, AVX2 and no vector instructions)

def test_untouched_frozen_train_mode_model(untouched):
    m = tiny_ddpm(4).train()
    for p in m.parameters(): p.requires_grad_(False)
    x = torch.randn(3, 1, 8, 8)
    with untouched(m):
        g = measurement_grads(m, SCHED, x, 'loss', n_draws=2)
        op = ggn_curvature(m, SCHED, x, 'kfac', n_draws=2)
        measure(m, SCHED, x, 'elbo', n_draws=2)
        influence_scores(g, g, op, 1e-3)
    assert torch.isfinite(g).all() and g.abs().sum() > 0

def test_other_scheduler_and_bfloat16():
    m = tiny_ddpm(5).to(torch.bfloat16)
    x = torch.randn(2, 1, 8, 8)
    ddim = DDIMScheduler(**{k: v for k, v in DDPM_SCHEDULER.items()})
    g = measurement_grads(m, ddim, x, 'loss', n_draws=2)
    assert g.dtype == torch.float32 and torch.isfinite(g).all()
    assert torch.isfinite(measure(m, ddim, x, 'elbo', n_draws=4)).all()

def test_schedule_without_betas_and_noised_dtype():
    class NoBetas:   # a scheduler that keeps only ᾱ: β is recovered from it
        alphas_cumprod, config = SCHED.alphas_cumprod, {'prediction_type': 'epsilon'}
    s = di._schedule(NoBetas())
    torch.testing.assert_close(s['beta'], SCHED.betas.double(), rtol=2e-3, atol=1e-7)   # float32 ᾱ: β to its round-off
    torch.testing.assert_close(s['alpha_bar'], SCHED.alphas_cumprod.double())
    x, eps = torch.randn(3, 1, 8, 8), torch.randn(3, 1, 8, 8)
    assert noised(SCHED, x, torch.tensor([0, 5, 999]), eps).dtype == torch.float32
    assert noised(SCHED, x.double(), torch.tensor([0, 5, 999]), eps.double()).dtype == torch.float64

def test_vectors_single_images_and_an_mlp_denoiser(untouched):
    "Images need not be (N, C, H, W): an MLP denoiser on vectors, and a single image."
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 6)).double()
    f = lambda model, x, t: model(x)
    x = torch.randn(4, 6, dtype=torch.float64)
    params = influence_params(influence_modules(mlp))
    with untouched(mlp):
        g = measurement_grads(mlp, SCHED, x, 'loss', n_draws=3, forward=f)
        one = measure(mlp, SCHED, x[:1], 'loss', n_draws=3, forward=f)
        op = ggn_curvature(mlp, SCHED, x, n_draws=2, forward=f)
    t, eps = draws(4, 3, (6,), 1000, seed=0)
    for i in range(4):
        ab = SCHED.alphas_cumprod.double()[t[i]][:, None]
        terms = (mlp(ab.sqrt() * x[i] + (1 - ab).sqrt() * eps[i].double()) - eps[i].double()).pow(2).mean(1)
        torch.testing.assert_close(g[i], torch.cat([p.flatten() for p in torch.autograd.grad(terms.mean(), params)]), rtol=1e-9, atol=1e-12)
        if i == 0: torch.testing.assert_close(one[0], terms.mean().detach())
    assert op.shape[1] == g.shape[1]

def test_curvature_defaults_and_half_precision_model(untouched):
    m = tiny_ddpm(7)
    gen = torch.Generator().manual_seed(0)   # seeded: the bf16-against-float32 similarity below depends on the images and vectors
    x = torch.randn(4, 1, 8, 8, generator=gen)
    v = torch.randn(2, sum(p.numel() for p in influence_params(influence_modules(m))), generator=gen)
    a = precondition(ggn_curvature(m, SCHED, x), v, 1e-3)
    b = precondition(ggn_curvature(m, SCHED, x, 'kfac', n_draws=4, fisher_type='mc', seed=0, batch_size=256), v, 1e-3)
    torch.testing.assert_close(a, b)   # the documented defaults
    h = tiny_ddpm(7).to(torch.bfloat16)
    with untouched(h):   # factors in float32 on a copy: the model keeps its dtype
        c = precondition(ggn_curvature(h, SCHED, x, modules=influence_modules(h)), v, 1e-3)
    assert next(h.parameters()).dtype == torch.bfloat16 and c.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(a.flatten(), c.flatten(), dim=0) > 0.9   # bf16 weights and inputs: close to float32's
    sub = dict(list(influence_modules(h).items())[:3])   # a subset of the layers, given as the bf16 model's modules
    P = sum(p.numel() for p in influence_params(sub))
    with untouched(h): G = ggn_curvature(h, SCHED, x, modules=sub)
    assert G.shape == (P, P) and P < v.shape[1]

def test_documented_defaults():
    "Defaults a user relies on without passing them: the demo's recipe (as in the asset's meta), the draws' seed, damping, projection."
    import inspect
    meta = demo.load_influence_demo()[2]
    d = {k: v.default for k, v in inspect.signature(train_ddpm).parameters.items()}
    assert (d['steps'], d['lr'], d['seed'], d['batch_size'], d['progress']) == (meta['steps'], meta['lr'], 0, None, True)
    assert all(torch.equal(a, b) for a, b in zip(draws(2, 3, (1,), 10), draws(2, 3, (1,), 10, seed=0)))
    assert all(torch.equal(a, b) for a, b in zip(tiny_ddpm().parameters(), tiny_ddpm(0).parameters()))
    gq, gt = torch.randn(2, 5000), torch.randn(3, 5000)
    torch.testing.assert_close(influence_scores(gq, gt), influence_scores(gq, gt, None, 1e-3))
    torch.testing.assert_close(trak_scores(gq, gt), trak_scores(gq, gt, dim=2048, damping=1e-3, seed=0))
    m, x1 = tiny_ddpm(0), torch.randn(1, 1, 8, 8)
    torch.testing.assert_close(measure(m, SCHED, x1), measure(m, SCHED, x1, 'loss', n_draws=256, seed=0))
    assert measure(m, SCHED, x1, n_draws=1).shape == (1,)
    p = project_flat(gt)
    assert p.shape == (3, 2048)
    torch.testing.assert_close(p, project_flat(gt, dim=2048, seed=0))
    R = torch.cat([torch.randn(n, 2048, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i, n in ((0, 4096), (4096, 904))])   # slice i seeded seed·1000003 + i
    torch.testing.assert_close(p, gt.double() @ R / math.sqrt(2048))
    assert project_flat(gt, dim=1).shape == (3, 1)
    with pytest.raises(ConfigError, match='dim'): project_flat(gt, dim=0)

def test_denoiser_forward_reads_every_output_kind():
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([3, 4])
    pred = torch.randn(2, 1, 8, 8)
    assert denoiser_forward(lambda x, t: pred, x, t) is pred
    assert denoiser_forward(lambda x, t: (pred, 'extra'), x, t) is pred   # diffusers with return_dict=False
    assert denoiser_forward(lambda x, t: type('Out', (), {'sample': pred})(), x, t) is pred
    seen = {}
    def model(x, t, **kw): seen.update(kw); return pred
    denoiser_forward(model, x, t, torch.tensor([0, 1])); assert set(seen) == {'class_labels'}
    seen.clear(); denoiser_forward(model, x, t, torch.zeros(2, 3, 4)); assert set(seen) == {'encoder_hidden_states'}

def test_typed_errors():
    m = tiny_ddpm(6)
    x = torch.randn(2, 1, 8, 8)
    g = torch.randn(2, 10)
    for bad in (0., -1., float('nan'), '1e-3'):
        with pytest.raises(ConfigError, match='damping'): influence_scores(g, g, None, bad)
        with pytest.raises(ConfigError, match='damping'): trak_scores(g, g, dim=4, damping=bad)
    with pytest.raises(ShapeError, match='columns'): influence_scores(torch.randn(2, 11), g)
    with pytest.raises(ShapeError, match='rows, P'): influence_scores(g.tolist(), g)
    with pytest.raises(ShapeError, match='float tensor'): measure(m, SCHED, x.tolist())
    with pytest.raises(ShapeError, match='float tensor'): measure(m, SCHED, x[:0])
    for bad in ([True, False], torch.ones(2), torch.ones(3, dtype=torch.bool)):
        with pytest.raises(ShapeError, match='keep'): train_ddpm(x, bad, steps=1, progress=False)
    with pytest.raises(ShapeError, match='square'): precondition(torch.ones(9, 10), g, 1.)
    nan = g.clone(); nan[1, 3] = float('nan')
    with pytest.raises(NotFiniteError, match='1 NaN'): influence_scores(nan, g)
    with pytest.raises(NotFiniteError): influence_scores(g, nan)
    with pytest.raises(ConfigError, match='measurement'): measure(m, SCHED, x, 'likelihood')
    with pytest.raises(ConfigError, match='n_draws'): measurement_grads(m, SCHED, x, n_draws=0)
    with pytest.raises(ShapeError, match='float tensor'): measurement_grads(m, SCHED, torch.ones(2, 1, 8, 8, dtype=torch.long))
    with pytest.raises(NotFiniteError): measure(m, SCHED, x * float('nan'))
    with pytest.raises(ConfigError, match='alphas_cumprod'): measure(m, object(), x)
    with pytest.raises(ConfigError, match='alphas_cumprod'): measure(m, type('NoConfig', (), {'alphas_cumprod': torch.ones(3)})(), x)
    with pytest.raises(ConfigError, match='alphas_cumprod'): measure(m, type('NoSchedule', (), {'config': {}})(), x)
    flow = type('Flow', (), {'alphas_cumprod': torch.ones(3), 'config': {'prediction_type': 'flow'}})()
    with pytest.raises(ConfigError, match='prediction_type'): measure(m, flow, x)
    with pytest.raises(ConfigError, match='kind'): ggn_curvature(m, SCHED, x, 'hessian')
    with pytest.raises(ShapeError, match='keep'): lds(torch.zeros(1, 4), torch.ones(3, 5, dtype=torch.bool), torch.zeros(3, 1))
    with pytest.raises(ShapeError, match='keep'): lds(torch.zeros(4), torch.ones(3, 4, dtype=torch.bool), torch.zeros(3, 4))   # scores must be (Q, N), even when the other shapes would fit
    with pytest.raises(ShapeError, match='S >= 2'): retrain_ceiling(torch.zeros(1, 3, 2))
    with pytest.raises(ConfigError, match='nope'): influence_modules(m, ['nope'])
    nan_model = tiny_ddpm(6)
    with torch.no_grad(): nan_model.conv_out.bias.fill_(float('nan'))
    with pytest.raises(NotFiniteError): measurement_grads(nan_model, SCHED, x, n_draws=2)
    with pytest.raises(ConfigError, match='top_k'): top_influences(torch.zeros(1, 4), 0, top_k=9)

# ---------------------------------------------------------------- issue 49: a damping fixed relative to the curvature

def test_mean_eigenvalue_against_dense_eigenvalues_and_the_exact_ggn():
    from interpkit.papers.diffusion_influence import mean_eigenvalue
    m = _deep_linear()
    x, xr, t, eps = _rows(6, 2)
    for kind in CURVATURES:   # the operator's trace (from its factors) against the eigenvalues of its dense matrix
        op = ggn_curvature(m, SCHED, x, kind, n_draws=2, fisher_type='type-2', seed=2, forward=fwd)
        dense = (op @ torch.eye(op.shape[1], dtype=torch.float64)).numpy()
        assert mean_eigenvalue(op) == pytest.approx(np.linalg.eigvalsh((dense + dense.T) / 2).mean(), rel=1e-9)
    # K-FAC keeps the diagonal blocks of the GGN exactly (for this net, see above): so its mean eigenvalue is the exact GGN's
    G = exact_ggn(m, fwd, xr, t, eps)
    assert mean_eigenvalue(ggn_curvature(m, SCHED, x, 'kfac', n_draws=2, fisher_type='type-2', seed=2, forward=fwd)) == pytest.approx(torch.linalg.eigvalsh(G).mean().item(), rel=1e-9)
    phi = torch.randn(9, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)   # TRAK's features: mean eigenvalue of PhiᵀPhi / N
    assert mean_eigenvalue(phi.T @ phi / 9) == pytest.approx(float((np.linalg.svd(phi.numpy(), compute_uv=False) ** 2).sum()) / (9 * 4), rel=1e-12)
    with pytest.raises(ShapeError, match='square'): mean_eigenvalue(phi)
    with pytest.raises(ConfigError, match='ggn_curvature'): mean_eigenvalue([[1.0]])
    with pytest.raises(NotFiniteError): mean_eigenvalue(torch.tensor([[float('nan')]]))


# ---------------------------------------------------------------- issue 50: the old names still work, with a FutureWarning

def test_old_argument_names_warn_and_still_work():
    m, x = tiny_ddpm(0), torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.warns(FutureWarning, match='n_draws'): old = measure(m, SCHED, x, k=3)
    torch.testing.assert_close(old, measure(m, SCHED, x, n_draws=3))
    with pytest.warns(FutureWarning, match='n_draws'): old = measurement_grads(m, SCHED, x, k=2)
    torch.testing.assert_close(old, measurement_grads(m, SCHED, x, n_draws=2))
    with pytest.warns(FutureWarning, match='n_draws'): old = draws(2, k=3, shape=(1,), timesteps=10)
    assert all(torch.equal(a, b) for a, b in zip(old, draws(2, 3, (1,), 10)))
    with pytest.warns(FutureWarning, match='n_draws'): old = ggn_curvature(m, SCHED, x, samples=1)
    assert old.shape == ggn_curvature(m, SCHED, x, n_draws=1).shape
    s = torch.tensor([[0.5, -2., 3., 0.]])
    with pytest.warns(FutureWarning, match='top_k'): old = top_influences(s, 0, k=2)
    assert [a.tolist() for a in old] == [a.tolist() for a in top_influences(s, 0, top_k=2)]

@pytest.mark.parametrize('old, new', [('DDPM_UNET', demo.DDPM_UNET), ('DIGIT_CLASSES', demo.DIGIT_CLASSES), ('tiny_ddpm', demo.tiny_ddpm),
                                      ('train_ddpm', demo.train_influence_demo), ('DEMO_ASSET', demo.DEMO_ASSET), ('demo_images', demo.demo_images),
                                      ('load_influence_demo', demo.load_influence_demo), ('retraining_results', demo.retraining_results),
                                      ('influence_modules', influence_modules), ('project', project_flat)])
def test_moved_names_warn_and_resolve(old, new):
    with pytest.warns(FutureWarning, match=old): got = getattr(di, old)
    assert got is new

def test_moved_helpers_give_the_old_results():
    "The demo's model, images and asset as the paper module gave them; the core's denoiser call and prediction types."
    m = tiny_ddpm(0)
    assert sum(p.numel() for p in m.parameters()) == 41_609 and m.config.block_out_channels == (8, 16) and m.config.num_class_embeds is None
    x, y = demo.demo_images(), demo.demo_labels()
    from sklearn.datasets import load_digits   # the 0s and 1s of the digits, found again without interpkit.data
    d = load_digits()
    assert x.shape == (269, 1, 8, 8) and set(y.tolist()) == {0, 1}
    assert all(any(torch.equal(img[0], torch.tensor(r, dtype=torch.float32).view(8, 8) / 8 - 1) for r in d.data[d.target == int(lab)]) for img, lab in zip(x[:5], y[:5]))
    unet, tok, meta = demo.load_influence_demo()
    assert tok is None and not unet.training and meta['unet'] == {k: list(v) if isinstance(v, tuple) else v for k, v in demo.DDPM_UNET.items()}
    assert di.PREDICTION_TYPES == ('epsilon', 'sample', 'v_prediction') and di.denoiser_forward is denoiser_forward

def test_old_retraining_results_is_the_flat_dict_of_load_retraining():
    new = demo.load_retraining()
    with pytest.warns(FutureWarning, match='load_retraining'): old = demo.retraining_results()
    assert set(old) == {'keep', 'queries'} | {f'subsets.{m}' for m in new.subsets} | {f'full.{m}' for m in new.full} | {f'removal.{k}' for k in new.removal}
    assert torch.equal(old['keep'], new.keep) and torch.equal(old['queries'], new.queries)
    assert all(torch.equal(old[f'subsets.{m}'], v) for m, v in new.subsets.items()) and all(torch.equal(old[f'removal.{k}'], v) for k, v in new.removal.items())

# ---------------------------------------------------------------- issue 51: conditions and arguments a UNet cannot take

def _cross_attention_unet():
    from diffusers import UNet2DConditionModel
    from interpkit.train import seeded
    with seeded(4): return UNet2DConditionModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16), norm_num_groups=4,
                                                down_block_types=('CrossAttnDownBlock2D', 'DownBlock2D'), up_block_types=('UpBlock2D', 'CrossAttnUpBlock2D'), cross_attention_dim=8, attention_head_dim=2)

def test_conditions_a_unet_cannot_take_are_refused_by_every_entry_point(untouched):
    "Class labels to an unconditional UNet gave diffusers' ValueError ('class_embedding needs to be initialized'); now a ConfigError that says to pass cond=None, in measure, measurement_grads and ggn_curvature."
    x, y = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 1])
    plain, labelled, cross = tiny_ddpm(6), _conditional_unet(), _cross_attention_unet()
    calls = (lambda m, c: measure(m, SCHED, x, n_draws=2, cond=c), lambda m, c: measurement_grads(m, SCHED, x, n_draws=2, cond=c),
             lambda m, c: ggn_curvature(m, SCHED, x, n_draws=2, cond=c))
    with untouched(plain, labelled, cross):
        for f in calls:
            for c in (y, torch.randn(3, 4)):
                with pytest.raises(ConfigError, match=r'for an unconditional UNet2DModel \(num_class_embeds=None.*Pass cond=None'): f(plain, c)
            for c in (None, torch.randn(3)):
                with pytest.raises(ConfigError, match=r'for a class-conditional UNet2DModel \(num_class_embeds=2\).*integers \(N,\) from 0 to 1'): f(labelled, c)
            for c in (torch.tensor([0, 2, 1]), torch.tensor([0, -1, 1])):
                with pytest.raises(ConfigError, match=r'class label\(s\) \[(2|-1)\] for a UNet2DModel with num_class_embeds=2'): f(labelled, c)
            for c in (None, y):
                with pytest.raises(ConfigError, match=r'UNet2DConditionModel, which is conditioned on embeddings.*\(N, sequence, 8\)'): f(cross, c)
        emb = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(1))
        got = measure(cross, SCHED, x, n_draws=2, cond=emb)
        own = measure(plain, SCHED, x, n_draws=3, cond=y, forward=lambda m, xt, t, c: m(xt, t).sample)   # a forward of one's own is not second-guessed
    t, eps = draws(3, 2, (1, 8, 8), 1000, seed=0)
    with torch.no_grad():
        for i in range(3):
            ab = SCHED.alphas_cumprod[t[i]].view(-1, 1, 1, 1)
            ref = (cross(ab.sqrt() * x[i] + (1 - ab).sqrt() * eps[i], t[i], encoder_hidden_states=emb[i].expand(2, -1, -1)).sample - eps[i]).pow(2).mean((1, 2, 3)).mean()
            torch.testing.assert_close(got[i].float(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(own, measure(plain, SCHED, x, n_draws=3))

def test_images_of_another_shape_and_counts_that_meant_something_else():
    m, x = tiny_ddpm(6), torch.randn(2, 1, 8, 8)
    with pytest.raises(ShapeError, match=r'shape=\(3, 8, 8\) .*in_channels=1'): measure(m, SCHED, torch.randn(2, 3, 8, 8))   # was conv2d's RuntimeError
    with pytest.raises(ShapeError, match=r'shape=\(1, 7, 7\).*divisible by 2'): measurement_grads(m, SCHED, torch.randn(2, 1, 7, 7), n_draws=2)   # was torch.cat's RuntimeError
    for seed in ('a', 1.5, True):
        with pytest.raises(ConfigError, match=f'seed={seed!r}'): measure(m, SCHED, x, n_draws=2, seed=seed)
        with pytest.raises(ConfigError, match=f'seed={seed!r}'): trak_scores(torch.ones(2, 4), torch.ones(2, 4), dim=2, seed=seed)
    for args, name in (((0, 4, (1,), 1000), 'n=0'), ((2, 0, (1,), 1000), 'n_draws=0'), ((2, 4, (1,), 0), 'timesteps=0')):   # n_draws=0 or timesteps=0 drew nothing or t = -1
        with pytest.raises(ConfigError, match=name): draws(*args)
    z = torch.zeros(2, 1, 8, 8)
    torch.testing.assert_close(noised(SCHED, z + 1, torch.tensor([0, 999]), z), SCHED.alphas_cumprod[[0, 999]].sqrt().view(-1, 1, 1, 1).expand(2, 1, 8, 8))
    for t in (torch.tensor([5, -1]), torch.tensor([5, 1000]), torch.tensor([5., 6.])):   # -1 was silently the last timestep
        with pytest.raises(ConfigError, match='Integer timesteps from 0 to 999'): noised(SCHED, z, t, z)
    s = torch.tensor([[0.5, -1., 2., 0.]])
    for q in (True, 0.0):   # True was row 1
        with pytest.raises(ConfigError, match=f'query={q}'): top_influences(s, q, top_k=1)
    assert [v.tolist() for v in top_influences(s.tolist(), 0, top_k=2)] == [[2, 0], [1, 3]]
    with pytest.raises(NotFiniteError, match='scores of query 0'): top_influences(torch.tensor([[float('nan'), 1., 2.]]), 0, top_k=1)   # NaN sorted first as the most positive
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ConfigError, match='damping=True'): influence_scores(g, g, None, True)
    with pytest.raises(ConfigError, match='curvature is a list'): precondition([[1.]], g, 1.)
    with pytest.raises(NotFiniteError, match='actual'): retrain_ceiling(torch.full((2, 3, 2), float('nan')))
    with pytest.raises(NotFiniteError): spearman(torch.tensor([1., float('nan'), 3.]), torch.tensor([1., 2., 3.]))
    scores, actual = torch.randn(2, 4, generator=torch.Generator().manual_seed(3)), torch.randn(5, 2, generator=torch.Generator().manual_seed(4))
    keep = torch.rand(5, 4, generator=torch.Generator().manual_seed(5)) > 0.5
    ref = lds(scores, keep, actual)
    for k in (keep.numpy(), keep.tolist()):   # was AttributeError: 'numpy.ndarray' object has no attribute 'dim'
        got = lds(scores, k, actual)
        assert got.score == ref.score and torch.equal(got.predicted, ref.predicted)

def test_a_float64_model_noises_float32_images_in_float64():
    "Float32 images under a float64 model were noised in float32 (measurements off by 1.7e-9, gradients 6.5e-9, K-FAC 1.4e-8 relative); now exactly as the same images in float64."
    m = tiny_ddpm(1).double()
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(measure(m, SCHED, x, n_draws=4), measure(m, SCHED, x.double(), n_draws=4))
    assert torch.equal(measurement_grads(m, SCHED, x, n_draws=4), measurement_grads(m, SCHED, x.double(), n_draws=4))
    o32, o64 = ggn_curvature(m, SCHED, x, 'kfac', n_draws=2), ggn_curvature(m, SCHED, x.double(), 'kfac', n_draws=2)
    v = torch.randn(o64.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(o32 @ v, o64 @ v)
    t, eps = draws(3, 4, (1, 8, 8), 1000, seed=0)   # and against the formulas in float64
    torch.testing.assert_close(measure(m, SCHED, x, n_draws=4), torch.stack([ref_terms(m, SCHED, x[i:i + 1].double(), t[i], eps[i].double(), 'loss').mean() for i in range(3)]).detach(), rtol=1e-12, atol=0)
