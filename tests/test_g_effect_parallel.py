"""Data-parallel G-effects: `g_effect` (exact means and the official moving average) and `instance_g_effects` run by two
processes under `torchrun` (gloo) against the same calls in this one process; each process must have run its share of
the rows only (counted by a forward pre-hook), so the agreement is not by construction."""
import json, textwrap
import pandas as pd, pytest, torch
from interpkit.parallel import launch

SETUP = textwrap.dedent('''
    import torch
    from interpkit.models import encode_queries, tiny_lm
    from interpkit.demos.g_effect import author_qa, qa_tokenizer
    from interpkit.papers.g_effect import g_effect, instance_g_effects, objective
    torch.set_num_threads(1)
    QA = author_qa(n_authors=10, forget_frac=0.2, seed=0)
    TOK = qa_tokenizer(QA)
    FORGET, RETAIN = (encode_queries(TOK, *QA.pairs(ix)) for ix in (QA.forget[:6], QA.retain[::7][:5]))
    MODEL = tiny_lm('llama', n_layers=2, d_model=32, n_heads=4, vocab_size=TOK.vocab_size, seed=0).double()
    ROWS = [0]
    MODEL.register_forward_pre_hook(lambda mod, args, kw: ROWS.__setitem__(0, ROWS[0] + kw['input_ids'].shape[0]), with_kwargs=True)

    def results():
        "Each call's G-effects, and the rows its forwards saw."
        out = {}
        for name, call in (('npo+gd', lambda: g_effect(MODEL, objective('npo', regularizer='gd'), FORGET, RETAIN, batch_size=1)),
                           ('ga smoothed', lambda: g_effect(MODEL, 'ga', FORGET, RETAIN, batch_size=2, smoothing=0.6)),
                           ('instance npo', lambda: instance_g_effects(MODEL, 'npo', FORGET, RETAIN, batch_size=2))):
            ROWS[0] = 0
            r = call()
            out[name] = dict(rows=ROWS[0], values=[r.unlearning, r.retention, r.loss] + r.groups.to_numpy().ravel().tolist() if hasattr(r, 'groups')
                             else r.reset_index().to_numpy().ravel().tolist())
        return out
''')

SCRIPT = SETUP + textwrap.dedent('''
    import json, sys, torch.distributed as dist
    dist.init_process_group('gloo')
    out = results()
    json.dump(out, open(f'{sys.argv[1]}/{dist.get_rank()}.json', 'w'))
    dist.destroy_process_group()
''')

def test_two_processes_match_one(tmp_path):
    (tmp_path/'ge.py').write_text(SCRIPT)
    launch(tmp_path/'ge.py', tmp_path)
    ns = {}; exec(SETUP, ns)
    one = ns['results']()
    r0, r1 = (json.loads((tmp_path/f'{i}.json').read_text()) for i in (0, 1))
    for name, want in one.items():
        w = torch.tensor(want['values'], dtype=torch.float64)
        for r in (r0, r1):
            torch.testing.assert_close(torch.tensor(r[name]['values'], dtype=torch.float64), w, rtol=1e-9, atol=1e-12 * float(w.abs().max()), msg=name)
        assert r0[name]['rows'] + r1[name]['rows'] == want['rows'], name
    # each process did its share: forget 6 rows and retain 5 in batches of 1: NPO's term and the reference 3 + 3, the forget risk 3, the retain risk 2 or 3,
    # GD's retain term 2 or 3 (the reference model is the model itself, so its forwards count too)
    assert (r0['npo+gd']['rows'], r1['npo+gd']['rows'], one['npo+gd']['rows']) == (6 + 3 + 2 + 2, 6 + 3 + 3 + 3, 12 + 6 + 5 + 5)
    # batches of 2: forget 3 batches (rank 0 one, rank 1 two), retain 3 batches (5 rows: 2 | 2 + 1); the weights of the moving average stay global
    assert (r0['ga smoothed']['rows'], r1['ga smoothed']['rows']) == (2 + 2 + 2, 4 + 4 + 3)
    # instance-wise: both risks' gradients split by batches, the 6 rows' objectives 3 + 3 (NPO runs the reference too)
    assert r0['instance npo']['rows'] < one['instance npo']['rows'] and r1['instance npo']['rows'] < one['instance npo']['rows']
