"""Tests of interpkit.diffusion against independent references: diffusers' own scheduler formulas for x0/ε/v, the x0 that every supported
scheduler itself computes, a plain diffusers sampling loop for unconditional models, devices and dtypes, model outputs, the DDPM trainer
against a training loop written out by hand (bit for bit), properties of its draws, the old names, bad input. Guidance rules here are
stand-ins (CFG written out, a rule with a state, a non-affine rule); APG's are in test_apg.py, APG's digit demo in test_apg_demo.py."""
import copy, dataclasses, inspect, os
import numpy as np, pytest, torch
from torch import nn
import diffusers
from diffusers import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler, UNet2DModel
from interpkit.diffusion import (to_x0, from_x0, sample, denoiser_forward, check_scale, training_target, train_ddpm, SUPPORTED_SCHEDULERS,
                                 GUIDANCE_SPACES, PREDICTION_TYPES)
from interpkit.errors import ConfigError, ShapeError, NotFiniteError
from interpkit.train import Trained, seeded

os.environ.setdefault('HF_HUB_OFFLINE', '1')

def rnd(*shape, seed=0): return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

def cfg(c, u, w): return u + w * (c - u)   # classifier-free guidance, the textbook form

NULL_CLASS = 10   # a class-conditional UNet with 10 classes and a null class, as APG's demo model
SCHED = dict(num_train_timesteps=1000, beta_schedule='squaredcos_cap_v2', clip_sample=False, prediction_type='epsilon')
UNET = dict(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16), down_block_types=('DownBlock2D', 'DownBlock2D'),
            up_block_types=('UpBlock2D', 'UpBlock2D'), norm_num_groups=8, num_class_embeds=NULL_CLASS + 1)

def tiny_unet(seed=0, **kw):
    "A small class-conditional UNet2DModel for 8×8 images (kw: other settings, e.g. num_class_embeds=None), from the seeded RNG."
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return UNet2DModel(**{**UNET, **kw})

@dataclasses.dataclass(frozen=True)
class Damped:
    "A guidance rule with a state, like APG's momentum: CFG whose update is the mean of this evaluation's and the previous one's; `start()` gives a fresh state."
    def start(self):
        last = []
        def guide(c, u, w):
            d = c - u if not last else (c - u + last[0]) / 2
            last[:] = [c - u]
            return c + (w - 1) * d
        return guide

def clamped(c, u, w):
    "A guidance rule that is not affine in the predictions: CFG with each sample's update shrunk to norm at most 1."
    d = c - u
    f = (1 / d.flatten(1).norm(dim=1).clamp_min(1e-12)).clamp(max=1)
    return c + (w - 1) * d * f.view(-1, *[1] * (d.ndim - 1))

def test_the_stand_ins():
    c, u = rnd(3, 1, 4, 4, seed=1), rnd(3, 1, 4, 4, seed=2)
    g = Damped().start()
    assert torch.allclose(g(c, u, 3.), c + 2 * (c - u)) and torch.allclose(g(u, c, 3.), u)   # the second update cancels the first: its mean is 0
    assert torch.allclose(Damped().start()(u, c, 3.), u + 2 * (u - c))                         # a fresh state
    assert torch.allclose(clamped(c, u, 1.), c) and ((clamped(c, u, 5.) - c) / 4).flatten(1).norm(dim=1).max() <= 1 + 1e-6

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
        step.__signature__ = inspect.signature(cls.step)   # the scheduler's own: `sample` passes its seeded generator where step takes one
        def convert_model_output(self, *a, **k):
            out = super().convert_model_output(*a, **k)
            theirs.append(out)
            return out
    def record(c, u, w):
        seen.append(c); return c
    labels = torch.tensor([1, 2])
    x = sample(model, Rec(**kw), labels, labels.clone(), (1, 8, 8), guidance=record, scale=3., n_steps=steps)
    return seen, theirs, x

KINDS = [(n, k) for n in SUPPORTED_SCHEDULERS for k in PREDICTION_TYPES if not (k == 'sample' and n in ('PNDMScheduler', 'EulerAncestralDiscreteScheduler'))]

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
    assert torch.isfinite(sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), Damped(), 5., n_steps=3)).all()

@pytest.mark.parametrize('name', SUPPORTED_SCHEDULERS)
def test_every_scheduler_samples_and_leaves_model_and_scheduler_alone(untouched, tiny, name):
    sched = getattr(diffusers, name)(num_train_timesteps=1000)
    before = (sched.num_inference_steps, copy.deepcopy(sched.timesteps))
    with untouched(tiny):
        a = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), Damped(), 4., n_steps=4, seed=1)
        b = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), Damped(), 4., n_steps=4, seed=1)
    assert torch.isfinite(a).all() and torch.equal(a, b)                     # same seed, same numbers (stochastic samplers too), a fresh state per run
    assert sched.num_inference_steps == before[0] and (sched.timesteps is before[1] is None or torch.equal(sched.timesteps, before[1]))   # the scheduler given was not set up
    if name in ('DDPMScheduler', 'EulerAncestralDiscreteScheduler'):          # their noise comes from the seeded generator
        c = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), Damped(), 4., n_steps=4, seed=2)
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
    assert sample(m, MyDDIM(num_train_timesteps=10), torch.tensor([1]), 2, (1, 2, 2), n_steps=2, forward=lambda mm, x, t, c: 0 * x).shape == (1, 1, 2, 2)

