"""Tests of interpkit.papers.graphnorm against independent references: eigenvectors from numpy, brute-force Dirichlet
energy, closed-form ranks, PyG's own GraphNorm, per-graph statistics by hand, and bad input."""
import numpy as np, pytest, torch
from torch_geometric.nn import GraphNorm
from interpkit.papers.graphnorm import (csbm, karate, gcn_operator, linear_gnn, dirichlet_energy, effective_rank, numerical_rank,
                                        eigenspace_energy, top_eigvecs, centring_basis, GraphNormv2, DeepGCN, train_gcn, depth_curves)
from interpkit.errors import ConfigError, ShapeError


@pytest.fixture(scope='module')
def g():
    return csbm(n=80, d=4, p_in=0.3, p_out=0.05, seed=5)

def test_operator_matches_numpy(g):
    n = g.num_nodes
    A = np.zeros((n, n)); A[g.edge_index[0].numpy(), g.edge_index[1].numpy()] = 1; A += np.eye(n)
    d = A.sum(1); ref = A / np.sqrt(d[:, None] * d[None, :])
    np.testing.assert_allclose(gcn_operator(g.edge_index, n).numpy(), ref, atol=1e-12)

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
    assert effective_rank(X) > 1.5 and numerical_rank(X) >= 2
    assert effective_rank(linear_gnn(A, g.x, 40, 'plain')[-1]) < 1.05

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
    assert effective_rank(X) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)
    assert numerical_rank(X) == 2 and effective_rank(torch.eye(5)) == pytest.approx(5)

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

def test_method_does_not_change_inputs_and_short_training_runs(g):
    x0, e0 = g.x.clone(), g.edge_index.clone()
    depth_curves(g, variants=('plain', 'batchnorm'), depths=(0, 4))
    r = train_gcn(g, 4, 'graphv2', steps=20)
    assert torch.equal(g.x, x0) and torch.equal(g.edge_index, e0)
    assert 0 <= r['test'] <= 1 and r['train'] > 0.5

def test_bad_input():
    with pytest.raises(ShapeError, match=r'\(2, E\)'): gcn_operator(torch.zeros(3, 4, dtype=torch.long), 4)
    with pytest.raises(ShapeError, match='num_nodes'): centring_basis(torch.tensor([[0], [9]]), 3)
    with pytest.raises(ConfigError, match='variant'): linear_gnn(torch.eye(3), torch.ones(3, 2), 2, 'layernorm')
    with pytest.raises(ConfigError, match='norm'): DeepGCN(4, 4, 2, 2, 'groupnorm')
    with pytest.raises(ShapeError, match='batch'): GraphNormv2(3)(torch.randn(4, 3), torch.tensor([0, 1]))
    with pytest.raises(ShapeError, match=r'\(N, 3\)'): GraphNormv2(3)(torch.randn(4, 5))
    with pytest.raises(ConfigError): GraphNormv2(3, k=0)
