"""Tests of interpkit.papers.bilinear against brute-force loops, numpy, closed forms, constructed cases and real forward passes."""
import copy, math, os
import numpy as np, pytest, torch, transformers
from torch import nn
import torch.nn.functional as F
import warnings
import interpkit.papers.bilinear as bilinear_module
from interpkit.papers.bilinear import (Bilinear, BilinearClassifier, interaction_matrix, bilinear_form, class_interactions, classifier_inputs,
                                       Eigen, AttackResult, eigen, to_input_space, truncate, truncated_logits, truncated_accuracy, eigen_attack,
                                       to_bilinear, mlp_interaction, token_interaction, token_readout, nudge_probs, INTERACTION_SPACES)
from interpkit.stats import effective_rank
from interpkit.errors import ConfigError, ShapeError, NotFiniteError, SiteError
from interpkit.hooks import capture, resid_post, mlp_out
from interpkit.models import tiny_lm

os.environ.setdefault('HF_HUB_OFFLINE', '1')

# ---------------------------------------------------------------- the identity x^T B_u x = u . g(x)

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_identity_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    d_in, d_out = 4, 5
    W, V, u = (torch.randn(d_out, d_in, generator=g, dtype=torch.float64), torch.randn(d_out, d_in, generator=g, dtype=torch.float64),
               torch.randn(d_out, generator=g, dtype=torch.float64))
    # B element by element with plain loops
    B_loop = torch.zeros(d_in, d_in, dtype=torch.float64)
    for i in range(d_in):
        for j in range(d_in):
            B_loop[i, j] = sum(u[k] * (W[k, i] * V[k, j] + W[k, j] * V[k, i]) / 2 for k in range(d_out))
    B = interaction_matrix(W, V, u)
    assert torch.allclose(B, B_loop, atol=1e-12)
    for _ in range(5):
        x = torch.randn(d_in, generator=g, dtype=torch.float64)
        ug = sum(u[k] * sum(W[k, i] * x[i] for i in range(d_in)) * sum(V[k, j] * x[j] for j in range(d_in)) for k in range(d_out))
        xBx = sum(x[i] * B_loop[i, j] * x[j] for i in range(d_in) for j in range(d_in))
        assert float(bilinear_form(B, x[None])[0]) == pytest.approx(float(ug), abs=1e-10)
        assert float(xBx) == pytest.approx(float(ug), abs=1e-10)

def test_identity_layer_float32_and_half_precision():
    torch.manual_seed(0)
    layer = Bilinear(16, 32)
    U, x = torch.randn(3, 32), torch.randn(50, 16)
    with torch.no_grad(): want = layer(x) @ U.T
    got = bilinear_form(interaction_matrix(layer.w.weight, layer.v.weight, U), x)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    # bfloat16 weights: summed in float32, so B equals the float32 matrix of the same (rounded) weights
    w16, v16 = layer.w.weight.bfloat16(), layer.v.weight.bfloat16()
    B16 = interaction_matrix(w16, v16, U[0])
    assert B16.dtype == torch.float32 and torch.allclose(B16, interaction_matrix(w16.float(), v16.float(), U[0]), atol=1e-6)

@pytest.mark.parametrize('space', INTERACTION_SPACES)
def test_classifier_logits_are_quadratic_forms(space):
    clf = BilinearClassifier(d_input=9, d_hidden=7, n_classes=4, seed=3).double()
    x = torch.randn(20, 9, dtype=torch.float64)
    with torch.no_grad():
        h = x @ clf.embed.weight.T
        want = ((h @ clf.layer.w.weight.T) * (h @ clf.layer.v.weight.T)) @ clf.head.weight.T
    assert torch.allclose(bilinear_form(class_interactions(clf, space), classifier_inputs(clf, x, space)), want, atol=1e-10)

# ---------------------------------------------------------------- eigendecomposition and truncation

def test_full_reconstruction_reproduces_logits():
    clf = BilinearClassifier(d_input=8, d_hidden=12, n_classes=5, seed=1)
    x = torch.randn(30, 8)
    with torch.no_grad(): logits = clf(x)
    e = eigen(class_interactions(clf))
    assert torch.allclose(truncate(e, x), logits, atol=1e-4)
    assert torch.allclose(truncated_logits(clf, x, None), logits, atol=1e-4)
    assert torch.allclose(truncated_logits(clf, x, 8), logits, atol=1e-4)

def test_truncation_error_falls_with_k_psd():
    # W = V and u > 0 make B positive semi-definite: the residual sum_{i>k} lam_i (q_i.x)^2 >= 0 shrinks with k for every input
    g = torch.Generator().manual_seed(0)
    W = torch.randn(20, 10, generator=g, dtype=torch.float64)
    B = interaction_matrix(W, W, torch.rand(20, generator=g, dtype=torch.float64) + .1)
    e = eigen(B)
    assert (e.vals > -1e-12).all()
    x = torch.randn(100, 10, generator=g, dtype=torch.float64)
    full = bilinear_form(B, x)
    errs = torch.stack([(full - truncate(e, x, k)).abs() for k in range(1, 11)])
    assert (errs.diff(dim=0) <= 1e-10).all() and errs[-1].max() < 1e-10 and errs[0].mean() > 0

def test_truncation_error_closed_form():
    # x ~ N(0, I): z_i = q_i.x are iid N(0,1), so E[(sum_{i>k} lam_i z_i^2)^2] = 2 sum lam_i^2 + (sum lam_i)^2 over i > k
    g = torch.Generator().manual_seed(1)
    A = torch.randn(6, 6, generator=g, dtype=torch.float64)
    B = (A + A.T) / 2
    e = eigen(B)
    x = torch.randn(200_000, 6, generator=g, dtype=torch.float64)
    full = bilinear_form(B, x)
    for k in (1, 3, 5):
        rest = e.vals[k:]
        want = 2 * (rest ** 2).sum() + rest.sum() ** 2
        got = ((full - truncate(e, x, k)) ** 2).mean()
        assert float(got) == pytest.approx(float(want), rel=0.03)

