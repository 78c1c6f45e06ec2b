"""Tests of interpkit.papers.monosemantic (paper 12, Zhang et al. 2024: SimCLR vs non-negative contrastive learning vs a
TopK SAE, and the robustness of linear probes) against independent references: InfoNCE as a float64 double loop over
anchors and candidates and in the official solo-learn form −log(pos/(pos+neg)); GELU's derivative Φ(x)+xφ(x) written
with math.erf; the network's forward written out by hand from its weights; semantic consistency on hand-worked
activations and as a plain Python loop; a chi-square goodness-of-fit test (scipy) of the label noise; sample moments
of the input noise; scikit-learn's LogisticRegression as a second probe; the digit pairs matched pixel by pixel to the
images of `interpkit.data.digits`; image moments (centre of mass, principal axes) of augmented Gaussian blobs;
closed-form parameter counts; and bad input."""
import inspect, math
import numpy as np, pandas as pd, pytest, torch
import torch.nn.functional as F
from scipy import stats
from torch import nn
from interpkit.data import digits
from interpkit.errors import ConfigError, NotFiniteError, ShapeError
from interpkit.sae import SAE
from interpkit.train import assets_dir
import interpkit.papers.monosemantic as mono
import warnings
from sklearn.linear_model import LogisticRegression
from interpkit.train import Shipped, Trained
from interpkit.stats import Probe, linear_probe
from interpkit.papers.monosemantic import (info_nce, NON_NEGATIVE, non_negative, ContrastiveNet, contrastive_loss, train_contrastive,
                                           projector_features, semantic_consistency, Monosemanticity, top_activating, monosemanticity,
                                           symmetric_label_noise, gaussian_input_noise, few_shot_indices, label_noise_curve, input_noise_curve,
                                           robustness_table, train_feature_sae)
from interpkit.demos.monosemantic import (DigitPairs, digit_pairs, DigitAugment, DigitEncoder, DIGIT_RECIPE, DIGIT_MODELS, METHODS,
                                          train_digit_net, DigitModels, load_digit_models)

def sk_accuracy(x, y, xt, yt):
    "The probe written out with scikit-learn: a logistic regression (C = 1) on the raw features, trained to convergence."
    return LogisticRegression(max_iter=10_000).fit(np.asarray(x, np.float64), np.asarray(y)).score(np.asarray(xt, np.float64), np.asarray(yt))

torch.set_num_threads(1)

NEUTRAL = dict(rotate=0., scale=(1., 1.), shift=0., contrast=(1., 1.), brightness=0., erase=0., noise=0.)

def mlp_encoder(d_in=5, d_out=6, seed=0, dtype=torch.float32):
    "A flat MLP encoder (N, d_in) -> (N, d_out)."
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(d_in, 12), nn.Tanh(), nn.Linear(12, d_out)).to(dtype)

def cnn_encoder(d_out=8, seed=0):
    "A small CNN encoder for (N, 1, 8, 16) images."
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 8, d_out))

def tiny_net(non_neg='relu', d_proj=16, seed=0):
    "A ContrastiveNet on flattened 8×16 images."
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        enc = nn.Sequential(nn.Flatten(), nn.Linear(128, 16), nn.ReLU())
    return ContrastiveNet(enc, 16, d_proj, 16, non_neg, seed=seed)

def noise_aug(x, g): return x + 0.1 * torch.randn(x.shape, generator=g)

def rand(*shape, seed=0, dtype=torch.float32): return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)

@pytest.fixture(scope='module')
def pair_images():
    return digit_pairs('train', n=64).x

# ---------------------------------------------------------------- info_nce

def nce_loop(z1, z2, tau):
    "NT-Xent by a double loop in float64: −log(exp(s_pos/τ) / Σ_{j≠i} exp(s_ij/τ)), averaged over the 2n anchors."
    z = torch.cat([z1, z2]).double()
    z = z / z.norm(dim=1, keepdim=True)
    n2 = len(z); n = n2 // 2
    total = 0.
    for i in range(n2):
        p = (i + n) % n2
        den = sum(math.exp(float(z[i] @ z[j]) / tau) for j in range(n2) if j != i)
        total += -math.log(math.exp(float(z[i] @ z[p]) / tau) / den)
    return total / n2

def nce_solo(z1, z2, tau):
    "The solo-learn form: pos = exp(s_ip/τ), neg = Σ over the other 2n−2 views; loss −log(pos/(pos+neg)) averaged."
    z = F.normalize(torch.cat([z1, z2]).double(), dim=1)
    n = len(z1)
    s = torch.exp(z @ z.T / tau)
    pos_mask = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    idx = torch.arange(n)
    pos_mask[idx, idx + n] = True; pos_mask[idx + n, idx] = True
    neg_mask = ~pos_mask & ~torch.eye(2 * n, dtype=torch.bool)
    pos = (s * pos_mask).sum(1); neg = (s * neg_mask).sum(1)
    return float(-(pos / (pos + neg)).log().mean())

@pytest.mark.parametrize('tau', [0.05, 0.2, 1.0, 3.0])
def test_info_nce_matches_a_double_loop_and_the_solo_learn_form(tau):
    z1, z2 = 3 * rand(6, 7, seed=1), 0.2 * rand(6, 7, seed=2) + 1.   # unnormalised rows of different scales
    got = info_nce(z1, z2, tau)
    assert got.dim() == 0
    assert abs(got.item() - nce_loop(z1, z2, tau)) < 2e-5 * max(1., nce_loop(z1, z2, tau))
    assert abs(nce_solo(z1, z2, tau) - nce_loop(z1, z2, tau)) < 1e-10

def test_info_nce_default_temperature_and_scale_invariance():
    assert inspect.signature(info_nce).parameters['temperature'].default == 0.2   # the official code's 0.2
    z1, z2 = rand(4, 5, seed=3), rand(4, 5, seed=4)
    assert abs(info_nce(z1, z2).item() - nce_loop(z1, z2, 0.2)) < 1e-5
    row_scales = torch.tensor([[0.1], [7.], [2.], [30.]])
    assert torch.allclose(info_nce(z1 * row_scales, z2), info_nce(z1, z2), atol=1e-5)

def test_info_nce_perfect_pairs_and_swap_symmetry():
    # identical views of orthogonal rows: s_pos = 1, every negative 0 → loss = −log(e^{1/τ} / (e^{1/τ} + 2n−2))
    n, tau = 4, 0.5
    z = torch.eye(n)
    want = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + 2 * n - 2))
    assert abs(info_nce(z, z, tau).item() - want) < 1e-5
    z1, z2 = rand(5, 3, seed=5), rand(5, 3, seed=6)
    assert torch.allclose(info_nce(z1, z2), info_nce(z2, z1), atol=1e-6)

def test_info_nce_masks_the_anchor_itself():
    """Views (e, −e | −e, −e) at τ = 1e-3: anchor e sees three candidates at similarity −1 (loss log 3 whatever the scale,
    as long as the anchor itself is excluded); the two −e anchors whose partner is −e lose log 2; the −e anchor whose partner
    is e loses 2/τ + log 2."""
    e = torch.tensor([[1., 0.]])
    tau = 1e-3
    got = info_nce(torch.cat([e, -e]), torch.cat([-e, -e]), tau).item()
    assert got == pytest.approx((math.log(3) + 3 * math.log(2) + 2 / tau) / 4, rel=1e-6)

def test_info_nce_gradient_matches_the_loop():
    z1 = rand(3, 4, seed=7, dtype=torch.float64).requires_grad_(True)
    z2 = rand(3, 4, seed=8, dtype=torch.float64)
    info_nce(z1, z2, 0.3).backward()
    def ref(z):
        z = torch.cat([z, z2]); z = z / z.norm(dim=1, keepdim=True)
        s = (z @ z.T / 0.3).masked_fill(torch.eye(6, dtype=torch.bool), float('-inf'))
        return -(s.log_softmax(1)[torch.arange(6), torch.tensor([3, 4, 5, 0, 1, 2])]).mean()
    z = z1.detach().clone().requires_grad_(True)
    g_ref, = torch.autograd.grad(ref(z), z)
    assert torch.allclose(z1.grad, g_ref, atol=1e-5) and z1.grad.abs().max() > 1e-3

def test_info_nce_bad_input():
    z = rand(4, 3)
    with pytest.raises(ShapeError, match='shapes'): info_nce(z, rand(4, 2))
    with pytest.raises(ShapeError, match='shapes'): info_nce(z[None], z[None])
    with pytest.raises(ShapeError, match='pair'): info_nce(z[:1], z[:1])
    for t in (0., -0.2, float('nan')):
        with pytest.raises(ConfigError, match='temperature'): info_nce(z, z, t)
    assert torch.isfinite(info_nce(z[:2], z[:2]))    # n = 2 is enough

# ---------------------------------------------------------------- non_negative

def test_non_negative_kinds():
    assert NON_NEGATIVE == ('none', 'relu', 'rep_relu')
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    assert non_negative(x, 'none') is x
    assert torch.equal(non_negative(x, 'relu'), x.clamp(min=0))
    assert torch.equal(non_negative(x), x.clamp(min=0))          # NCL's ReLU is the default
    assert torch.allclose(non_negative(x, 'rep_relu'), x.clamp(min=0), atol=1e-12)
    with pytest.raises(ConfigError, match='kind'): non_negative(x, 'gelu')

def test_rep_relu_has_the_gelu_gradient():
    x = torch.linspace(-3, 3, 25, dtype=torch.float64).requires_grad_(True)
    non_negative(x, 'rep_relu').sum().backward()
    want = torch.tensor([0.5 * (1 + math.erf(v / math.sqrt(2))) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi) for v in x.tolist()],
                        dtype=torch.float64)
    assert torch.allclose(x.grad, want, atol=1e-10)
    y = x.detach().clone().requires_grad_(True)
    non_negative(y, 'relu').sum().backward()
    assert torch.equal(y.grad, (y > 0).double())      # the plain ReLU keeps its own gradient

# ---------------------------------------------------------------- ContrastiveNet

