"""Tests of interpkit.papers.apg against independent references: CFG as a special case of APG, numpy projections, norm bounds,
a by-hand momentum recurrence, diffusers' own APG guider, diffusers' own scheduler formulas for x0/ε/v, the x0 that every supported
scheduler itself computes, a hand-written Euler sampling loop, devices and dtypes, model outputs, short training runs, bad input."""
import copy, dataclasses, math, os
import numpy as np, pytest, torch
from torch import nn
import diffusers
from diffusers import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler, UNet2DModel
from diffusers.guiders.adaptive_projected_guidance import MomentumBuffer, normalized_guidance
from transformers.modeling_outputs import ImageClassifierOutput
from interpkit.papers.apg import (cfg, apg, split_parallel, rescale, Momentum, CFG, APG, to_x0, from_x0, sample, image_stats, ImageStats,
                                  class_forward, NULL_CLASS, DIGIT_UNET, DIGIT_SCHEDULER, SUPPORTED_SCHEDULERS, GUIDANCE_SPACES, PREDICTIONS,
                                  train_digit_diffusion, load_digit_diffusion, train_digit_classifier, digit_images, digit_unet)
from interpkit.errors import ConfigError, ShapeError, NotFiniteError

os.environ.setdefault('HF_HUB_OFFLINE', '1')

def rnd(*shape, seed=0): return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

SHAPES = [(5, 3), (4, 1, 8, 8), (2, 4, 6, 6), (3, 7, 5)]

# ---------------------------------------------------------------- guidance rules

@pytest.mark.parametrize('shape', SHAPES)
def test_apg_with_eta1_no_rescale_no_momentum_is_cfg(shape):
    c, u = rnd(*shape, seed=1), rnd(*shape, seed=2)
    for w in (1., 3., 7.5, 15.):
        want = u + w * (c - u)                                  # the textbook form of CFG
        assert torch.allclose(cfg(c, u, w), want, atol=1e-4)
        assert torch.allclose(apg(c, u, w, eta=1., r=math.inf, momentum=None), want, atol=1e-4)
        assert torch.allclose(APG(eta=1., r=math.inf, beta=0.).start()(c, u, w), want, atol=1e-4)
        assert torch.allclose(CFG().start()(c, u, w), want, atol=1e-4)

@pytest.mark.parametrize('shape', SHAPES + [(6,)])
def test_split_parallel_matches_numpy(shape):
    v, d = rnd(*shape, seed=3), rnd(*shape, seed=4)
    par, orth = split_parallel(v, d)
    V, D = v.numpy().reshape(len(v), -1).astype(np.float64), d.numpy().reshape(len(d), -1).astype(np.float64)
    P = (np.sum(V * D, 1) / np.sum(D * D, 1))[:, None] * D    # brute-force per-sample projection (a 1-D input: one number per sample)
    assert par.shape == v.shape and orth.shape == v.shape
    assert np.allclose(par.numpy().reshape(len(v), -1), P, atol=1e-5)
    assert np.allclose(orth.numpy().reshape(len(v), -1), V - P, atol=1e-5)
    if len(shape) > 1:
        dots = (orth.double() * d.double()).flatten(1).sum(1) / (d.double().flatten(1).norm(dim=1) * v.double().flatten(1).norm(dim=1))
        assert dots.abs().max() < 1e-6                             # orthogonal part ⟂ direction, sample by sample
        assert torch.allclose(split_parallel(v[1:2], d[1:2])[0], par[1:2], atol=1e-6)   # samples are independent
    else: assert torch.allclose(orth, torch.zeros_like(v), atol=1e-6)   # in one dimension everything is parallel
    # a zero direction: no parallel part at all
    par0, orth0 = split_parallel(v, torch.zeros_like(v))
    assert torch.equal(par0, torch.zeros_like(v)) and torch.equal(orth0, v)

def test_split_parallel_by_hand_and_dtype():
    par, orth = split_parallel(torch.tensor([[3., 4.], [2., 2.]]), torch.tensor([[2., 0.], [1., -1.]]))
    assert torch.allclose(par, torch.tensor([[3., 0.], [0., 0.]])) and torch.allclose(orth, torch.tensor([[0., 4.], [2., 2.]]))
    b = split_parallel(torch.tensor([[3., 4.]], dtype=torch.bfloat16), torch.tensor([[1., 0.]], dtype=torch.bfloat16))
    assert b[0].dtype == torch.bfloat16 and b[0].tolist() == [[3., 0.]] and b[1].tolist() == [[0., 4.]]