def test_eigen_sorted_orthonormal_and_top():
    A = torch.randn(3, 5, 5, dtype=torch.float64)
    B = A + A.mT
    e = eigen(B)
    assert torch.allclose(e.vecs @ e.vecs.mT, torch.eye(5, dtype=torch.float64).expand(3, 5, 5), atol=1e-10)
    assert torch.allclose(torch.einsum('cki,ck,ckj->cij', e.vecs, e.vals, e.vecs), B, atol=1e-10)
    ref = np.linalg.eigvalsh(B.numpy())
    order = np.argsort(-np.abs(ref), axis=-1, kind='stable')
    assert np.allclose(e.vals.numpy(), np.take_along_axis(ref, order, -1), atol=1e-10)   # sorted by |λ|, largest first
    assert torch.allclose(e.top(2, 'pos').vals, torch.from_numpy(ref[:, ::-1][:, :2].copy()))
    assert torch.allclose(e.top(2, 'neg').vals, torch.from_numpy(ref[:, :2].copy()))
    i = np.abs(ref).argmax(-1)
    assert torch.allclose(e.top(1).vals[:, 0], torch.from_numpy(ref[np.arange(3), i]))
    q = e.top(1, 'neg').vecs[:, 0]
    assert torch.allclose(torch.einsum('ci,cij->cj', q, B), torch.from_numpy(ref[:, :1]) * q, atol=1e-10)   # really an eigenvector

def test_eigen_of_half_precision_upcasts():
    # E1c: eigh has no bfloat16 kernel; the matrix is decomposed in float32 and the result matches float64's decomposition
    A = torch.randn(6, 6)
    B16 = ((A + A.T) / 2).bfloat16()
    e = eigen(B16)
    ref = np.linalg.eigvalsh(B16.double().numpy())
    assert e.vals.dtype == torch.float32 and e.vecs.dtype == torch.float32
    assert np.allclose(np.sort(e.vals.numpy()), ref, atol=1e-5)
    lm16 = to_bilinear(tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, vocab_size=20)).to(torch.bfloat16)
    assert len(eigen(token_interaction(lm16, 3))) == 16

def test_reprs_do_not_dump_tensors():
    e = eigen(torch.eye(64))
    r = eigen_attack(BilinearClassifier(d_input=4, d_hidden=3, n_classes=2), torch.randn(100, 4), .5)
    for text in (repr(e), repr(r)):
        assert '\n' not in text and len(text) < 300 and 'tensor(' in text
    assert repr(e).startswith('Eigen(vals=tensor(64,)') and 'flip_eigen=' in repr(r)
    assert isinstance(e, Eigen) and isinstance(r, AttackResult)

def test_to_input_space():
    E = torch.randn(7, 3)     # nn.Linear(3, 7).weight layout: hidden x input
    v = torch.randn(2, 7)
    assert torch.allclose(to_input_space(v, E), torch.stack([sum(v[r, h] * E[h] for h in range(7)) for r in range(2)]), atol=1e-5)
    lin = nn.Linear(3, 7, bias=False)
    assert torch.allclose(to_input_space(v, lin), v @ lin.weight.detach(), atol=1e-6)
    emb = nn.Embedding(11, 7)
    assert torch.allclose(to_input_space(v[0], emb), emb.weight.detach() @ v[0], atol=1e-5)
    with pytest.raises(ShapeError, match='embedding maps'): to_input_space(torch.randn(2, 5), E)

# ---------------------------------------------------------------- accuracy, effective rank and attacks against numpy

def numpy_class_matrices(clf):
    "Pixel-space matrices E^T B_c E of a classifier, one class at a time with numpy outer products."
    E, W, V, P = (p.detach().double().numpy() for p in (clf.embed.weight, clf.layer.w.weight, clf.layer.v.weight, clf.head.weight))
    out = []
    for c in range(P.shape[0]):
        Bc = sum(P[c, k] * (np.outer(W[k], V[k]) + np.outer(V[k], W[k])) / 2 for k in range(W.shape[0]))
        out.append(E.T @ Bc @ E)
    return out

def numpy_truncated_logits(clf, x, k):
    x = x.reshape(len(x), -1).double().numpy()
    cols = []
    for M in numpy_class_matrices(clf):
        lam, Q = np.linalg.eigh(M)
        keep = np.argsort(-np.abs(lam), kind='stable')[:k]
        cols.append(sum(lam[i] * (x @ Q[:, i]) ** 2 for i in keep))
    return np.stack(cols, -1)

def test_truncated_accuracy_against_numpy(untouched):
    clf = BilinearClassifier(d_input=6, d_hidden=8, n_classes=4, seed=2).train()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 6, generator=g), torch.randint(0, 4, (60,), generator=g)
    ks = [1, 2, 4, 6]
    want = [float((numpy_truncated_logits(clf, x, k).argmax(-1) == y.numpy()).mean()) for k in ks]
    with untouched(clf): df = truncated_accuracy(clf, x, y, ks, batch_size=7)
    assert list(df['rank']) == ks and np.allclose(df.accuracy, want, atol=1e-12)
    assert len(set(want)) > 1                                       # the k's differ: a test that could fail
    with untouched(clf): tl = truncated_logits(clf, x, 2, batch_size=11)
    assert np.allclose(tl.numpy(), numpy_truncated_logits(clf, x, 2), atol=1e-4)

def test_truncation_on_float64_and_bfloat16_models(untouched):
    # E1b: a float64 classifier and float32 inputs
    clf = BilinearClassifier(d_input=64, d_hidden=16, seed=4).double()
    x = torch.rand(9, 1, 8, 8)
    with untouched(clf): tl = truncated_logits(clf, x, 3)
    assert tl.dtype == torch.float64 and np.allclose(tl.numpy(), numpy_truncated_logits(clf, x, 3), atol=1e-10)
    y = torch.from_numpy(numpy_truncated_logits(clf, x, 64).argmax(-1))
    assert truncated_accuracy(clf, x, y, [64]).accuracy.iloc[0] == 1.0
    b16 = copy.deepcopy(clf).to(torch.bfloat16)
    with untouched(b16): t16 = truncated_logits(b16, x, 3)
    assert t16.dtype == torch.float32 and torch.isfinite(t16).all()
    assert np.allclose(t16.numpy(), numpy_truncated_logits(b16.float(), x.bfloat16(), 3), atol=0.05)