def test_sampler_scale1_is_conditional_only(untouched, tiny):
    sched = DDIMScheduler(**SCHED)
    labels = torch.tensor([0, 3, 9])
    with untouched(tiny):
        plain = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=None, n_steps=5)
        for gd in (cfg, Damped(), clamped):
            for space in GUIDANCE_SPACES:
                assert torch.allclose(sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=gd, scale=1., n_steps=5, space=space), plain, atol=1e-5)
        # CFG is affine in the prediction, so guiding x0 or ε gives the same samples
        a = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=cfg, scale=5., n_steps=5, space='x0')
        b = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=cfg, scale=5., n_steps=5, space='pred')
        assert torch.allclose(a, b, atol=1e-4) and not torch.allclose(a, plain, atol=1e-3)
        # ... and a rule that is not affine does not
        c = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=clamped, scale=5., n_steps=5, space='x0')
        d = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=clamped, scale=5., n_steps=5, space='pred')
        assert not torch.allclose(a, c, atol=1e-3) and not torch.allclose(c, d, atol=1e-3)
        # guidance None is the conditional model alone: the same as a guidance function that returns cond
        assert torch.allclose(sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=lambda c_, u_, w: c_, scale=5., n_steps=5), plain, atol=1e-5)
        assert sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), n_steps=1).shape == (3, 1, 8, 8)

def test_sampler_in_eval_mode_and_in_chunks(untouched):
    seen = []
    class Noisy(nn.Module):   # dropout: train mode would give different predictions on every call
        def __init__(self): super().__init__(); self.net = nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.Dropout(0.5)); self.emb = nn.Embedding(11, 4)
        def forward(self, x, t, class_labels):
            seen.append(len(x))
            return type('O', (), {'sample': (self.net(x) + self.emb(class_labels)).view(-1, 1, 2, 2)})()
    with seeded(0): m = Noisy().train()
    sched, labels = DDIMScheduler(num_train_timesteps=100, clip_sample=False), torch.arange(5)
    with untouched(m):
        a = sample(m, sched, labels, NULL_CLASS, (1, 2, 2), Damped(), 3., n_steps=3)
        b = sample(m, sched, labels, NULL_CLASS, (1, 2, 2), Damped(), 3., n_steps=3, batch_size=3)
    assert torch.allclose(a, b, atol=1e-6)
    assert seen[:3] == [10, 10, 10] and seen[3:] == [3, 3, 3, 1] * 3        # 2N rows per step, in chunks of batch_size
    m.eval()
    assert torch.allclose(a, sample(m, sched, labels, NULL_CLASS, (1, 2, 2), Damped(), 3., n_steps=3), atol=1e-6)

def test_sampler_with_embeddings_dicts_outputs_and_a_plain_callable():
    emb_c, emb_n = rnd(4, 3, 5, seed=60), torch.zeros(4, 3, 5)
    W = rnd(5, 16, seed=61) * 0.1
    def model(x, t, c): return 0.1 * x + (c.mean(1) @ W).view(-1, 1, 4, 4)
    fwd = lambda m, x, t, c: m(x, t, c)
    sched = DDPMScheduler(num_train_timesteps=50)
    out = sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=Damped(), scale=4., n_steps=10, forward=fwd)
    assert out.shape == (4, 1, 4, 4) and torch.isfinite(out).all()
    # same seed, same numbers (DDPM is stochastic: its noise comes from the seeded generator)
    assert torch.equal(out, sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=Damped(), scale=4., n_steps=10, forward=fwd))
    # the same conditions as a dict, and the prediction inside a dict, a tuple or an object with .sample
    dfwd = lambda m, x, t, c: {'sample': m(x, t, c['emb'])}
    assert torch.equal(out, sample(model, sched, {'emb': emb_c}, {'emb': emb_n}, (1, 4, 4), Damped(), 4., n_steps=10, forward=dfwd))
    tfwd = lambda m, x, t, c: (m(x, t, c), None)
    assert torch.equal(out, sample(model, sched, emb_c, emb_n, (1, 4, 4), Damped(), 4., n_steps=10, forward=tfwd))
    # a plain guidance function: guidance at the midpoint of the two predictions (a scale < 1 of CFG)
    mid = sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=lambda c, u, w: (c + u) / 2, scale=4., n_steps=10, forward=fwd)
    assert torch.allclose(mid, sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=cfg, scale=0.5, n_steps=10, forward=fwd), atol=1e-5)

