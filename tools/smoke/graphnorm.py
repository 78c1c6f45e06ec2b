"Smoke checks of interpkit.papers.graphnorm and its demo module interpkit.demos.graphnorm: the linearised GNN and its diagnostics, DeepGCN with every normalisation on graphs and mini-batches, train_gcn, and graph classification with GraphNormv2's per-graph basis."
import math
import torch
from torch_geometric.data import Batch
from _util import on, finite, untouched
from interpkit.papers.graphnorm import (gcn_operator, linear_gnn, dirichlet_energy, top_eigvecs, eigenspace_energy, subspace_distance, depth_curves,
                                        centering_basis, GraphNormv2, projection)
from interpkit.demos.graphnorm import (NORMS, CONVS, csbm, karate, DeepGCN, train_gcn, structure_graphs, mean_signal_graphs, GraphClassifier,
                                       graph_accuracy, train_graph_classifier, graph_sweep, sweep_table)
from interpkit.stats import effective_rank, linear_probe

NOT_SMOKED = {'TrainedGCN': 'made by train_gcn', 'TrainedGraphClassifier': 'made by train_graph_classifier',
              'mean_signal_bayes_accuracy': 'a closed form over graph sizes, on the CPU',
              'load_runs': 'loads a shipped table of accuracies: nothing device-specific'}

def _graph(device, dtype, n=30, seed=0):
    "A CSBM graph on `device`, its features in `dtype`."
    g = csbm(n=n, d=4, p_in=0.3, p_out=0.1, seed=seed).to(device)
    g.x = g.x.to(dtype)
    return g

def checks(device, dtype):
    def diagnostics():
        g = _graph(device, dtype)
        A = on(gcn_operator(g.edge_index, g.num_nodes), device, 'operator')
        X = on(linear_gnn(A, g.x, 4, 'batchnorm')[-1], device, 'representations')
        U = on(top_eigvecs(A, 2), device, 'eigenvectors')
        nums = [dirichlet_energy(X, g.edge_index), float(effective_rank(torch.linalg.svdvals(X.to(dtype).float()))), eigenspace_energy(X, U.cpu()),
                subspace_distance(X, U), linear_probe(X.to(dtype), g.y, test_frac=0.5).accuracy]
        assert all(math.isfinite(v) for v in nums) and 1 <= int(torch.linalg.matrix_rank(X, rtol=1e-6)) <= 4
        dc = depth_curves(g, variants=('plain', 'residual'), depths=(0, 2), rank=2)
        finite(torch.tensor(dc.drop(columns='variant').to_numpy(float)), 'depth_curves')
        xy, sv = projection(g, 2, 'residual')
        on(xy, device, 'projection'); on(sv, device, 'singular values')
        kc = karate().to(device)
        finite(torch.tensor(depth_curves(kc, variants=('plain',), depths=(0, 2), rank=2).probe.to_numpy()), 'karate curves')
        return f"energy {nums[0]:.3g}, effective rank {nums[1]:.3g}, probe {nums[4]:.2f}"

    def deep_gcn():
        g1, g2 = _graph(device, dtype, 30, 0), _graph(device, dtype, 17, 1)
        b = Batch.from_data_list([g1, g2])
        seen = []
        for norm in NORMS + ('center',):
            m = DeepGCN(4, 8, 3, 2, norm, rank=2).to(device=device, dtype=dtype).eval()
            basis = lambda d, batch=None: centering_basis(d.edge_index, d.num_nodes, batch, rank=2) if norm == 'graphv2' else None
            with untouched(m), torch.no_grad():
                on(m(g1.x, g1.edge_index, basis=basis(g1)), device, f'{norm} logits')
                out = on(m(b.x, b.edge_index, b.batch, basis(b, b.batch)), device, f'{norm} mini-batch logits')
                assert out.dtype == dtype and out.shape == (47, 3)
            seen.append(norm)
        U = on(centering_basis(b.edge_index, b.num_nodes, b.batch, rank=2), device, 'basis')
        gn = GraphNormv2(8, rank=2).to(device=device, dtype=dtype)
        h = torch.randn(47, 8, device=device, dtype=dtype)
        with untouched(gn), torch.no_grad(): on(gn(h, b.batch, basis=U), device, 'GraphNormv2')
        return ', '.join(seen)

    def train():
        g = _graph(device, dtype)
        r = train_gcn(g, 2, 'graphv2', steps=3, hidden=8, rank=2)
        assert next(r.model.parameters()).device.type == device.type and r.test_nodes.device.type == device.type
        finite(torch.tensor(r.history.loss.to_numpy()), 'loss')
        assert 0 <= r.train_accuracy <= 1 and 0 <= r.test_accuracy <= 1
        return f"loss {r.history.loss.iloc[0]:.3g} -> {r.history.loss.iloc[-1]:.3g}, test accuracy {r.test_accuracy:.2f}"

    def graph_classification():
        gs = [g.to(device) for g in structure_graphs(12, seed=0)]
        for g in gs: g.x = g.x.to(dtype)
        b = Batch.from_data_list(gs)
        cache = {}
        for conv in CONVS:
            E = on(centering_basis(b.edge_index, b.num_nodes, b.batch, rank=2, operator=conv, cache=cache), device, f'{conv} basis')
            for norm in NORMS + ('center',):
                m = GraphClassifier(b.num_features, 8, 3, 2, conv, norm, rank=2).to(device=device, dtype=dtype).eval()
                with untouched(m), torch.no_grad():
                    out = on(m(b.x, b.edge_index, b.batch, E), device, f'{conv} {norm} logits')
                    assert out.dtype == dtype and out.shape == (12, 3)
                    assert 0 <= graph_accuracy(m, gs, batch_size=5) <= 1
        r = train_graph_classifier(gs, 2, 'gin', 'graphv2', steps=3, batch_size=4, hidden=8)
        assert next(r.model.parameters()).device.type == device.type
        finite(torch.tensor(r.history.loss.to_numpy()), 'loss')
        ms = [g.to(device) for g in mean_signal_graphs(8, seed=0)]
        runs = graph_sweep(ms, ('gcn',), ('center', 'graphv2'), (1,), (0, 1), steps=2, batch_size=4, hidden=4)
        t = sweep_table(runs)
        return f"{len(cache)} cached bases, loss {r.history.loss.iloc[0]:.3g} -> {r.history.loss.iloc[-1]:.3g}, sweep {t.iloc[0].tolist()}"

    return [('diagnostics', diagnostics), ('deep_gcn', deep_gcn), ('train', train), ('graph_classification', graph_classification)]