def test_effective_rank_closed_forms():
    for n in (1, 2, 5, 64): assert float(effective_rank(torch.ones(n))) == pytest.approx(n)
    assert float(effective_rank(torch.tensor([1., -1., 0., 0.]))) == pytest.approx(2)          # signs and zeros
    assert float(effective_rank(torch.tensor([2., 1., 1.]))) == pytest.approx(2 ** 1.5)        # exp(1.5 ln 2)
    assert float(effective_rank(torch.tensor([5., 1e-12]))) == pytest.approx(1, abs=1e-6)
    p = np.array([.5, .3, .2])
    assert float(effective_rank(torch.tensor([-5., 3., 2.]))) == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert torch.allclose(effective_rank(torch.tensor([[1., 1.], [1., 0.]])), torch.tensor([2., 1.]))
    with pytest.raises(NotFiniteError, match='all zeros'): effective_rank(torch.zeros(2, 3))

def test_digits_train_quick():
    from interpkit.data import digits
    from interpkit.train import fit
    x_tr, y_tr, x_te, y_te = digits()
    clf = BilinearClassifier(d_hidden=64)   # narrower than the notebook's 256: 1 s instead of 17
    fit(clf, [(x_tr, y_tr)], lambda m, b: F.cross_entropy(m(b[0]), b[1]), steps=100, lr=1e-2, weight_decay=0.5, progress=False)
    with torch.no_grad(): acc = (clf(x_te).argmax(-1) == y_te).float().mean().item()
    assert acc > 0.9

@pytest.mark.parametrize('k', [1, 2])
def test_eigen_attack_against_numpy(k, untouched):
    clf = BilinearClassifier(d_input=6, d_hidden=8, n_classes=3, seed=5).train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(80, 6, generator=g)
    Ms = numpy_class_matrices(clf)
    xs = x.double().numpy()
    logits = lambda z: np.stack([np.einsum('ni,ij,nj->n', z, M, z) for M in Ms], -1)
    pred = logits(xs).argmax(-1)
    eps = 1.2
    x_adv = np.empty_like(xs)
    for n in range(len(xs)):
        lam, Q = np.linalg.eigh(Ms[pred[n]])
        d = sum(np.sign(Q[:, i] @ xs[n]) * Q[:, i] for i in np.argsort(lam, kind='stable')[:k]) / math.sqrt(k)   # the k most negative
        x_adv[n] = xs[n] + eps * d
    r = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).double().numpy()
    x_rand = xs + eps * r / np.linalg.norm(r, axis=-1, keepdims=True)
    with untouched(clf): res = eigen_attack(clf, x, eps, rank=k, seed=3, batch_size=13)
    assert np.array_equal(res.pred.numpy(), pred) and np.allclose(res.x_adv.numpy(), x_adv, atol=1e-5)
    assert res.flip_eigen == pytest.approx((logits(x_adv).argmax(-1) != pred).mean())
    assert res.flip_random == pytest.approx((logits(x_rand).argmax(-1) != pred).mean())
    assert res.flip_eigen > res.flip_random and clf.training

# ---------------------------------------------------------------- adversarial directions on constructed cases

def toy(head):
    m = BilinearClassifier(d_input=2, d_hidden=2, n_classes=len(head))
    with torch.no_grad():
        for p in (m.embed.weight, m.layer.w.weight, m.layer.v.weight): p.copy_(torch.eye(2))
        m.head.weight.copy_(torch.tensor(head))
    return m

def test_attack_away_constructed():
    m = toy([[1., -1.], [0., 0.]])     # logit0 = x1^2 - x2^2, logit1 = 0; at (1, .5) class 0 wins by .75
    x = torch.tensor([[1., .5]])
    # the most negative eigenvector of diag(1, -1) is e2, moved with the sign of x2: flips when (.5 + eps)^2 > 1
    assert eigen_attack(m, x, .49).flip_eigen == 0.
    r = eigen_attack(m, x, .51)
    assert r.flip_eigen == 1. and torch.allclose(r.x_adv, torch.tensor([[1., 1.01]])) and r.pred_adv.item() == 1
    x2 = torch.tensor([[1., -.5]])     # the sign follows the input: x2 is pushed further negative
    assert torch.allclose(eigen_attack(m, x2, .6).x_adv, torch.tensor([[1., -1.1]]))

def test_attack_towards_target_constructed():
    m = toy([[1., -1.], [0., .5], [0., 0.]])   # logit1 = .5 x2^2: target 1 flips when 1.5 (.5 + eps)^2 > 1
    x = torch.tensor([[1., .5]])
    thr = math.sqrt(2 / 3) - .5
    assert eigen_attack(m, x, thr - .01, target=1).flip_eigen == 0.
    r = eigen_attack(m, x, thr + .01, target=1)
    assert r.flip_eigen == 1. and r.pred_adv.item() == 1

def test_random_directions_have_norm_eps():
    clf = BilinearClassifier(d_input=6, d_hidden=8, n_classes=3)
    x = torch.randn(25, 6)
    r = eigen_attack(clf, x, 0.7, rank=2)
    assert torch.allclose((r.x_adv - x).norm(dim=-1), torch.full((25,), 0.7), atol=1e-5)

# ---------------------------------------------------------------- nudge_probs on any classifier

def test_nudge_probs_constructed():
    m = toy([[1., -1.], [0., 0.]])
    p = nudge_probs(m, torch.tensor([1., .5]), torch.tensor([0., 5.]), .6)     # direction normalised
    assert torch.allclose(p, torch.tensor([math.exp(1 - 1.21), 1.]) / (math.exp(1 - 1.21) + 1))   # logits (1 - 1.1², 0)

def test_nudge_probs_cnn_train_mode_and_dtypes(untouched):
    # 3b: a CNN taking (B, 1, 8, 8); 3d: a model with dropout in train mode; 3c: float64 and bfloat16 models
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(256, 10)).train()
    x, d = torch.randn(1, 8, 8), torch.randn(1, 8, 8)
    moved = x + 0.5 * d / d.norm()
    ref = copy.deepcopy(cnn).eval()
    with torch.no_grad(): want = ref(moved[None]).softmax(-1)[0]
    with untouched(cnn):
        p1, p2 = nudge_probs(cnn, x, d, 0.5), nudge_probs(cnn, x, d.flatten(), 0.5)
    assert torch.allclose(p1, want, atol=1e-6) and torch.equal(p1, p2) and cnn.training
    for dt, tol in ((torch.float64, 1e-12), (torch.bfloat16, 2e-2)):
        m = copy.deepcopy(cnn).to(dt)
        with torch.no_grad(): w = copy.deepcopy(m).eval()(moved.to(dt)[None]).double().softmax(-1)[0]
        with untouched(m): p = nudge_probs(m, x, d, 0.5)
        assert p.dtype == (torch.float64 if dt == torch.float64 else torch.float32)
        assert torch.allclose(p.double(), w, atol=tol) and float(p.sum()) == pytest.approx(1, abs=1e-5)

