"""Tests of interpkit.papers.graphnorm against independent references: eigenvectors from numpy, brute-force Dirichlet
energy, closed-form ranks, a numpy linearised GNN, PyG's own GraphNorm, per-graph statistics by hand, a dense GCN by hand,
graphs one by one against a mini-batch, accuracies recounted from the model, devices and dtypes, and bad input."""
import copy
import numpy as np, pandas as pd, pytest, torch
import torch.nn.functional as F
from torch_geometric.data import Batch
from torch_geometric.nn import GraphNorm
from interpkit.papers.graphnorm import (VARIANTS, NORMS, csbm, karate, gcn_operator, linear_gnn, dirichlet_energy, feature_effective_rank,
                                        numerical_rank, eigenspace_energy, subspace_distance, top_eigvecs, probe_accuracy, centring_basis,
                                        GraphNormv2, DeepGCN, TrainedGCN, train_gcn, depth_curves, projection)
from interpkit.errors import ConfigError, ShapeError, NotFiniteError


@pytest.fixture(scope='module')
def g():
    return csbm(n=80, d=4, p_in=0.3, p_out=0.05, seed=5)

def test_operator_matches_numpy(g):
    n = g.num_nodes
    A = np.zeros((n, n)); A[g.edge_index[0].numpy(), g.edge_index[1].numpy()] = 1; A += np.eye(n)
    d = A.sum(1); ref = A / np.sqrt(d[:, None] * d[None, :])
    np.testing.assert_allclose(gcn_operator(g.edge_index, n).numpy(), ref, atol=1e-12)
    # one direction given, and an isolated last node: edge 0 -> 1 is made symmetric, node 2 keeps only its self-loop
    np.testing.assert_allclose(gcn_operator(torch.tensor([[0], [1]]), 3).numpy(), [[.5, .5, 0], [.5, .5, 0], [0, 0, 1]], atol=1e-12)

def test_numerical_rank_threshold():
    X = torch.diag(torch.tensor([10.0, 1.0, 0.05, 0.0], dtype=torch.float64))
    assert [numerical_rank(X, r) for r in (1e-6, 0.01, 0.2)] == [3, 2, 1]
    assert numerical_rank(torch.diag(torch.tensor([4.0, 2.0 ** -18], dtype=torch.float64)), 2.0 ** -20) == 1   # exactly at the threshold: not counted

def test_plain_converges_to_dominant_eigenvector(g):
    # |λ2| < 1 on this connected non-bipartite graph, so 200 layers leave a residue of |λ2|^200, far below the 1e-6 tolerance
    A = gcn_operator(g.edge_index, g.num_nodes)
    vals, vecs = np.linalg.eigh(A.numpy())
    v1 = vecs[:, -1]
    assert abs(vals[-2]) < 0.95 and vals[-1] == pytest.approx(1.0)
    X = linear_gnn(A, g.x, 200, 'plain')[-1].numpy()
    for j in range(X.shape[1]):
        c = X[:, j] / np.linalg.norm(X[:, j])
        assert abs(abs(c @ v1) - 1) < 1e-6

def test_batchnorm_keeps_rank_and_aligns_with_centred_topk(g):
    A = gcn_operator(g.edge_index, g.num_nodes); n, d = g.x.shape
    P = np.eye(n) - 1 / n
    w, V = np.linalg.eigh(P @ A.numpy() @ P); Uc = V[:, np.argsort(w)[::-1][:d]]
    X = linear_gnn(A, g.x, 40, 'batchnorm')[-1]
    Q = np.linalg.qr(Uc)[0]
    share = np.linalg.norm(Q.T @ X.numpy()) ** 2 / np.linalg.norm(X.numpy()) ** 2
    assert share > 0.99 and abs(eigenspace_energy(X, torch.tensor(Uc)) - share) < 1e-9
    assert feature_effective_rank(X) > 1.5 and numerical_rank(X) >= 2
    assert feature_effective_rank(linear_gnn(A, g.x, 40, 'plain')[-1]) < 1.05

def test_residual_stays_in_krylov_subspace(g):
    # with alpha and random W, X_t lies in span{A^j X0 W}: the columns of [X0, A X0, ..., A^t X0]
    A = gcn_operator(g.edge_index, g.num_nodes); X0 = g.x.double()
    t = 3; K = torch.cat([torch.linalg.matrix_power(A, j) @ X0 for j in range(t + 1)], 1)
    X = linear_gnn(A, X0, t, 'residual', alpha=0.3)[-1]
    assert eigenspace_energy(X, K) > 1 - 1e-9

