"""`stream_activations` under two gloo processes (`torchrun`): each process runs the forward pass on its own rows of every batch
(a spy on the model counts them, so the test does not hold by construction), and every process yields the chunks one process yields:
for a tensor cut into batches, for dicts with padding, and for a batch of one row, where one process has no rows."""
import torch
from interpkit.models import tiny_lm
from interpkit.parallel import launch
from interpkit.sae import stream_activations

torch.set_num_threads(1)

SETUP = '''
import torch
from interpkit.models import tiny_lm
def setup():
    m = tiny_lm('llama', n_layers=3, seed=1)
    ids = torch.randint(0, 128, (7, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids); mask[1, 6:] = 0; mask[4, 3:] = 0; mask[5, 5:] = 0
    dicts = [dict(input_ids=ids[:5], attention_mask=mask[:5]), dict(input_ids=ids[5:6], attention_mask=mask[5:6])]
    return m, ids, dicts
'''

SCRIPT = '''
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from setup_sae import setup
from interpkit.sae import stream_activations
dist.init_process_group('gloo')
m, ids, dicts = setup()
rows = []
m.register_forward_pre_hook(lambda mod, args, kw: rows.append(kw['input_ids'].shape[0]), with_kwargs=True)   # the rows of every forward pass
a = list(stream_activations(m, ids, 'resid_post(1)', batch_size=3, skip_first=2))
n_a = len(rows)
b = list(stream_activations(m, dicts, 'resid_post(2)'))
torch.save(dict(a=a, b=b, rows_a=rows[:n_a], rows_b=rows[n_a:]), f'{sys.argv[1]}/{dist.get_rank()}.pt')
dist.destroy_process_group()
'''

def test_two_processes_stream_what_one_streams(tmp_path):
    (tmp_path/'setup_sae.py').write_text(SETUP); (tmp_path/'two.py').write_text(SCRIPT)
    launch(tmp_path/'two.py', tmp_path)
    ns = {}; exec(SETUP, ns)
    m, ids, dicts = ns['setup']()
    one_a = list(stream_activations(m, ids, 'resid_post(1)', batch_size=3, skip_first=2))
    one_b = list(stream_activations(m, dicts, 'resid_post(2)'))
    r0, r1 = [torch.load(tmp_path/f'{r}.pt') for r in (0, 1)]
    # each process ran its contiguous share of each batch's rows: batches of 3, 3, 1 rows, then 5 and 1 (a share of none: no forward pass)
    assert (r0['rows_a'], r1['rows_a']) == ([1, 1], [2, 2, 1])
    assert (r0['rows_b'], r1['rows_b']) == ([2], [3, 1])
    for r in (r0, r1):
        for got, want in ((r['a'], one_a), (r['b'], one_b)):
            assert [tuple(c.shape) for c in got] == [tuple(c.shape) for c in want]
            for g, w in zip(got, want): torch.testing.assert_close(g, w, atol=1e-6 * float(w.abs().max()), rtol=1e-5)
    assert [tuple(c.shape) for c in one_b] == [(5 * 8 - 3 - 6, 64), (4, 64)]   # padding and the first position left out