def test_apg_eta0_update_is_orthogonal_to_cond():
    c, u = rnd(6, 1, 8, 8, seed=5), rnd(6, 1, 8, 8, seed=6)
    out = apg(c, u, 9.)                                          # the defaults: eta = 0, no rescaling, no momentum
    dots = ((out - c).double() * c.double()).flatten(1).sum(1) / (c.double().flatten(1).norm(dim=1) * (out - c).double().flatten(1).norm(dim=1))
    assert dots.abs().max() < 1e-5
    assert torch.allclose(out, c + 8 * split_parallel(c - u, c)[1], atol=1e-5)
    # and eta interpolates linearly between the projected rule and CFG
    half = apg(c, u, 9., eta=0.5)
    assert torch.allclose(half, (apg(c, u, 9., eta=0.) + apg(c, u, 9., eta=1.)) / 2, atol=1e-4)
    assert torch.allclose(apg(c, u, 9., eta=2.), c + 8 * ((c - u) + split_parallel(c - u, c)[0]), atol=1e-4)

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
    # (N, D) vectors: the norm of each row
    v = torch.tensor([[3., 4.], [0.3, 0.4], [-6., 8.]])
    assert torch.allclose(rescale(v, 2.), torch.tensor([[1.2, 1.6], [0.3, 0.4], [-1.2, 1.6]]))
    # one number per sample: its absolute value is the norm
    assert torch.allclose(rescale(torch.tensor([3., -0.5, -4.]), 1.), torch.tensor([1., -0.5, -1.]))

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
    mom = Momentum(beta)
    mom.update(cs[0]); mom.reset()
    assert torch.equal(mom.update(cs[1]), cs[1]) and 'beta=-0.5' in repr(mom) and '(3, 1, 4, 4)' in repr(mom)

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

@pytest.mark.parametrize('eta,r,beta', [(0., math.inf, 0.), (0., 2., -0.5), (0.3, 1., -0.9), (1., 0.5, 0.4)])
def test_apg_matches_diffusers_guider(eta, r, beta):
    # diffusers' own APG (its "original formulation" is cond + w'·update, so w' = w - 1; norm_threshold 0 means no rescaling)
    steps = [(rnd(3, 2, 5, 5, seed=80 + k), rnd(3, 2, 5, 5, seed=90 + k)) for k in range(5)]
    ours = APG(eta=eta, r=r, beta=beta).start()
    buf = MomentumBuffer(beta) if beta != 0 else None
    for c, u in steps:
        ref = normalized_guidance(c, u, 7. - 1, buf, eta, 0. if math.isinf(r) else r, use_original_formulation=True)
        assert torch.allclose(ours(c, u, 7.), ref, atol=1e-5)

# ---------------------------------------------------------------- conversions

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
    # ε <-> v against DDPMScheduler.get_velocity (v = √ᾱ ε − √(1−ᾱ) x0), with one ᾱ per sample
    ddpm = DDPMScheduler(num_train_timesteps=1000)
    x0, eps = rnd(2, 1, 4, 4, seed=52), rnd(2, 1, 4, 4, seed=53)
    t = torch.tensor([100, 800])
    xt = ddpm.add_noise(x0, eps, t)
    ab = ddpm.alphas_cumprod[t]
    assert torch.allclose(from_x0(x0, xt, ab, 'v_prediction'), ddpm.get_velocity(x0, eps, t), atol=1e-5)
    assert torch.allclose(from_x0(x0, xt, ab), eps, atol=1e-4)
    assert torch.allclose(to_x0(eps, xt, ab), x0, atol=1e-4)
    assert torch.allclose(to_x0(ddpm.get_velocity(x0, eps, t), xt, ab, 'v_prediction'), x0, atol=1e-4)

def test_conversions_in_float64_to_full_precision():
    # ᾱ given as a Python float or a float32 tensor is used in float64: x0 of a float64 prediction is exact to ~1e-15
    x, p = rnd(3, 4, seed=56).double(), rnd(3, 4, seed=57).double()
    for ab in (0.123456789, torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)):
        a = np.asarray(ab.numpy() if torch.is_tensor(ab) else ab, dtype=np.float64).reshape(-1, 1)
        X, P = x.numpy(), p.numpy()
        assert np.abs(to_x0(p, x, ab).numpy() - (X - np.sqrt(1 - a) * P) / np.sqrt(a)).max() < 1e-13
        assert np.abs(to_x0(p, x, ab, 'v_prediction').numpy() - (np.sqrt(a) * X - np.sqrt(1 - a) * P)).max() < 1e-13
        assert np.abs(from_x0(p, x, ab).numpy() - (X - np.sqrt(a) * P) / np.sqrt(1 - a)).max() < 1e-13

def test_conversions_at_the_ends_of_the_noise_range():
    x, p = rnd(2, 3, seed=54), rnd(2, 3, seed=55)
    assert torch.allclose(to_x0(p, x, 1.), x) and torch.allclose(to_x0(p, x, 1., 'v_prediction'), x)   # no noise: x0 is the sample
    assert torch.allclose(to_x0(p, x, 0., 'v_prediction'), -p)             # pure noise: x0 = −v
    assert torch.allclose(from_x0(-p, x, 0., 'v_prediction'), p)
    assert torch.equal(to_x0(p, x, 0.3, 'sample'), p) and torch.equal(from_x0(p, x, 0.3, 'sample'), p)
    with pytest.raises(ConfigError, match='ε prediction'): to_x0(p, x, 0.)
    with pytest.raises(ConfigError, match='no noise'): from_x0(p, x, 1.)
    assert to_x0(p.double(), x.double(), 0.5).dtype == torch.float64 and to_x0(p.bfloat16(), x, 0.5).dtype == torch.bfloat16

# ---------------------------------------------------------------- the sampler

def tiny_unet(seed=0, **kw):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return UNet2DModel(**{**DIGIT_UNET, 'block_out_channels': (8, 16), **kw})

