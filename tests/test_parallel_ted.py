"""TED under `torch.distributed` (issue 52): `operational_embeddings` and `output_similarity` run by two gloo processes on the
same full `EditOutputs` give what one process gives (up to the order of float32 sums), and each process ran only its share:
its (phrase, query) pairs, counted as the rows of the model's forward passes; its queries, counted as the texts the encoder
embedded. The one-process results are computed here, in this process, without a process group."""
import json
import pytest, torch
from interpkit.models import tiny_lm, tiny_tokenizer
from interpkit.parallel import launch
from interpkit.papers.ted import EditOutputs, operational_embeddings, output_similarity

torch.set_num_threads(1)

SETUP = '''
import torch
from interpkit.models import tiny_lm
from interpkit.papers.ted import EditOutputs
def words(g, n): return ' '.join(f'w{int(i)}' for i in torch.randint(0, 120, (n,), generator=g))
def setup():
    "A tiny Llama and 5 queries edited for 3 phrases (one edit empty), of several lengths, in words the tiny tokenizer knows."
    g = torch.Generator().manual_seed(0)
    out = {w: [words(g, 1 + (i + j) % 3) for j in range(5)] for i, w in enumerate(('w1', 'w2', 'w3'))}
    out['w2'][3] = ''   # dropped from its phrase's mean
    return tiny_lm('llama', n_layers=2, seed=1), EditOutputs([words(g, 1 + j) for j in range(5)], [words(g, 2) for _ in range(5)], [words(g, 2) for _ in range(5)], out)
'''

SCRIPT = '''
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import interpkit.papers.ted as ted
from interpkit.models import tiny_tokenizer, embed
from setup_ted import setup
torch.set_num_threads(1)
dist.init_process_group('gloo')
m, data = setup()
rows = []
m.register_forward_pre_hook(lambda mod, a, kw: rows.append(kw['input_ids'].shape[0]), with_kwargs=True)
e = ted.operational_embeddings(m, data, tiny_tokenizer(), batch_size=2)
texts = []
ted.embed = lambda model, t, *a, **kw: (texts.extend(t), embed(model, t, *a, **kw))[1]
sim = ted.output_similarity(None, data)
json.dump(dict(vectors=e.vectors.tolist(), counts=e.counts, rows=rows, sim=sim.to_dict(orient='list'), texts=texts), open(f'{sys.argv[1]}/{dist.get_rank()}.json', 'w'))
dist.destroy_process_group()
'''

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('ted')
    (tmp/'setup_ted.py').write_text(SETUP); (tmp/'two.py').write_text(SCRIPT)
    launch(tmp/'two.py', tmp)
    import sys
    sys.path.insert(0, str(tmp))
    try: from setup_ted import setup
    finally: sys.path.remove(str(tmp))
    return [json.loads((tmp/f'{r}.json').read_text()) for r in (0, 1)], setup()

def test_operational_embeddings_split_over_pairs(runs):
    (r0, r1), (m, data) = runs
    want = operational_embeddings(m, data, tiny_tokenizer(), batch_size=2)
    for r in (r0, r1):
        torch.testing.assert_close(torch.tensor(r['vectors']), want.vectors, atol=1e-6 * float(want.vectors.abs().max()), rtol=1e-5)   # float32 sums in another order
        assert r['counts'] == want.counts == [5, 4, 5]
    # 14 (phrase, query) pairs with a non-empty edit: 7 each, in forward passes of at most 2 rows (one process: all 14)
    assert (r0['rows'], r1['rows']) == ([2, 2, 2, 1], [2, 2, 2, 1])

def test_output_similarity_split_over_queries(runs):
    (r0, r1), (m, data) = runs
    want = output_similarity(None, data)
    for r in (r0, r1):
        assert list(zip(r['sim']['w1'], r['sim']['w2'])) == list(zip(want.w1, want.w2))
        torch.testing.assert_close(torch.tensor(r['sim']['similarity'], dtype=torch.float64), torch.tensor(want.similarity.to_numpy()), atol=1e-6, rtol=1e-5)
    # 5 queries: 2 and 3 per process, their edits for each of the 3 phrases
    assert sorted(r0['texts']) == sorted(sum((data.of(w)[:2] for w in data.phrases), []))
    assert sorted(r1['texts']) == sorted(sum((data.of(w)[2:] for w in data.phrases), []))