@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16])
def test_sampler_keeps_the_models_dtype(untouched, dtype):
    m32 = tiny_unet(seed=1).eval()
    m = copy.deepcopy(m32).to(dtype)
    seen = []
    def fwd(model, x, t, c): seen.append((x.dtype, c['emb'].dtype)); return model(x, t, class_labels=c['lab']).sample
    cond = {'lab': torch.tensor([2, 6]), 'emb': torch.zeros(2, 3)}            # a float condition goes to the model's dtype too
    null = {'lab': torch.full((2,), NULL_CLASS), 'emb': torch.ones(2, 3)}
    with untouched(m):
        x = sample(m, DDIMScheduler(**SCHED), cond, null, (1, 8, 8), Damped(), 5., n_steps=4, forward=fwd)
    ref = sample(m32, DDIMScheduler(**SCHED), cond, null, (1, 8, 8), Damped(), 5., n_steps=4, forward=fwd)
    assert set(seen[:4]) == {(dtype, dtype)}
    assert x.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)   # the sampler's state: float32 at least
    assert torch.allclose(x.float(), ref, atol=1e-4 if dtype == torch.float64 else 0.3)

def test_a_prediction_of_the_wrong_shape_is_refused():
    sched = DDPMScheduler(num_train_timesteps=10, variance_type='learned')
    with pytest.raises(ShapeError, match='learned variance'):
        sample(None, sched, torch.tensor([1]), 2, (1, 2, 2), n_steps=2, forward=lambda m, x, t, c: torch.cat([x, x], 1))
    with pytest.raises(ShapeError, match='forward returned'):
        sample(None, sched, torch.tensor([1]), 2, (1, 2, 2), n_steps=2, forward=lambda m, x, t, c: 'x')

def test_the_prediction_is_read_from_any_output():
    # what `forward` returns: a tensor, a diffusers UNet2DOutput, a dict or an object with `sample` (also when another tensor comes first),
    # else the first tensor of a dict or tuple; nothing with a tensor in it is refused
    from diffusers.models.unets.unet_2d import UNet2DOutput
    model = lambda x, t, c: 0.1 * x + 0.05 * c.view(-1, 1, 1, 1).float()
    sched, labels = DDIMScheduler(num_train_timesteps=50, clip_sample=False), torch.tensor([1, 4])
    run = lambda fwd: sample(model, sched, labels, 0, (1, 2, 2), Damped(), 3., n_steps=3, forward=fwd)
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
    go = lambda cond, null, guidance=cfg: sample(m, sched, cond, null, (1, 2, 2), guidance, 2., n_steps=2, forward=fwd)
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
    assert torch.allclose(sample(m, sched, labels, NULL_CLASS, (1, 1, 1), cfg), plain, atol=1e-6)   # the default scale 1: no guidance
    assert not torch.allclose(sample(m, sched, labels, NULL_CLASS, (1, 1, 1), cfg, 2.), plain, atol=1e-3)   # (scale 2 would differ)
    assert seen[:40] == [256, 2] * 20                                        # 2N = 258 rows in chunks of the default batch_size 256

def test_noise_free_and_pure_noise_steps():
    # x0 space refuses, with a clear error, an ᾱ where a conversion is undefined: ᾱ = 1 at t = 0 (a schedule with β_0 = 0), and ε at ᾱ = 0
    # (zero terminal SNR); in 'pred' space the scheduler's own step gives NaN there (DDIM divides by 1 − ᾱ and by √ᾱ)
    m = tiny_unet(seed=2).eval()
    one = DDIMScheduler(num_train_timesteps=10, trained_betas=[0.] + [0.1] * 9, clip_sample=False, timestep_spacing='leading', prediction_type='v_prediction')
    zero = DDIMScheduler(num_train_timesteps=1000, rescale_betas_zero_snr=True, timestep_spacing='trailing', clip_sample=False)
    assert one.alphas_cumprod[0] == 1 and zero.alphas_cumprod[-1] == 0
    for s, msg in ((one, 'no noise'), (zero, 'ε prediction')):
        with pytest.raises(ConfigError, match=msg): sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), Damped(), 5., n_steps=5)
        with pytest.raises(NotFiniteError): sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), Damped(), 5., n_steps=5, space='pred')

def test_a_bfloat16_model_guides_in_float32():
    # the model runs in bfloat16, the guidance and the sampler's state in float32: the same as upcasting the model's output by hand
    m = tiny_unet(seed=4).eval().bfloat16()
    sched, labels = EulerDiscreteScheduler(num_train_timesteps=1000), torch.tensor([2, 8])
    a = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), Damped(), 7., n_steps=4)
    b = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), Damped(), 7., n_steps=4, forward=lambda mm, x, t, c: denoiser_forward(mm, x, t, c).float())
    assert a.dtype == torch.float32 and torch.equal(a, b)

# ---------------------------------------------------------------- unconditional models