@pytest.fixture(scope='module')
def tiny():
    return tiny_unet().train()

CONV = {'DPMSolverMultistepScheduler', 'UniPCMultistepScheduler'}   # no pred_original_sample: record their convert_model_output (x0)

def _x0_pairs(model, name, kind, steps=4, **cfg_):
    "Run `sample` with an identity guidance that records its x0, next to the x0 the scheduler itself computes from the same prediction."
    cls = getattr(diffusers, name)
    kw = dict(num_train_timesteps=1000, beta_schedule='linear', prediction_type=kind, **cfg_)
    if name in ('DDIMScheduler', 'DDPMScheduler'): kw['clip_sample'] = False   # their pred_original_sample is clipped otherwise
    seen, theirs = [], []
    ddim = DDIMScheduler(num_train_timesteps=1000, beta_schedule='linear', prediction_type=kind, clip_sample=False)
    ddim.set_timesteps(1000)
    class Rec(cls):
        def step(self, model_output, timestep, sample, *a, **k):
            if name == 'PNDMScheduler':   # PNDM exposes no x0: DDIM's formula for the same ᾱ_t (both are variance preserving)
                theirs.append(ddim.step(model_output, timestep, sample).pred_original_sample)
            out = super().step(model_output, timestep, sample, *a, **k)
            if name not in CONV and name != 'PNDMScheduler': theirs.append(out.pred_original_sample)
            return out
        def convert_model_output(self, *a, **k):
            out = super().convert_model_output(*a, **k)
            theirs.append(out)
            return out
    def record(c, u, w):
        seen.append(c); return c
    labels = torch.tensor([1, 2])
    x = sample(model, Rec(**kw), labels, labels.clone(), (1, 8, 8), guidance=record, scale=3., steps=steps)
    return seen, theirs, x

KINDS = [(n, k) for n in SUPPORTED_SCHEDULERS for k in PREDICTIONS if not (k == 'sample' and n in ('PNDMScheduler', 'EulerAncestralDiscreteScheduler'))]

@pytest.mark.parametrize('name,kind', KINDS)
def test_x0_is_the_schedulers_own(tiny, name, kind):
    seen, theirs, x = _x0_pairs(tiny, name, kind)
    calls = {'PNDMScheduler': 13, 'HeunDiscreteScheduler': 7}.get(name, 4)   # PNDM's Runge-Kutta warm-up; Heun: two evaluations per step but the last
    assert len(seen) == len(theirs) == calls
    for a, b in zip(seen, theirs):
        assert ((a - b).norm() / b.norm()).item() < 1e-5
    assert torch.isfinite(x).all()

@pytest.mark.parametrize('name,cfg_', [('EulerDiscreteScheduler', dict(use_karras_sigmas=True)), ('DPMSolverMultistepScheduler', dict(use_karras_sigmas=True)),
                                       ('DPMSolverMultistepScheduler', dict(algorithm_type='sde-dpmsolver++')), ('HeunDiscreteScheduler', dict(use_karras_sigmas=True)),
                                       ('UniPCMultistepScheduler', dict(use_karras_sigmas=True)), ('LMSDiscreteScheduler', dict(use_karras_sigmas=True))])
def test_x0_is_the_schedulers_own_with_other_sigmas(tiny, name, cfg_):
    seen, theirs, _ = _x0_pairs(tiny, name, 'epsilon', steps=6, **cfg_)
    assert len(seen) == len(theirs) > 0
    assert max(((a - b).norm() / b.norm()).item() for a, b in zip(seen, theirs)) < 1e-5

def test_x0_with_a_zero_terminal_snr():
    # DDIM with zero terminal SNR has ᾱ = 0 at its first step: x0 = −v for a v prediction
    m = tiny_unet()
    seen, theirs, _ = _x0_pairs(m, 'DDIMScheduler', 'v_prediction', rescale_betas_zero_snr=True, timestep_spacing='trailing')
    assert max(((a - b).norm() / b.norm()).item() for a, b in zip(seen, theirs)) < 1e-5
    s = DDIMScheduler(num_train_timesteps=1000, rescale_betas_zero_snr=True, timestep_spacing='trailing', clip_sample=False, prediction_type='v_prediction')
    assert torch.isfinite(sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), APG(), 5., steps=3)).all()

def _euler_by_hand(model, labels, guide, w, steps, seed, sched):
    "Euler sampling written out in σ-space: x = x0 + σε, the model sees x/√(σ²+1), x0 = x − σε."
    s = copy.deepcopy(sched); s.set_timesteps(steps)
    x = torch.randn((len(labels), 1, 8, 8), generator=torch.Generator().manual_seed(seed)) * s.init_noise_sigma
    for i, t in enumerate(s.timesteps):
        sig = s.sigmas[i].double()
        xin = (x.double() / (sig ** 2 + 1).sqrt()).float()
        with torch.no_grad():
            eps = model(torch.cat([xin, xin]), t, class_labels=torch.cat([labels, torch.full_like(labels, NULL_CLASS)])).sample
        ec, eu = eps.double().chunk(2)
        g = guide(x.double() - sig * ec, x.double() - sig * eu, w)
        x = s.step(((x.double() - g) / sig).float(), t, x).prev_sample
    return x

