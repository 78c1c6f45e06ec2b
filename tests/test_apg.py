"""Tests of interpkit.papers.apg against independent references: CFG as a special case of APG, numpy projections, norm bounds,
a by-hand momentum recurrence, diffusers' own scheduler formulas for x0/ε/v, sampler invariants, a short training run, bad input."""
import copy, math, os
import numpy as np, pytest, torch
from torch import nn
from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel
from interpkit.papers.apg import (cfg, apg, project, rescale, Momentum, CFG, APG, to_x0, from_x0, sample, image_stats, NULL_CLASS,
                                  DIGIT_UNET, DIGIT_SCHEDULER, train_digit_diffusion, load_digit_diffusion, digit_images, evaluating)
from interpkit.errors import ConfigError, ShapeError

os.environ.setdefault('HF_HUB_OFFLINE', '1')

def rnd(*shape, seed=0): return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

SHAPES = [(5, 3), (4, 1, 8, 8), (2, 4, 6, 6), (3, 7, 5)]

@pytest.mark.parametrize('shape', SHAPES)
def test_apg_with_eta1_no_rescale_no_momentum_is_cfg(shape):
    c, u = rnd(*shape, seed=1), rnd(*shape, seed=2)
    for w in (1., 3., 7.5, 15.):
        want = u + w * (c - u)                                  # the textbook form of CFG
        assert torch.allclose(cfg(c, u, w), want, atol=1e-4)
        assert torch.equal(apg(c, u, w, eta=1., r=math.inf, momentum=None), cfg(c, u, w))
        assert torch.equal(apg(c, u, w, eta=1., r=math.inf, momentum=Momentum(0.)), cfg(c, u, w))
        assert torch.equal(APG(eta=1., r=math.inf, beta=0.).start()(c, u, w), CFG().start()(c, u, w))

@pytest.mark.parametrize('shape', SHAPES)
def test_projection_matches_numpy(shape):
    v, d = rnd(*shape, seed=3), rnd(*shape, seed=4)
    par, orth = project(v, d)
    V, D = v.numpy().reshape(len(v), -1).astype(np.float64), d.numpy().reshape(len(d), -1).astype(np.float64)
    P = (np.sum(V * D, 1) / np.sum(D * D, 1))[:, None] * D    # brute-force per-sample projection
    assert np.allclose(par.numpy().reshape(len(v), -1), P, atol=1e-5)
    assert torch.allclose(par + orth, v, atol=1e-6)
    dots = (orth.double() * d.double()).flatten(1).sum(1) / (d.double().flatten(1).norm(dim=1) * v.double().flatten(1).norm(dim=1))
    assert dots.abs().max() < 1e-6                             # orthogonal part ⟂ direction, sample by sample
    # samples are independent: projecting one sample alone gives the same result
    assert torch.allclose(project(v[1:2], d[1:2])[0], par[1:2], atol=1e-6)

def test_apg_eta0_update_is_orthogonal_to_cond():
    c, u = rnd(6, 1, 8, 8, seed=5), rnd(6, 1, 8, 8, seed=6)
    out = apg(c, u, 9., eta=0.)
    dots = ((out - c).double() * c.double()).flatten(1).sum(1) / (c.double().flatten(1).norm(dim=1) * (out - c).double().flatten(1).norm(dim=1))
    assert dots.abs().max() < 1e-5
    # and eta interpolates linearly between the projected rule and CFG
    half = apg(c, u, 9., eta=0.5)
    assert torch.allclose(half, (apg(c, u, 9., eta=0.) + apg(c, u, 9., eta=1.)) / 2, atol=1e-4)

def test_rescale_bounds_norms_and_leaves_small_ones():
    x = rnd(200, 3, 4, 4, seed=7) * torch.linspace(0.01, 3, 200).view(-1, 1, 1, 1)
    norms = x.flatten(1).norm(dim=1)
    for r in (0.1, 1., 2.5, 10.):
        y = rescale(x, r)
        yn = y.flatten(1).norm(dim=1)
        assert (yn <= r * (1 + 1e-6)).all()
        small = norms <= r
        assert torch.equal(y[small], x[small])                        # untouched, bit for bit
        assert torch.allclose(yn[~small], torch.full_like(yn[~small], r), rtol=1e-5)
        cos = nn.functional.cosine_similarity(y.flatten(1), x.flatten(1))
        assert torch.allclose(cos, torch.ones_like(cos), atol=1e-5)   # direction kept
    assert torch.equal(rescale(x, math.inf), x)