def test_dirichlet_energy_brute_force(g):
    X = torch.randn(g.num_nodes, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ei = g.edge_index.tolist(); seen, e = set(), 0.0
    for i in range(g.num_nodes):
        for j in range(g.num_nodes):
            if i < j and any(a == i and b == j for a, b in zip(*ei)) and (i, j) not in seen:
                seen.add((i, j)); e += float(((X[i] - X[j]) ** 2).sum())
    assert dirichlet_energy(X, g.edge_index, normalise=False) == pytest.approx(e, rel=1e-9)

def test_ranks_closed_forms():
    U = torch.linalg.qr(torch.randn(10, 10, dtype=torch.float64))[0]
    s = torch.tensor([3., 1., 0., 0.], dtype=torch.float64)
    X = U[:, :4] @ torch.diag(s)
    p = np.array([.75, .25])
    assert feature_effective_rank(X) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert numerical_rank(X) == 2 and feature_effective_rank(torch.eye(5)) == pytest.approx(5)

def test_graphnormv2_equals_pyg_graphnorm_per_graph():
    torch.manual_seed(1)
    x, b = torch.randn(9, 4), torch.tensor([0, 0, 1, 1, 1, 1, 2, 2, 2])
    gn, gn2 = GraphNorm(4), GraphNormv2(4)
    with torch.no_grad():
        gn.mean_scale.uniform_(-1, 2); gn.weight.uniform_(.5, 2); gn.bias.normal_()
        gn2.tau[0] = gn.mean_scale; gn2.weight.copy_(gn.weight); gn2.bias.copy_(gn.bias)
        torch.testing.assert_close(gn2(x, b), gn(x, b), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gn2(x, b, batch_size=3), gn(x, b, batch_size=3), atol=1e-5, rtol=1e-5)

def test_graphnormv2_by_hand_and_limits():
    torch.manual_seed(2)
    x, b = torch.randn(5, 3), torch.tensor([0, 0, 1, 1, 1])
    m = GraphNormv2(3)
    with torch.no_grad():
        out = m(x, b)
        for idx in ([0, 1], [2, 3, 4]):   # tau = 1: mean-centring, then divide by the per-graph RMS
            xc = x[idx] - x[idx].mean(0)
            torch.testing.assert_close(out[idx], xc / (xc.pow(2).mean(0) + 1e-5).sqrt(), atol=1e-6, rtol=1e-5)
        m.tau.zero_()
        torch.testing.assert_close(m.centre(x, b), x)
        out = m(x, b)
        for idx in ([0, 1], [2, 3, 4]):
            torch.testing.assert_close(out[idx], x[idx] / (x[idx].pow(2).mean(0) + 1e-5).sqrt(), atol=1e-6, rtol=1e-5)

def test_centring_basis_batch_matches_eigh_per_graph():
    g1, g2 = csbm(n=12, p_in=0.6, p_out=0.3, seed=1), csbm(n=9, p_in=0.7, p_out=0.4, seed=2)
    ei = torch.cat([g1.edge_index, g2.edge_index + 12], 1); b = torch.tensor([0] * 12 + [1] * 9)
    for k in (1, 2):
        U = centring_basis(ei, 21, b, k=k)
        for sl, gg in ((slice(0, 12), g1), (slice(12, 21), g2)):
            w, V = np.linalg.eigh(gcn_operator(gg.edge_index, gg.num_nodes).numpy())
            for j in range(k):
                assert abs(abs(float(U[sl, j].double() @ torch.tensor(V[:, -1 - j]))) - 1) < 1e-5
    # the batched layer equals the layer applied to each graph alone
    m, x = GraphNormv2(4, k=2), torch.randn(21, 4)
    with torch.no_grad():
        m.tau.uniform_(0, 1); U = centring_basis(ei, 21, b, k=2)
        full = m(x, b, basis=U)
        torch.testing.assert_close(full[:12], m(x[:12], basis=U[:12]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(full[12:], m(x[12:], basis=U[12:]), atol=1e-5, rtol=1e-5)

# ---------------------------------------------------------------- the linearised GNN and its diagnostics, against numpy

def ref_linear_gnn(A, X0, depth, variant, alpha=0.2, seed=0):
    "The linearised layers written again in numpy; the Gaussian weights are drawn in the same order (A X W first, then X0 W)."
    g, d = torch.Generator().manual_seed(seed), X0.shape[1]
    draw = lambda: (torch.randn(d, d, generator=g, dtype=torch.float64) / np.sqrt(d)).numpy()
    X, out = X0, [X0]
    for _ in range(depth):
        H = A @ X @ draw()
        if variant == 'residual': H = (1 - alpha) * H + alpha * (X0 @ draw())
        if variant in ('batchnorm', 'centre'): H = H - H.mean(0)
        if variant in ('batchnorm', 'rescale'): H = H / np.sqrt((H ** 2).mean(0))
        if variant in ('plain', 'residual', 'centre'): H = H / np.sqrt((H ** 2).sum())
        X = H; out.append(X)
    return out

def dense_operator(g):
    n = g.num_nodes
    A = np.zeros((n, n)); A[g.edge_index[0].numpy(), g.edge_index[1].numpy()] = 1; A = np.maximum(A, A.T); np.fill_diagonal(A, 1)
    d = A.sum(1); return A / np.sqrt(d[:, None] * d[None, :])

def ref_probe(X, y, frac=0.5, seed=0):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.linear_model import LogisticRegression
    order = np.random.default_rng(seed).permutation(len(y)); fit_on = np.zeros(len(y), bool); fit_on[order[:int(frac * len(y))]] = True
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(X[fit_on], y[fit_on])
    return float((clf.predict(X[~fit_on]) == y[~fit_on]).mean())

@pytest.mark.parametrize('variant, alpha', [(v, 0.3) for v in VARIANTS] + [('residual', 0.0), ('residual', 1.0)])
def test_linear_gnn_matches_numpy(g, variant, alpha):
    A = dense_operator(g)
    ref = ref_linear_gnn(A, g.x.double().numpy(), 6, variant, alpha=alpha, seed=4)
    out = linear_gnn(torch.tensor(A), g.x, 6, variant, alpha=alpha, seed=4)
    assert len(out) == 7 and all(o.dtype == torch.float64 for o in out)
    for o, r in zip(out, ref): np.testing.assert_allclose(o.numpy(), r, rtol=1e-9, atol=1e-12)
    if variant in ('plain', 'residual', 'centre'): assert np.linalg.norm(out[-1].numpy()) == pytest.approx(1)

def test_depth_curves_match_independent_diagnostics():
    g = csbm(n=45, d=3, p_in=0.35, p_out=0.1, seed=7)   # connected, with simple top eigenvalues (k = 2)
    depths, k = (0, 3, 9), 2
    dc = depth_curves(g, depths=depths, k=k, alpha=0.25, seed=2)
    assert list(dc.columns) == ['variant', 'depth', 'energy', 'rank', 'eff_rank', 'in_top1', 'in_topk', 'in_topk_centred', 'probe']
    A = dense_operator(g); n = g.num_nodes
    P = np.eye(n) - 1 / n
    top = lambda M, j: (lambda w, V: V[:, np.argsort(w)[::-1][:j]])(*np.linalg.eigh(M))
    U1, Uk, Uc = top(A, 1), top(A, k), top(P @ A @ P, k)
    edges = {(min(a, b), max(a, b)) for a, b in g.edge_index.T.tolist() if a != b}
    y = g.y.numpy()
    for v in VARIANTS:
        Xs = ref_linear_gnn(A, g.x.double().numpy(), max(depths), v, alpha=0.25, seed=2)
        for t in depths:
            X, row = Xs[t], dc[(dc.variant == v) & (dc.depth == t)].iloc[0]
            s = np.linalg.svd(X, compute_uv=False); p = s[s > 0] / s.sum()
            share = lambda U: np.linalg.norm(U.T @ X) ** 2 / np.linalg.norm(X) ** 2
            assert row.energy == pytest.approx(sum(((X[a] - X[b]) ** 2).sum() for a, b in edges) / (X ** 2).sum(), rel=1e-7)
            assert row['rank'] == (s > 1e-6 * s[0]).sum()
            assert row.eff_rank == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-7)
            assert (row.in_top1, row.in_topk, row.in_topk_centred) == pytest.approx((share(U1), share(Uk), share(Uc)), rel=1e-6, abs=1e-9)
            assert row.probe == ref_probe(X, y)

def test_eigenspace_energy_and_distance_closed_forms():
    # X = [cos t, sin t, 0, 0]: share cos^2 t in span(e1), sine of the angle |sin t| to it, and 0 to span(e1, e2)
    E = torch.eye(4, dtype=torch.float64)
    for t in (0.3, 1.1):
        X = (np.cos(t) * E[:, :1] + np.sin(t) * E[:, 1:2])
        assert eigenspace_energy(X, E[:, :1]) == pytest.approx(np.cos(t) ** 2, rel=1e-12)
        assert subspace_distance(X, E[:, :1]) == pytest.approx(abs(np.sin(t)), rel=1e-12)
        assert subspace_distance(X, E[:, :2] * 3) == pytest.approx(0, abs=1e-12)
    # two principal angles a < b: the distance is sin b (the spectral norm), not sqrt(sin^2 a + sin^2 b)
    E6, ta, tb = torch.eye(6, dtype=torch.float64), 0.2, 0.7
    U = torch.stack([np.cos(ta) * E6[:, 0] + np.sin(ta) * E6[:, 2], np.cos(tb) * E6[:, 1] + np.sin(tb) * E6[:, 3]], 1)
    X2 = E6[:, :2] @ torch.tensor([[3.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert subspace_distance(X2, U) == pytest.approx(np.sin(tb), rel=1e-10)
    assert subspace_distance(X2, U.float()) == pytest.approx(np.sin(tb), rel=1e-6)   # float32 U, float64 X
    assert eigenspace_energy(X2, U.float()) == pytest.approx((9 * np.cos(ta) ** 2 + np.cos(tb) ** 2) / 10, rel=1e-6)
    # top_eigvecs: a diagonal matrix with known order
    V = top_eigvecs(torch.diag(torch.tensor([0.5, 3.0, -4.0, 1.0])), 2)
    np.testing.assert_allclose(V.abs().numpy(), np.eye(4)[:, [1, 3]])

def test_probe_accuracy_against_sklearn_and_any_tensor(g):
    X = torch.randn(g.num_nodes, 3, generator=torch.Generator().manual_seed(1)) + g.y[:, None] * 0.7
    ref = ref_probe(X.double().numpy(), g.y.numpy(), 0.6, 3)
    assert 0.5 < ref < 1
    assert probe_accuracy(X, g.y, 0.6, 3) == ref
    assert probe_accuracy(X.double().numpy(), g.y.tolist(), 0.6, 3) == ref
    assert probe_accuracy(X.requires_grad_(), g.y, 0.6, 3) == ref   # a tensor that needs a gradient (before: .numpy() raised)
    Xb = X.detach().bfloat16()
    assert probe_accuracy(Xb, g.y, 0.6, 3) == ref_probe(Xb.double().numpy(), g.y.numpy(), 0.6, 3)

def test_projection_matches_numpy_svd(g):
    xy, sv = projection(g, 3, 'residual', seed=1)
    X = ref_linear_gnn(dense_operator(g), g.x.double().numpy(), 3, 'residual', seed=1)[-1]; X = X - X.mean(0)
    _, S, Vt = np.linalg.svd(X, full_matrices=False)
    np.testing.assert_allclose(xy.abs().numpy(), np.abs(X @ Vt[:2].T), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sv.numpy(), S / S[0], rtol=1e-5, atol=1e-7)

# ---------------------------------------------------------------- DeepGCN: no cached graph, mini-batches, a dense reference

def _basis(norm, data, k=1, batch=None):
    return centring_basis(data.edge_index, data.num_nodes, batch, k=k) if norm == 'graphv2' else None

def _randomise_norms(m):
    "Non-trivial parameters and running statistics, so that every normalisation does something."
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for nm in m.norms:
            for p in list(nm.parameters()) + [b for b in nm.buffers() if b.is_floating_point()]:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)

@pytest.mark.parametrize('norm', NORMS)
def test_deepgcn_uses_each_calls_graph(norm, untouched):
    # before: GCNConv(cached=True) reused the first graph's normalised adjacency (max |diff| 0.139 on the second graph,
    # IndexError on a smaller third one)
    g1, g2, g3 = csbm(n=40, d=8, seed=0), csbm(n=40, d=8, p_in=0.2, p_out=0.05, seed=1), csbm(n=25, d=8, seed=2)
    m = DeepGCN(8, 16, 3, depth=2, norm=norm).eval(); _randomise_norms(m)
    fresh2, fresh3 = copy.deepcopy(m), copy.deepcopy(m)
    with torch.no_grad():
        m(g1.x, g1.edge_index, basis=_basis(norm, g1))
        with untouched(m):
            torch.testing.assert_close(m(g2.x, g2.edge_index, basis=_basis(norm, g2)), fresh2(g2.x, g2.edge_index, basis=_basis(norm, g2)), rtol=0, atol=0)
            torch.testing.assert_close(m(g3.x, g3.edge_index, basis=_basis(norm, g3)), fresh3(g3.x, g3.edge_index, basis=_basis(norm, g3)), rtol=0, atol=0)

@pytest.mark.parametrize('norm', NORMS)
def test_deepgcn_minibatch_equals_each_graph_alone(norm):
    gs = [csbm(n=n, d=8, p_in=0.3, p_out=0.05, seed=s) for n, s in ((12, 0), (20, 1), (9, 2))]
    b = Batch.from_data_list(gs)
    m = DeepGCN(8, 16, 3, 3, norm, k=2, seed=5).eval(); _randomise_norms(m)
    with torch.no_grad():
        alone = torch.cat([m(g.x, g.edge_index, basis=_basis(norm, g, 2)) for g in gs])
        full = m(b.x, b.edge_index, b.batch, _basis(norm, b, 2, b.batch))
    torch.testing.assert_close(full, alone, atol=2e-5, rtol=1e-4)
    if norm in ('pair', 'graph', 'graphv2'):   # per-graph statistics: without the batch vector the answer differs
        with torch.no_grad(): assert (m(b.x, b.edge_index, None, _basis(norm, b, 2, b.batch)) - alone).abs().max() > 1e-3

def test_deepgcn_forward_equals_dense_gcn_by_hand(g):
    m = DeepGCN(4, 6, 3, depth=3, seed=2).eval()
    A = torch.tensor(dense_operator(g)).float()
    h = g.x @ m.inp.weight.T + m.inp.bias
    for conv in m.convs: h = torch.relu(A @ (h @ conv.lin.weight.T) + conv.bias)
    with torch.no_grad():
        torch.testing.assert_close(m(g.x, g.edge_index), h @ m.out.weight.T + m.out.bias, atol=1e-5, rtol=1e-5)
        m2 = DeepGCN(4, 6, 3, depth=3, seed=2)
        assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))   # same seed, same weights
        assert not torch.equal(m.inp.weight, DeepGCN(4, 6, 3, depth=3, seed=3).inp.weight)

def _norm_by_hand(norm, nm, h, basis):
    "Each normalisation of DeepGCN written out, one graph, eval mode."
    if norm == 'none': return h
    if norm == 'batch':
        bn = nm.module
        return (h - bn.running_mean) / (bn.running_var + bn.eps).sqrt() * bn.weight + bn.bias
    if norm == 'pair':
        c = h - h.mean(0)
        return c / (1e-5 + c.pow(2).sum(1).mean()).sqrt()
    if norm == 'graph':
        c = h - nm.mean_scale * h.mean(0)
        return nm.weight * c / (c.pow(2).mean(0) + 1e-5).sqrt() + nm.bias
    c = h - sum(basis[:, j:j + 1] * (nm.tau[j] * (basis[:, j] @ h)) for j in range(basis.shape[1]))   # graphv2
    return nm.weight * c / (c.pow(2).mean(0) + nm.eps).sqrt() + nm.bias

@pytest.mark.parametrize('norm', NORMS)
def test_deepgcn_each_norm_equals_the_formula_by_hand(g, norm):
    m = DeepGCN(4, 6, 3, depth=3, norm=norm, k=2, seed=1).eval(); _randomise_norms(m)
    A = torch.tensor(dense_operator(g)).float()
    U = centring_basis(g.edge_index, g.num_nodes, k=2)
    with torch.no_grad():
        h = g.x @ m.inp.weight.T + m.inp.bias
        for conv, nm in zip(m.convs, m.norms): h = torch.relu(_norm_by_hand(norm, nm, A @ (h @ conv.lin.weight.T) + conv.bias, U))
        torch.testing.assert_close(m(g.x, g.edge_index, basis=U if norm == 'graphv2' else None), h @ m.out.weight.T + m.out.bias, atol=1e-4, rtol=1e-4)

# ---------------------------------------------------------------- train_gcn

def test_train_gcn_result_recounted_by_hand(g):
    x0, e0 = g.x.clone(), g.edge_index.clone()
    r = train_gcn(g, 2, 'none', steps=15, hidden=8, seed=3)
    assert isinstance(r, TrainedGCN) and torch.equal(g.x, x0) and torch.equal(g.edge_index, e0)
    assert not any(mod.training for mod in r.model.modules())
    n = g.num_nodes
    te = r.test_nodes; tr = torch.tensor(sorted(set(range(n)) - set(te.tolist())))
    assert len(te) == n - n // 2 and len(tr) == n // 2
    with torch.no_grad(): pred = r.model(g.x, g.edge_index).argmax(-1)
    assert r.test_accuracy == pytest.approx((pred[te] == g.y[te]).double().mean().item(), abs=1e-7)
    assert r.train_accuracy == pytest.approx((pred[tr] == g.y[tr]).double().mean().item(), abs=1e-7)
    # the first logged loss is the cross-entropy of the untrained model on the training nodes
    fresh = DeepGCN(4, 8, int(g.y.max()) + 1, 2, seed=3)
    with torch.no_grad(): first = F.cross_entropy(fresh(g.x, g.edge_index)[tr], g.y[tr]).item()
    assert r.history.loss.iloc[0] == pytest.approx(first, rel=1e-5)
    assert len(r.history) == 15 and r.history.loss.iloc[-1] < r.history.loss.iloc[0]
    assert r.train_accuracy > 0.6
    rep = repr(r)
    assert rep.startswith('TrainedGCN(') and 'tensor([' not in rep and 'test_accuracy=' in rep
    r2 = train_gcn(g, 2, 'none', steps=15, hidden=8, seed=3)
    assert (r2.test_accuracy, r2.train_accuracy) == (r.test_accuracy, r.train_accuracy) and torch.equal(r2.test_nodes, te)

def test_train_gcn_graphv2_uses_the_basis_and_takes_float64_features(g):
    g64 = g.clone(); g64.x = g.x.double()   # before: float64 features reached the float32 model (a dtype error)
    r = train_gcn(g64, 2, 'graphv2', steps=5, hidden=8, seed=1, k=2)
    tr = torch.tensor(sorted(set(range(g.num_nodes)) - set(r.test_nodes.tolist())))
    fresh = DeepGCN(4, 8, int(g.y.max()) + 1, 2, 'graphv2', k=2, seed=1)
    with torch.no_grad():
        first = F.cross_entropy(fresh(g.x, g.edge_index, basis=centring_basis(g.edge_index, g.num_nodes, k=2))[tr], g.y[tr]).item()
        without = F.cross_entropy(fresh(g.x, g.edge_index)[tr], g.y[tr]).item()
    assert r.history.loss.iloc[0] == pytest.approx(first, rel=1e-5) and abs(first - without) > 1e-4
    assert r.model.inp.weight.dtype == torch.float32
    with torch.no_grad(): pred = r.model(g.x, g.edge_index, basis=centring_basis(g.edge_index, g.num_nodes, k=2)).argmax(-1)
    assert r.test_accuracy == pytest.approx((pred[r.test_nodes] == g.y[r.test_nodes]).double().mean().item(), abs=1e-7)
    assert r.train_accuracy == pytest.approx((pred[tr] == g.y[tr]).double().mean().item(), abs=1e-7)
    assert train_gcn(g, 2, 'graphv2', steps=5, hidden=8, seed=1, k=2).test_accuracy == r.test_accuracy

def test_train_gcn_equals_a_training_loop_by_hand(g):
    # AdamW (lr, weight decay 5e-4) with a cosine schedule, full batch, cross-entropy on the training nodes
    steps, lr = 6, 0.02
    r = train_gcn(g, 2, 'graph', steps=steps, hidden=8, lr=lr, seed=2)
    tr = torch.tensor(sorted(set(range(g.num_nodes)) - set(r.test_nodes.tolist())))
    m = DeepGCN(4, 8, int(g.y.max()) + 1, 2, 'graph', seed=2)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=5e-4)
    losses = []
    for step in range(steps):
        for group in opt.param_groups: group['lr'] = lr * 0.5 * (1 + np.cos(np.pi * step / steps))
        loss = F.cross_entropy(m(g.x, g.edge_index)[tr], g.y[tr])
        opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
    np.testing.assert_allclose(r.history.loss.to_numpy(), losses, rtol=1e-5)
    np.testing.assert_allclose(r.history.lr.to_numpy(), [lr * 0.5 * (1 + np.cos(np.pi * s / steps)) for s in range(steps)], rtol=1e-9)
    for (name, a), b in zip(r.model.named_parameters(), m.parameters()): torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)