def test_apg_on_euler_matches_a_hand_written_loop():
    m = tiny_unet(seed=3).eval()
    labels, sched = torch.tensor([0, 4, 7]), EulerDiscreteScheduler(num_train_timesteps=1000, beta_schedule='linear')
    gd = APG(eta=0., r=2., beta=-0.5)
    got = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), gd, 6., steps=5, seed=2)
    want = _euler_by_hand(m, labels, gd.start(), 6., 5, 2, sched)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)
    # and it is not what applying APG to the ε prediction gives (the projection is not affine)
    assert not torch.allclose(got, sample(m, sched, labels, NULL_CLASS, (1, 8, 8), gd, 6., steps=5, seed=2, space='pred'), atol=1e-2)

@pytest.mark.parametrize('name', SUPPORTED_SCHEDULERS)
def test_every_scheduler_samples_with_apg_and_leaves_model_and_scheduler_alone(untouched, tiny, name):
    sched = getattr(diffusers, name)(num_train_timesteps=1000)
    before = (sched.num_inference_steps, copy.deepcopy(sched.timesteps))
    with untouched(tiny):
        a = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), APG(r=1.), 4., steps=4, seed=1)
        b = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), APG(r=1.), 4., steps=4, seed=1)
    assert torch.isfinite(a).all() and torch.equal(a, b)                     # same seed, same numbers (stochastic samplers too)
    assert sched.num_inference_steps == before[0] and (sched.timesteps is before[1] is None or torch.equal(sched.timesteps, before[1]))   # the scheduler given was not set up
    if name in ('DDPMScheduler', 'EulerAncestralDiscreteScheduler'):          # their noise comes from the seeded generator
        c = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), APG(r=1.), 4., steps=4, seed=2)
        assert not torch.allclose(a, c, atol=1e-3)

def test_other_schedulers_are_refused():
    m = lambda x, t, y: x
    for sched in (diffusers.KDPM2DiscreteScheduler(num_train_timesteps=10), diffusers.EDMEulerScheduler(),
                  diffusers.FlowMatchEulerDiscreteScheduler(), diffusers.DPMSolverMultistepScheduler(num_train_timesteps=10, use_flow_sigmas=True,
                                                                                                       prediction_type='flow_prediction'),
                  diffusers.DPMSolverMultistepScheduler(num_train_timesteps=10, use_flow_sigmas=True), object()):
        with pytest.raises(ConfigError) as e: sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), forward=lambda mm, x, t, c: x)
        assert 'EulerDiscreteScheduler' in str(e.value) or 'flow' in str(e.value)
    class MyDDIM(DDIMScheduler): pass                                         # a subclass of a supported one is fine
    assert sample(m, MyDDIM(num_train_timesteps=10), torch.tensor([1]), 2, (1, 2, 2), steps=2, forward=lambda mm, x, t, c: 0 * x).shape == (1, 1, 2, 2)

def test_sampler_scale1_is_conditional_only(untouched, tiny):
    sched = DDIMScheduler(**DIGIT_SCHEDULER)
    labels = torch.tensor([0, 3, 9])
    with untouched(tiny):
        plain = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=None, steps=5)
        for gd in (CFG(), APG(), APG(eta=1., r=0.3, beta=-0.9)):
            for space in GUIDANCE_SPACES:
                assert torch.allclose(sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=gd, scale=1., steps=5, space=space), plain, atol=1e-5)
        # CFG is affine in the prediction, so guiding x0 or ε gives the same samples
        a = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=CFG(), scale=5., steps=5, space='x0')
        b = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=CFG(), scale=5., steps=5, space='pred')
        assert torch.allclose(a, b, atol=1e-4)
        # ... and APG does not (the projection is not affine); nor is APG CFG
        c = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=APG(), scale=5., steps=5, space='x0')
        d = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=APG(), scale=5., steps=5, space='pred')
        assert not torch.allclose(a, c, atol=1e-3) and not torch.allclose(c, d, atol=1e-3)
        # guidance None is the conditional model alone: the same as a guidance function that returns cond
        assert torch.allclose(sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=lambda c_, u_, w: c_, scale=5., steps=5), plain, atol=1e-5)
        assert sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), steps=1).shape == (3, 1, 8, 8)

def test_sampler_in_eval_mode_and_in_chunks(untouched):
    seen = []
    class Noisy(nn.Module):   # dropout: train mode would give different predictions on every call
        def __init__(self): super().__init__(); self.net = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.Dropout(0.5)); self.emb = nn.Embedding(11, 4)
        def forward(self, x, t, class_labels):
            seen.append(len(x))
            return type('O', (), {'sample': (self.net(x) + self.emb(class_labels)).view(-1, 1, 2, 2)})()
    m = Noisy().train()
    sched, labels = DDIMScheduler(num_train_timesteps=100, clip_sample=False), torch.arange(5)
    with untouched(m):
        a = sample(m, sched, labels, NULL_CLASS, (1, 2, 2), APG(), 3., steps=3)
        b = sample(m, sched, labels, NULL_CLASS, (1, 2, 2), APG(), 3., steps=3, batch_size=3)
    assert torch.allclose(a, b, atol=1e-6)
    assert seen[:3] == [10, 10, 10] and seen[3:] == [3, 3, 3, 1] * 3        # 2N rows per step, in chunks of batch_size
    m.eval()
    assert torch.allclose(a, sample(m, sched, labels, NULL_CLASS, (1, 2, 2), APG(), 3., steps=3), atol=1e-6)