def test_nudge_probs_dict_and_model_output():
    # E3: models that return a dict or a transformers ModelOutput
    from transformers.modeling_outputs import ImageClassifierOutput
    lin = nn.Linear(4, 3)
    class AsDict(nn.Module):
        def __init__(self): super().__init__(); self.lin = lin
        def forward(self, x): return {'loss': None, 'logits': self.lin(x)}
    class AsOutput(AsDict):
        def forward(self, x): return ImageClassifierOutput(logits=self.lin(x))
    x, d = torch.randn(4), torch.randn(4)
    with torch.no_grad(): want = lin((x + 2 * d / d.norm())[None]).softmax(-1)[0]
    for m in (AsDict(), AsOutput()): assert torch.allclose(nudge_probs(m, x, d, 2.), want, atol=1e-6)

# ---------------------------------------------------------------- the bilinear MLP of language models

def test_to_bilinear_copies_and_matches_by_hand(untouched):
    lm = tiny_lm('llama', n_layers=2, d_model=16, n_heads=2, vocab_size=30)
    act = type(lm.model.layers[0].mlp.act_fn)
    with untouched(lm): blm = to_bilinear(lm)
    assert all(type(l.mlp.act_fn) is act for l in lm.model.layers) and lm.config.hidden_act == 'silu'
    assert blm.config.hidden_act == 'linear' and blm is not lm
    z = torch.randn(3, 4, 16)
    for l in range(2):
        mlp = blm.model.layers[l].mlp
        G, Uw, D = mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach(), mlp.down_proj.weight.detach()
        by_hand = torch.zeros(3, 4, 16)
        for k in range(G.shape[0]): by_hand += ((z @ G[k]) * (z @ Uw[k]))[..., None] * D[:, k]
        with torch.no_grad(): assert torch.allclose(mlp(z), by_hand, atol=1e-5)
    rebuilt = transformers.AutoModelForCausalLM.from_config(blm.config)   # a model rebuilt from the copy's config is bilinear too
    assert type(rebuilt.model.layers[0].mlp.act_fn).__name__ == 'LinearActivation'

@pytest.mark.parametrize('arch', ['gemma2', 'phi3'])
def test_to_bilinear_other_families(arch):
    blm = to_bilinear(tiny_lm(arch, n_layers=1, d_model=16, n_heads=2, vocab_size=30))
    mlp = blm.model.layers[0].mlp
    assert all(isinstance(getattr(mlp, a, nn.Identity()), nn.Identity) for a in ('act_fn', 'activation_fn'))
    rebuilt = transformers.AutoModelForCausalLM.from_config(blm.config).model.layers[0].mlp   # Gemma 2 reads hidden_activation
    assert type(getattr(rebuilt, 'act_fn', None) or rebuilt.activation_fn).__name__ == 'LinearActivation'

def bilinear_lm(arch, random_norms=True, seed=0):
    "A 2-layer bilinear tiny LM in float64; norm weights drawn at random (Gemma's initial zeros mean a gain of 1)."
    m = to_bilinear(tiny_lm(arch, n_layers=2, d_model=16, n_heads=2, vocab_size=40, seed=seed)).double()
    g = torch.Generator().manual_seed(seed + 1)
    if random_norms:
        with torch.no_grad():
            for n, p in m.named_parameters():
                if 'norm' in n: p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * .5 + .3)
    return m

def mlp_pass(m, layer):
    "From a real forward pass: ẑ (the RMS-normalised residual stream entering block `layer`'s MLP), what the MLP adds, and the MLP module's own output."
    path = f'model.layers.{layer}.mlp'
    ids = torch.arange(12)[None] % m.config.vocab_size
    with torch.no_grad(), capture(m, [resid_post(layer), mlp_out(layer), path]) as c: m(ids)
    r = c[resid_post(layer)][0] - c[mlp_out(layer)][0]
    zh = r / (r.pow(2).mean(-1, keepdim=True) + m.config.rms_norm_eps).sqrt()
    return zh, c[mlp_out(layer)][0], c[path][0]

NO_POST = ['llama', 'gemma', 'qwen2', 'qwen3', 'phi3']

@pytest.mark.parametrize('arch', NO_POST)
@pytest.mark.parametrize('layer', [0, -1])
def test_mlp_interaction_real_forward(arch, layer, untouched):
    # 3a: u · (what the MLP adds) = ẑᵀ B_u ẑ, with the pre-MLP norm's gain (w, or 1 + w for Gemma) folded in
    m = bilinear_lm(arch)
    zh, added, _ = mlp_pass(m, layer % 2)
    U = torch.randn(3, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with untouched(m): B = mlp_interaction(m, U, layer)
    got, want = bilinear_form(B, zh), added @ U.T
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * want.abs().max()), (got - want).abs().max()

def test_mlp_interaction_gemma_initial_norms():
    # at Gemma's initial norm weights (0, a gain of 1) the old code returned B = 0
    m = bilinear_lm('gemma', random_norms=False)
    assert all((p == 0).all() for n, p in m.named_parameters() if 'norm' in n)
    zh, added, _ = mlp_pass(m, 1)
    u = torch.randn(16, dtype=torch.float64)
    B = mlp_interaction(m, u)
    assert B.abs().max() > 0 and torch.allclose(bilinear_form(B, zh), added @ u, rtol=1e-5, atol=1e-9)

@pytest.mark.parametrize('arch', ['gemma2', 'gemma3'])
@pytest.mark.parametrize('layer', [0, 1])
def test_mlp_interaction_post_norm(arch, layer, untouched):
    # Gemma 2/3: the pre-MLP norm is pre_feedforward_layernorm and the MLP's output is normalised again: refused, or folded up to 1/rms
    m = bilinear_lm(arch)
    zh, added, y = mlp_pass(m, layer)
    u = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with untouched(m):
        with pytest.raises(ConfigError, match=r"post_feedforward_layernorm.*post_norm='fold'"): mlp_interaction(m, u, layer)
        with pytest.raises(ConfigError, match="post_norm='fold'"): token_interaction(m, 3, layer)
        B = mlp_interaction(m, u, layer, post_norm='fold')
    rms = (y.pow(2).mean(-1) + m.config.rms_norm_eps).sqrt()
    assert torch.allclose(bilinear_form(B, zh) / rms, added @ u, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="'raise', 'fold'"): mlp_interaction(m, u, layer, post_norm='ignore')