def _plain_loop(model, sched, n, shape, steps, seed):
    "A diffusers sampling loop written out: model(x, t) at every step, the noise and the scheduler's randomness from one seeded generator."
    s = copy.deepcopy(sched); s.set_timesteps(steps)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, *shape), generator=gen) * s.init_noise_sigma
    kw = {'generator': gen} if 'generator' in __import__('inspect').signature(s.step).parameters else {}
    with torch.no_grad():
        for t in s.timesteps: x = s.step(model(s.scale_model_input(x, t), t).sample, t, x, **kw).prev_sample
    return x

@pytest.mark.parametrize('name', ['DDIMScheduler', 'DDPMScheduler', 'EulerDiscreteScheduler'])
def test_unconditional_sampling_is_a_plain_loop(untouched, name):
    m = tiny_unet(seed=5, num_class_embeds=None).train()
    sched = getattr(diffusers, name)(**SCHED) if name != 'EulerDiscreteScheduler' else EulerDiscreteScheduler(num_train_timesteps=1000, timestep_spacing='leading')
    with untouched(m):
        x = sample(m, sched, None, None, (1, 8, 8), n_steps=6, seed=3, n=5, batch_size=2)
    m.eval()
    assert x.shape == (5, 1, 8, 8) and torch.allclose(x, _plain_loop(m, sched, 5, (1, 8, 8), 6, 3), atol=1e-5)
    assert torch.allclose(x, sample(m, sched, None, None, (1, 8, 8), n_steps=6, seed=3, n=5), atol=1e-5)   # in one chunk or in three: the same samples

def test_unconditional_calls():
    calls = []
    class Plain(nn.Module):   # no class_labels argument at all
        def __init__(self): super().__init__(); self.w = nn.Parameter(torch.tensor(0.1))
        def forward(self, x, t):
            calls.append(len(x)); return type('O', (), {'sample': self.w * x})()
    sched = DDIMScheduler(num_train_timesteps=50, clip_sample=False)
    x = sample(Plain(), sched, None, None, (2, 3), n_steps=3, n=5, batch_size=2)
    assert x.shape == (5, 2, 3) and calls == [2, 2, 1] * 3                                        # n rows per step, in chunks of batch_size
    seen = []
    def fwd(m, x, t, c): seen.append(c); return 0 * x
    sample(Plain(), sched, None, 7, (2, 3), n_steps=2, n=1, forward=fwd)                            # null is not used
    assert seen == [None, None]                                                                   # a forward of your own gets cond=None
    assert denoiser_forward(lambda x, t: type('O', (), {'sample': x + 1})(), torch.zeros(1), 0, None).item() == 1
    # conditioned on labels, n may repeat the number of samples
    lab = torch.tensor([1, 2])
    m = lambda x, t, class_labels: type('O', (), {'sample': 0.1 * x})()
    assert torch.equal(sample(m, sched, lab, NULL_CLASS, (1, 2), n_steps=2, n=2), sample(m, sched, lab, NULL_CLASS, (1, 2), n_steps=2))

def test_unconditional_bad_input():
    m, sched = (lambda x, t: type('O', (), {'sample': x})()), DDIMScheduler(num_train_timesteps=10)
    for n in (None, 0, -2, 2.5, True, '3'):
        with pytest.raises(ConfigError, match='needs the number of samples n') as e: sample(m, sched, None, None, (1, 2), n=n)
        assert f"n={n!r}" in str(e.value)
    for gd in (cfg, Damped()):
        with pytest.raises(ConfigError, match='guidance=.* with cond=None'): sample(m, sched, None, None, (1, 2), guidance=gd, scale=3., n=2)
    with pytest.raises(ConfigError, match='n=3 with cond of 2 rows'): sample(m, sched, torch.tensor([1, 2]), 0, (1, 2), n=3)

# ---------------------------------------------------------------- bad input

def test_bad_input():
    c = torch.zeros(2, 4)
    with pytest.raises(ConfigError): to_x0(c, c, 0.5, 'eps')
    with pytest.raises(ConfigError): to_x0(c, c, 1.5)
    with pytest.raises(ConfigError): to_x0(c, c, -0.1, 'v_prediction')
    with pytest.raises(ConfigError): from_x0(c, c, 1.0)
    sched = DDIMScheduler(num_train_timesteps=10)
    m = lambda x, t, y: type('O', (), {'sample': x})()
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), space='latent')
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), n_steps=0)
    with pytest.raises(ConfigError): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), batch_size=0)
    with pytest.raises(ConfigError): sample(m, DDIMScheduler(num_train_timesteps=10, prediction_type='flow_prediction'), torch.tensor([1]), 2, (1, 2, 2))
    with pytest.raises(ShapeError): sample(m, sched, torch.zeros(1, 3), 2, (1, 2, 2), guidance=cfg)
    with pytest.raises(ShapeError): sample(m, sched, [1, 2], torch.tensor([0, 0]), (1, 2, 2), guidance=cfg)
    with pytest.raises(NotFiniteError): sample(lambda x, t, class_labels: type('O', (), {'sample': x * float('nan')})(), sched, torch.tensor([1]), 2, (1, 2, 2), n_steps=2)
    assert denoiser_forward(lambda x, t, class_labels: type('O', (), {'sample': x + class_labels})(), torch.zeros(1), 0, torch.ones(1, dtype=torch.long)).item() == 1
    with pytest.raises(ConfigError, match='n_steps=0'): sample(m, sched, torch.tensor([1]), 2, (1, 2, 2), n_steps=0)
    for bad in (float('nan'), float('inf'), '3', None, True):
        with pytest.raises(ConfigError, match='scale='): check_scale(bad)