def by_hand(net, x, relu):
    h = net.encoder(x)
    l1, l2 = net.projector[0], net.projector[2]
    p = torch.clamp(h @ l1.weight.T + l1.bias, min=0) @ l2.weight.T + l2.bias
    z = p / p.norm(dim=1, keepdim=True)
    if relu: z = z.clamp(min=0); z = z / z.norm(dim=1, keepdim=True)
    return z

@pytest.mark.parametrize('non_neg', NON_NEGATIVE)
def test_contrastive_net_forward_by_hand(non_neg):
    net = ContrastiveNet(mlp_encoder(), 6, d_proj=16, d_hidden=10, non_neg=non_neg, seed=1)
    x = 3 * rand(20, 5, seed=2)
    with torch.no_grad(): z, ref = net(x), by_hand(net, x, non_neg != 'none')
    assert z.shape == (20, 16)
    assert torch.allclose(z, ref, atol=1e-6)
    assert torch.allclose(z.norm(dim=1), torch.ones(20), atol=1e-5)
    if non_neg == 'none': assert (z < 0).any()
    else: assert (z >= 0).all() and (z == 0).any()
    assert [type(m) for m in net.projector] == [nn.Linear, nn.ReLU, nn.Linear]
    assert (net.projector[0].in_features, net.projector[0].out_features, net.projector[2].out_features) == (6, 10, 16)
    assert repr(net).count(f"d_enc=6, d_proj=16, non_neg={non_neg!r}") == 1
    with torch.no_grad(): raw, feats = net.project(x), net.features(x)
    assert torch.allclose(F.normalize(raw, dim=1), by_hand(net, x, False), atol=1e-6) and not torch.allclose(raw.norm(dim=1), torch.ones(20))
    assert torch.allclose(feats, raw if non_neg == 'none' else raw.clamp(min=0), atol=1e-7)

def test_contrastive_net_with_a_cnn_and_rep_relu_equals_relu():
    x = rand(5, 1, 8, 16, seed=3)
    a = ContrastiveNet(cnn_encoder(), 8, 12, 20, 'relu', seed=2)
    b = ContrastiveNet(cnn_encoder(), 8, 12, 20, 'rep_relu', seed=2)
    with torch.no_grad():
        assert torch.allclose(a(x), b(x), atol=1e-6)
        assert torch.allclose(a(x), by_hand(a, x, True), atol=1e-6)

def test_contrastive_net_seeds_dtype_and_global_rng():
    torch.manual_seed(11); want = torch.rand(3)
    torch.manual_seed(11)
    a = ContrastiveNet(mlp_encoder(), 6, 8, 10, seed=5)
    assert torch.equal(torch.rand(3), want)                      # the projector's seed does not touch the global RNG
    b = ContrastiveNet(mlp_encoder(), 6, 8, 10, seed=5)
    c = ContrastiveNet(mlp_encoder(), 6, 8, 10, seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.projector.parameters(), b.projector.parameters()))
    assert not torch.equal(a.projector[0].weight, c.projector[0].weight)
    sig = inspect.signature(ContrastiveNet).parameters
    assert sig['non_neg'].default == 'none' and sig['seed'].default == 0
    assert torch.equal(ContrastiveNet(mlp_encoder(), 6, 8, 10).projector[0].weight, ContrastiveNet(mlp_encoder(), 6, 8, 10, seed=0).projector[0].weight)
    d = ContrastiveNet(mlp_encoder(dtype=torch.float64), 6, 8, 10)
    assert all(p.dtype == torch.float64 for p in d.parameters())
    assert d(rand(2, 5, dtype=torch.float64)).dtype == torch.float64
    e = ContrastiveNet(nn.Flatten(), 6, 8, 10)                    # an encoder without parameters: the projector stays float32
    assert all(p.dtype == torch.float32 for p in e.parameters())
    assert torch.allclose(e(rand(3, 2, 3)).norm(dim=1), torch.ones(3), atol=1e-5)

def test_contrastive_net_bad_input():
    with pytest.raises(ShapeError, match='d_enc=7'): ContrastiveNet(mlp_encoder(), 7, 8, 10)(rand(2, 5))
    with pytest.raises(ShapeError, match='encoder returned'): ContrastiveNet(nn.Identity(), 5, 8, 10)(rand(2, 1, 5))
    for kw in (dict(d_enc=0), dict(d_proj=0), dict(d_hidden=0), dict(d_proj=2.0), dict(d_hidden=True), dict(d_enc=-1)):
        args = dict(d_enc=6, d_proj=8, d_hidden=10) | kw
        with pytest.raises(ConfigError, match=next(iter(kw))): ContrastiveNet(mlp_encoder(), **args)
    with pytest.raises(ConfigError, match='non_neg'): ContrastiveNet(mlp_encoder(), 6, non_neg='abs')
    assert ContrastiveNet(mlp_encoder(), 6, 1, 1).projector[2].out_features == 1      # width 1 is allowed

# ---------------------------------------------------------------- contrastive_loss

@pytest.mark.parametrize('w,non_neg', [(0.0, 'relu'), (1.0, 'relu'), (2.5, 'none'), (1.0, 'none')])
def test_contrastive_loss_by_hand(w, non_neg):
    net = ContrastiveNet(mlp_encoder(), 6, 8, 10, non_neg)
    x1, x2 = rand(7, 5, seed=1), rand(7, 5, seed=2)
    loss, logged = contrastive_loss(net, (x1, x2), 0.3, w)
    with torch.no_grad(): z1, z2 = by_hand(net, x1, non_neg != 'none'), by_hand(net, x2, non_neg != 'none')
    z = torch.cat([z1, z2]).double()
    act = -float(np.mean([np.mean([abs(float(z[b, d])) for b in range(len(z))]) for d in range(z.shape[1])]))
    nce = nce_loop(z1, z2, 0.3)
    assert abs(logged['nce'] - nce) < 1e-5 and abs(logged['activation'] - act) < 1e-6
    assert abs(loss.item() - (nce + w * act)) < 1e-5 * (1 + w)
    assert loss.requires_grad
    assert act < 0
    sig = inspect.signature(contrastive_loss).parameters
    assert sig['temperature'].default == 0.2 and sig['activation_weight'].default == 0.0

def test_contrastive_loss_moves_inputs_to_the_net():
    net = ContrastiveNet(mlp_encoder(dtype=torch.float64), 6, 8, 10, 'none').double()
    loss, logged = contrastive_loss(net, (rand(4, 5, seed=1), rand(4, 5, seed=2)))   # float32 views, float64 net
    assert torch.isfinite(loss) and math.isfinite(logged['nce'])

# ---------------------------------------------------------------- train_contrastive

def test_train_contrastive_lowers_the_loss(pair_images):
    net = tiny_net('relu')
    g = torch.Generator().manual_seed(5)
    views = (noise_aug(pair_images, g), noise_aug(pair_images, g))
    with torch.no_grad(): before = contrastive_loss(net, views)[0].item()
    _, _, res = train_contrastive(net, pair_images, noise_aug, steps=25, batch_size=32, lr=1e-2, progress=False)
    with torch.no_grad(): after = contrastive_loss(net, views)[0].item()
    assert after < before - 0.8
    assert len(res.history) == 25 and net.training                         # the flags are as they were
    assert res.history.loss.iloc[-5:].mean() < res.history.loss.iloc[:5].mean() - 0.5

def test_train_contrastive_logs_what_the_batches_give(pair_images):
    """With lr = 0 nothing changes, so every logged loss must be InfoNCE (at the given τ) + w·activation of the views
    rebuilt here: batch_size rows drawn with the seeded generator, then two augmentations with it."""
    net = tiny_net('relu', seed=3)
    _, _, res = train_contrastive(net, pair_images, noise_aug, steps=3, batch_size=5, lr=0.0, temperature=0.5, activation_weight=0.7,
                            seed=4, progress=False)
    g = torch.Generator().manual_seed(4)
    for step in range(3):
        x = pair_images[torch.randint(0, len(pair_images), (5,), generator=g)]
        v1, v2 = noise_aug(x, g), noise_aug(x, g)
        with torch.no_grad(): z1, z2 = net(v1), net(v2)
        nce = nce_loop(z1, z2, 0.5)
        act = -torch.cat([z1, z2]).abs().mean().item()
        row = res.history.iloc[step]
        assert abs(row.nce - nce) < 1e-5 and abs(row.activation - act) < 1e-6
        assert abs(row.loss - (nce + 0.7 * act)) < 1e-5

def test_train_contrastive_schedule_and_weight_decay(pair_images):
    net = tiny_net('none')
    _, _, res = train_contrastive(net, pair_images, noise_aug, steps=40, batch_size=4, lr=0.01, progress=False)
    lr = res.history.lr.to_numpy()
    # warmup of max(1, 40 // 20) = 2 steps, then a cosine from the peak over the remaining 38
    want = [0.005, 0.01] + [0.005 * (1 + math.cos(math.pi * s / 38)) for s in range(38)]
    assert np.allclose(lr, want, atol=1e-12)
    assert res.optimizer.param_groups[0]['weight_decay'] == 1e-4            # the official LARS's 1e-4
    sig = inspect.signature(train_contrastive).parameters
    assert sig['temperature'].default == 0.2 and sig['weight_decay'].default == 1e-4 and sig['activation_weight'].default == 0.0
    one = train_contrastive(tiny_net('none'), pair_images, noise_aug, steps=1, batch_size=4, progress=False)     # warmup 0 for one step
    assert one.fit.history.lr.tolist() == [2e-3]
    assert sig['lr'].default == 2e-3

def test_train_contrastive_seeds(pair_images):
    def run(seed):
        net = tiny_net('relu')
        return net, train_contrastive(net, pair_images, noise_aug, steps=4, batch_size=8, seed=seed, progress=False).fit
    (a, ra), (b, rb), (c, rc) = run(1), run(1), run(2)
    assert ra.history.loss.tolist() == rb.history.loss.tolist()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert ra.history.loss.tolist() != rc.history.loss.tolist()
    assert not torch.equal(a.projector[0].weight, c.projector[0].weight)