def test_sampler_with_embeddings_dicts_outputs_and_a_plain_callable():
    emb_c, emb_n = rnd(4, 3, 5, seed=60), torch.zeros(4, 3, 5)
    W = rnd(5, 16, seed=61) * 0.1
    def model(x, t, c): return 0.1 * x + (c.mean(1) @ W).view(-1, 1, 4, 4)
    fwd = lambda m, x, t, c: m(x, t, c)
    sched = DDPMScheduler(num_train_timesteps=50)
    out = sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=APG(r=1.), scale=4., steps=10, forward=fwd)
    assert out.shape == (4, 1, 4, 4) and torch.isfinite(out).all()
    # same seed, same numbers (DDPM is stochastic: its noise comes from the seeded generator)
    assert torch.equal(out, sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=APG(r=1.), scale=4., steps=10, forward=fwd))
    # the same conditions as a dict, and the prediction inside a dict, a tuple or an object with .sample
    dfwd = lambda m, x, t, c: {'sample': m(x, t, c['emb'])}
    assert torch.equal(out, sample(model, sched, {'emb': emb_c}, {'emb': emb_n}, (1, 4, 4), APG(r=1.), 4., steps=10, forward=dfwd))
    tfwd = lambda m, x, t, c: (m(x, t, c), None)
    assert torch.equal(out, sample(model, sched, emb_c, emb_n, (1, 4, 4), APG(r=1.), 4., steps=10, forward=tfwd))
    # a plain guidance function: guidance at the midpoint of the two predictions (a scale < 1 of CFG)
    mid = sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=lambda c, u, w: (c + u) / 2, scale=4., steps=10, forward=fwd)
    assert torch.allclose(mid, sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=CFG(), scale=0.5, steps=10, forward=fwd), atol=1e-5)

@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16])
def test_sampler_keeps_the_models_dtype(untouched, dtype):
    m32 = tiny_unet(seed=1).eval()
    m = copy.deepcopy(m32).to(dtype)
    seen = []
    def fwd(model, x, t, c): seen.append((x.dtype, c['emb'].dtype)); return model(x, t, class_labels=c['lab']).sample
    cond = {'lab': torch.tensor([2, 6]), 'emb': torch.zeros(2, 3)}            # a float condition goes to the model's dtype too
    null = {'lab': torch.full((2,), NULL_CLASS), 'emb': torch.ones(2, 3)}
    with untouched(m):
        x = sample(m, DDIMScheduler(**DIGIT_SCHEDULER), cond, null, (1, 8, 8), APG(r=2.), 5., steps=4, forward=fwd)
    ref = sample(m32, DDIMScheduler(**DIGIT_SCHEDULER), cond, null, (1, 8, 8), APG(r=2.), 5., steps=4, forward=fwd)
    assert set(seen[:4]) == {(dtype, dtype)}
    assert x.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)   # the sampler's state: float32 at least
    assert torch.allclose(x.float(), ref, atol=1e-4 if dtype == torch.float64 else 0.3)

def test_a_prediction_of_the_wrong_shape_is_refused():
    sched = DDPMScheduler(num_train_timesteps=10, variance_type='learned')
    with pytest.raises(ShapeError, match='learned variance'):
        sample(None, sched, torch.tensor([1]), 2, (1, 2, 2), steps=2, forward=lambda m, x, t, c: torch.cat([x, x], 1))
    with pytest.raises(ShapeError, match='forward returned'):
        sample(None, sched, torch.tensor([1]), 2, (1, 2, 2), steps=2, forward=lambda m, x, t, c: 'x')

def test_the_prediction_is_read_from_any_output():
    # what `forward` returns: a tensor, a diffusers UNet2DOutput, a dict or an object with `sample` (also when another tensor comes first),
    # else the first tensor of a dict or tuple; nothing with a tensor in it is refused
    from diffusers.models.unets.unet_2d import UNet2DOutput
    model = lambda x, t, c: 0.1 * x + 0.05 * c.view(-1, 1, 1, 1).float()
    sched, labels = DDIMScheduler(num_train_timesteps=50, clip_sample=False), torch.tensor([1, 4])
    run = lambda fwd: sample(model, sched, labels, 0, (1, 2, 2), APG(r=1.), 3., steps=3, forward=fwd)
    want = run(lambda m, x, t, c: m(x, t, c))
    other = lambda x: torch.full_like(x, 7.)
    for fwd in (lambda m, x, t, c: UNet2DOutput(sample=m(x, t, c)), lambda m, x, t, c: {'other': other(x), 'sample': m(x, t, c)},
                lambda m, x, t, c: type('O', (), {'other': other(x), 'sample': m(x, t, c)})(), lambda m, x, t, c: {'pred': m(x, t, c), 'other': other(x)},
                lambda m, x, t, c: (None, m(x, t, c), other(x))):
        assert torch.equal(run(fwd), want)
    for bad in (object(), {'a': 1}, [None]):
        with pytest.raises(ShapeError, match='forward returned'): run(lambda m, x, t, c: bad)

