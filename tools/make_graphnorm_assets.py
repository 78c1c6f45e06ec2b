"""Make the result tables of paper 3 (GraphNormv2): `python tools/make_graphnorm_assets.py`.

Runs `interpkit.demos.graphnorm.graph_sweep` (fixed seeds, one thread) twice and ships the accuracies:
- `graphnorm_sweep`: graph classification on `structure_graphs(300)` (labels: the networkx generator), GCN and GIN,
  depths 2/4/8/16, normalisations none / BatchNorm / PairNorm / GraphNorm / GraphNormv2, seeds 0-2;
- `graphnorm_mean_signal`: claim (c), `mean_signal_graphs(200)` (the label only in each graph's mean), GCN of depth 2,
  none / BatchNorm / PairNorm / fixed mean-centring / GraphNorm / GraphNormv2, seeds 0-4.
Each asset is a (runs, 2) tensor of (train, test) accuracy plus the runs' (conv, norm, depth, seed) and the config in
its .json; `interpkit.demos.graphnorm.load_runs(name)` loads it as a DataFrame. Prints its runtime.
(The shipped tables were made when the fixed mean-centering was spelled 'centre' and `rank` was `k`: `load_runs` reads them in today's names.)
"""
import time
import torch
from interpkit.demos.graphnorm import NORMS, structure_graphs, mean_signal_graphs, graph_sweep
from interpkit.train import save_asset

SWEEP = dict(data=dict(n=300, seed=0), convs=('gcn', 'gin'), norms=NORMS, depths=(2, 4, 8, 16), seeds=(0, 1, 2),
             train=dict(steps=150, batch_size=32, hidden=32, lr=0.01, rank=1))
MEAN_SIGNAL = dict(data=dict(n=200, seed=0), convs=('gcn',), norms=('none', 'batch', 'pair', 'center', 'graph', 'graphv2'),
                   depths=(2,), seeds=(0, 1, 2, 3, 4), train=dict(steps=100, batch_size=32, hidden=16, lr=0.01, rank=1))

def make(name, graphs_fn, config, folder=None):
    "Run the sweep of `config` on `graphs_fn(**config['data'])`, save it as asset `name`; return (path, runs, seconds)."
    t0 = time.time()
    runs = graph_sweep(graphs_fn(**config['data']), config['convs'], config['norms'], config['depths'], config['seeds'], **config['train'])
    secs = time.time() - t0
    path = save_asset(name, {'accuracy': torch.tensor(runs[['train', 'test']].to_numpy(), dtype=torch.float32)},
                      dict(columns=['train', 'test'], runs=runs[['conv', 'norm', 'depth', 'seed']].values.tolist(), config=config,
                           graphs=graphs_fn.__name__, seconds=round(secs, 1), threads=torch.get_num_threads(),
                           recipe='interpkit.demos.graphnorm.graph_sweep'), folder=folder)
    return path, runs, secs

if __name__ == '__main__':
    torch.set_num_threads(1)   # one thread: the numbers (BatchNorm's especially) depend on the summation order
    t0 = time.time()
    for name, fn, cfg in (('graphnorm_mean_signal', mean_signal_graphs, MEAN_SIGNAL), ('graphnorm_sweep', structure_graphs, SWEEP)):
        path, runs, secs = make(name, fn, cfg)
        print(f"wrote {path} ({len(runs)} runs in {secs:.0f} s)", flush=True)
        print(runs.groupby(['conv', 'depth', 'norm'], sort=False).test.agg(['mean', 'std']).unstack('norm').round(3).to_string(), flush=True)
    print(f"total {time.time() - t0:.0f} s")