# ---------------------------------------------------------------- calling a denoiser

def test_denoiser_forward_routes_conditions_as_diffusers_does():
    seen = []
    def model(x, t, **kw):
        seen.append(sorted(kw)); return type('O', (), {'sample': x + 1})()
    x = torch.zeros(2, 1, 2, 2)
    for cond, want in ((None, []), (torch.tensor([1, 2]), ['class_labels']), (torch.zeros(2, 5, 3), ['encoder_hidden_states']),
                       ({'class_labels': torch.tensor([1, 2]), 'added_cond_kwargs': {}}, ['added_cond_kwargs', 'class_labels'])):
        seen.clear()
        assert torch.equal(denoiser_forward(model, x, 3, cond), x + 1) and seen == [want]
    # a real class-conditional UNet and a text-conditional one, called the way their own pipelines call them
    from diffusers import UNet2DConditionModel
    u = tiny_unet(seed=1).eval()
    with torch.no_grad():
        assert torch.equal(denoiser_forward(u, rnd(2, 1, 8, 8), 5, torch.tensor([3, 4])), u(rnd(2, 1, 8, 8), 5, class_labels=torch.tensor([3, 4])).sample)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tc = UNet2DConditionModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16), norm_num_groups=4,
                                  down_block_types=('CrossAttnDownBlock2D', 'DownBlock2D'), up_block_types=('UpBlock2D', 'CrossAttnUpBlock2D'),
                                  cross_attention_dim=6, attention_head_dim=2).eval()
    emb = rnd(2, 3, 6, seed=9)
    with torch.no_grad():
        assert torch.equal(denoiser_forward(tc, rnd(2, 1, 8, 8), 5, emb), tc(rnd(2, 1, 8, 8), 5, encoder_hidden_states=emb).sample)

def test_a_forward_without_cond_serves_unconditional_models():
    m = tiny_unet(seed=5, num_class_embeds=None).eval()
    sched = DDIMScheduler(**SCHED)
    fwd3 = lambda model, x, t: model(x, t).sample   # three arguments: called without cond
    assert torch.equal(sample(m, sched, None, None, (1, 8, 8), n_steps=3, n=2, forward=fwd3), sample(m, sched, None, None, (1, 8, 8), n_steps=3, n=2))
    with pytest.raises(TypeError): sample(m, sched, torch.tensor([1]), None, (1, 8, 8), n_steps=2, forward=fwd3)   # but it cannot take a condition

# ---------------------------------------------------------------- the old names

def _warns(f, *names):
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        out = f()
    assert [x.category for x in w] == [FutureWarning] and all(n in str(w[0].message) for n in names), [str(x.message) for x in w]
    return out

def test_renamed_and_moved_names_keep_working_with_a_warning():
    import interpkit.diffusion as ikd, interpkit.demos.apg as demo
    assert _warns(lambda: ikd.PREDICTIONS, 'PREDICTION_TYPES') is PREDICTION_TYPES
    assert _warns(lambda: ikd.class_forward, 'denoiser_forward') is denoiser_forward
    x, p = rnd(2, 3, seed=1), rnd(2, 3, seed=2)
    assert torch.equal(_warns(lambda: to_x0(p, x, 0.3, kind='v_prediction'), 'prediction_type='), to_x0(p, x, 0.3, 'v_prediction'))
    assert torch.equal(_warns(lambda: from_x0(p, x, 0.3, kind='v_prediction'), 'prediction_type='), from_x0(p, x, 0.3, prediction_type='v_prediction'))
    m, sched = (lambda x_, t, class_labels: type('O', (), {'sample': 0.1 * x_})()), DDIMScheduler(num_train_timesteps=20)
    assert torch.equal(_warns(lambda: sample(m, sched, torch.tensor([1]), 0, (1, 2), steps=3), 'n_steps='), sample(m, sched, torch.tensor([1]), 0, (1, 2), n_steps=3))
    with pytest.raises(ConfigError, match='both'): sample(m, sched, torch.tensor([1]), 0, (1, 2), steps=3, n_steps=3)
    for name in ('NULL_CLASS', 'DIGIT_UNET', 'DIGIT_SCHEDULER', 'digit_images', 'digit_unet', 'train_digit_diffusion', 'load_digit_diffusion', 'train_digit_classifier'):
        assert _warns(lambda: getattr(ikd, name), f'interpkit.demos.apg.{name}') is getattr(demo, name)
        assert name not in ikd.__all__
    with pytest.raises(AttributeError): ikd.no_such_name