@pytest.mark.parametrize('arch', ['llama', 'gemma', 'qwen3', 'gemma2'])
def test_token_interaction_direct_path(arch, untouched):
    # V_t · final_norm(y) · rms(y) = (V_t ⊙ gain) · y for the MLP's contribution y: the final norm's gain, from the model's own norm module
    m = bilinear_lm(arch)
    fold = 'fold' if arch == 'gemma2' else 'raise'
    zh, added, y = mlp_pass(m, 1)
    rms_f = (added.pow(2).mean(-1) + m.config.rms_norm_eps).sqrt()
    rms_post = (y.pow(2).mean(-1) + m.config.rms_norm_eps).sqrt() if arch == 'gemma2' else 1
    t = 7
    with torch.no_grad(): want = m.model.norm(added) @ m.lm_head.weight[t] * rms_f
    with untouched(m): Bt = token_interaction(m, t, -1, fold)
    assert torch.allclose(bilinear_form(Bt, zh) / rms_post, want, rtol=1e-5, atol=1e-6)
    w = m.model.norm.weight.detach()
    gain = 1 + w if arch.startswith('gemma') else w   # by hand: Gemma's RMSNorm scales by 1 + w
    assert torch.allclose(Bt, mlp_interaction(m, m.lm_head.weight[t].detach() * gain, -1, fold), atol=1e-12)

def test_mlp_interaction_bfloat16_model():
    m = bilinear_lm('gemma')
    B64 = mlp_interaction(m, torch.ones(16, dtype=torch.float64))
    m16 = copy.deepcopy(m).to(torch.bfloat16)
    B16 = mlp_interaction(m16, torch.ones(16))
    assert B16.dtype == torch.float32 and torch.allclose(B16.double(), B64, atol=0.03 * B64.abs().max())

def test_token_readout_brute_force(untouched):
    blm = to_bilinear(tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, vocab_size=30, seed=5))
    v = torch.randn(16)
    E = blm.model.embed_tokens.weight.detach()
    scores = torch.tensor([float(E[t] / E[t].pow(2).mean().add(blm.config.rms_norm_eps).sqrt() @ v) for t in range(30)])
    with untouched(blm): df = token_readout(blm, v, top_k=5)
    assert list(df.id) == scores.abs().argsort(descending=True)[:5].tolist()
    assert torch.allclose(torch.tensor(df.score.tolist()), scores[df.id.tolist()], atol=1e-5)
    df = token_readout(blm, v, top_k=3, tokens=[1, 2, 3, 4])
    assert list(df.id) == [1 + i for i in scores[1:5].abs().argsort(descending=True)[:3].tolist()]
    from interpkit.data import char_tokenizer
    top2 = token_readout(blm, v, top_k=2, tokenizer=char_tokenizer())
    assert list(top2.token) == [chr(i) for i in top2.id] and list(top2.id) == list(token_readout(blm, v, top_k=2).id)
    with pytest.raises(ShapeError, match=r'Valid: \(16,\)'): token_readout(blm, torch.randn(15))
    with pytest.raises(ConfigError, match='outside'): token_readout(blm, v, tokens=[30])

# ---------------------------------------------------------------- bad input

def test_bad_input():
    layer = Bilinear(4, 6)
    with pytest.raises(ShapeError, match=r'u has shape \(5,\)'): interaction_matrix(layer.w.weight, layer.v.weight, torch.randn(5))
    with pytest.raises(ShapeError, match='equal'): interaction_matrix(torch.randn(6, 4), torch.randn(6, 3), torch.randn(6))
    with pytest.raises(ShapeError, match='x must be'): bilinear_form(torch.eye(4), torch.randn(3, 5))
    with pytest.raises(ConfigError, match='BilinearClassifier'): class_interactions(nn.Linear(3, 3))
    clf = BilinearClassifier(d_input=6, d_hidden=5, n_classes=3)
    with pytest.raises(ConfigError, match="'input', 'hidden'"): class_interactions(clf, 'pixel')
    with pytest.raises(ConfigError, match='not symmetric'): eigen(torch.tensor([[1., 2.], [0., 1.]]))
    with pytest.raises(ShapeError, match='square'): eigen(torch.randn(3, 4))
    e = eigen(class_interactions(clf))
    with pytest.raises(ConfigError, match='top_k=7 is not valid'): e.top(7)
    with pytest.raises(ConfigError, match='sign'): e.top(1, 'up')
    with pytest.raises(ShapeError, match=r'Valid: \(n, 6\)'): truncate(e, torch.randn(2, 5))
    with pytest.raises(ConfigError, match='batch_size'): truncated_logits(clf, torch.randn(2, 6), 1, batch_size=0)
    with pytest.raises(ShapeError, match='one label per input'): truncated_accuracy(clf, torch.randn(4, 6), torch.zeros(3), [1])
    with pytest.raises(ConfigError, match='target=3'): eigen_attack(clf, torch.randn(2, 6), 1., target=3)
    with pytest.raises(ConfigError, match='negative'): eigen_attack(clf, torch.randn(2, 6), -1.)
    with pytest.raises(ShapeError, match='same number'): nudge_probs(clf, torch.randn(6), torch.randn(5), 1.)
    with pytest.raises(ConfigError, match='no gated MLP'): to_bilinear(tiny_lm('gpt2'))
    with pytest.raises(ConfigError, match='no gated MLP'): to_bilinear(tiny_lm('mixtral', n_layers=1))   # mixtures of experts
    lm = tiny_lm('llama', n_layers=1, d_model=16, n_heads=2)
    with pytest.raises(ConfigError, match='activation is SiLU'): mlp_interaction(lm, torch.randn(16))
    blm = to_bilinear(lm)
    with pytest.raises(ShapeError, match='residual-stream direction'): mlp_interaction(blm, torch.randn(15))
    with pytest.raises(ConfigError, match='layer=3'): mlp_interaction(blm, torch.randn(16), layer=3)
    with pytest.raises(ConfigError, match='token=500'): token_interaction(blm, 500)
    with pytest.raises(ConfigError, match='no known layout'): mlp_interaction(nn.Linear(3, 3), torch.randn(3))
    with pytest.raises(ConfigError, match='causal language model'): token_interaction(blm.model, 3)   # the base model has no LM head
    biased = to_bilinear(tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, mlp_bias=True))
    with pytest.raises(ConfigError, match='biases'): mlp_interaction(biased, torch.randn(16))

