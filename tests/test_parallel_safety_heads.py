"""The safety-head sweeps under `torch.distributed` (issue 52): `ships`, `sahara` and `ablation_outcomes` run by two gloo processes
on the same full data give what one process gives, and each process ran only its share of the sweep: its heads (counted as the
model's forward passes), its candidates (the forward passes of each greedy step), its generations (counted as `chat_replies` calls).
The one-process results are computed here, in this process, without a process group."""
import json
import pytest, torch
from interpkit.models import tiny_lm, tiny_tokenizer
from interpkit.parallel import launch
from interpkit.papers.safety_heads import ablation_outcomes, sahara, ships

torch.set_num_threads(1)

SETUP = '''
import torch
from interpkit.models import tiny_lm, tiny_tokenizer
def setup():
    "The tiny model, its tokenizer, a left-padded batch of 3 queries, and harmful / harmless requests."
    m = tiny_lm('llama', n_layers=2, n_heads=4, seed=0)
    b = dict(input_ids=torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(0)), attention_mask=torch.ones(3, 7, dtype=torch.long))
    b['attention_mask'][0, :2] = 0
    return m, tiny_tokenizer(), b, ['w1 w2', 'w3', 'w4 w5 w6', 'w7'], ['w8 w9', 'w30 w31', 'w40']
SETS = {'none': [], 'L1H2': [(1, 2)], 'L0H0 L1H3': {0: [0], 1: [3]}, 'L0H1': [(0, 1)]}
'''

SCRIPT = '''
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import interpkit.papers.safety_heads as sh
from setup_sh import setup, SETS
torch.set_num_threads(1)
dist.init_process_group('gloo')
m, tok, b, harm, safe = setup()
n_fwd = []
m.register_forward_pre_hook(lambda mod, a, kw: n_fwd.append(1), with_kwargs=True)
def counted(f):
    n0 = len(n_fwd); r = f(); return r, len(n_fwd) - n0
gens, cr = [], sh.chat_replies
sh.chat_replies = lambda *a, **kw: (gens.append(len(a[2])), cr(*a, **kw))[1]   # generate calls it once per list of requests
s_all, f_all = counted(lambda: sh.ships(m, b, batch_size=2))
s_one, f_one = counted(lambda: sh.ships(m, b, heads=[(1, 2)], reduce=False, last_only=False, how='zero'))
sah, f_sah = counted(lambda: sh.sahara(m, b, budget=2, candidates=[(0, 0), (0, 3), (1, 1), (1, 2), (0, 2)], last_only=False))
o = sh.ablation_outcomes(m, tok, harm, SETS, harmless=safe, max_new_tokens=3, how='zero', batch_size=3)
out = dict(ships=s_all.tolist(), ships_one=s_one.tolist(), sahara=[sah.heads, sah.angles], table=o.table.to_dict(), replies=o.replies,
           forwards=[f_all, f_one, f_sah], generations=gens)
json.dump(out, open(f'{sys.argv[1]}/{dist.get_rank()}.json', 'w'))
dist.destroy_process_group()
'''

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('sh')
    (tmp/'setup_sh.py').write_text(SETUP); (tmp/'two.py').write_text(SCRIPT)
    launch(tmp/'two.py', tmp)
    return [json.loads((tmp/f'{r}.json').read_text()) for r in (0, 1)], tmp

def one_process(tmp):
    import sys
    sys.path.insert(0, str(tmp))
    try: from setup_sh import setup, SETS
    finally: sys.path.remove(str(tmp))
    return setup(), SETS

def test_ships_split_over_heads(runs):
    (r0, r1), tmp = runs
    (m, tok, b, harm, safe), _ = one_process(tmp)
    want, want_one = ships(m, b, batch_size=2), ships(m, b, heads=[(1, 2)], reduce=False, last_only=False, how='zero')
    for r in (r0, r1):
        got, got_one = torch.tensor(r['ships'], dtype=torch.float64), torch.tensor(r['ships_one'], dtype=torch.float64)
        torch.testing.assert_close(got, want, atol=1e-12 + 1e-9 * float(want.abs().max()), rtol=0)   # the same passes, each in one process: equal up to rounding
        torch.testing.assert_close(got_one, want_one, atol=1e-12 + 1e-9 * float(want_one.nan_to_num().abs().max()), rtol=0, equal_nan=True)
    # 8 heads in chunks of 2 and 1 queries, cached prefix: per chunk a prefix pass, the base step and one step per head of this process's share
    assert (r0['forwards'][0], r1['forwards'][0]) == (2 * (2 + 4), 2 * (2 + 4)), (r0['forwards'], r1['forwards'])   # one process: 2 * (2 + 8)
    assert (r0['forwards'][1], r1['forwards'][1]) == (1, 2)   # one head, every position: the base pass in each, the head in the second only

def test_sahara_split_over_candidates(runs):
    (r0, r1), tmp = runs
    (m, tok, b, harm, safe), _ = one_process(tmp)
    want = sahara(m, b, budget=2, candidates=[(0, 0), (0, 3), (1, 1), (1, 2), (0, 2)], last_only=False)
    for r in (r0, r1):
        assert [tuple(h) for h in r['sahara'][0]] == want.heads
        torch.testing.assert_close(torch.tensor(r['sahara'][1]), torch.tensor(want.angles), atol=1e-9, rtol=0)
    # the base pass, then 5 candidates (shares 2 and 3) and 4 (shares 2 and 2), one pass each
    assert (r0['forwards'][2], r1['forwards'][2]) == (1 + 2 + 2, 1 + 3 + 2)

def test_ablation_outcomes_split_over_generations(runs):
    (r0, r1), tmp = runs
    (m, tok, b, harm, safe), sets = one_process(tmp)
    want = ablation_outcomes(m, tok, harm, sets, harmless=safe, max_new_tokens=3, how='zero', batch_size=3)
    for r in (r0, r1):
        assert r['replies'] == want.replies
        assert r['table'] == json.loads(json.dumps(want.table.to_dict()))
    # 1 + 4 + 3 lists of requests to generate (the model's own harmless replies, each set's harmful ones, the harmless ones of the 3 sets with heads): 4 each
    assert (len(r0['generations']), len(r1['generations'])) == (4, 4)
    assert sum(r0['generations']) + sum(r1['generations']) == len(safe) + 4 * len(harm) + 3 * len(safe)