def test_train_contrastive_bad_input(pair_images):
    net = tiny_net()
    with pytest.raises(ConfigError, match='batch_size=1'): train_contrastive(net, pair_images, noise_aug, steps=2, batch_size=1, progress=False)
    with pytest.raises(ConfigError, match='batch_size'): train_contrastive(net, pair_images, noise_aug, steps=2, batch_size=0, progress=False)
    with pytest.raises(ShapeError, match='images'): train_contrastive(net, pair_images[:1], noise_aug, steps=2, batch_size=4, progress=False)
    with pytest.raises(ShapeError, match='list'): train_contrastive(net, list(pair_images[:4]), noise_aug, steps=2, batch_size=4, progress=False)
    assert len(train_contrastive(net, pair_images[:2], noise_aug, steps=1, batch_size=2, progress=False).fit.history) == 1

# ---------------------------------------------------------------- projector_features

def bn_dropout_net():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        enc = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Dropout(0.5))
    net = ContrastiveNet(enc, 8, 6, 10, 'relu')
    with torch.no_grad(): net(rand(50, 5, seed=9) * 2 + 1)          # move the batchnorm statistics away from their init
    return net.train()

def test_projector_features_eval_mode_batches_and_untouched(untouched):
    net = bn_dropout_net()
    x = rand(11, 5, seed=1)
    with untouched(net):
        f = projector_features(net, x, normalize=True)
        f3 = projector_features(net, x, normalize=True, batch_size=3)
        raw = projector_features(net, x, batch_size=4)
    assert net.training and all(m.training for m in net.modules())
    net.eval()
    with torch.no_grad(): want, h = net(x), net.encoder(x)
    l1, l2 = net.projector[0], net.projector[2]
    with torch.no_grad(): want_raw = (torch.clamp(h @ l1.weight.T + l1.bias, min=0) @ l2.weight.T + l2.bias).clamp(min=0)   # ReLU(projector), not normalised
    net.train()
    with torch.no_grad(): train_mode = net(x)
    assert torch.allclose(f, want, atol=1e-6) and torch.allclose(f3, want, atol=1e-6)
    assert torch.allclose(raw, want_raw, atol=1e-6) and not torch.allclose(raw.norm(dim=1), torch.ones(11), atol=1e-2)
    assert torch.allclose(F.normalize(raw, dim=1), want, atol=1e-5)
    assert not torch.allclose(train_mode, want, atol=1e-3)
    assert inspect.signature(projector_features).parameters['normalize'].default is False
    with pytest.raises(ConfigError, match='features'): projector_features(net.encoder, x)
    assert torch.allclose(projector_features(nn.Identity(), x, normalize=True), x)     # any module, with normalize=True
    assert f.dtype == torch.float32 and not f.requires_grad

def test_projector_features_with_an_sae(untouched):
    net = bn_dropout_net()
    sae = SAE(6, 12, 'topk', 3, seed=1).train()
    with torch.no_grad(): sae.b_enc.normal_(generator=torch.Generator().manual_seed(0))
    x = rand(9, 5, seed=2)
    with untouched(net, sae):
        f = projector_features(net, x, sae, batch_size=4)
    assert sae.training
    with torch.no_grad(): sae.scale.fill_(2.5)
    with untouched(net, sae): f = projector_features(net, x, sae, batch_size=4)
    with torch.no_grad(): want = sae.encode(net.eval()(x)) / 2.5            # on the unit-norm projections, in the input's units
    assert torch.allclose(f, want, atol=1e-6) and (want != 0).any()
    assert f.shape == (9, 12) and ((f != 0).sum(1) <= 3).all()

def test_projector_features_dtypes_and_errors():
    net64 = ContrastiveNet(mlp_encoder(dtype=torch.float64), 6, 8, 10, 'relu')
    f = projector_features(net64, rand(4, 5), normalize=True)
    assert f.dtype == torch.float32
    with torch.no_grad(): assert torch.allclose(f.double(), net64(rand(4, 5).double()), atol=1e-6)
    with torch.no_grad(): assert torch.allclose(projector_features(net64, rand(4, 5)).double(), net64.features(rand(4, 5).double()), atol=1e-6)
    with pytest.raises(ShapeError, match='no input'): projector_features(net64, rand(0, 5))
    with pytest.raises(ConfigError, match='batch_size'): projector_features(net64, rand(4, 5), batch_size=0)
    bad = rand(3, 5); bad[1, 2] = float('nan')
    with pytest.raises(NotFiniteError, match='features'): projector_features(net64, bad)
    assert inspect.signature(projector_features).parameters['sae'].default is None

@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16])
def test_other_dtypes_run_finitely(dtype, untouched):
    net = ContrastiveNet(cnn_encoder(), 8, 12, 16, 'relu').to(dtype)
    x = rand(6, 1, 8, 16)
    with untouched(net):
        f = projector_features(net, x, normalize=True, batch_size=4)
        assert torch.isfinite(projector_features(net, x)).all()
    assert f.dtype == torch.float32 and torch.isfinite(f).all()
    assert torch.allclose(f.norm(dim=1), torch.ones(6), atol=2e-2) and (f >= 0).all()
    loss, logged = contrastive_loss(net, (x, x + 0.1))
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in logged.values())
    loss.backward()
    assert all(torch.isfinite(p.grad.float()).all() for p in net.parameters() if p.grad is not None)

# ---------------------------------------------------------------- semantic consistency

def test_semantic_consistency_by_hand():
    acts = torch.tensor([[3., 4, 0, 0],     # label 0 → (0.6, 0.8, 0, 0)
                         [1, 0, -2, 0],     # label 1, a negative value counts as active
                         [0, 2, 0, 0],      # label 0
                         [0, 0, 5, 0]])     # label 2; dimension 3 is never active
    labels = torch.tensor([0, 1, 0, 2])
    # dim 0: labels {0, 1} → 1/2; dim 1: {0, 0} → 1; dim 2: {1, 2} → 1/2
    assert abs(semantic_consistency(acts, labels) - 2 / 3) < 1e-6
    assert abs(semantic_consistency(acts, labels.tolist()) - 2 / 3) < 1e-6     # labels as a list
    assert inspect.signature(semantic_consistency).parameters['eps'].default == 1e-5     # the official threshold

def test_semantic_consistency_normalises_rows_and_is_strict():
    """eps = 0.5: row a = (1, 1, 1, 1) normalises to 0.5 everywhere, which is *not* above eps; rows b, d (0.3 and 0.4 on dim 0),
    c (0.2 on dim 1), e (0.9 on dim 3) normalise to 1. Active: dim 0 {b, d}, dim 1 {c}, dim 3 {e}: all pure → 1.
    Unnormalised rows would give 0.875; '≥ eps' would give 2/3."""
    acts = torch.tensor([[1., 1, 1, 1], [0.3, 0, 0, 0], [0, 0.2, 0, 0], [0.4, 0, 0, 0], [0, 0, 0, 0.9]])
    labels = torch.tensor([0, 1, 1, 1, 1])
    assert semantic_consistency(acts, labels, eps=0.5) == pytest.approx(1.0, abs=1e-7)
    assert semantic_consistency(acts, labels, eps=0.49) == pytest.approx((2 / 3 + 1 / 2 + 1 + 1 / 2) / 4, abs=1e-6)
    # tiny values count at the default eps once the row is normalised: 1e-4 · (1, 0.5) → (0.89, 0.45)
    assert semantic_consistency(torch.tensor([[1e-4, 5e-5], [0, 1e-4]]), torch.tensor([0, 1])) == pytest.approx((1 + 0.5) / 2)

def consistency_loop(acts, labels, eps):
    "Semantic consistency by plain loops: normalise each row (float64), then for each dim the majority share of the samples above eps."
    a = acts.double().numpy(); y = labels.tolist()
    shares = []
    rows = [r / np.sqrt((r ** 2).sum()) if (r ** 2).sum() > 0 else r for r in a]
    for d in range(a.shape[1]):
        fired = [y[i] for i in range(len(a)) if abs(rows[i][d]) > eps]
        if fired: shares.append(max(fired.count(c) for c in set(fired)) / len(fired))
    return float(np.mean(shares))

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_semantic_consistency_against_a_loop(seed):
    g = torch.Generator().manual_seed(seed)
    acts = torch.randn(60, 12, generator=g) * (torch.rand(60, 12, generator=g) < 0.25)
    acts[:, 3] = 0; acts[:, 7] = 0                       # dimensions never active
    acts[:5] = 0                                         # all-zero rows
    labels = torch.randint(0, 4, (60,), generator=g)
    assert semantic_consistency(acts, labels) == pytest.approx(consistency_loop(acts, labels, 1e-5), abs=1e-6)
    assert semantic_consistency(acts, labels, 0.3) == pytest.approx(consistency_loop(acts, labels, 0.3), abs=1e-6)
    assert semantic_consistency(acts.double(), labels) == pytest.approx(consistency_loop(acts, labels, 1e-5), abs=1e-6)

def test_semantic_consistency_of_one_hot_features_is_one_and_errors():
    labels = torch.arange(30) % 5
    assert semantic_consistency(F.one_hot(labels, 5).float() * 3, labels) == pytest.approx(1.0)
    assert semantic_consistency(torch.ones(30, 2), labels) == pytest.approx(0.2)        # every dim fires on everything: 6/30
    with pytest.raises(ConfigError, match='No feature'): semantic_consistency(torch.zeros(4, 3), torch.arange(4))
    with pytest.raises(ShapeError, match='acts'): semantic_consistency(torch.ones(4), torch.arange(4))
    with pytest.raises(ShapeError, match='acts'): semantic_consistency(torch.ones(0, 3), torch.arange(0))
    with pytest.raises(ShapeError, match='acts'): semantic_consistency(np.ones((4, 3)), torch.arange(4))
    with pytest.raises(ShapeError, match='labels'): semantic_consistency(torch.ones(4, 3), torch.arange(3))
    with pytest.raises(ConfigError, match='non-negative integers'): semantic_consistency(torch.ones(4, 3), torch.arange(4.))
    with pytest.raises(ConfigError, match='non-negative integers'): semantic_consistency(torch.ones(4, 3), torch.tensor([0, 1, -1, 2]))