def test_defaults_are_the_documented_experiment(g):
    # the notebook describes its demos with these numbers and calls the functions with their defaults (its trained sweep
    # passes steps and lr explicitly):
    # a call with the defaults must equal the call with the documented values written out
    small = csbm(n=24, d=2, p_in=0.4, p_out=0.1, seed=3)
    same_graph = lambda a, b: torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index) and torch.equal(a.y, b.y)
    assert same_graph(csbm(), csbm(300, 3, 0.05, 0.01, 16, 1.0, 0))
    pd.testing.assert_frame_equal(depth_curves(small), depth_curves(small, VARIANTS, (0, 1, 2, 4, 8, 16, 32, 64), None, 0.2, 0))
    A = gcn_operator(g.edge_index, g.num_nodes)
    assert torch.equal(linear_gnn(A, g.x, 3)[-1], linear_gnn(A, g.x, 3, 'plain', 0.2, 0)[-1])
    zero = linear_gnn(A, g.x, 0)
    assert len(zero) == 1 and torch.equal(zero[0], g.x.double())   # depth 0: the input only
    X = linear_gnn(A, g.x, 2, 'batchnorm')[-1]
    assert probe_accuracy(X, g.y) == probe_accuracy(X, g.y, 0.5, 0)
    assert dirichlet_energy(X, g.edge_index) == dirichlet_energy(X, g.edge_index, True)
    for a, b in zip(projection(g, 3), projection(g, 3, 'plain', 0)): assert torch.equal(a, b)
    assert torch.equal(centring_basis(g.edge_index, g.num_nodes), centring_basis(g.edge_index, g.num_nodes, None, 1))
    for norm in ('none', 'graphv2'):
        a, b = DeepGCN(4, 6, 3, 2, norm).state_dict(), DeepGCN(4, 6, 3, 2, norm, 1, 0).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    r, r2 = train_gcn(small, 1), train_gcn(small, 1, 'none', 100, 32, 0.01, 0, 1, False)
    assert len(r.history) == 100 and torch.equal(r.test_nodes, r2.test_nodes)
    np.testing.assert_array_equal(r.history.loss.to_numpy(), r2.history.loss.to_numpy())
    assert all(torch.equal(p, q) for p, q in zip(r.model.parameters(), r2.model.parameters()))
    v, v2 = train_gcn(small, 1, 'graphv2', steps=3), train_gcn(small, 1, 'graphv2', steps=3, k=1)
    np.testing.assert_array_equal(v.history.loss.to_numpy(), v2.history.loss.to_numpy())