# ---------------------------------------------------------------- gaps found by mutation testing

def test_model_outputs_read_by_logits():
    # a dict with another tensor first, a ModelOutput with a loss first, a tuple, and an output without tensors
    from transformers.modeling_outputs import ImageClassifierOutput
    lin = nn.Linear(4, 3)
    class Out(nn.Module):
        def __init__(self, kind): super().__init__(); self.lin, self.kind = lin, kind
        def forward(self, x):
            lg = self.lin(x)
            if self.kind == 'dict': return {'hidden': torch.zeros(1, 7), 'logits': lg}
            if self.kind == 'output': return ImageClassifierOutput(loss=torch.tensor(5.), logits=lg)
            if self.kind == 'tuple': return (None, lg, torch.zeros(1, 2))
            return {'names': ['a']}
    x, d = torch.randn(4), torch.randn(4)
    with torch.no_grad(): want = lin((x + d / d.norm())[None]).softmax(-1)[0]
    for kind in ('dict', 'output', 'tuple'): assert torch.allclose(nudge_probs(Out(kind), x, d, 1.), want, atol=1e-6), kind
    with pytest.raises(ConfigError, match='no tensor'): nudge_probs(Out('none'), x, d, 1.)

def test_nudge_probs_steps_in_float32_at_least():
    # bfloat16 inputs into a float64 model: the step is taken in float64 from the bf16 values, not in bf16
    lin = nn.Linear(6, 3).double()
    x, d = torch.randn(6).bfloat16(), torch.randn(6).bfloat16()
    xd, dd = x.double(), d.double()
    with torch.no_grad(): want = lin((xd + 0.3 * dd / dd.norm())[None]).softmax(-1)[0]
    p = nudge_probs(lin, x, d, 0.3)
    assert p.dtype == torch.float64 and torch.allclose(p, want, atol=1e-12)

class Recording(BilinearClassifier):
    "A classifier that records the training flag of every forward pass."
    def forward(self, x):
        self.seen = getattr(self, 'seen', []) + [self.training]
        return super().forward(x)

def test_classifier_methods_run_in_eval_mode(untouched):
    clf = Recording(d_input=6, d_hidden=5, n_classes=3).train()
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    with untouched(clf):
        truncated_logits(clf, x, 2); truncated_accuracy(clf, x, y, [1]); eigen_attack(clf, x, .5)
    assert clf.seen and not any(clf.seen) and clf.training

def test_forms_dtypes():
    A = torch.randn(5, 5, dtype=torch.float64)
    B, x = A + A.T, torch.randn(4, 5)
    want = torch.einsum('ni,ij,nj->n', x.double(), B, x.double())
    got = bilinear_form(B, x)                                          # float32 inputs, float64 matrix: float64
    assert got.dtype == torch.float64 and torch.allclose(got, want, atol=1e-12)
    b16, x16 = B.bfloat16(), x.bfloat16()
    got16 = bilinear_form(b16, x16)                                   # bfloat16: summed in float32
    assert got16.dtype == torch.float32 and torch.allclose(got16, torch.einsum('ni,ij,nj->n', x16.float(), b16.float(), x16.float()), atol=1e-5)
    E = torch.randn(7, 3, dtype=torch.float64)
    assert to_input_space(torch.ones(2, 7), E).dtype == torch.float64

def test_classifier_inputs_defaults_and_integer_pixels():
    clf = BilinearClassifier(d_input=4, d_hidden=3, n_classes=2, seed=1)
    x = torch.randint(0, 17, (5, 2, 2), dtype=torch.uint8)
    got = classifier_inputs(clf, x)                                   # default space: the pixels, as floats
    assert got.dtype == torch.float32 and torch.equal(got, x.flatten(1).float())
    with torch.no_grad(): assert torch.allclose(truncated_logits(clf, x, None), clf(x.float()), atol=1e-4)

def test_eigen_symmetry_tolerance_is_relative():
    assert len(eigen(torch.tensor([[1000., 1e-4], [0., 1.]]))) == 2          # asymmetric only at round-off of its scale
    with pytest.raises(ConfigError, match='not symmetric'): eigen(1e-6 * torch.tensor([[1., 2.], [0., 1.]]))

def numpy_hidden_truncated(clf, x, k):
    "Truncated logits of the hidden-space matrices B_c, decomposed with numpy, and the rest of the logits kept whole."
    E, W, V, P = (p.detach().double().numpy() for p in (clf.embed.weight, clf.layer.w.weight, clf.layer.v.weight, clf.head.weight))
    h = x.reshape(len(x), -1).double().numpy() @ E.T
    a = clf.layer.w.bias.detach().double().numpy() if clf.layer.w.bias is not None else 0
    b = clf.layer.v.bias.detach().double().numpy() if clf.layer.v.bias is not None else 0
    full = ((h @ W.T + a) * (h @ V.T + b) + (h if clf.residual else 0)) @ P.T     # the forward pass by hand
    out = []
    for c in range(P.shape[0]):
        Bc = sum(P[c, j] * (np.outer(W[j], V[j]) + np.outer(V[j], W[j])) / 2 for j in range(W.shape[0]))
        lam, Q = np.linalg.eigh(Bc)
        keep = np.argsort(-np.abs(lam), kind='stable')[:k]
        quad, cut = np.einsum('ni,ij,nj->n', h, Bc, h), sum(lam[i] * (h @ Q[:, i]) ** 2 for i in keep)
        out.append(full[:, c] - quad + cut)
    return np.stack(out, -1)

@pytest.mark.parametrize('bias,residual', [(False, False), (True, True)])
def test_truncation_hidden_space_and_lower_degree_terms(bias, residual):
    clf = BilinearClassifier(d_input=6, d_hidden=5, n_classes=3, bias=bias, residual=residual, seed=6).double()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (40,), generator=g)
    for k in (1, 3):
        assert np.allclose(truncated_logits(clf, x, k, 'hidden').numpy(), numpy_hidden_truncated(clf, x, k), atol=1e-9)
    want = [float((numpy_hidden_truncated(clf, x, k).argmax(-1) == y.numpy()).mean()) for k in (1, 2)]
    assert np.allclose(truncated_accuracy(clf, x, y, [1, 2], 'hidden').accuracy, want)
    if residual: assert not np.allclose(truncated_logits(clf, x, 1).numpy(), numpy_truncated_logits(clf, x, 1))   # the rest is kept

