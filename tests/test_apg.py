"""Tests of interpkit.papers.apg against independent references: CFG as a special case of APG, numpy projections, norm bounds,
a by-hand momentum recurrence, diffusers' own APG guider, a hand-written Euler sampling loop, APG in the core's sampler on every supported
scheduler, image statistics against numpy, the notebook's claims on the shipped model, bad input. The sampler and the conversions are
tested in test_diffusion.py, the demo's data and models (interpkit.demos.apg) in test_apg_demo.py."""
import copy, dataclasses, math, os
import numpy as np, pytest, torch
from torch import nn
import diffusers
from diffusers import DDIMScheduler, EulerDiscreteScheduler
from diffusers.guiders.adaptive_projected_guidance import MomentumBuffer, normalized_guidance
from transformers.modeling_outputs import ImageClassifierOutput
from interpkit.papers.apg import cfg, apg, split_parallel, rescale, Momentum, CFG, APG, image_stats, ImageStats
from interpkit.diffusion import sample, SUPPORTED_SCHEDULERS, GUIDANCE_SPACES
from interpkit.demos.apg import NULL_CLASS, DIGIT_SCHEDULER, load_digit_diffusion, digit_unet
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

# ---------------------------------------------------------------- APG in the core's sampler

def tiny_unet(seed=0, **kw): return digit_unet(seed, block_out_channels=(8, 16), **kw)

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
    got = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), gd, 6., n_steps=5, seed=2)
    want = _euler_by_hand(m, labels, gd.start(), 6., 5, 2, sched)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5)
    # and it is not what applying APG to the ε prediction gives (the projection is not affine)
    assert not torch.allclose(got, sample(m, sched, labels, NULL_CLASS, (1, 8, 8), gd, 6., n_steps=5, seed=2, space='pred'), atol=1e-2)

@pytest.mark.parametrize('name', SUPPORTED_SCHEDULERS)
def test_every_scheduler_samples_with_apg(untouched, name):
    m = tiny_unet().train()
    sched = getattr(diffusers, name)(num_train_timesteps=1000)
    with untouched(m):
        a = sample(m, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), APG(r=1.), 4., n_steps=4, seed=1)
        b = sample(m, sched, torch.tensor([3, 5]), NULL_CLASS, (1, 8, 8), APG(r=1.), 4., n_steps=4, seed=1)
    assert torch.isfinite(a).all() and torch.equal(a, b)                     # same seed, same numbers: momentum starts afresh in every run

def test_apg_in_the_sampler_at_scale1_and_above():
    m, sched, labels = tiny_unet().eval(), DDIMScheduler(**DIGIT_SCHEDULER), torch.tensor([0, 3, 9])
    plain = sample(m, sched, labels, NULL_CLASS, (1, 8, 8), guidance=None, n_steps=5)
    for gd in (CFG(), APG(), APG(eta=1., r=0.3, beta=-0.9)):
        for space in GUIDANCE_SPACES:
            assert torch.allclose(sample(m, sched, labels, NULL_CLASS, (1, 8, 8), guidance=gd, scale=1., n_steps=5, space=space), plain, atol=1e-5)
    # CFG is affine in the prediction, so guiding x0 or ε gives the same samples; APG is not (the projection), and APG is not CFG
    a, b, c, d = (sample(m, sched, labels, NULL_CLASS, (1, 8, 8), guidance=gd, scale=5., n_steps=5, space=sp)
                  for gd, sp in ((CFG(), 'x0'), (CFG(), 'pred'), (APG(), 'x0'), (APG(), 'pred')))
    assert torch.allclose(a, b, atol=1e-4) and not torch.allclose(a, c, atol=1e-3) and not torch.allclose(c, d, atol=1e-3)

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

# ---------------------------------------------------------------- the notebook's claims on the shipped model

def test_the_headline_on_the_shipped_model():
    # the notebook's claim at a smaller scale: at a high guidance scale APG clips and saturates less than CFG
    unet, _, meta = load_digit_diffusion()
    labels = torch.arange(10).repeat_interleave(2)
    sched = DDIMScheduler(**meta['scheduler'])
    c = image_stats(sample(unet, sched, labels, NULL_CLASS, (1, 8, 8), CFG(), 15., n_steps=10))
    a = image_stats(sample(unet, sched, labels, NULL_CLASS, (1, 8, 8), APG(r=1.35), 15., n_steps=10))
    assert c.clipped > a.clipped + 0.1 and c.saturation > a.saturation

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
    with pytest.raises(ShapeError): rescale(torch.tensor(3.), 1.)
    with pytest.raises(ConfigError): APG(r=0.)
    with pytest.raises(ConfigError): APG(beta=1.)
    with pytest.raises(ConfigError): APG(eta=float('nan'))
    with pytest.raises(ConfigError): Momentum(-1.)
    with pytest.raises(ShapeError): image_stats(c, torch.zeros(3), lambda z: z)
    with pytest.raises(ShapeError): image_stats(c, None, lambda z: z)
    with pytest.raises(NotFiniteError, match='samples'): image_stats(torch.full((2, 4), float('nan')))
    with pytest.raises(ConfigError): image_stats(c, torch.zeros(2), lambda z: z, batch_size=0)

def test_momentum_at_every_evaluation_on_heun_as_the_notebook_says():
    # the notebook's "Differences": with Heun (two evaluations per step) reverse momentum makes APG clip more than CFG; without it, less
    unet, _, meta = load_digit_diffusion()
    labels = torch.arange(10).repeat_interleave(4)
    sched = diffusers.HeunDiscreteScheduler.from_config({**meta['scheduler'], 'timestep_spacing': 'leading'})
    clipped = {k: image_stats(sample(unet, sched, labels, NULL_CLASS, (1, 8, 8), gd, 7., n_steps=10)).clipped
               for k, gd in (('cfg', CFG()), ('apg', APG(r=1.35)), ('apg0', APG(r=1.35, beta=0.)))}
    assert clipped['apg'] > clipped['cfg'] > clipped['apg0'], clipped
    # the numbers quoted there, rounded to two digits (±0.005), plus 4 of the 2,560 pixels (0.0016) for round-off on other CPUs: measured 0.3703,
    # 0.4848 and 0.2469 alike with AVX-512, AVX2 and no vector instructions and with 1 or 2 threads (APG's is 0.6 pixel from rounding up)
    assert clipped == pytest.approx({'cfg': 0.37, 'apg': 0.48, 'apg0': 0.25}, abs=0.005 + 4 / 2560)


def test_nan_predictions_and_integer_images_are_refused():
    "Issue 51's classes in APG: NaN predictions flowed through the guidance, and uint8 pixels were read as values in [-1, 1] (saturation 0 for a black image)."
    from interpkit.errors import ConfigError, NotFiniteError
    from interpkit.papers.apg import apg, image_stats
    g = torch.Generator().manual_seed(0)
    c, u = torch.randn(2, 1, 4, 4, generator=g), torch.randn(2, 1, 4, 4, generator=g)
    c[1, 0, 2, 2] = float('nan')
    with pytest.raises(NotFiniteError, match='^cond has 1 non-finite'): apg(c, u, 2.0)
    with pytest.raises(ConfigError, match='torch.uint8 tensor'): image_stats(torch.zeros(2, 1, 4, 4, dtype=torch.uint8))