def test_isolated_last_node_and_bfloat16_in_deepgcn():
    # the highest node id has no edge: it keeps its self-loop (num_nodes comes from x, not from edge_index)
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]); x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    m = DeepGCN(3, 5, 2, depth=2, seed=4).eval()
    A = gcn_operator(ei, 4).float()
    h = x @ m.inp.weight.T + m.inp.bias
    for conv in m.convs: h = torch.relu(A @ (h @ conv.lin.weight.T) + conv.bias)
    with torch.no_grad():
        torch.testing.assert_close(m(x, ei), h @ m.out.weight.T + m.out.bias, atol=1e-5, rtol=1e-5)
        mb = copy.deepcopy(m).bfloat16()
        out = mb(x.bfloat16(), ei)
    assert out.dtype == torch.bfloat16   # the normalised edge weights are made in the model's dtype
    torch.testing.assert_close(out.float(), m(x, ei).detach(), atol=0.05, rtol=0.05)

# ---------------------------------------------------------------- devices (run where a GPU is present; the smoke script covers the rest)

@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU')
def test_on_gpu_same_numbers_as_cpu(g):
    dev = torch.device('cuda')
    gd = g.clone().to(dev)
    A = gcn_operator(g.edge_index, g.num_nodes)
    Ad = gcn_operator(gd.edge_index, g.num_nodes)
    assert Ad.device.type == 'cuda'
    torch.testing.assert_close(linear_gnn(Ad, gd.x, 5, 'residual')[-1].cpu(), linear_gnn(A, g.x, 5, 'residual')[-1])
    X = linear_gnn(Ad, gd.x, 3, 'batchnorm')[-1]
    assert probe_accuracy(X, gd.y) == probe_accuracy(X.cpu(), g.y)
    assert eigenspace_energy(X, top_eigvecs(A, 2)) == pytest.approx(eigenspace_energy(X.cpu(), top_eigvecs(A, 2)), rel=1e-9)
    assert dirichlet_energy(X, g.edge_index) == pytest.approx(dirichlet_energy(X.cpu(), g.edge_index), rel=1e-9)
    cpu, gpu = depth_curves(g, depths=(0, 2), k=2), depth_curves(gd, depths=(0, 2), k=2)
    assert np.allclose(cpu.drop(columns='variant').to_numpy(float), gpu.drop(columns='variant').to_numpy(float), rtol=1e-6, atol=1e-9)
    b = torch.tensor([0] * 40 + [1] * 40)
    for k in (1, 2):
        U = centring_basis(gd.edge_index, g.num_nodes, b, k=k)
        assert U.device.type == 'cuda'
        torch.testing.assert_close(U.cpu(), centring_basis(g.edge_index, g.num_nodes, b, k=k), atol=1e-5, rtol=1e-4)
    r = train_gcn(gd, 2, 'graphv2', steps=5, hidden=8)
    assert next(r.model.parameters()).device.type == 'cuda' and 0 <= r.test_accuracy <= 1