def test_eigen_attack_edge_cases():
    clf = BilinearClassifier(d_input=6, d_hidden=8, n_classes=3, seed=5).double()   # float64: inputs are cast back to the model
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 6, generator=g)
    r0 = eigen_attack(clf, x, 0.)
    assert r0.eps == 0. and r0.flip_eigen == 0. and torch.equal(r0.x_adv, x.double())
    r = eigen_attack(clf, x, .8, target=0)
    assert r.eps == .8 and (r.pred_adv == 0).float().mean() >= (r.pred == 0).float().mean()
    assert eigen_attack(clf, x, .8).flip_random == eigen_attack(clf, x, .8, seed=0).flip_random   # the default seed is 0
    z = eigen_attack(clf, torch.zeros(1, 6), .5)                       # q·x = 0: the sign counts as +1, so the input still moves
    assert float(z.x_adv.norm()) == pytest.approx(.5)

def test_gated_module_detection():
    class MLP(nn.Module):
        def __init__(self, parts):
            super().__init__()
            for p in parts: setattr(self, p, nn.SiLU() if p == 'act_fn' else nn.Linear(4, 4, bias=False))
    class Net(nn.Module):   # no config attribute
        def __init__(self, parts): super().__init__(); self.mlp = MLP(parts)
    for parts in (['gate_proj', 'up_proj', 'act_fn'], ['gate_proj', 'down_proj', 'act_fn'], ['gate_proj', 'up_proj', 'down_proj']):
        with pytest.raises(ConfigError, match='no gated MLP'): to_bilinear(Net(parts))
    net = Net(['gate_proj', 'up_proj', 'down_proj', 'act_fn'])
    assert isinstance(to_bilinear(net).mlp.act_fn, nn.Identity) and isinstance(net.mlp.act_fn, nn.SiLU)

def test_norms_with_a_bias_are_refused():
    m = bilinear_lm('llama')
    m.model.layers[1].post_attention_layernorm = nn.LayerNorm(16).double()
    with pytest.raises(ConfigError, match='bias'): mlp_interaction(m, torch.randn(16))

def test_mlp_interaction_casts_u_and_accepts_rebuilt_models():
    m = bilinear_lm('llama')
    u = torch.randn(16)
    assert torch.allclose(mlp_interaction(m, u), mlp_interaction(m, u.double()), atol=1e-12)    # float32 u into a float64 model
    rebuilt = transformers.AutoModelForCausalLM.from_config(m.config).double()                 # act_fn = LinearActivation
    rebuilt.load_state_dict(m.state_dict())
    assert torch.allclose(mlp_interaction(rebuilt, u), mlp_interaction(m, u), atol=1e-12)

def test_layer_and_token_bounds():
    m = bilinear_lm('gemma')                                          # 2 layers, vocabulary 40
    for bad in (2, -3, True):
        with pytest.raises(ConfigError, match='out of range'): mlp_interaction(m, torch.randn(16), layer=bad)
    gain = 1 + m.model.norm.weight.detach()
    for t in (0, 39):
        assert torch.allclose(token_interaction(m, t), mlp_interaction(m, m.lm_head.weight[t].detach() * gain), atol=1e-12)
    for bad in (40, -1, True):
        with pytest.raises(ConfigError, match='out of range'): token_interaction(m, bad)
    with pytest.raises(ConfigError, match='no .mlp. module'): mlp_interaction(tiny_lm('bert', n_layers=1), torch.randn(64))
    class Plain(nn.Module):
        def forward(self, x): return x
    with pytest.raises(ConfigError, match='output head'): token_interaction(Plain(), 1)

def test_token_readout_eps_dtypes_and_candidates():
    # Gemma 2 names its epsilon `eps`; a large one makes it visible; the MLP need not be bilinear for a readout
    m = tiny_lm('gemma2', n_layers=1, d_model=16, n_heads=2, vocab_size=30, rms_norm_eps=0.5)
    E, v = m.model.embed_tokens.weight.detach().double(), torch.randn(16, dtype=torch.float64)
    ref = lambda eps: torch.stack([E[t] / (E[t].pow(2).mean() + eps).sqrt() @ v for t in range(30)])
    df = token_readout(m, v, top_k=30)
    assert torch.allclose(torch.tensor(df.score.tolist(), dtype=torch.float64), ref(0.5)[df.id.tolist()], atol=1e-6)
    m16 = copy.deepcopy(m).to(torch.bfloat16)                         # bfloat16 weights, float32 vector: scored in float32
    E16 = m16.model.embed_tokens.weight.detach().double()
    d16 = token_readout(m16, v.float(), top_k=30)
    want16 = torch.stack([E16[t] / (E16[t].pow(2).mean() + 0.5).sqrt() @ v for t in range(30)])
    assert torch.allclose(torch.tensor(d16.score.tolist(), dtype=torch.float64), want16[d16.id.tolist()], atol=1e-5)
    assert list(token_readout(m, v, top_k=3, tokens=[4]).id) == [4]
    with pytest.raises(ConfigError, match='outside'): token_readout(m, v, tokens=[])
    # a norm that names no epsilon: none is added
    class NoEps(nn.Module):
        def __init__(self): super().__init__(); self.weight = nn.Parameter(torch.ones(16))
        def forward(self, x): return self.weight * x / x.pow(2).mean(-1, keepdim=True).sqrt()
    lm = tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, vocab_size=30)
    with torch.no_grad(): lm.model.embed_tokens.weight.mul_(1e-3)    # mean(e²) ≈ 4e-10: an epsilon of 1e-6 or 1 would dominate
    lm.model.layers[0].post_attention_layernorm = NoEps()
    El = lm.model.embed_tokens.weight.detach().double()
    dl = token_readout(lm, v, top_k=30)
    want = torch.stack([El[t] / El[t].pow(2).mean().sqrt() @ v for t in range(30)])
    assert torch.allclose(torch.tensor(dl.score.tolist(), dtype=torch.float64), want[dl.id.tolist()], rtol=1e-5)