def test_monosemanticity_by_hand():
    acts = torch.tensor([[3., 4, 0, 0, 0], [1, 0, -2, 0, 0], [0, 2, 0, 0, 1e-7], [0, 0, 5, 0, 0]])
    labels = torch.tensor([0, 1, 0, 2])
    m = monosemanticity(acts, labels)
    assert isinstance(m, Monosemanticity)
    assert m.consistency == pytest.approx(2 / 3, abs=1e-6)
    assert m.sparsity == pytest.approx(1 - 6 / 20)          # 6 values above 1e-5 (1e-7 is not)
    assert m.active_dims == 4 and m.dims == 5                # dim 4 is non-zero (1e-7) though below eps
    assert isinstance(m.active_dims, int) and isinstance(m.dims, int)
    # eps = 0.5 with a raw 0.5 in the last row: normalised, dim 0 fires on rows 1, 3, 5 (labels 1, 1, 0), dim 1 on row 2, dim 3 on row 4
    m2 = monosemanticity(torch.tensor([[1., 1, 1, 1], [0.3, 0, 0, 0], [0, 0.2, 0, 0], [0.4, 0, 0, 0], [0, 0, 0, 0.9], [0.5, 0, 0, 0]]),
                         torch.tensor([0, 1, 1, 1, 1, 0]), eps=0.5)
    assert m2.consistency == pytest.approx((2 / 3 + 1 + 1) / 3, abs=1e-6)
    assert m2.sparsity == pytest.approx(1 - 5 / 24)          # raw values above 0.5: 1, 1, 1, 1 and 0.9 (0.5 is not above)
    assert 'consistency' in repr(m)
    with pytest.raises(ShapeError, match='labels'): monosemanticity(acts, labels[:3])

def test_top_activating_against_a_sort():
    f = rand(30, 4, seed=3)
    for dim in range(4):
        want = sorted(range(30), key=lambda i: -float(f[i, dim]))[:5]
        assert top_activating(f, dim, 5).tolist() == want
    assert top_activating(f, 1).tolist() == sorted(range(30), key=lambda i: -float(f[i, 1]))[:8]      # k = 8 by default
    assert len(top_activating(f[:3], 0, 10)) == 3
    for d in (-1, 4, True, 1.0):
        with pytest.raises(ConfigError, match='dim'): top_activating(f, d)
    for k in (0, True, 2.0):
        with pytest.raises(ConfigError, match='top_k='): top_activating(f, 0, k)
    with pytest.raises(ShapeError, match='acts'): top_activating(f[0], 0)

# ---------------------------------------------------------------- label and input noise

def test_symmetric_label_noise_counts_and_changes():
    y = torch.arange(1000) % 7
    for rate in (0.0, 0.1, 0.37, 0.5, 0.9, 0.999):
        z = symmetric_label_noise(y, rate, seed=3)
        assert (z != y).sum().item() == round(rate * 1000)
        assert z.dtype == y.dtype and z.shape == y.shape and z.min() >= 0 and z.max() <= 6
    assert torch.equal(symmetric_label_noise(y, 0.0), y)
    y10 = torch.arange(10)
    assert (symmetric_label_noise(y10, 0.37) != y10).sum() == 4          # round, not floor
    assert (symmetric_label_noise(y10, 0.34) != y10).sum() == 3
    y_copy = y.clone()
    symmetric_label_noise(y, 0.5)
    assert torch.equal(y, y_copy)                                       # the input is not modified

def test_symmetric_label_noise_keeps_an_int32_dtype():
    y32 = (torch.arange(50) % 3).int()
    z = symmetric_label_noise(y32, 0.5)
    assert z.dtype == torch.int32 and (z != y32).sum() == 25