def test_bad_input():
    with pytest.raises(NotFiniteError, match='all zeros'): dirichlet_energy(torch.zeros(3, 2), torch.tensor([[0], [1]]))
    with pytest.raises(ConfigError, match='train_frac'): probe_accuracy(torch.ones(4, 1), [0, 1, 0, 1], train_frac=1.0)
    with pytest.raises(ConfigError, match='train_frac'): probe_accuracy(torch.ones(4, 1), [0, 1, 0, 1], train_frac=0.1)
    with pytest.raises(ShapeError, match='labels'): probe_accuracy(torch.ones(4, 1), [0, 1])
    with pytest.raises(ConfigError, match='depth'): linear_gnn(torch.eye(3), torch.ones(3, 2), -1)
    with pytest.raises(ShapeError, match=r'\(n, n\)'): linear_gnn(torch.eye(3), torch.ones(4, 2), 2)
    with pytest.raises(ShapeError, match=r'\(n, n\)'): linear_gnn(torch.eye(3), torch.ones(3), 2)
    for a in (-0.1, 1.5):
        with pytest.raises(ConfigError, match='alpha'): linear_gnn(torch.eye(3), torch.ones(3, 2), 2, 'residual', alpha=a)
    with pytest.raises(ShapeError, match='rows'): eigenspace_energy(torch.ones(3, 1), torch.ones(4, 1))
    with pytest.raises(ShapeError, match=r'\(2, E\)'): gcn_operator(torch.zeros(3, 4, dtype=torch.long), 4)
    with pytest.raises(ShapeError, match='num_nodes'): centring_basis(torch.tensor([[0], [9]]), 3)
    with pytest.raises(ConfigError, match='variant'): linear_gnn(torch.eye(3), torch.ones(3, 2), 2, 'layernorm')
    with pytest.raises(ConfigError, match='norm'): DeepGCN(4, 4, 2, 2, 'groupnorm')
    with pytest.raises(ShapeError, match='batch'): GraphNormv2(3)(torch.randn(4, 3), torch.tensor([0, 1]))
    with pytest.raises(ShapeError, match=r'\(N, 3\)'): GraphNormv2(3)(torch.randn(4, 5))
    with pytest.raises(ConfigError): GraphNormv2(3, k=0)

