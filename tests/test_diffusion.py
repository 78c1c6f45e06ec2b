"""Tests of interpkit.diffusion against independent references: diffusers' own scheduler formulas for x0/ε/v, the x0 that every supported
scheduler itself computes, a plain diffusers sampling loop for unconditional models, scikit-learn's digits, devices and dtypes, model outputs,
short training runs, bad input. Guidance rules here are stand-ins (CFG written out, a rule with a state, a non-affine rule); APG's are in test_apg.py."""
import copy, dataclasses, inspect, os
import numpy as np, pytest, torch
from torch import nn
import diffusers
from diffusers import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler, UNet2DModel
from interpkit.diffusion import (to_x0, from_x0, sample, class_forward, NULL_CLASS, DIGIT_UNET, DIGIT_SCHEDULER, SUPPORTED_SCHEDULERS, GUIDANCE_SPACES,
                                 PREDICTIONS, train_digit_diffusion, load_digit_diffusion, train_digit_classifier, digit_images, digit_unet)
from interpkit.errors import ConfigError, ShapeError, NotFiniteError
from interpkit.train import seeded

os.environ.setdefault('HF_HUB_OFFLINE', '1')

def rnd(*shape, seed=0): return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

def cfg(c, u, w): return u + w * (c - u)   # classifier-free guidance, the textbook form

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

def tiny_unet(seed=0, **kw): return digit_unet(seed, block_out_channels=(8, 16), **kw)

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
    assert torch.isfinite(sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), Damped(), 5., steps=3)).all()

@pytest.mark.parametrize('name', SUPPORTED_SCHEDULERS)
def test_every_scheduler_samples_and_leaves_model_and_scheduler_alone(untouched, tiny, name):
    sched = getattr(diffusers, name)(num_train_timesteps=1000)
    before = (sched.num_inference_steps, copy.deepcopy(sched.timesteps))
    with untouched(tiny):
        a = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), Damped(), 4., steps=4, seed=1)
        b = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), Damped(), 4., steps=4, seed=1)
    assert torch.isfinite(a).all() and torch.equal(a, b)                     # same seed, same numbers (stochastic samplers too), a fresh state per run
    assert sched.num_inference_steps == before[0] and (sched.timesteps is before[1] is None or torch.equal(sched.timesteps, before[1]))   # the scheduler given was not set up
    if name in ('DDPMScheduler', 'EulerAncestralDiscreteScheduler'):          # their noise comes from the seeded generator
        c = sample(tiny, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), Damped(), 4., steps=4, seed=2)
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
        for gd in (cfg, Damped(), clamped):
            for space in GUIDANCE_SPACES:
                assert torch.allclose(sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=gd, scale=1., steps=5, space=space), plain, atol=1e-5)
        # CFG is affine in the prediction, so guiding x0 or ε gives the same samples
        a = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=cfg, scale=5., steps=5, space='x0')
        b = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=cfg, scale=5., steps=5, space='pred')
        assert torch.allclose(a, b, atol=1e-4) and not torch.allclose(a, plain, atol=1e-3)
        # ... and a rule that is not affine does not
        c = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=clamped, scale=5., steps=5, space='x0')
        d = sample(tiny, sched, labels, NULL_CLASS, (1, 8, 8), guidance=clamped, scale=5., steps=5, space='pred')
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
    with seeded(0): m = Noisy().train()
    sched, labels = DDIMScheduler(num_train_timesteps=100, clip_sample=False), torch.arange(5)
    with untouched(m):
        a = sample(m, sched, labels, NULL_CLASS, (1, 2, 2), Damped(), 3., steps=3)
        b = sample(m, sched, labels, NULL_CLASS, (1, 2, 2), Damped(), 3., steps=3, batch_size=3)
    assert torch.allclose(a, b, atol=1e-6)
    assert seen[:3] == [10, 10, 10] and seen[3:] == [3, 3, 3, 1] * 3        # 2N rows per step, in chunks of batch_size
    m.eval()
    assert torch.allclose(a, sample(m, sched, labels, NULL_CLASS, (1, 2, 2), Damped(), 3., steps=3), atol=1e-6)

