"""CNL under two gloo processes (`torchrun`): `neuron_attributions` (activation x gradient over all positions and at the last one,
integrated gradients) and `answer_scores` run each process's share of the samples (a spy on the model counts the rows of its forward
passes, so the test does not hold by construction) and gather the per-sample results, so each process returns what one returns."""
import numpy as np, pandas as pd, torch
from interpkit.parallel import launch
from interpkit.papers.cnl import answer_scores, neuron_attributions

torch.set_num_threads(1)

SETUP = '''
import torch
from interpkit.models import tiny_lm, tiny_tokenizer
def setup():
    g = torch.Generator().manual_seed(0)
    w = lambda k: ' '.join(f'w{int(i)}' for i in torch.randint(0, 120, (k,), generator=g))
    data = [w(2 + i % 3) for i in range(5)], [' ' + w(1 + i % 2) for i in range(5)]
    return tiny_lm('llama', n_layers=2, d_model=32, seed=4), tiny_tokenizer(), data
'''

SCRIPT = '''
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from setup_cnl import setup
from interpkit.papers.cnl import answer_scores, neuron_attributions
dist.init_process_group('gloo')
m, tok, data = setup()
rows = []
m.register_forward_pre_hook(lambda mod, args, kw: rows.append(kw['input_ids'].shape[0]), with_kwargs=True)   # the rows of every forward pass
gxa = neuron_attributions(m, tok, data, batch_size=2)
n_gxa = len(rows)
out = dict(gxa=gxa, last=neuron_attributions(m, tok, data, positions='last', batch_size=2), ig=neuron_attributions(m, tok, data, method='ig', n_steps=4, batch_size=2),
           answers=answer_scores(m, tok, data, batch_size=2), rows=rows[:n_gxa])
torch.save(out, f'{sys.argv[1]}/{dist.get_rank()}.pt')
dist.destroy_process_group()
'''

def test_two_processes_attribute_what_one_attributes(tmp_path):
    (tmp_path/'setup_cnl.py').write_text(SETUP); (tmp_path/'two.py').write_text(SCRIPT)
    launch(tmp_path/'two.py', tmp_path)
    ns = {}; exec(SETUP, ns)
    m, tok, data = ns['setup']()
    one = dict(gxa=neuron_attributions(m, tok, data, batch_size=2), last=neuron_attributions(m, tok, data, positions='last', batch_size=2),
               ig=neuron_attributions(m, tok, data, method='ig', n_steps=4, batch_size=2))
    answers = answer_scores(m, tok, data, batch_size=2)
    r0, r1 = [torch.load(tmp_path/f'{r}.pt', weights_only=False) for r in (0, 1)]
    assert (r0['rows'], r1['rows']) == ([2], [2, 1])   # 5 samples: the first process samples 0-1, the second 2-4, in batches of 2
    for r in (r0, r1):
        for k, want in one.items():
            got = r[k]
            assert (got.layers, got.method, got.positions) == (want.layers, want.method, want.positions) and got.scores.shape == want.scores.shape == (5, 2, 128)
            torch.testing.assert_close(got.scores, want.scores, atol=1e-5 * float(want.scores.abs().max()), rtol=1e-4)
            torch.testing.assert_close(got.logprob, want.logprob, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(r['answers'].logprob, answers.logprob, rtol=1e-5)
        assert (r['answers'].correct == answers.correct).all()