def test_momentum_matches_recurrence_by_hand():
    beta, w, K = -0.5, 4., 6
    cs, us = [rnd(3, 1, 4, 4, seed=10 + k) for k in range(K)], [rnd(3, 1, 4, 4, seed=30 + k) for k in range(K)]
    step = APG(eta=1., r=math.inf, beta=beta).start()
    m = torch.zeros(3, 1, 4, 4)
    for k in range(K):
        m = (cs[k] - us[k]) + beta * m                                  # m_k = Δ_k + β m_{k-1}, m_0 = 0
        assert torch.allclose(step(cs[k], us[k], w), cs[k] + (w - 1) * m, atol=1e-5)
    # a second start() has its own, fresh state
    assert torch.allclose(APG(eta=1., r=math.inf, beta=beta).start()(cs[0], us[0], w), cfg(cs[0], us[0], w), atol=1e-6)

def test_full_apg_order_momentum_then_rescale_then_project():
    c1, u1, c2, u2 = (rnd(4, 2, 3, 3, seed=s) for s in (40, 41, 42, 43))
    step = APG(eta=0.25, r=1.5, beta=-0.75).start()
    step(c1, u1, 5.)
    m = (c2 - u2) - 0.75 * (c1 - u1)
    mr = m * torch.clamp(1.5 / m.flatten(1).norm(dim=1), max=1).view(-1, 1, 1, 1)
    C, M = c2.flatten(1).double(), mr.flatten(1).double()
    par = ((M * C).sum(1) / (C * C).sum(1))[:, None] * C
    want = c2.double() + 4 * ((M - par) + 0.25 * par).reshape(c2.shape)
    assert torch.allclose(step(c2, u2, 5.), want.float(), atol=1e-5)

@pytest.mark.parametrize('kind', ['epsilon', 'v_prediction', 'sample'])
def test_conversions_roundtrip_and_match_diffusers(kind):
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule='squaredcos_cap_v2', clip_sample=False, prediction_type=kind)
    sched.set_timesteps(20)
    x_t, pred = rnd(3, 1, 8, 8, seed=50), rnd(3, 1, 8, 8, seed=51)
    for t in sched.timesteps[::4]:
        ab = sched.alphas_cumprod[int(t)].item()
        x0 = to_x0(pred, x_t, ab, kind)
        assert torch.allclose(from_x0(x0, x_t, ab, kind), pred, atol=1e-4)
        ref = copy.deepcopy(sched).step(pred, t, x_t).pred_original_sample     # diffusers' own formula
        assert torch.allclose(x0, ref, atol=1e-4)
    # ε <-> v against DDPMScheduler.get_velocity (v = √ᾱ ε − √(1−ᾱ) x0)
    ddpm = DDPMScheduler(num_train_timesteps=1000)
    x0, eps = rnd(2, 1, 4, 4, seed=52), rnd(2, 1, 4, 4, seed=53)
    t = torch.tensor([100, 800])
    xt = ddpm.add_noise(x0, eps, t)
    ab = ddpm.alphas_cumprod[t]
    assert torch.allclose(from_x0(x0, xt, ab, 'v_prediction'), ddpm.get_velocity(x0, eps, t), atol=1e-5)
    assert torch.allclose(from_x0(x0, xt, ab, 'epsilon'), eps, atol=1e-4)

@pytest.fixture(scope='module')
def tiny():
    cfg_ = dict(DIGIT_UNET, block_out_channels=(8, 16))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return UNet2DModel(**cfg_).train()

def test_sampler_scale1_is_conditional_only_and_model_untouched(tiny):
    sched = DDIMScheduler(**DIGIT_SCHEDULER)
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    labels = torch.tensor([0, 3, 9])
    plain = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=None, steps=5)
    for gd in (CFG(), APG(), APG(eta=1., r=0.3, beta=-0.9)):
        for space in ('x0', 'pred'):
            assert torch.allclose(sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=gd, scale=1., steps=5, space=space), plain, atol=1e-5)
    assert tiny.training and all(m.training for m in tiny.modules())
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())
    assert sched.num_inference_steps is None                  # the scheduler given was not set up
    # CFG is affine in the prediction, so guiding x0 or ε gives the same samples
    a = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=CFG(), scale=5., steps=5, space='x0')
    b = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=CFG(), scale=5., steps=5, space='pred')
    assert torch.allclose(a, b, atol=1e-4)
    # ... and APG does not (the projection is not affine)
    c = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=APG(), scale=5., steps=5, space='x0')
    assert not torch.allclose(a, c, atol=1e-3)