# ---------------------------------------------------------------- training: the target, the draws, the loop

TYPES = ['epsilon', 'v_prediction', 'sample']

@pytest.mark.parametrize('kind', TYPES)
def test_training_target_by_hand(kind):
    sched = DDPMScheduler(num_train_timesteps=100, beta_schedule='squaredcos_cap_v2', prediction_type=kind)
    x0, eps, t = rnd(3, 1, 4, 4, seed=1), rnd(3, 1, 4, 4, seed=2), torch.tensor([0, 40, 99])
    ab = sched.alphas_cumprod.double()[t].view(-1, 1, 1, 1)
    want = {'epsilon': eps.double(), 'sample': x0.double(), 'v_prediction': ab.sqrt() * eps.double() - (1 - ab).sqrt() * x0.double()}[kind]
    for dt in (torch.float32, torch.float64):
        got = training_target(sched, x0.to(dt), eps, t)
        assert got.dtype == dt and torch.allclose(got.double(), want, atol=1e-6 if dt == torch.float32 else 1e-15)
    # what a model predicting the target exactly gives back x0 through the sampler's conversion
    xt = sched.add_noise(x0.double(), eps.double(), t)
    assert torch.allclose(to_x0(training_target(sched, x0.double(), eps, t), xt, ab.flatten(), kind), x0.double(), atol=1e-9)
    # another scheduler family with the same config has the same forward process
    for name in ('EulerDiscreteScheduler', 'DPMSolverMultistepScheduler', 'PNDMScheduler'):
        assert torch.equal(training_target(getattr(diffusers, name).from_config(sched.config), x0, eps, t), training_target(sched, x0, eps, t))