def test_conditions_are_checked():
    m = lambda x, t, c: 0 * x
    sched, fwd = DDIMScheduler(num_train_timesteps=10), lambda mm, x, t, c: 0 * x
    go = lambda cond, null, guidance=CFG(): sample(m, sched, cond, null, (1, 2, 2), guidance, 2., steps=2, forward=fwd)
    emb = torch.zeros(2, 3)
    assert go(emb, torch.ones(2, 3)).shape == (2, 1, 2, 2)
    assert go({'e': emb, 'l': torch.tensor([1, 2])}, {'e': emb, 'l': torch.tensor([0, 0])}).shape == (2, 1, 2, 2)
    assert go(emb, None, guidance=None).shape == (2, 1, 2, 2)                # unguided: null is not used
    for cond, null in ((emb, torch.ones(2, 4)), (emb, torch.ones(1, 3)), (emb, {'e': emb}), ({'e': emb}, {'f': emb}), ({'e': emb}, emb)):
        with pytest.raises(ShapeError, match='null'): go(cond, null)
    for cond in ([1, 2], {'e': emb, 'l': torch.tensor([1, 2, 3])}, {}, {'e': [1, 2]}, torch.tensor(1)):
        with pytest.raises(ShapeError, match='cond'): go(cond, cond, guidance=None)

def test_the_samplers_defaults():
    seen = []
    class Lin(nn.Module):
        def __init__(self): super().__init__(); self.w = nn.Parameter(torch.tensor(0.1))
        def forward(self, x, t, class_labels):
            seen.append(len(x)); return type('O', (), {'sample': self.w * x + 0.05 * class_labels.view(-1, 1, 1, 1).float()})()
    m, sched = Lin(), DDIMScheduler(num_train_timesteps=100, clip_sample=False)
    labels = torch.arange(129) % 10
    plain = sample(m, sched, labels, NULL_CLASS, (1, 1, 1))
    assert seen == [129] * 20                                                # 20 steps by default, unguided: N rows per call
    seen.clear()
    assert torch.allclose(sample(m, sched, labels, NULL_CLASS, (1, 1, 1), CFG()), plain, atol=1e-6)   # the default scale 1: no guidance
    assert not torch.allclose(sample(m, sched, labels, NULL_CLASS, (1, 1, 1), CFG(), 2.), plain, atol=1e-3)   # (scale 2 would differ)
    assert seen[:40] == [256, 2] * 20                                        # 2N = 258 rows in chunks of the default batch_size 256

def test_noise_free_and_pure_noise_steps():
    # x0 space refuses, with a clear error, an ᾱ where a conversion is undefined: ᾱ = 1 at t = 0 (a schedule with β_0 = 0), and ε at ᾱ = 0
    # (zero terminal SNR); in 'pred' space the scheduler's own step gives NaN there (DDIM divides by 1 − ᾱ and by √ᾱ)
    m = tiny_unet(seed=2).eval()
    one = DDIMScheduler(num_train_timesteps=10, trained_betas=[0.] + [0.1] * 9, clip_sample=False, timestep_spacing='leading', prediction_type='v_prediction')
    zero = DDIMScheduler(num_train_timesteps=1000, rescale_betas_zero_snr=True, timestep_spacing='trailing', clip_sample=False)
    assert one.alphas_cumprod[0] == 1 and zero.alphas_cumprod[-1] == 0
    for s, msg in ((one, 'no noise'), (zero, 'ε prediction')):
        with pytest.raises(ConfigError, match=msg): sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), APG(), 5., steps=5)
        with pytest.raises(NotFiniteError): sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), APG(), 5., steps=5, space='pred')

def test_a_bfloat16_model_guides_in_float32():
    # the model runs in bfloat16, the guidance and the sampler's state in float32: the same as upcasting the model's output by hand
    m = tiny_unet(seed=4).eval().bfloat16()
    sched, labels = EulerDiscreteScheduler(num_train_timesteps=1000), torch.tensor([2, 8])
    a = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), APG(r=1.), 7., steps=4)
    b = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), APG(r=1.), 7., steps=4, forward=lambda mm, x, t, c: class_forward(mm, x, t, c).float())
    assert a.dtype == torch.float32 and torch.equal(a, b)

# ---------------------------------------------------------------- image statistics

class DropoutClf(nn.Module):
    def __init__(self, out='tensor'):
        super().__init__(); self.out = out
        with torch.random.fork_rng():
            torch.manual_seed(0); self.f = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 10))
    def forward(self, x):
        lg = self.f(x)
        return {'logits': lg} if self.out == 'dict' else ImageClassifierOutput(logits=lg) if self.out == 'output' else lg