# ---------------------------------------------------------------- gaps found by mutation testing

def test_subspace_distance_uses_only_the_singular_directions_x_has():
    # X has one column, U two: X's left singular space is span(x) alone, inside span(U), so the distance is 0
    # (a full SVD would add an arbitrary direction orthogonal to x)
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 1, generator=gen, dtype=torch.float64), torch.randn(7, 1, generator=gen, dtype=torch.float64)
    assert subspace_distance(x, torch.cat([x, w], 1)) == pytest.approx(0, abs=1e-12)
    assert subspace_distance(x, torch.cat([w, w + 1], 1)) > 0.1

def _signed_eigvecs(ei, n, k):
    "Top-k eigenvectors of the symmetrised GCN operator from numpy, each signed to sum to a non-negative number."
    A = np.zeros((n, n)); A[ei[0].numpy(), ei[1].numpy()] = 1; A = np.maximum(A, A.T); np.fill_diagonal(A, 1)
    d = A.sum(1); w, V = np.linalg.eigh(A / np.sqrt(d[:, None] * d[None, :]))
    V = V[:, np.argsort(w)[::-1][:k]]
    return V * np.where(V.sum(0) < 0, -1.0, 1.0)

def test_centring_basis_signs_norms_and_one_directional_edges():
    # the documented convention: per graph, orthonormal columns, each summing to >= 0 (checked on 3 graphs, k = 3)
    gs = [csbm(n=n, d=2, p_in=0.5, p_out=0.2, seed=s) for n, s in ((10, 0), (13, 4), (8, 6))]
    b = Batch.from_data_list(gs)
    U = centring_basis(b.edge_index, b.num_nodes, b.batch, k=3).double()
    for j, gg in enumerate(gs):
        Ub = U[b.batch == j].numpy()
        np.testing.assert_allclose(Ub.T @ Ub, np.eye(3), atol=1e-5)
        assert (Ub.sum(0) >= -1e-6).all()
        np.testing.assert_allclose(Ub, _signed_eigvecs(gg.edge_index, gg.num_nodes, 3), atol=1e-5)
    # edges given in one direction only are made symmetric, as gcn_operator does, in the k = 1 closed form and for k > 1
    ei = torch.tensor([[0, 0, 0, 1, 3], [1, 2, 3, 2, 4]])
    for k in (1, 2):
        np.testing.assert_allclose(centring_basis(ei, 5, k=k).double().numpy(), _signed_eigvecs(ei, 5, k), atol=1e-6)
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError, match='k='): centring_basis(ei, 5, k=bad)