def test_symmetric_label_noise_is_uniform_over_the_other_classes():
    """n = 60,000 labels of C = 5 classes, rate 0.6: 36,000 changed labels, about 7,200 per original class spread over its
    4 other classes. The pooled chi-square statistic over the 5 × 4 off-diagonal cells has 5·3 = 15 degrees of freedom
    (each row's total is fixed). We require p > 1e-7: a correct implementation fails with probability 1e-7 (and the seed
    is fixed, so the outcome is deterministic); a sampler that never sends a class to one of its 4 others, or sends 10% of a
    class's changes to the wrong cell (±180 of 1,800), gives a statistic far beyond that level."""
    C, n = 5, 60_000
    y = torch.arange(n) % C
    z = symmetric_label_noise(y, 0.6, seed=1)
    changed = z != y
    counts = np.zeros((C, C))
    np.add.at(counts, (y[changed].numpy(), z[changed].numpy()), 1)
    assert np.all(np.diag(counts) == 0)
    off = counts[~np.eye(C, dtype=bool)].reshape(C, C - 1)
    expected = off.sum(1, keepdims=True) / (C - 1)
    stat = ((off - expected) ** 2 / expected).sum()
    assert stats.chi2.sf(stat, C * (C - 2)) > 1e-7
    # which labels change is uniform too: the first half holds about half of the changes (hypergeometric sd 60; 400 is 6.7 sd: 2e-11)
    assert abs(changed[:n // 2].sum().item() - 18_000) < 400
    # and a larger n_classes sends labels to classes beyond labels.max(): each of the 4,200 changed labels lands on 5 or 6 with
    # probability 2/6 (binomial; 6 standard errors: fails with probability 2e-9)
    w = symmetric_label_noise(torch.arange(7000) % 5, 0.6, n_classes=7)
    assert set(w.tolist()) == set(range(7)) and abs((w >= 5).float().mean().item() - 0.6 * 2 / 6) < 6 * math.sqrt(4200 * 2 / 6 * 4 / 6) / 7000

def test_symmetric_label_noise_seeds_and_errors():
    y = torch.arange(200) % 4
    assert torch.equal(symmetric_label_noise(y, 0.5, seed=2), symmetric_label_noise(y, 0.5, seed=2))
    assert not torch.equal(symmetric_label_noise(y, 0.5, seed=2), symmetric_label_noise(y, 0.5, seed=3))
    assert torch.equal(symmetric_label_noise(y, 0.5), symmetric_label_noise(y, 0.5, seed=0))
    assert torch.equal(symmetric_label_noise(y.tolist(), 0.3), symmetric_label_noise(y, 0.3))
    for rate in (-0.1, 1.0, 1.5, True, False, float('nan')):
        with pytest.raises(ConfigError, match='rate'): symmetric_label_noise(y, rate)
    with pytest.raises(ConfigError, match='n_classes=3'): symmetric_label_noise(y, 0.5, n_classes=3)
    with pytest.raises(ConfigError, match='n_classes=1'): symmetric_label_noise(torch.zeros(5, dtype=torch.long), 0.5)
    with pytest.raises(ConfigError, match='-1'): symmetric_label_noise(torch.tensor([0, 1, -1, 2]), 0.5)
    with pytest.raises(ShapeError, match='float'): symmetric_label_noise(y.float(), 0.5)
    with pytest.raises(ShapeError, match='1-D'): symmetric_label_noise(y.reshape(20, 10), 0.5)
    assert symmetric_label_noise(y, 0.5, n_classes=4).max() <= 3

def test_gaussian_input_noise_moments():
    """200,000 draws of σ = 0.3: the sample mean has sd σ/√n ≈ 6.7e-4 (tolerance 4e-3, 6 sd), the sample std has sd
    σ/√(2n) ≈ 4.7e-4 (tolerance 3e-3, 6.4 sd), and the fraction within ±σ (0.6827 for a normal, 0.577 for a uniform of that std)
    has sd ≈ 1.04e-3 (tolerance 6.5e-3, 6.2 sd): each fails a correct sampler with probability below 2e-9."""
    x = torch.linspace(-2, 2, 200_000)
    e = gaussian_input_noise(x, 0.3, seed=1) - x
    assert abs(e.mean().item()) < 4e-3 and abs(e.std().item() - 0.3) < 3e-3
    assert abs((e.abs() < 0.3).float().mean().item() - 0.6827) < 6.5e-3
    assert torch.equal(gaussian_input_noise(x, 0.0), x)
    assert torch.equal(gaussian_input_noise(x, 0.3, seed=1), gaussian_input_noise(x, 0.3, seed=1))
    assert torch.equal(gaussian_input_noise(x, 0.3), gaussian_input_noise(x, 0.3, seed=0))
    assert not torch.equal(gaussian_input_noise(x, 0.3, seed=1), gaussian_input_noise(x, 0.3, seed=2))
    assert torch.allclose(gaussian_input_noise(x, 0.6, seed=1) - x, 2 * e, atol=1e-5)   # same draws, scaled by σ

def test_gaussian_input_noise_keeps_dtype_shape_and_input():
    x = rand(3, 1, 4, 4, dtype=torch.float64); x0 = x.clone()
    y = gaussian_input_noise(x, 0.2)
    assert y.dtype == torch.float64 and y.shape == x.shape and y.device == x.device and torch.equal(x, x0)
    assert gaussian_input_noise(x.bfloat16(), 0.2).dtype == torch.bfloat16
    for s in (-0.1, float('nan'), True):
        with pytest.raises(ConfigError, match='sigma'): gaussian_input_noise(x, s)

# ---------------------------------------------------------------- probes

def planted(n, sep, C=5, d=10, seed=0, mu_seed=0):
    "Class means sep·μ_c (μ from mu_seed) plus N(0, I) noise; balanced labels."
    mu = torch.randn(C, d, generator=torch.Generator().manual_seed(mu_seed))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return sep * mu[y] + torch.randn(n, d, generator=g), y

def test_the_protocols_probe_is_the_library_probe_on_raw_features():
    x, y = planted(600, 4., seed=1); xt, yt = planted(600, 4., seed=2)
    df = robustness_table({'id': ident}, x, y, xt, yt)
    assert df.loc['id', 'clean'] == sk_accuracy(x, y, xt, yt) > 0.99
    x, y = planted(1000, 0.7, seed=3); xt, yt = planted(1000, 0.7, seed=4)
    got = label_noise_curve({'id': ident}, x, y, xt, yt, rates=(0.0,))
    assert got.loc[0.0, 'id'] == sk_accuracy(x, y, xt, yt) and 0.5 < got.loc[0.0, 'id'] < 0.95
    # keywords go to the probe: standardising the features (here, an affine change of scale) is a different, scale-free probe
    scaled = lambda v: 50 * v + 3
    raw = label_noise_curve({'s': scaled}, x, y, xt, yt, rates=(0.0,)).iloc[0, 0]
    std = label_noise_curve({'s': scaled}, x, y, xt, yt, rates=(0.0,), standardize=True).iloc[0, 0]
    assert raw == sk_accuracy(scaled(x), y, scaled(xt), yt) and std == linear_probe(x, y, xt, yt).accuracy

def test_old_probe_names_still_work_and_warn():
    x, y = planted(300, 3., C=3, seed=5)
    with pytest.warns(FutureWarning, match='interpkit.stats.linear_probe'): p = mono.linear_probe(x, y, 3, epochs=2, seed=1)
    assert isinstance(p, Probe) and p.train_accuracy == p.accuracy == sk_accuracy(x, y, x, y)
    with pytest.warns(FutureWarning, match='Probe.score'): assert mono.probe_score(p, x, y) == p.accuracy
    lin = nn.Linear(10, 3)
    with torch.no_grad(): want = (lin(x).argmax(-1) == y).float().mean().item()
    with pytest.warns(FutureWarning): assert mono.probe_score(lin, x, y) == pytest.approx(want)   # an old nn.Linear probe still scores
    assert 'linear_probe' not in mono.__all__ and 'probe_score' not in mono.__all__

def test_old_argument_names_still_work_and_warn(pair_images):
    net = tiny_net('relu')
    with pytest.warns(FutureWarning, match='model='): out = projector_features(net=net, x=pair_images[:4])
    assert torch.equal(out, projector_features(net, pair_images[:4]))
    with pytest.warns(FutureWarning, match='model='): loss, _ = contrastive_loss(net=net, views=(pair_images[:4], pair_images[:4]))
    assert loss == contrastive_loss(net, (pair_images[:4], pair_images[:4]))[0]
    with pytest.warns(FutureWarning, match='model='): r = train_contrastive(net=tiny_net('none'), images=pair_images, augment=noise_aug, steps=1, batch_size=4, progress=False)
    assert isinstance(r, Trained) and r.tokenizer is None and len(r.fit.history) == 1
    f = torch.rand(20, 3, generator=torch.Generator().manual_seed(0))
    with pytest.warns(FutureWarning, match='top_k='): assert torch.equal(top_activating(f, 1, k=3), top_activating(f, 1, top_k=3))
    from interpkit.demos import monosemantic as demo
    for name in ('DIGIT_RECIPE', 'DIGIT_MODELS', 'METHODS', 'DigitPairs', 'digit_pairs', 'DigitAugment', 'DigitEncoder', 'train_digit_net', 'DigitModels', 'load_digit_models'):
        with pytest.warns(FutureWarning, match='interpkit.demos.monosemantic'): assert getattr(mono, name) is getattr(demo, name)
        assert name not in mono.__all__
    with pytest.raises(AttributeError): mono.no_such_name

def test_few_shot_indices():
    y = torch.tensor([0] * 10 + [1] * 10 + [2] * 2 + [3] * 7)[torch.randperm(29, generator=torch.Generator().manual_seed(0))]
    i = few_shot_indices(y, 3, seed=1)
    assert torch.equal(i, i.sort().values) and len(set(i.tolist())) == len(i)
    assert torch.bincount(y[i]).tolist() == [3, 3, 2, 3]
    assert torch.equal(i, few_shot_indices(y, 3, seed=1)) and torch.equal(few_shot_indices(y, 3), few_shot_indices(y, 3, seed=0))
    seen = set()
    for s in range(30): seen |= set(few_shot_indices(y, 3, seed=s).tolist())
    assert seen == set(range(29))                          # a random choice, not the first three
    assert torch.equal(few_shot_indices(y, 100), torch.arange(29))
    assert torch.equal(few_shot_indices(y.tolist(), 2, seed=4), few_shot_indices(y, 2, seed=4))
    for k in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match='per_class'): few_shot_indices(y, k)

# ---------------------------------------------------------------- label_noise_curve, robustness_table

@pytest.fixture(scope='module')
def probe_data():
    x, y = planted(400, 2.5, C=4, d=6, seed=1)
    xt, yt = planted(400, 2.5, C=4, d=6, seed=2)
    return x, y, xt, yt

def ident(x): return x

def test_label_noise_curve(probe_data):
    x, y, xt, yt = probe_data
    maps = {'id': ident, 'double': lambda v: 2 * v[:, :3]}
    df = label_noise_curve(maps, x, y, xt, yt, rates=(0.0, 0.5, 0.9), seed=2)
    assert list(df.columns) == ['id', 'double'] and df.index.name == 'label noise' and df.index.tolist() == [0.0, 0.5, 0.9]
    assert df.loc[0.0, 'id'] > 0.9 and df.loc[0.9, 'id'] < df.loc[0.0, 'id'] - 0.4
    for r in (0.0, 0.5, 0.9):
        for name, f in maps.items():
            want = sk_accuracy(f(x), symmetric_label_noise(y, r, 4, 2), f(xt), yt)
            assert df.loc[r, name] == want
    assert inspect.signature(label_noise_curve).parameters['rates'].default == (0.0, 0.3, 0.6, 0.9)    # the paper's rates
    d5 = label_noise_curve({'id': ident}, x, y, xt, yt, rates=(0.5,), n_classes=6)
    assert d5.loc[0.5, 'id'] == sk_accuracy(x, symmetric_label_noise(y, 0.5, 6, 0), xt, yt)
    for bad in ({}, [ident], {'a': 3}, None):
        with pytest.raises(ConfigError, match='feature_maps'): label_noise_curve(bad, x, y, xt, yt)

def test_robustness_table(probe_data):
    x, y, xt, yt = probe_data
    df = robustness_table({'id': ident, 'half': lambda v: v[:, :3]}, x, y, xt, yt, sigma=0.3)
    assert list(df.columns) == ['clean', 'label noise 90%', 'input noise σ=0.3'] and df.index.name == 'features'
    assert df.index.tolist() == ['id', 'half']
    assert df.loc['id', 'clean'] > 0.9 and df.loc['id', 'label noise 90%'] < df.loc['id', 'clean'] - 0.4
    assert df.loc['id', 'clean'] == sk_accuracy(x, y, xt, yt)
    assert df.loc['id', 'label noise 90%'] == sk_accuracy(x, symmetric_label_noise(y, 0.9, 4, 0), xt, yt)
    assert df.loc['id', 'input noise σ=0.3'] == sk_accuracy(x, y, gaussian_input_noise(xt, 0.3, 0), yt)
    sig = inspect.signature(robustness_table).parameters
    assert sig['label_noise'].default == 0.9 and sig['sigma'].default == 0.2
    # a huge σ: the input-noise column is at chance (uniformly drawn labels, the noise alone picks the class; 400 test rows, sd ≤ 0.022,
    # 6 sd: fails with probability 2e-9), the others are not affected
    big = robustness_table({'id': ident}, x, y, xt, yt, label_noise=0.5, sigma=1e3, seed=1)
    assert list(big.columns) == ['clean', 'label noise 50%', 'input noise σ=1000']
    assert abs(big.iloc[0, 2] - 0.25) < 0.13 and big.iloc[0, 0] > 0.9
    zero = robustness_table({'id': ident}, x, y, xt, yt, label_noise=0.0, sigma=0.0)
    assert zero.iloc[0, 0] == zero.iloc[0, 1] == zero.iloc[0, 2]
    with pytest.raises(ConfigError, match='feature_maps'): robustness_table({}, x, y, xt, yt)
    assert list(robustness_table({'id': ident}, x, y, xt, yt).columns)[2] == 'input noise σ=0.2'

def test_input_noise_curve(probe_data):
    x, y, xt, yt = probe_data
    maps = {'id': ident, 'half': lambda v: v[:, :3]}
    df = input_noise_curve(maps, x, y, xt, yt, sigmas=(0.0, 0.3, 1e3), seed=1)
    assert list(df.columns) == ['id', 'half'] and df.index.name == 'input noise σ' and df.index.tolist() == [0.0, 0.3, 1e3]
    for name, f in maps.items():
        for s in (0.0, 0.3, 1e3): assert df.loc[s, name] == sk_accuracy(f(x), y, f(gaussian_input_noise(xt, s, 1)), yt)
    assert df.loc[0.0, 'id'] > 0.9 and abs(df.loc[1e3, 'id'] - 0.25) < 0.13          # chance at a huge σ (400 rows, sd ≤ 0.022; 6 sd: 2e-9)
    assert inspect.signature(input_noise_curve).parameters['sigmas'].default == (0.0, 0.1, 0.2, 0.3)
    with pytest.raises(ConfigError, match='feature_maps'): input_noise_curve({'a': None}, x, y, xt, yt)

# ---------------------------------------------------------------- digit pairs

@pytest.fixture(scope='module')
def digit_images():
    d = digits(flat=False)
    key = lambda im: im.numpy().tobytes()
    return ({key(im): int(c) for im, c in zip(d.x_train, d.y_train)}, {key(im): int(c) for im, c in zip(d.x_test, d.y_test)})

@pytest.mark.parametrize('split', ['train', 'test'])
def test_digit_pairs_are_two_digits_of_the_same_split(split, digit_images):
    train, test = digit_images
    own, other = (train, test) if split == 'train' else (test, train)
    p = digit_pairs(split, n=500, seed=3)
    assert isinstance(p, DigitPairs) and len(p) == 500
    assert p.x.shape == (500, 1, 8, 16) and p.x.dtype == torch.float32 and p.y.dtype == torch.long
    assert p.x.min() >= 0 and p.x.max() <= 1
    for im, c in zip(p.x, p.y.tolist()):
        left, right = im[0, :, :8].contiguous().numpy().tobytes(), im[0, :, 8:].contiguous().numpy().tobytes()
        assert own.get(left) == c // 10 and own.get(right) == c % 10
        assert left not in other and right not in other
    lefts = {im[0, :, :8].contiguous().numpy().tobytes() for im in p.x}
    assert len(lefts) > 150                                  # images are drawn at random, not always the first of a digit
    assert 'classes=100' in repr(p) and 'n=500' in repr(p)

def test_digit_pairs_balance_defaults_seeds_and_errors():
    assert torch.bincount(digit_pairs('train', n=1000).y, minlength=100).tolist() == [10] * 100
    c = torch.bincount(digit_pairs('test', n=150, seed=2).y, minlength=100).tolist()
    assert c == [2] * 50 + [1] * 50                          # the first n mod 100 classes get one more
    a, b = digit_pairs('train', n=200, seed=1), digit_pairs('train', n=200, seed=1)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.y, digit_pairs('train', n=200, seed=2).y)
    assert torch.equal(a.y, digit_pairs('train', n=200, seed=1).y) and not torch.equal(digit_pairs('train', n=200).y, digit_pairs('test', n=200).y)
    assert len(digit_pairs()) == 12_000 and len(digit_pairs('test')) == 3_000
    assert torch.equal(digit_pairs(n=100).y, digit_pairs('train', n=100, seed=0).y)
    with pytest.raises(ConfigError, match='split'): digit_pairs('val')
    for n in (0, -5, 1.5, True):
        with pytest.raises(ConfigError, match='n='): digit_pairs('train', n=n)