def test_image_stats_against_numpy():
    x = rnd(10, 1, 8, 8, seed=70) * 1.5
    s = image_stats(x)
    a = x.numpy()
    assert isinstance(s, ImageStats) and s.accuracy is None
    assert np.isclose(s.saturation, np.abs(np.clip(a, -1, 1)).mean(), atol=1e-6)
    assert np.isclose(s.clipped, (np.abs(a) > 1).mean())
    e = image_stats(torch.tensor([[[-1., 1.], [0.5, 3.]], [[-1.01, 0.], [1., -0.99]]]))   # pixels at exactly ±1 are in range, not clipped
    assert e.clipped == 2 / 8 and np.isclose(e.saturation, (1 + 1 + 0.5 + 1 + 1 + 0 + 1 + 0.99) / 8)
    assert np.isclose(s.std, np.clip(a, -1, 1).reshape(10, -1).std(1, ddof=1).mean(), atol=1e-5)
    assert 'saturation=' in repr(s) and 'tensor' not in repr(s)
    # accuracy against a hand count: a classifier that reads the image (the sign of its mean pixel) and a label set it gets 7 of 10 right
    clf = lambda z: torch.stack([-z.flatten(1).mean(1), z.flatten(1).mean(1)], 1)
    pred = (a.reshape(10, -1).clip(-1, 1).mean(1) > 0).astype(int)
    labels = torch.tensor(np.where(np.arange(10) < 7, pred, 1 - pred))
    assert image_stats(x, labels, clf).accuracy == 0.7
    assert image_stats(x, labels, clf, batch_size=3).accuracy == 0.7
    sizes = []
    def counting(z): sizes.append(len(z)); return torch.zeros(len(z), 2)
    assert image_stats(torch.zeros(257, 1, 2, 2), torch.zeros(257, dtype=torch.long), counting).accuracy == 1 and sizes == [256, 1]   # default batch_size 256
    assert dataclasses.asdict(image_stats(x, labels, clf)) == dict(dataclasses.asdict(s), accuracy=0.7)

@pytest.mark.parametrize('out', ['tensor', 'dict', 'output'])
def test_image_stats_runs_the_classifier_in_eval_mode(untouched, out):
    x, y = rnd(64, 1, 8, 8, seed=71), torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(72))
    clf = DropoutClf(out).train()
    with torch.no_grad():
        clf.eval(); lg = clf.f(x.clamp(-1, 1)); clf.train()
    want = (lg.argmax(-1) == y).float().mean().item()                      # the eval-mode accuracy, by hand
    with untouched(clf):
        accs = {image_stats(x, y, clf, batch_size=10).accuracy for _ in range(5)}
    assert accs == {want}
    # a float64 classifier gets float64 inputs
    assert image_stats(x, y, DropoutClf(out).double()).accuracy == want

# ---------------------------------------------------------------- the demo's model, data and classifier

def test_digit_images():
    x, y = digit_images('train')
    xt, yt = digit_images('test')
    assert all(torch.equal(a, b) for a, b in zip(digit_images(), (x, y)))   # the default split is 'train'
    from sklearn.datasets import load_digits
    d = load_digits()
    assert len(x) + len(xt) == len(d.target) and x.shape[1:] == (1, 8, 8)
    assert x.min() == -1 and x.max() == 1 and xt.min() == -1 and xt.max() == 1
    # the same images as scikit-learn's, rescaled from 0..16 to [-1, 1], with their labels; 25% held out, stratified
    labels_of = {}
    for img, lab in zip(torch.tensor(d.data, dtype=torch.float32) / 8 - 1, d.target): labels_of.setdefault(img.numpy().tobytes(), set()).add(int(lab))
    for xs, ys in ((x, y), (xt, yt)):
        assert all(int(l) in labels_of.get(img.flatten().numpy().tobytes(), ()) for img, l in zip(xs, ys))
    assert len(xt) == 450 and (torch.bincount(yt) - torch.bincount(torch.tensor(d.target)) * 0.25).abs().max() <= 1

def test_short_diffusion_training():
    unet, tok, res = train_digit_diffusion(steps=3, batch_size=8, progress=False)
    assert tok is None and len(res.history) == 3 and np.isfinite(res.history['loss']).all()
    assert not unet.training and not torch.equal(unet.conv_in.weight, digit_unet().conv_in.weight)
    again = train_digit_diffusion(steps=3, batch_size=8, progress=False)[2]
    assert np.array_equal(res.history['loss'], again.history['loss'])         # same seed, same numbers
    assert not np.array_equal(res.history['loss'], train_digit_diffusion(steps=3, batch_size=8, seed=1, progress=False)[2].history['loss'])

def _denoising_mse(unet, t=300, seed=0):
    x, y = digit_images('test')
    s = DDPMScheduler(**DIGIT_SCHEDULER)
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=g)
    tt = torch.full((len(x),), t)
    with torch.no_grad(): return nn.functional.mse_loss(unet(s.add_noise(x, noise, tt), tt, class_labels=y).sample, noise).item()

def test_the_shipped_model_denoises_real_digits():
    unet, tok, meta = load_digit_diffusion()
    assert tok is None and not unet.training
    assert _denoising_mse(unet) < 0.35 < 0.9 < _denoising_mse(digit_unet().eval())   # trained vs fresh: ε-prediction error on held-out digits
    assert DDIMScheduler(**meta['scheduler']).config.beta_schedule == DIGIT_SCHEDULER['beta_schedule']

def test_the_headline_on_the_shipped_model():
    # the notebook's claim at a smaller scale: at a high guidance scale APG clips and saturates less than CFG
    unet, _, meta = load_digit_diffusion()
    labels = torch.arange(10).repeat_interleave(2)
    sched = DDIMScheduler(**meta['scheduler'])
    c = image_stats(sample(unet, sched, labels, NULL_CLASS, (1, 8, 8), CFG(), 15., steps=10))
    a = image_stats(sample(unet, sched, labels, NULL_CLASS, (1, 8, 8), APG(r=1.35), 15., steps=10))
    assert c.clipped > a.clipped + 0.1 and c.saturation > a.saturation