def test_sampler_with_embeddings_and_a_plain_callable():
    emb_c, emb_n = rnd(4, 3, 5, seed=60), torch.zeros(4, 3, 5)
    W = rnd(5, 16, seed=61) * 0.1
    def model(x, t, c): return 0.1 * x + (c.mean(1) @ W).view(-1, 1, 4, 4)
    fwd = lambda m, x, t, c: m(x, t, c)
    sched = DDPMScheduler(num_train_timesteps=50)
    out = sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=APG(r=1.), scale=4., steps=10, forward=fwd)
    assert out.shape == (4, 1, 4, 4) and torch.isfinite(out).all()
    # same seed, same numbers (DDPM is stochastic: its noise comes from the seeded generator)
    assert torch.equal(out, sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=APG(r=1.), scale=4., steps=10, forward=fwd))

def test_image_stats_against_numpy():
    x = rnd(10, 1, 8, 8, seed=70) * 1.5
    s = image_stats(x)
    a = x.numpy()
    assert np.isclose(s['saturation'], np.abs(np.clip(a, -1, 1)).mean(), atol=1e-6)
    assert np.isclose(s['clipped'], (np.abs(a) > 1).mean())
    assert np.isclose(s['std'], np.clip(a, -1, 1).reshape(10, -1).std(1, ddof=1).mean(), atol=1e-5)
    labels = torch.arange(10)
    assert image_stats(x, labels, lambda z: nn.functional.one_hot(labels, 10).float())['accuracy'] == 1.

def test_short_training_and_asset():
    unet, res = train_digit_diffusion(steps=3, batch_size=8, progress=False)
    assert len(res.history) == 3 and np.isfinite(res.history['loss']).all()
    assert not unet.training
    loaded, sched, meta = load_digit_diffusion()
    assert meta['recipe'].endswith('train_digit_diffusion') and set(loaded.state_dict()) == set(unet.state_dict())
    assert sched.config.prediction_type == 'epsilon'
    x, y = digit_images('test')
    assert x.min() >= -1 and x.max() <= 1 and x.shape[1:] == (1, 8, 8)

def test_evaluating_restores_flags_on_error(tiny):
    with pytest.raises(RuntimeError):
        with evaluating(tiny):
            assert not tiny.training
            raise RuntimeError('boom')
    assert tiny.training

def test_bad_input():
    c = torch.zeros(2, 4)
    with pytest.raises(ShapeError): cfg(c, torch.zeros(3, 4), 2.)
    with pytest.raises(ShapeError): apg(c, torch.zeros(2, 5), 2.)
    with pytest.raises(ShapeError): project(c, [1, 2])
    with pytest.raises(ConfigError): apg(c, c, 2., eta=float('nan'))
    with pytest.raises(ConfigError): apg(c, c, float('inf'))
    with pytest.raises(ConfigError): rescale(c, 0.)
    with pytest.raises(ConfigError): rescale(c, -1.)
    with pytest.raises(ConfigError): APG(r=0.)
    with pytest.raises(ConfigError): APG(beta=1.)
    with pytest.raises(ConfigError): Momentum(-1.)
    with pytest.raises(ConfigError): to_x0(c, c, 0.5, 'eps')
    with pytest.raises(ConfigError): to_x0(c, c, 1.5)
    with pytest.raises(ConfigError): from_x0(c, c, 1.0)
    sched = DDIMScheduler(num_train_timesteps=10)
    m = lambda x, t, y: type('O', (), {'sample': x})()
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), space='latent')
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), steps=0)
    with pytest.raises(ShapeError): sample(m, sched, torch.zeros(1, 3), 2, (1, 2, 2), guidance=CFG())
    with pytest.raises(ConfigError): train_digit_diffusion(steps=1, p_uncond=0.)