def _by_hand(model, sched, images, labels, null, p_uncond, keep, common, steps, batch_size, lr, seed):
    "The DDPM loss written out, on the core's `fit`: the draws in the documented order, x_t and the target from the closed forms."
    from interpkit.train import fit
    rows = keep.nonzero().squeeze(1) if keep is not None else torch.arange(len(images))
    x = images[rows]; y = None if labels is None else labels[rows]
    ab_all, kind = sched.alphas_cumprod, sched.config.prediction_type
    def batches(step, gen):
        if common:
            t_all, e_all = torch.randint(1000, (len(images),), generator=gen), torch.randn(images.shape, generator=gen)
            i = torch.arange(len(rows)) if batch_size is None else torch.randint(len(rows), (batch_size,), generator=gen)
            t, e = t_all[rows][i], e_all[rows][i]
        else:
            i = torch.arange(len(rows)) if batch_size is None else torch.randint(len(rows), (batch_size,), generator=gen)
        d = torch.rand(len(i), generator=gen) < p_uncond if p_uncond else torch.zeros(len(i), dtype=torch.bool)
        if not common: t, e = torch.randint(1000, (len(i),), generator=gen), torch.randn(x[i].shape, generator=gen)
        return x[i], None if y is None else torch.where(d, null, y[i]), t, e
    def loss(m, b):
        x0, lab, t, e = b
        a = ab_all.to(x0.dtype)[t].view(-1, 1, 1, 1)
        xt = a ** 0.5 * x0 + (1 - a) ** 0.5 * e.to(x0.dtype)
        target = {'epsilon': e.to(x0.dtype), 'sample': x0, 'v_prediction': a ** 0.5 * e.to(x0.dtype) - (1 - a) ** 0.5 * x0}[kind]
        out = m(xt.float(), t) if lab is None else m(xt.float(), t, class_labels=lab)
        return ((out.sample - target.float()) ** 2).mean()
    return model, None, fit(model, batches, loss, steps=steps, lr=lr, seed=seed, warmup=steps // 10, grad_clip=1.0, progress=False)

def _same(a, b):
    return a[2].history['loss'].tolist() == b[2].history['loss'].tolist() and all(torch.equal(p, q) for p, q in zip(a[0].parameters(), b[0].parameters()))

@pytest.mark.parametrize('kind', TYPES)
def test_train_ddpm_is_the_loop_written_out_bit_for_bit(kind):
    images = rnd(40, 1, 8, 8, seed=11).clamp(-1, 1)
    labels = torch.arange(40) % 10
    sched = DDPMScheduler(**dict(SCHED, prediction_type=kind))
    keep = torch.arange(40) % 3 != 0
    for cond, p, kp, common, bs, dt in ((labels, 0.2, None, False, 8, torch.float32), (None, 0., keep, True, None, torch.float64),
                                        (labels, 0.3, keep, True, 5, torch.float32), (None, 0., None, False, None, torch.float32)):
        m = lambda: tiny_unet(seed=3, num_class_embeds=None if cond is None else NULL_CLASS + 1)
        got = train_ddpm(m(), sched, images.to(dt), cond, null=NULL_CLASS, p_uncond=p, keep=kp, common_draws=common, steps=4, batch_size=bs, lr=3e-3, seed=7, progress=False)
        want = _by_hand(m(), sched, images.to(dt), cond, NULL_CLASS, p, kp, common, 4, bs, 3e-3, 7)
        assert _same(got, want), (cond is None, p, common, bs, dt)
        assert isinstance(got, Trained) and not got.model.training and got.tokenizer is None

def test_common_draws_give_an_image_the_same_noise_in_every_subset():
    seen = {}
    class Rec(nn.Module):   # records the noisy input of each training image by its value at pixel 0, which identifies the image
        def __init__(self): super().__init__(); self.w = nn.Parameter(torch.zeros(()))
        def forward(self, x, t): seen.setdefault(self.tag, []).append((x.detach().clone(), t.clone())); return self.w * x
    images = torch.zeros(6, 1, 2, 2)
    sched = DDPMScheduler(num_train_timesteps=1000)
    for tag, keep in (('all', None), ('some', torch.tensor([True, False, True, False, False, True]))):
        r = Rec(); r.tag = tag
        train_ddpm(r, sched, images, keep=keep, common_draws=True, steps=2, batch_size=None, progress=False, seed=4)
    for step in range(2):
        (xa, ta), (xs, ts) = seen['all'][step], seen['some'][step]
        assert torch.equal(ts, ta[[0, 2, 5]]) and torch.equal(xs, xa[[0, 2, 5]])   # images 0, 2 and 5: the same t and x_t (x0 = 0: x_t = √(1−ᾱ) ε)
    r = Rec(); r.tag = 'own'
    train_ddpm(r, sched, images, keep=torch.tensor([True, False, True, False, False, True]), steps=1, batch_size=None, progress=False, seed=4)
    assert not torch.equal(seen['own'][0][1], seen['all'][0][1][[0, 2, 5]])   # without common draws the subset draws its own

def test_label_dropout_rate():
    # 1 step of 20,000 rows with p_uncond = 0.25: the share of null labels has standard deviation √(0.25·0.75/20000) = 0.0031; 0.02 is 6.5 of them
    got = []
    class Lin(nn.Module):
        def __init__(self): super().__init__(); self.w = nn.Parameter(torch.zeros(()))
        def forward(self, x, t, class_labels): got.append(class_labels.clone()); return self.w * x
    labels = torch.arange(20000) % 3
    train_ddpm(Lin(), DDPMScheduler(num_train_timesteps=10), torch.zeros(20000, 1), labels, null=7, p_uncond=0.25, steps=1, batch_size=None, progress=False)
    lab = got[0]
    assert abs((lab == 7).float().mean().item() - 0.25) < 0.02 and torch.equal(lab[lab != 7], labels[lab != 7])

def test_dict_conditions_and_embeddings_are_dropped_row_by_row():
    got = []
    class Cond(nn.Module):   # takes its conditions as keyword arguments, as the default forward passes a dict
        def __init__(self): super().__init__(); self.w = nn.Parameter(torch.zeros(()))
        def forward(self, x, t, class_labels, emb): got.append((class_labels.clone(), emb.clone())); return self.w * x
    n = 400
    cond = {'class_labels': torch.arange(n) % 5, 'emb': torch.ones(n, 3)}
    null = {'class_labels': torch.full((n,), 9), 'emb': torch.zeros(n, 3)}
    train_ddpm(Cond(), DDPMScheduler(num_train_timesteps=10), torch.zeros(n, 1), cond, null=null, p_uncond=0.5, steps=1, batch_size=None, progress=False)
    lab, emb = got[0]
    dropped = lab == 9
    assert 0.3 < dropped.float().mean() < 0.7 and torch.equal(emb[dropped], torch.zeros(int(dropped.sum()), 3)) and torch.equal(emb[~dropped], torch.ones(int((~dropped).sum()), 3))
    # float embeddings alone go in as encoder_hidden_states and drop to the null embedding
    seen = []
    class Text(nn.Module):
        def __init__(self): super().__init__(); self.w = nn.Parameter(torch.zeros(()))
        def forward(self, x, t, encoder_hidden_states): seen.append(encoder_hidden_states.clone()); return self.w * x
    train_ddpm(Text(), DDPMScheduler(num_train_timesteps=10), torch.zeros(n, 1), torch.ones(n, 2, 4), null=torch.zeros(n, 2, 4), p_uncond=0.5, steps=1, batch_size=None, progress=False)
    rows = seen[0].flatten(1)
    assert set(rows.sum(1).tolist()) == {0., 8.} and 0.3 < (rows.sum(1) == 0).float().mean() < 0.7   # whole rows dropped; share 0.5 (sd 0.025)

def test_train_ddpm_with_any_supported_scheduler_and_leaves_it_alone():
    images = rnd(16, 1, 8, 8, seed=12)
    ddpm = DDPMScheduler(**SCHED)
    ref = train_ddpm(tiny_unet(num_class_embeds=None), ddpm, images, steps=2, batch_size=4, progress=False)
    for name in ('EulerDiscreteScheduler', 'DDIMScheduler', 'UniPCMultistepScheduler'):
        s = getattr(diffusers, name).from_config(ddpm.config)
        before = s.alphas_cumprod.clone()
        assert _same(train_ddpm(tiny_unet(num_class_embeds=None), s, images, steps=2, batch_size=4, progress=False), ref)
        assert torch.equal(s.alphas_cumprod, before) and s.num_inference_steps is None
    # a bfloat16 model trains, its loss in float32
    m = tiny_unet(num_class_embeds=None).bfloat16()
    assert np.isfinite(train_ddpm(m, ddpm, images, steps=2, batch_size=4, progress=False)[2].history['loss']).all() and m.dtype == torch.bfloat16

def test_train_ddpm_bad_input():
    m, sched, x, lab = tiny_unet(), DDPMScheduler(**SCHED), rnd(4, 1, 8, 8), torch.tensor([1, 2, 3, 4])
    go = lambda **kw: train_ddpm(**{**dict(model=m, scheduler=sched, images=x, steps=1, progress=False), **kw})
    with pytest.raises(ShapeError, match='images'): go(images=torch.zeros(4, 1, 8, 8, dtype=torch.long))
    with pytest.raises(ShapeError, match='images'): go(images=torch.zeros(0, 1, 8, 8))
    with pytest.raises(NotFiniteError): go(images=torch.full((2, 1, 8, 8), float('nan')))
    with pytest.raises(ShapeError, match='keep'): go(keep=torch.tensor([True, False]))
    with pytest.raises(ShapeError, match='keep'): go(keep=torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ConfigError, match='p_uncond'): go(cond=lab, null=10, p_uncond=1.)
    with pytest.raises(ConfigError, match='p_uncond'): go(cond=lab, null=10, p_uncond=-0.1)
    with pytest.raises(ConfigError, match='cond=None'): go(p_uncond=0.1)
    with pytest.raises(ShapeError, match='3 rows'): go(cond=lab[:3])
    with pytest.raises(ShapeError, match='null'): go(cond=torch.zeros(4, 3), null=torch.zeros(4, 2), p_uncond=0.1)
    with pytest.raises(ConfigError, match='batch_size'): go(batch_size=0)
    with pytest.raises(ConfigError, match='EulerDiscreteScheduler'): go(scheduler=diffusers.KDPM2DiscreteScheduler())
    with pytest.raises(ConfigError, match='prediction_type'): go(scheduler=DDPMScheduler(prediction_type='flow_prediction'))
    with pytest.raises(ConfigError, match='flow'): go(scheduler=diffusers.DPMSolverMultistepScheduler(use_flow_sigmas=True))


def test_sample_checks_shape_and_labels_against_a_diffusers_unet():
    "Issue 51: a sample shape or class label the UNet cannot take is a typed error before anything runs, not diffusers' or torch's."
    from diffusers import UNet2DModel, DDIMScheduler
    from interpkit.errors import ConfigError, ShapeError
    from interpkit.diffusion import sample
    with seeded(0):
        u = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16), down_block_types=('DownBlock2D', 'DownBlock2D'),
                        up_block_types=('UpBlock2D', 'UpBlock2D'), norm_num_groups=4, num_class_embeds=3)
    s = DDIMScheduler(num_train_timesteps=100)
    y = torch.tensor([0, 1])
    with pytest.raises(ShapeError, match='in_channels=1'): sample(u, s, y, 2, (3, 8, 8), n_steps=2)
    with pytest.raises(ShapeError, match='divisible by 2'): sample(u, s, y, 2, (1, 7, 7), n_steps=2)
    with pytest.raises(ConfigError, match=r'\[5\]'): sample(u, s, torch.tensor([0, 5]), 2, (1, 8, 8), n_steps=2)
    with pytest.raises(ConfigError, match=r'\[3\] .*num_class_embeds=3'): sample(u, s, y, 3, (1, 8, 8), n_steps=2)   # the null class must be an embedded one too
    assert sample(u, s, y, 2, (1, 8, 8), n_steps=2).shape == (2, 1, 8, 8)
    with seeded(0):
        un = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16), down_block_types=('DownBlock2D', 'DownBlock2D'),
                         up_block_types=('UpBlock2D', 'UpBlock2D'), norm_num_groups=4)
    with pytest.raises(ConfigError, match='for an unconditional UNet2DModel'): sample(un, s, y, 0, (1, 8, 8), n_steps=2)
    with pytest.raises(ConfigError, match='class-conditional'): sample(u, s, None, None, (1, 8, 8), n_steps=2, n=2)   # and no labels for a class-conditional one
    assert sample(un, s, None, None, (1, 8, 8), n_steps=2, n=2).shape == (2, 1, 8, 8)