# ---------------------------------------------------------------- DigitAugment

H, W = 48, 96
YY, XX = torch.meshgrid(torch.arange(H) - (H - 1) / 2, torch.arange(W) - (W - 1) / 2, indexing='ij')

def blob(sx=8., sy=3.): return torch.exp(-(XX ** 2 / (2 * sx ** 2) + YY ** 2 / (2 * sy ** 2)))

def moments(img):
    "Centre of mass (x, y), principal-axis angle (degrees) and the two principal variances of an image."
    w = img.double() / img.double().sum()
    mx, my = (w * XX).sum(), (w * YY).sum()
    cxx, cyy, cxy = (w * (XX - mx) ** 2).sum(), (w * (YY - my) ** 2).sum(), (w * (XX - mx) * (YY - my)).sum()
    ev = torch.linalg.eigvalsh(torch.stack([torch.stack([cxx, cxy]), torch.stack([cxy, cyy])]))
    return mx.item(), my.item(), math.degrees(0.5 * math.atan2(2 * cxy, cxx - cyy)), ev.tolist()

def test_digit_augment_neutral_is_the_identity_and_seeds():
    x = torch.rand(20, 2, 8, 16, generator=torch.Generator().manual_seed(0)); x0 = x.clone()
    out = DigitAugment(**NEUTRAL)(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == x.dtype and torch.allclose(out, x, atol=1e-5)
    aug = DigitAugment()
    a = aug(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, aug(x, torch.Generator().manual_seed(3))) and not torch.equal(a, aug(x, torch.Generator().manual_seed(4)))
    assert torch.equal(aug(x), aug(x, torch.Generator().manual_seed(0)))
    assert (a - x).abs().mean() > 0.05
    assert torch.equal(x, x0)
    a64 = aug(x.double(), torch.Generator().manual_seed(3))
    assert a64.dtype == torch.float64 and torch.allclose(a64.float(), a, atol=1e-4)
    g = torch.Generator().manual_seed(3)
    assert not torch.equal(aug(x, g), aug(x, g))            # the generator advances: two views differ
    with pytest.raises(ShapeError, match='channel'): aug(x[:, 0])
    with pytest.raises(ShapeError, match='DigitAugment'): aug(x.numpy())

def test_digit_augment_erase_boxes():
    N, h, w = 3000, 8, 16
    x = 0.5 + torch.rand(N, 1, h, w, generator=torch.Generator().manual_seed(0))
    out = DigitAugment(**(NEUTRAL | dict(erase=1.0)))(x, torch.Generator().manual_seed(2))
    box = out[:, 0] == 0
    assert torch.allclose(out[:, 0][~box], x[:, 0][~box], atol=1e-5)
    rows, cols = box.any(2), box.any(1)
    assert torch.equal(box, rows[:, :, None] & cols[:, None, :])          # a rectangle (rows × columns)
    heights, widths = rows.sum(1), cols.sum(1)
    for r, c in zip(rows[:200], cols[:200]):                                  # contiguous rows and columns
        ri, ci = r.nonzero().flatten(), c.nonzero().flatten()
        assert ri[-1] - ri[0] + 1 == len(ri) and ci[-1] - ci[0] + 1 == len(ci)
    assert set(heights.tolist()) == {1, 2, 3, 4} and set(widths.tolist()) == {1, 2, 3, 4, 5, 6}    # 1 + U·H/2, 1 + U·W/3
    assert rows[:, 0].any() and rows[:, -1].any() and cols[:, 0].any() and cols[:, -1].any()    # boxes reach every border
    # erase = 0.5: about half the images get a box (2000 draws: sd 0.011)
    half = DigitAugment(**(NEUTRAL | dict(erase=0.5)))(x[:2000], torch.Generator().manual_seed(3))
    assert abs((half[:, 0] == 0).flatten(1).any(1).float().mean().item() - 0.5) < 0.05
    erase_default = DigitAugment()(x[:2000], torch.Generator().manual_seed(3))
    assert ((erase_default[:, 0] == 0).flatten(1).any(1).float().mean().item()) < 0.1      # pixel noise: boxes are not exact zeros then

def test_digit_augment_contrast_brightness_noise():
    x = 0.2 + torch.rand(1000, 1, 8, 16, generator=torch.Generator().manual_seed(0))
    b = DigitAugment(**(NEUTRAL | dict(brightness=0.15)))(x, torch.Generator().manual_seed(1)) - x
    off = b.mean((1, 2, 3))
    assert torch.allclose(b, off[:, None, None, None].expand_as(b), atol=1e-5)    # one offset per image
    assert off.abs().max() <= 0.15 + 1e-6 and off.min() < -0.14 and off.max() > 0.14
    k = (DigitAugment(**(NEUTRAL | dict(contrast=(0.6, 1.2))))(x, torch.Generator().manual_seed(1)) / x)
    fac = k.mean((1, 2, 3))
    assert torch.allclose(k, fac[:, None, None, None].expand_as(k), atol=1e-5)
    assert fac.min() >= 0.6 - 1e-6 and fac.max() <= 1.2 + 1e-6 and fac.min() < 0.61 and fac.max() > 1.19
    both = DigitAugment(**(NEUTRAL | dict(contrast=(2., 2.), brightness=0.1)))(x, torch.Generator().manual_seed(1)) - 2 * x
    assert both.abs().max() <= 0.1 + 1e-5                   # contrast first, then the offset: 2x + b, not 2(x + b)
    n = DigitAugment(**(NEUTRAL | dict(noise=0.05)))(x, torch.Generator().manual_seed(1)) - x
    assert abs(n.std().item() - 0.05) < 1e-3 and abs(n.mean().item()) < 1e-3          # 128,000 draws
    assert abs((n.abs() < 0.05).float().mean().item() - 0.6827) < 0.01
    erased = DigitAugment(**(NEUTRAL | dict(brightness=0.15, erase=1.0)))(x, torch.Generator().manual_seed(1))
    assert ((erased == 0).flatten(1).sum(1) > 0).all()      # the box is erased after the brightness offset

def test_digit_augment_rotation_is_a_rotation_in_pixels():
    """On a non-square canvas (48 × 96) an elongated Gaussian (variances 64 and 9 pixels²) keeps its principal variances
    under the rotation (a shear from a wrong aspect correction would change them) and its axis turns by at most ±rotate."""
    x = blob()[None, None].repeat(300, 1, 1, 1)
    out = DigitAugment(**(NEUTRAL | dict(rotate=30.)))(x, torch.Generator().manual_seed(1))
    m = [moments(o[0]) for o in out]
    angles = torch.tensor([a for _, _, a, _ in m])
    assert angles.abs().max() <= 30.5 and angles.min() < -28 and angles.max() > 28
    ev = torch.tensor([e for *_, e in m])
    assert (ev[:, 0] - 9).abs().max() < 0.3 and (ev[:, 1] - 64).abs().max() < 0.5
    centre = torch.tensor([[mx, my] for mx, my, _, _ in m])
    assert centre.abs().max() < 1e-3                         # about the centre, no shift

def test_digit_augment_scale_and_shift_in_pixels():
    x = blob(6., 3.)[None, None]
    z = DigitAugment(**(NEUTRAL | dict(scale=(1.5, 1.5))))(x)
    ev = moments(z[0, 0])[3]
    assert math.sqrt(ev[0] / 9) == pytest.approx(1.5, rel=0.02) and math.sqrt(ev[1] / 36) == pytest.approx(1.5, rel=0.02)   # zoom by s
    zs = DigitAugment(**(NEUTRAL | dict(scale=(0.8, 1.2))))(x.repeat(300, 1, 1, 1), torch.Generator().manual_seed(2))
    ratios = torch.tensor([math.sqrt(moments(o[0])[3][1] / 36) for o in zs])
    assert ratios.min() > 0.79 and ratios.max() < 1.21 and ratios.min() < 0.82 and ratios.max() > 1.18
    sh = DigitAugment(**(NEUTRAL | dict(shift=3.)))(x.repeat(300, 1, 1, 1), torch.Generator().manual_seed(3))
    com = torch.tensor([moments(o[0])[:2] for o in sh])       # bilinear resampling moves the centre of mass by exactly the shift
    assert com.abs().max() <= 3.02 and (com.abs().max(0).values > 2.9).all()
    assert (com.min(0).values < -2.9).all() and (com.max(0).values > 2.9).all()

def test_digit_augment_defaults():
    a = DigitAugment()
    assert (a.rotate, a.scale, a.shift, a.contrast, a.brightness, a.erase, a.noise) == (12.0, (0.85, 1.1), 1.5, (0.6, 1.2), 0.15, 0.5, 0.05)

# ---------------------------------------------------------------- DigitEncoder and the digit models

def test_digit_encoder():
    torch.manual_seed(3); want = torch.rand(2)
    torch.manual_seed(3)
    e = DigitEncoder(d_out=20, seed=1)
    assert torch.equal(torch.rand(2), want)
    x = rand(5, 1, 8, 16)
    with torch.no_grad(): out = e(x)
    assert out.shape == (5, 20) and (out >= 0).all() and (out > 0).any()
    n = (9 * 32 + 32) + (32 * 64 * 9 + 64) + (64 * 128 * 9 + 128) + (128 * 2 * 4 * 20 + 20)
    assert sum(p.numel() for p in e.parameters()) == n
    assert [m.out_channels for m in e.modules() if isinstance(m, nn.Conv2d)] == [32, 64, 128]
    assert [m.stride for m in e.modules() if isinstance(m, nn.Conv2d)] == [(1, 1), (2, 2), (2, 2)]
    assert all(torch.equal(p, q) for p, q in zip(e.parameters(), DigitEncoder(20, seed=1).parameters()))
    assert not torch.equal(e.head[1].weight, DigitEncoder(20, seed=2).head[1].weight)
    assert torch.equal(DigitEncoder().head[1].weight, DigitEncoder(256, seed=0).head[1].weight)
    with torch.no_grad(): assert DigitEncoder()(x).shape == (5, 256)

def test_digit_recipe():
    assert DIGIT_RECIPE['temperature'] == 0.2 and DIGIT_RECIPE['k'] == DIGIT_RECIPE['d_proj'] // 8      # paper: k = 256 of 2048
    assert DIGIT_MODELS == 'monosemantic_digit_pairs' and METHODS == ('simclr', 'ncl', 'sae')
    assert inspect.signature(train_digit_net).parameters['steps'].default == DIGIT_RECIPE['steps']
    assert inspect.signature(train_feature_sae).parameters['steps'].default == DIGIT_RECIPE['sae_steps'] == 3000

@pytest.fixture(scope='module')
def few_pairs():
    return digit_pairs('train', n=32, seed=5).x

def test_train_digit_net_short_runs(few_pairs):
    simclr, tok, rs = train_digit_net('simclr', few_pairs, steps=3, batch_size=8, activation_weight=1.0, progress=False)
    ncl, _, rn = train_digit_net('ncl', few_pairs, steps=3, batch_size=8, activation_weight=1.0, progress=False)
    assert tok is None and not simclr.training and not ncl.training
    assert simclr.non_neg == 'none' and ncl.non_neg == 'relu'
    assert isinstance(simclr.encoder, DigitEncoder) and (simclr.d_enc, simclr.d_proj, simclr.projector[0].out_features) == (256, 256, 512)
    assert len(rs.history) == 3 and np.isfinite(rs.history.loss).all()
    assert np.allclose(rs.history.loss, rs.history.nce, atol=1e-6)                                        # SimCLR ignores the activation term
    assert np.allclose(rn.history.loss, rn.history.nce + rn.history.activation, atol=1e-5)                # NCL adds it with weight 1
    assert not np.allclose(rn.history.activation, 0)
    assert rs.history.lr.max() == pytest.approx(DIGIT_RECIPE['lr'])
    with torch.no_grad(): z = ncl(few_pairs[:6])
    assert (z >= 0).all() and torch.allclose(z.norm(dim=1), torch.ones(6), atol=1e-5)
    again, _, ra = train_digit_net('ncl', few_pairs, steps=3, batch_size=8, activation_weight=1.0, progress=False)
    assert ra.history.loss.tolist() == rn.history.loss.tolist()
    assert all(torch.equal(p, q) for p, q in zip(ncl.parameters(), again.parameters()))
    rep, _, _ = train_digit_net('ncl', few_pairs, steps=1, batch_size=4, non_neg='rep_relu', seed=1, progress=False)
    assert rep.non_neg == 'rep_relu'
    default, _, rd = train_digit_net('ncl', steps=1, batch_size=4, progress=False)          # images None: the digit pairs' train split
    assert len(rd.history) == 1 and next(default.parameters()).device.type == 'cpu'
    with pytest.raises(ConfigError, match='method'): train_digit_net('sae', few_pairs, steps=1)

def test_train_feature_sae(few_pairs, untouched):
    net = tiny_net('none', d_proj=16).eval()
    with untouched(net):
        sae, tok, res = train_feature_sae(net, few_pairs, steps=3, batch_size=8, progress=False)
    assert tok is None and isinstance(sae, SAE) and not sae.training
    assert sae.kind == 'topk' and sae.top_k == 2 and sae.d_in == sae.d_sae == 16               # k = d / 8, as wide as its input
    assert len(res.history) == 3 and 'nmse' in res.history
    f = projector_features(net, few_pairs, sae)
    assert ((f != 0).sum(1) <= 2).all()
    with torch.no_grad(): z = net(few_pairs)                                   # the unit-norm projections: train_sae's scale is √(d / mean ‖z‖²) = 4
    assert sae.scale.item() == pytest.approx(4.0, rel=1e-4)
    s4, _, _ = train_feature_sae(tiny_net('none', d_proj=4).eval(), few_pairs, steps=1, batch_size=4, progress=False)
    assert s4.k == 1                                                                          # at least one latent
    s3, _, r3 = train_feature_sae(net, few_pairs, top_k=3, steps=2, batch_size=8, lr=0.0, progress=False)
    assert s3.k == 3 and r3.history.lr.max() == 0.0
    assert inspect.signature(train_feature_sae).parameters['top_k'].default is None

ASSET = assets_dir()/f'{DIGIT_MODELS}.safetensors'

@pytest.mark.skipif(not ASSET.exists(), reason=f'{DIGIT_MODELS} not built yet (tools/make_monosemantic_assets.py)')
def test_shipped_digit_models():
    models, tok, meta = load_digit_models()
    assert tok is None and isinstance(models, DigitModels) and meta['recipe']['k'] == models.sae.top_k
    assert not models.simclr.training and not models.ncl.training and not models.sae.training
    maps = models.feature_maps(batch_size=50)
    assert list(maps) == ['SimCLR', 'NCL', 'SAE']
    x = digit_pairs('test', n=120).x
    s, n, a = maps['SimCLR'](x), maps['NCL'](x), maps['SAE'](x)
    with torch.no_grad(): s_ref, n_ref = models.simclr.project(x), models.ncl.project(x).clamp(min=0)
    assert torch.allclose(s, s_ref, atol=1e-5) and (s < 0).any()                  # SimCLR: the raw projector output
    assert torch.allclose(n, n_ref, atol=1e-5) and (n >= 0).all() and (n == 0).any()   # NCL: ReLU of it
    assert torch.allclose(F.normalize(projector_features(models.ncl, x, normalize=True), dim=1).norm(dim=1), torch.ones(120), atol=1e-4)
    assert a.shape == (120, models.sae.d_sae) and ((a != 0).sum(1) <= models.sae.top_k).all() and (a >= 0).all()
    with torch.no_grad(): a_ref = models.sae.encode(models.simclr(x)) / models.sae.scale
    assert torch.allclose(a, a_ref, atol=1e-5)


def test_inputs_that_would_give_silent_nans_or_raw_torch_errors_raise():
    "No active value after normalisation, a negative eps, empty labels and n_classes=0 get library errors, not nan or torch's own."
    with pytest.raises(ConfigError, match='No feature exceeds eps'): semantic_consistency(torch.ones(4, 4), torch.arange(4), eps=0.9)
    with pytest.raises(ConfigError, match='No feature exceeds eps'): monosemanticity(torch.ones(4, 4), torch.arange(4), eps=0.9)
    with pytest.raises(ConfigError, match='eps='): semantic_consistency(torch.ones(4, 4), torch.arange(4), eps=-1e-5)
    with pytest.raises(ShapeError, match='non-empty'): symmetric_label_noise(torch.tensor([], dtype=torch.long), 0.5)
    with pytest.raises(ShapeError, match='non-empty'): few_shot_indices(torch.tensor([], dtype=torch.long), 2)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 3, generator=g), torch.arange(20) % 2
    for fn in (label_noise_curve, input_noise_curve, robustness_table):
        with pytest.raises(ConfigError, match='n_classes=0'): fn({'id': lambda v: v}, x, y, x, y, n_classes=0)