def test_second_round_gaps():
    from types import SimpleNamespace
    # plain Python and numpy inputs are accepted
    assert float(effective_rank([2., 1., 1.])) == pytest.approx(2 ** 1.5)
    assert torch.allclose(interaction_matrix(np.eye(2), np.eye(2), [1., -1.]), torch.tensor([[1., 0.], [0., -1.]], dtype=torch.float64))
    # a direction shorter than 1 is still normalised to unit length
    m = toy([[1., -1.], [0., 0.]])
    assert torch.allclose(nudge_probs(m, torch.tensor([1., .5]), torch.tensor([0., .1]), .6), nudge_probs(m, torch.tensor([1., .5]), torch.tensor([0., 7.]), .6))
    # outputs that are not Mappings but carry `.logits`, dicts without a `logits` key, and outputs with nothing to read
    lin = nn.Linear(4, 3)
    class Out(nn.Module):
        def __init__(self, kind): super().__init__(); self.lin, self.kind = lin, kind
        def forward(self, x):
            if self.kind == 'attr': return SimpleNamespace(hidden=torch.zeros(1, 5), logits=self.lin(x))
            if self.kind == 'scores': return {'scores': self.lin(x)}
            return SimpleNamespace(names=['a'])
    x, d = torch.randn(4), torch.randn(4)
    with torch.no_grad(): want = lin((x + d / d.norm())[None]).softmax(-1)[0]
    for kind in ('attr', 'scores'): assert torch.allclose(nudge_probs(Out(kind), x, d, 1.), want, atol=1e-6), kind
    with pytest.raises(ConfigError, match='no tensor'): nudge_probs(Out('nothing'), x, d, 1.)
    # float64 inputs into a float64 classifier stay float64 (no detour through float32)
    clf = BilinearClassifier(d_input=6, d_hidden=5, n_classes=3, seed=7).double()
    x64 = torch.randn(5, 6, dtype=torch.float64) * 1e3
    with torch.no_grad(): assert torch.allclose(truncated_logits(clf, x64, None), clf(x64), rtol=1e-12, atol=0)
    # a norm naming its epsilon `epsilon`; a block without the norm its layout puts before the MLP
    class EpsNorm(nn.Module):
        def __init__(self): super().__init__(); self.weight, self.epsilon = nn.Parameter(torch.ones(16)), 0.25
        def forward(self, x): return self.weight * x / (x.pow(2).mean(-1, keepdim=True) + self.epsilon).sqrt()
    lm = tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, vocab_size=30)
    lm.model.layers[0].post_attention_layernorm = EpsNorm()
    E, v = lm.model.embed_tokens.weight.detach().double(), torch.randn(16, dtype=torch.float64)
    df = token_readout(lm, v, top_k=30)
    want = torch.stack([E[t] / (E[t].pow(2).mean() + 0.25).sqrt() @ v for t in range(30)])
    assert torch.allclose(torch.tensor(df.score.tolist(), dtype=torch.float64), want[df.id.tolist()], atol=1e-5)
    del lm.model.layers[0].post_attention_layernorm
    with pytest.raises(SiteError, match='the norm its layout .llama. puts before the MLP'): token_readout(lm, v)

# ---------------------------------------------------------------- issue 50: the old names and spellings keep working for one release, and warn

def test_old_names_still_work_and_warn():
    clf = BilinearClassifier(d_input=6, d_hidden=5, n_classes=3, seed=1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 6, generator=g), torch.randint(0, 3, (20,), generator=g)
    e = eigen(class_interactions(clf))
    with pytest.warns(FutureWarning, match='top_k='): assert torch.equal(e.top(k=2).vals, e.top(2).vals)
    with pytest.warns(FutureWarning, match='rank='): assert torch.equal(truncate(e, x, k=2), truncate(e, x, 2))
    with pytest.warns(FutureWarning, match='rank='): assert torch.equal(truncated_logits(clf, x, k=2), truncated_logits(clf, x, 2))
    with pytest.warns(FutureWarning, match='rank='): assert eigen_attack(clf, x, .5, k=2).flip_eigen == eigen_attack(clf, x, .5, rank=2).flip_eigen
    with pytest.warns(FutureWarning, match='ranks='): df = truncated_accuracy(clf, x, y, ks=[1, 3])
    with pytest.warns(FutureWarning, match='truncated_accuracy'): old = bilinear_module.topk_accuracy(clf, x, y, [1, 3])
    assert list(old.columns) == ['k', 'accuracy'] and old.accuracy.tolist() == df.accuracy.tolist()
    with pytest.warns(FutureWarning, match='interpkit.stats'): assert bilinear_module.eigenvalue_effective_rank is effective_rank
    from interpkit.demos import bilinear as demo
    for name in ('CHAR_LM', 'train_char_lm', 'load_char_lm'):
        with pytest.warns(FutureWarning, match='interpkit.demos.bilinear'): assert getattr(bilinear_module, name) is getattr(demo, name)
    lm = to_bilinear(tiny_lm('llama', n_layers=1, d_model=16, n_heads=2, vocab_size=20))
    v = torch.randn(16, generator=g)
    with pytest.warns(FutureWarning, match='top_k='): assert token_readout(lm, v, k=3).equals(token_readout(lm, v, top_k=3))
    assert not {'topk_accuracy', 'eigenvalue_effective_rank', 'CHAR_LM', 'train_char_lm', 'load_char_lm'} & set(bilinear_module.__all__)
    with pytest.raises(AttributeError): bilinear_module.no_such_name


def test_nan_and_wrong_widths_are_named():
    "Issue 51: NaN inputs, weights or matrices, and inputs of the wrong width, are typed errors that say which, not NaN flowing through or a matmul error."
    clf = BilinearClassifier(d_input=6, d_hidden=4, n_classes=3, seed=1)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ShapeError, match='flattens to 7 features .* takes 6'): eigen_attack(clf, torch.randn(5, 7), .5)
    xn = x.clone(); xn[2, 1] = float('nan')
    with pytest.raises(NotFiniteError, match=r'^x has 1 non-finite'): eigen_attack(clf, xn, .5)
    bad = copy.deepcopy(clf)
    with torch.no_grad(): bad.layer.w.weight[0, 0] = float('nan')
    with pytest.raises(NotFiniteError, match="the classifier's layer.w.weight"): eigen_attack(bad, x, .5)
    B = torch.eye(3); B[0, 1] = B[1, 0] = float('inf')
    with pytest.raises(NotFiniteError, match='^B has 2 non-finite'): eigen(B)
    assert eigen_attack(clf, x, .5).flip_eigen >= 0   # the clean call still runs
