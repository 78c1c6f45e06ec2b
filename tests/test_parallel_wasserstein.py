"""W1 neuron statistics under two gloo processes (`torchrun`): `collect` runs each process's rows of every batch (a spy on the model
counts them, so the test does not hold by construction) and hands `on_batch` every process's tokens, so `neuron_scores` (W1 needs
each neuron's whole sample) and `input_hessians` give in each process what one process gives; with padding, and a last batch of
one row where one process has none."""
import numpy as np, pandas as pd, torch
from interpkit.parallel import launch
from interpkit.papers.wasserstein import collect, input_hessians, neuron_scores

torch.set_num_threads(1)

SETUP = '''
import torch
from interpkit.models import tiny_lm
SITES = ['model.layers.0.mlp.up_proj', 'model.layers.1.mlp.down_proj']
def setup():
    m = tiny_lm('llama', n_layers=2, d_model=32, seed=3)
    ids = torch.randint(0, 128, (7, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids); mask[1, 8:] = 0; mask[4, 5:] = 0; mask[6, 9:] = 0
    return m, dict(input_ids=ids, attention_mask=mask)
'''

SCRIPT = '''
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from setup_w1 import setup, SITES
from interpkit.papers.wasserstein import collect, input_hessians, neuron_scores
dist.init_process_group('gloo')
m, data = setup()
rows = []
m.register_forward_pre_hook(lambda mod, args, kw: rows.append(kw['input_ids'].shape[0]), with_kwargs=True)   # the rows of every forward pass
scores = neuron_scores(m, data, batch_size=3)
n_scores = len(rows)
seen = []
collect(m, data, SITES, lambda outs: seen.append({s: o.clone() for s, o in outs.items()}), batch_size=3, inputs=True)
H = input_hessians(m, data, SITES, batch_size=3)
torch.save(dict(scores=scores, seen=seen, H=dict(H.by_site), n_tokens=H.n_tokens, rows=rows[:n_scores]), f'{sys.argv[1]}/{dist.get_rank()}.pt')
dist.destroy_process_group()
'''

def test_two_processes_score_what_one_scores(tmp_path):
    (tmp_path/'setup_w1.py').write_text(SETUP); (tmp_path/'two.py').write_text(SCRIPT)
    launch(tmp_path/'two.py', tmp_path)
    ns = {}; exec(SETUP, ns)
    m, data = ns['setup']()
    one = neuron_scores(m, data, batch_size=3)
    seen = []
    collect(m, data, ns['SITES'], lambda outs: seen.append(outs), batch_size=3, inputs=True)
    H = input_hessians(m, data, ns['SITES'], batch_size=3)
    r0, r1 = [torch.load(tmp_path/f'{r}.pt', weights_only=False) for r in (0, 1)]
    assert (r0['rows'], r1['rows']) == ([1, 1], [2, 2, 1])   # batches of 3, 3, 1 rows: each process its contiguous share (none: no forward pass)
    for r in (r0, r1):
        pd.testing.assert_frame_equal(r['scores'][['site', 'neuron']], one[['site', 'neuron']])
        for c in ('w1', 'mean', 'std', 'kurtosis', 'weight_norm'):
            np.testing.assert_allclose(r['scores'][c], one[c], rtol=1e-4, atol=1e-6 * float(one[c].abs().max()))
        assert len(r['seen']) == len(seen) == 3
        for got, want in zip(r['seen'], seen):
            assert list(got) == list(want)
            for s in want: torch.testing.assert_close(got[s], want[s], atol=1e-6 * float(want[s].abs().max()), rtol=1e-5)
        assert r['n_tokens'] == H.n_tokens == int(data['attention_mask'].sum())
        for s in H: torch.testing.assert_close(r['H'][s], H[s], atol=1e-6 * float(H[s].abs().max()), rtol=1e-5)