def test_float64_inputs_keep_float64_precision():
    "info_nce and gaussian_input_noise compute in float64 for float64 inputs: results agree with a float64 reference to 1e-12."
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)
    z = torch.nn.functional.normalize(torch.cat([a, b]), dim=-1)
    sim = z @ z.T / 0.2
    ref = 0.0
    for i in range(12):
        others = [j for j in range(12) if j != i]
        ref += -(sim[i, (i + 6) % 12] - torch.logsumexp(sim[i, others], 0))
    out = info_nce(a, b)
    assert out.dtype == torch.float64 and abs(out.item() - ref.item() / 12) < 1e-12
    x = torch.zeros(1000, dtype=torch.float64)
    noisy = gaussian_input_noise(x, 1.0, seed=5)
    ref_noise = torch.randn(1000, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert noisy.dtype == torch.float64 and torch.equal(noisy, ref_noise)

def test_probing_protocols_leave_the_encoders_untouched(untouched):
    "The three protocols run on real (tiny) nets and an SAE, and leave them exactly as they were, also when they raise midway."
    g = torch.Generator().manual_seed(11)
    enc = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.1), nn.ReLU())
    net = ContrastiveNet(enc, 12, d_proj=8, d_hidden=10, non_neg='relu').train()
    sae = SAE(8, 8, 'topk', 2).train()
    maps = {'NCL': lambda v: projector_features(net, v), 'SAE': lambda v: projector_features(net, v, sae)}
    x, y = torch.randn(40, 6, generator=g), torch.arange(40) % 4
    with untouched(net, sae):
        robustness_table(maps, x, y, x, y)
        label_noise_curve(maps, x, y, x, y, rates=(0.0, 0.5))
        input_noise_curve(maps, x, y, x, y, sigmas=(0.1,))
        with pytest.raises(ConfigError, match='rate='): label_noise_curve(maps, x, y, x, y, rates=(0.5, 1.0))
    assert net.training and sae.training