def test_classifier_training_and_its_accuracy():
    clf, tok, res = train_digit_classifier(steps=60, progress=False)
    xt, yt = digit_images('test')
    with torch.no_grad(): acc = (clf(xt).argmax(-1) == yt).float().mean().item()   # computed here, independently
    assert tok is None and not clf.training
    assert len(res.evals) == 1 and res.evals['eval_accuracy'].iloc[-1] == acc and acc > 0.85
    clf2, _, res2 = train_digit_classifier(steps=60, batch_size=64, progress=False)
    with torch.no_grad(): acc2 = (clf2(xt).argmax(-1) == yt).float().mean().item()
    assert res2.evals['eval_accuracy'].iloc[-1] == acc2 and acc2 > 0.8 and not np.array_equal(res.history['loss'], res2.history['loss'])
    assert res.history['lr'].iloc[0] == pytest.approx(3e-3)

# ---------------------------------------------------------------- bad input

def test_bad_input():
    c = torch.zeros(2, 4)
    with pytest.raises(ShapeError): cfg(c, torch.zeros(3, 4), 2.)
    with pytest.raises(ShapeError): apg(c, torch.zeros(2, 5), 2.)
    with pytest.raises(ShapeError): split_parallel(c, [1, 2])
    with pytest.raises(ShapeError): split_parallel(torch.tensor(1.), torch.tensor(2.))
    with pytest.raises(ConfigError): apg(c, c, 2., eta=float('nan'))
    with pytest.raises(ConfigError): apg(c, c, float('inf'))
    with pytest.raises(ConfigError): rescale(c, 0.)
    with pytest.raises(ConfigError): rescale(c, -1.)
    with pytest.raises(ConfigError): APG(r=0.)
    with pytest.raises(ConfigError): APG(beta=1.)
    with pytest.raises(ConfigError): APG(eta=float('nan'))
    with pytest.raises(ConfigError): Momentum(-1.)
    with pytest.raises(ConfigError): to_x0(c, c, 0.5, 'eps')
    with pytest.raises(ConfigError): to_x0(c, c, 1.5)
    with pytest.raises(ConfigError): to_x0(c, c, -0.1, 'v_prediction')
    with pytest.raises(ConfigError): from_x0(c, c, 1.0)
    sched = DDIMScheduler(num_train_timesteps=10)
    m = lambda x, t, y: type('O', (), {'sample': x})()
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), space='latent')
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), steps=0)
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), batch_size=0)
    with pytest.raises(ConfigError): sample(m, DDIMScheduler(num_train_timesteps=10, prediction_type='flow_prediction'), torch.tensor([1]), 2, (1, 2, 2))
    with pytest.raises(ShapeError): sample(m, sched, torch.zeros(1, 3), 2, (1, 2, 2), guidance=CFG())
    with pytest.raises(ShapeError): sample(m, sched, [1, 2], torch.tensor([0, 0]), (1, 2, 2), guidance=CFG())
    with pytest.raises(NotFiniteError): sample(lambda x, t, class_labels: type('O', (), {'sample': x * float('nan')})(), sched, torch.tensor([1]), 2, (1, 2, 2), steps=2)
    with pytest.raises(ShapeError): image_stats(c, torch.zeros(3), lambda z: z)
    with pytest.raises(ShapeError): image_stats(c, None, lambda z: z)
    with pytest.raises(NotFiniteError, match='samples'): image_stats(torch.full((2, 4), float('nan')))
    with pytest.raises(ConfigError): image_stats(c, torch.zeros(2), lambda z: z, batch_size=0)
    with pytest.raises(ConfigError): train_digit_diffusion(steps=1, p_uncond=0.)
    with pytest.raises(ConfigError): train_digit_diffusion(steps=1, p_uncond=1.)
    with pytest.raises(ConfigError): digit_images('val')
    assert class_forward(lambda x, t, class_labels: type('O', (), {'sample': x + class_labels})(), torch.zeros(1), 0, torch.ones(1)).item() == 1

def test_momentum_at_every_evaluation_on_heun_as_the_notebook_says():
    # the notebook's "Differences": with Heun (two evaluations per step) reverse momentum makes APG clip more than CFG; without it, less
    unet, _, meta = load_digit_diffusion()
    labels = torch.arange(10).repeat_interleave(4)
    sched = diffusers.HeunDiscreteScheduler.from_config({**meta['scheduler'], 'timestep_spacing': 'leading'})
    clipped = {k: image_stats(sample(unet, sched, labels, NULL_CLASS, (1, 8, 8), gd, 7., steps=10)).clipped
               for k, gd in (('cfg', CFG()), ('apg', APG(r=1.35)), ('apg0', APG(r=1.35, beta=0.)))}
    assert clipped['apg'] > clipped['cfg'] > clipped['apg0'], clipped
    assert clipped == pytest.approx({'cfg': 0.37, 'apg': 0.48, 'apg0': 0.25}, abs=0.005)   # the numbers quoted there