def test_sampler_with_embeddings_dicts_outputs_and_a_plain_callable():
    emb_c, emb_n = rnd(4, 3, 5, seed=60), torch.zeros(4, 3, 5)
    W = rnd(5, 16, seed=61) * 0.1
    def model(x, t, c): return 0.1 * x + (c.mean(1) @ W).view(-1, 1, 4, 4)
    fwd = lambda m, x, t, c: m(x, t, c)
    sched = DDPMScheduler(num_train_timesteps=50)
    out = sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=Damped(), scale=4., steps=10, forward=fwd)
    assert out.shape == (4, 1, 4, 4) and torch.isfinite(out).all()
    # same seed, same numbers (DDPM is stochastic: its noise comes from the seeded generator)
    assert torch.equal(out, sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=Damped(), scale=4., steps=10, forward=fwd))
    # the same conditions as a dict, and the prediction inside a dict, a tuple or an object with .sample
    dfwd = lambda m, x, t, c: {'sample': m(x, t, c['emb'])}
    assert torch.equal(out, sample(model, sched, {'emb': emb_c}, {'emb': emb_n}, (1, 4, 4), Damped(), 4., steps=10, forward=dfwd))
    tfwd = lambda m, x, t, c: (m(x, t, c), None)
    assert torch.equal(out, sample(model, sched, emb_c, emb_n, (1, 4, 4), Damped(), 4., steps=10, forward=tfwd))
    # a plain guidance function: guidance at the midpoint of the two predictions (a scale < 1 of CFG)
    mid = sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=lambda c, u, w: (c + u) / 2, scale=4., steps=10, forward=fwd)
    assert torch.allclose(mid, sample(model, sched, emb_c, emb_n, (1, 4, 4), guidance=cfg, scale=0.5, steps=10, forward=fwd), atol=1e-5)

@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16])
def test_sampler_keeps_the_models_dtype(untouched, dtype):
    m32 = tiny_unet(seed=1).eval()
    m = copy.deepcopy(m32).to(dtype)
    seen = []
    def fwd(model, x, t, c): seen.append((x.dtype, c['emb'].dtype)); return model(x, t, class_labels=c['lab']).sample
    cond = {'lab': torch.tensor([2, 6]), 'emb': torch.zeros(2, 3)}            # a float condition goes to the model's dtype too
    null = {'lab': torch.full((2,), NULL_CLASS), 'emb': torch.ones(2, 3)}
    with untouched(m):
        x = sample(m, DDIMScheduler(**DIGIT_SCHEDULER), cond, null, (1, 8, 8), Damped(), 5., steps=4, forward=fwd)
    ref = sample(m32, DDIMScheduler(**DIGIT_SCHEDULER), cond, null, (1, 8, 8), Damped(), 5., steps=4, forward=fwd)
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
    run = lambda fwd: sample(model, sched, labels, 0, (1, 2, 2), Damped(), 3., steps=3, forward=fwd)
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
    go = lambda cond, null, guidance=cfg: sample(m, sched, cond, null, (1, 2, 2), guidance, 2., steps=2, forward=fwd)
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
        with pytest.raises(ConfigError, match=msg): sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), Damped(), 5., steps=5)
        with pytest.raises(NotFiniteError): sample(m, s, torch.tensor([1]), NULL_CLASS, (1, 8, 8), Damped(), 5., steps=5, space='pred')

def test_a_bfloat16_model_guides_in_float32():
    # the model runs in bfloat16, the guidance and the sampler's state in float32: the same as upcasting the model's output by hand
    m = tiny_unet(seed=4).eval().bfloat16()
    sched, labels = EulerDiscreteScheduler(num_train_timesteps=1000), torch.tensor([2, 8])
    a = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), Damped(), 7., steps=4)
    b = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), Damped(), 7., steps=4, forward=lambda mm, x, t, c: class_forward(mm, x, t, c).float())
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
    sched = getattr(diffusers, name)(**DIGIT_SCHEDULER) if name != 'EulerDiscreteScheduler' else EulerDiscreteScheduler(num_train_timesteps=1000, timestep_spacing='leading')
    with untouched(m):
        x = sample(m, sched, None, None, (1, 8, 8), steps=6, seed=3, n=5, batch_size=2)
    m.eval()
    assert x.shape == (5, 1, 8, 8) and torch.allclose(x, _plain_loop(m, sched, 5, (1, 8, 8), 6, 3), atol=1e-5)
    assert torch.allclose(x, sample(m, sched, None, None, (1, 8, 8), steps=6, seed=3, n=5), atol=1e-5)   # in one chunk or in three: the same samples

def test_unconditional_calls():
    calls = []
    class Plain(nn.Module):   # no class_labels argument at all
        def __init__(self): super().__init__(); self.w = nn.Parameter(torch.tensor(0.1))
        def forward(self, x, t):
            calls.append(len(x)); return type('O', (), {'sample': self.w * x})()
    sched = DDIMScheduler(num_train_timesteps=50, clip_sample=False)
    x = sample(Plain(), sched, None, None, (2, 3), steps=3, n=5, batch_size=2)
    assert x.shape == (5, 2, 3) and calls == [2, 2, 1] * 3                                        # n rows per step, in chunks of batch_size
    seen = []
    def fwd(m, x, t, c): seen.append(c); return 0 * x
    sample(Plain(), sched, None, 7, (2, 3), steps=2, n=1, forward=fwd)                            # null is not used
    assert seen == [None, None]                                                                   # a forward of your own gets cond=None
    assert class_forward(lambda x, t: type('O', (), {'sample': x + 1})(), torch.zeros(1), 0, None).item() == 1
    # conditioned on labels, n may repeat the number of samples
    lab = torch.tensor([1, 2])
    m = lambda x, t, class_labels: type('O', (), {'sample': 0.1 * x})()
    assert torch.equal(sample(m, sched, lab, NULL_CLASS, (1, 2), steps=2, n=2), sample(m, sched, lab, NULL_CLASS, (1, 2), steps=2))