def test_remaining_defaults_and_smallest_valid_sizes():
    "The documented defaults users get without passing them, and the smallest valid sizes accepted (not refused by an off-by-one check)."
    sig = inspect.signature(ContrastiveNet).parameters
    assert sig['d_proj'].default == 256 and sig['d_hidden'].default == 512
    sig = inspect.signature(train_contrastive).parameters
    assert sig['steps'].default == 2000 and sig['batch_size'].default == 256 and sig['seed'].default == 0 and sig['progress'].default is True
    for fn in (label_noise_curve, input_noise_curve, robustness_table, symmetric_label_noise, gaussian_input_noise, few_shot_indices):
        assert inspect.signature(fn).parameters['seed'].default == 0, fn.__name__
    net = ContrastiveNet(nn.Linear(3, 1), 1, d_proj=1, d_hidden=1)                    # widths of 1 are valid
    assert net(torch.randn(4, 3)).shape == (4, 1)
    g = torch.Generator().manual_seed(0)
    _, _, res = train_contrastive(ContrastiveNet(nn.Linear(3, 4), 4, 4, 4), torch.randn(2, 3, generator=g),
                            lambda x, gen: x + 0.1 * torch.randn(x.shape, generator=gen), steps=2, batch_size=2, progress=False)
    assert len(res.history) == 2                                                    # 2 images and batches of 2 are enough
    one = digit_pairs('test', n=1)
    assert len(one) == 1 and one.x.shape == (1, 1, 8, 16)
    assert repr(one) == 'DigitPairs(n=1, x=(1, 1, 8, 16), classes=1)'

def test_digit_augment_rotation_and_zoom_together():
    "Rotated and zoomed at once, the blob is zoomed by exactly s whatever the angle: the scale divides cosine and sine alike."
    x = blob(6., 3.)[None, None].repeat(200, 1, 1, 1)
    out = DigitAugment(**(NEUTRAL | dict(rotate=30., scale=(1.5, 1.5))))(x, torch.Generator().manual_seed(4))
    ev = torch.tensor([moments(o[0])[3] for o in out])
    assert ((ev[:, 0] / 9).sqrt() - 1.5).abs().max() < 0.03 and ((ev[:, 1] / 36).sqrt() - 1.5).abs().max() < 0.03

def test_warmup_is_a_twentieth_of_the_steps():
    "train_contrastive warms up for steps // 20 steps (at least 1): with 100 steps the learning rate climbs over the first 5."
    g = torch.Generator().manual_seed(0)
    _, _, res = train_contrastive(ContrastiveNet(nn.Linear(3, 4), 4, 4, 4), torch.randn(8, 3, generator=g),
                            lambda x, gen: x + 0.1 * torch.randn(x.shape, generator=gen), steps=100, batch_size=2, lr=1.0, progress=False)
    assert res.history.lr.iloc[:5].tolist() == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert res.history.lr.iloc[5] == pytest.approx(1.0)
    for steps, want in ((110, 0.2), (10, 1.0)):                         # 110 // 20 = 5 (integer division); at least 1 step
        _, _, res = train_contrastive(ContrastiveNet(nn.Linear(3, 4), 4, 4, 4), torch.randn(8, 3, generator=g),
                                lambda x, gen: x + 0.1 * torch.randn(x.shape, generator=gen), steps=steps, batch_size=2, lr=1.0, progress=False)
        assert res.history.lr.iloc[0] == pytest.approx(want), steps

def test_projector_features_puts_the_sae_in_eval_mode_and_batches_by_1024():
    "The SAE runs in eval mode (its flag restored after), and the default batch is 1024 inputs per forward pass."
    seen = []
    class Recording(SAE):
        def encode(self, x): seen.append((self.training, len(x))); return super().encode(x)
    net = ContrastiveNet(nn.Linear(3, 4), 4, 4, 4)
    sae = Recording(4, 4, 'topk', 2).train()
    projector_features(net, torch.randn(1500, 3), sae)
    assert seen == [(False, 1024), (False, 476)] and sae.training
    assert inspect.signature(projector_features).parameters['batch_size'].default == 1024

def test_eps_zero_is_valid():
    "eps = 0 counts every non-zero value as active."
    acts = torch.tensor([[1e-9, 0.], [0., 2.], [3., 0.]])
    assert semantic_consistency(acts, torch.tensor([0, 1, 1]), eps=0.0) == pytest.approx((0.5 + 1.0) / 2)

def test_digit_pairs_draw_from_every_image_of_the_split():
    "12,000 train pairs use each of the 1,347 training digits (about 9 times on each side): no image is left out, e.g. the first of a class."
    from interpkit.data import digits
    d = digits(flat=False)
    pairs = digit_pairs('train')
    halves = torch.cat([pairs.x[:, 0, :, :8], pairs.x[:, 0, :, 8:]]).flatten(1)
    seen = {tuple(r.tolist()) for r in halves}
    assert all(tuple(r.tolist()) in seen for r in d.x_train.flatten(1))

def test_monosemanticity_counts_small_active_dims_and_its_default_eps():
    "A dimension with small values (total below 1) is active; monosemanticity's threshold defaults to the official 1e-5."
    acts = torch.tensor([[0.01, 0., 0.], [0.02, 0.003, 0.], [0., 0.004, 0.]])
    m = monosemanticity(acts, torch.tensor([0, 0, 1]))
    assert (m.active_dims, m.dims) == (2, 3)
    assert m.sparsity == pytest.approx(5 / 9)
    assert inspect.signature(monosemanticity).parameters['eps'].default == 1e-5
    assert monosemanticity(torch.tensor([[2e-5, 1.], [1., 0.]]), torch.tensor([0, 1])).sparsity == pytest.approx(0.25)

def test_boundaries():
    "Smallest valid values (top_k=1, two classes, one per class) are accepted."
    acts = torch.tensor([[3., 0.], [1., 2.], [0., 5.]])
    assert top_activating(acts, 1, top_k=1).tolist() == [2]
    y2 = torch.arange(10) % 2
    assert (symmetric_label_noise(y2, 0.5, 2) != y2).sum() == 5 and torch.equal(symmetric_label_noise(y2, 0.5, 2)[symmetric_label_noise(y2, 0.5, 2) != y2], 1 - y2[symmetric_label_noise(y2, 0.5, 2) != y2])
    assert few_shot_indices(torch.tensor([0, 0, 1, 1, 1]), 1).numel() == 2
    eye = 5 * torch.eye(3)
    assert robustness_table({'id': ident}, eye, torch.tensor([0, 1, 2]), eye, torch.tensor([0, 1, 2]), label_noise=0.0).loc['id', 'clean'] == 1.0   # one example of each class is enough

def test_demo_defaults_and_the_recipe_the_asset_was_trained_with():
    "The demo's entry points default to the shipped recipe, and DIGIT_RECIPE is the recipe recorded in the shipped asset."
    sig = inspect.signature(train_digit_net).parameters
    assert (sig['method'].default, sig['seed'].default, sig['progress'].default, sig['batch_size'].default) == ('ncl', 0, True, DIGIT_RECIPE['batch_size'])
    sig = inspect.signature(train_feature_sae).parameters
    assert (sig['batch_size'].default, sig['lr'].default, sig['seed'].default, sig['progress'].default) == (256, 1e-3, 0, True)
    assert inspect.signature(DigitModels.feature_maps).parameters['batch_size'].default == 1024
    if not (assets_dir()/'monosemantic_digit_pairs.json').exists(): pytest.skip('the asset is not built')
    import json
    meta = json.loads((assets_dir()/'monosemantic_digit_pairs.json').read_text())
    assert meta['recipe'] == DIGIT_RECIPE

def test_width_mismatches_raise_shape_errors():
    "An SAE narrower or wider than the projection, and a probe scored on features of another width, raise ShapeError."
    net = ContrastiveNet(nn.Linear(3, 4), 4, d_proj=8, d_hidden=4)
    with pytest.raises(ShapeError, match='d_in=5'): projector_features(net, torch.randn(4, 3), SAE(5, 5, 'topk', 2))
    probe = linear_probe(torch.randn(20, 8), torch.arange(20) % 2, test_frac=0.5)
    with pytest.raises(ShapeError, match='7 features; the probe reads 8'): probe.score(torch.randn(20, 7), torch.arange(20) % 2)


def test_gaussian_input_noise_on_integer_pixels_has_the_asked_size():
    "Issue 51: uint8 or int64 inputs got noise cast to their dtype (std 936 instead of 10 on uint8); now they get float32 noise of std sigma."
    x = torch.full((4000,), 100, dtype=torch.uint8)
    for xi in (x, x.long()):
        y = mono.gaussian_input_noise(xi, 10., seed=0)
        assert y.dtype == torch.float32
        assert abs(float((y - 100).std()) - 10) < 10 * 4 / math.sqrt(2 * 4000)   # 4 standard errors of a sample std
    torch.testing.assert_close(mono.gaussian_input_noise(x, 10., seed=0), mono.gaussian_input_noise(x.float(), 10., seed=0))


def test_contrastive_net_over_a_transformers_encoder():
    "Issue 51: an HF encoder returns a ModelOutput; ContrastiveNet reads its pooler output, else the masked mean of its last hidden state."
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    enc = BertModel(cfg, add_pooling_layer=False).eval()
    net = mono.ContrastiveNet(enc, d_enc=16, d_proj=8, d_hidden=12, non_neg='relu')
    b = dict(input_ids=torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0]]), attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]))
    with torch.no_grad():
        h = enc(**b).last_hidden_state
        ref = torch.stack([h[0, :3].mean(0), h[1, :2].mean(0)])
        torch.testing.assert_close(net.encode(b), ref)
        assert net(b).shape == (2, 8) and (net(b) >= 0).all()
        pooled = BertModel(cfg).eval()
        torch.testing.assert_close(mono.ContrastiveNet(pooled, 16, 8, 12).encode(b), pooled(**b).pooler_output)