def test_graphnormv2_one_channel_dtype_and_basis_checks():
    x, b = torch.tensor([[1.0], [2.0], [4.0], [-1.0], [3.0]]), torch.tensor([0, 0, 0, 1, 1])
    m = GraphNormv2(1)
    with torch.no_grad():
        out = m(x, b)
        for idx in ([0, 1, 2], [3, 4]):   # one channel: mean-centring, then the per-graph RMS
            xc = x[idx] - x[idx].mean(0)
            torch.testing.assert_close(out[idx], xc / (xc.pow(2).mean(0) + 1e-5).sqrt())
        # a float32 basis (what centring_basis returns) is cast to the layer's dtype: a bfloat16 layer stays bfloat16
        mb, xb = GraphNormv2(4, k=2).bfloat16(), torch.randn(5, 4).bfloat16()
        U = centring_basis(torch.tensor([[0, 1, 3], [1, 2, 4]]), 5, b, k=2)
        assert mb(xb, b, basis=U).dtype == torch.bfloat16 and mb.centre(xb, b, basis=U).dtype == torch.bfloat16
    for basis in (torch.ones(5), torch.ones(6, 1), torch.ones(4, 2), torch.ones(5, 3), torch.ones(5, 0)):
        with pytest.raises(ShapeError, match='basis has shape'): GraphNormv2(4, k=2)(torch.randn(5, 4), b, basis=basis)

@pytest.mark.filterwarnings('ignore:Sparse')
def test_deepgcn_takes_a_sparse_adjacency():
    from torch_geometric.utils import to_torch_csr_tensor
    g = csbm(n=30, d=4, p_in=0.3, p_out=0.1, seed=0)   # undirected, so the adjacency equals its transpose
    m = DeepGCN(4, 6, 3, 2, 'graph').eval(); _randomise_norms(m)
    with torch.no_grad():
        torch.testing.assert_close(m(g.x, to_torch_csr_tensor(g.edge_index, size=(30, 30))), m(g.x, g.edge_index), atol=1e-5, rtol=1e-5)