def test_unconditional_bad_input():
    m, sched = (lambda x, t: type('O', (), {'sample': x})()), DDIMScheduler(num_train_timesteps=10)
    for n in (None, 0, -2, 2.5, True, '3'):
        with pytest.raises(ConfigError, match='needs the number of samples n') as e: sample(m, sched, None, None, (1, 2), n=n)
        assert f"n={n!r}" in str(e.value)
    for gd in (cfg, Damped()):
        with pytest.raises(ConfigError, match='guidance=.* with cond=None'): sample(m, sched, None, None, (1, 2), guidance=gd, scale=3., n=2)
    with pytest.raises(ConfigError, match='n=3 with cond of 2 rows'): sample(m, sched, torch.tensor([1, 2]), 0, (1, 2), n=3)

# ---------------------------------------------------------------- the digit model, its data and a classifier

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

def test_digit_images_of_some_classes():
    for split in ('train', 'test'):
        x, y = digit_images(split)
        for classes in ((0, 1), [7], (9, 3, 3), range(10), torch.tensor([2, 5]), np.array([4, 8])):
            want = torch.tensor([int(v) in set(np.asarray(classes).tolist()) for v in y])   # a mask built by hand
            xs, ys = digit_images(split, classes=classes)
            assert torch.equal(xs, x[want]) and torch.equal(ys, y[want]) and len(ys) > 0        # the digits themselves, in the split's order
    assert torch.equal(digit_images(classes=[np.int64(3)])[1].unique(), torch.tensor([3]))
    for bad, said in (((1, 12), '12'), ((-1, 0), '-1'), ((1.5,), '1.5'), ((True,), 'True'), (('a',), "'a'")):
        with pytest.raises(ConfigError, match='unknown class') as e: digit_images(classes=bad)
        assert said in str(e.value) and '0..9' in str(e.value)
    for bad in ((), 3, 'ab', []):
        with pytest.raises(ConfigError, match=r'classes=.*(holds no classes|unknown)'): digit_images(classes=bad)

def test_digit_unet_with_overrides():
    base = dict(DIGIT_UNET)
    def ref(seed, **kw):   # what digit_unet should be: UNet2DModel with the changed configuration, from the seeded RNG
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return UNet2DModel(**{**DIGIT_UNET, **kw})
    m = digit_unet(3, block_out_channels=(16, 32))
    assert tuple(m.config.block_out_channels) == (16, 32) and m.config.num_class_embeds == NULL_CLASS + 1
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), ref(3, block_out_channels=(16, 32)).state_dict().values()))
    assert all(torch.equal(a, b) for a, b in zip(digit_unet().state_dict().values(), ref(0).state_dict().values()))
    u = digit_unet(num_class_embeds=None, layers_per_block=2)
    assert u.class_embedding is None and u.config.layers_per_block == 2
    with torch.no_grad(): assert u(torch.zeros(2, 1, 8, 8), 10).sample.shape == (2, 1, 8, 8)   # called without labels
    assert DIGIT_UNET == base                                                                 # the defaults are not changed
    with pytest.raises(ConfigError, match="num_class_embed.*Did you mean 'num_class_embeds'") as e: digit_unet(num_class_embed=None)
    assert 'block_out_channels' in str(e.value)

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
    # trained vs fresh: ε-prediction error on held-out digits, a Monte-Carlo estimate over 450 digits' seeded noise: 0.165 and 1.18, with standard
    # errors 0.003 and 0.010 (over the digits; measured), so each threshold lies more than 25 of them away: no noise seed would flip it
    assert _denoising_mse(unet) < 0.35 < 0.9 < _denoising_mse(digit_unet().eval())
    assert DDIMScheduler(**meta['scheduler']).config.beta_schedule == DIGIT_SCHEDULER['beta_schedule']

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
    with pytest.raises(ShapeError): sample(m, sched, torch.zeros(1, 3), 2, (1, 2, 2), guidance=cfg)
    with pytest.raises(ShapeError): sample(m, sched, [1, 2], torch.tensor([0, 0]), (1, 2, 2), guidance=cfg)
    with pytest.raises(NotFiniteError): sample(lambda x, t, class_labels: type('O', (), {'sample': x * float('nan')})(), sched, torch.tensor([1]), 2, (1, 2, 2), steps=2)
    with pytest.raises(ConfigError): train_digit_diffusion(steps=1, p_uncond=0.)
    with pytest.raises(ConfigError): train_digit_diffusion(steps=1, p_uncond=1.)
    with pytest.raises(ConfigError): digit_images('val')
    assert class_forward(lambda x, t, class_labels: type('O', (), {'sample': x + class_labels})(), torch.zeros(1), 0, torch.ones(1)).item() == 1
