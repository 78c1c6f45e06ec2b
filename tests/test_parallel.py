"""interpkit.parallel: the shares of every process cover each row exactly once and in order (for every world size and row count,
checked against a brute-force split); sums and gathers under three gloo processes equal the one-process values."""
import json, textwrap
import pytest, torch
import interpkit.parallel as par
from interpkit.errors import ConfigError

@pytest.mark.parametrize('world', [1, 2, 3, 5])
def test_shares_cover_every_row_once_in_order(monkeypatch, world):
    for n in range(0, 13):
        got = []
        for rank in range(world):
            monkeypatch.setattr(par, 'rank_world', lambda r=rank: (r, world))
            s = par.share(n)
            got += list(range(n))[s]
            assert abs((s.stop - s.start) - n / world) < 1   # as even as can be
            b = dict(input_ids=torch.arange(2 * n).view(n, 2), pad=0)
            mine = par.rows_of_mine(b)
            assert mine['input_ids'].tolist() == b['input_ids'][s].tolist() and mine['pad'] == 0
            assert par.rows_of_mine([f'r{i}' for i in range(n)]) == [f'r{i}' for i in range(n)][s]
        assert got == list(range(n)), (world, n, got)

def test_bad_inputs(monkeypatch):
    with pytest.raises(ConfigError, match=r'n=2.5\. A row count >= 0\. Pass len\(data\)\.'): par.share(2.5)
    monkeypatch.setattr(par, 'rank_world', lambda: (0, 2))
    with pytest.raises(ConfigError, match=r'\[2, 3\] rows\. Tensors with the same number of rows\. Pass one batch of rows\.'): par.rows_of_mine(dict(a=torch.zeros(2, 1), b=torch.zeros(3, 1)))

SCRIPT = textwrap.dedent('''
    import json, sys, torch, torch.distributed as dist
    from interpkit.parallel import rank_world, rows_of_mine, all_sum, gather_rows
    dist.init_process_group('gloo')
    x = torch.arange(14, dtype=torch.float64).view(7, 2) / 3
    mine = rows_of_mine(x)
    t = mine.sum(0)
    s = all_sum(t)
    h = all_sum(torch.tensor([1, 2], dtype=torch.int32))
    out = dict(rank=rank_world(), n=len(mine), input_unchanged=t.tolist() == mine.sum(0).tolist(), sum=s.tolist(), sum_dtype=str(s.dtype), int_sum=h.tolist(), int_dtype=str(h.dtype),
               mine_unchanged=mine.tolist() == x[rank_world()[0] * 7 // 3:(rank_world()[0] + 1) * 7 // 3].tolist(),
               rows=gather_rows(mine * 2).tolist(), words=gather_rows([f'w{int(v)}' for v in mine[:, 0]]))
    try: gather_rows(torch.zeros(1, 2 + rank_world()[0]))
    except Exception as e: out['mismatch'] = f'{type(e).__name__}: {e}'
    out['bf16'] = gather_rows(mine.to(torch.bfloat16)).float().tolist()
    d = gather_rows(None if rank_world()[0] == 1 else dict(a=mine[:, :1], b=mine.long()))   # rank 1 has no rows this time
    out['dict'] = {k: v.tolist() for k, v in d.items()}
    out['none'] = gather_rows(None)
    out['plain_from_none'] = gather_rows(None if rank_world()[0] == 0 else mine).tolist()
    json.dump(out, open(f'{sys.argv[1]}/{dist.get_rank()}.json', 'w'))
    dist.destroy_process_group()
''')

def test_three_processes_sum_and_gather_as_one(tmp_path):
    (tmp_path/'three.py').write_text(SCRIPT)
    par.launch(tmp_path/'three.py', tmp_path, n_procs=3)
    x = torch.arange(14, dtype=torch.float64).view(7, 2) / 3
    outs = [json.loads((tmp_path/f'{r}.json').read_text()) for r in range(3)]
    assert [o['rank'] for o in outs] == [[0, 3], [1, 3], [2, 3]] and [o['n'] for o in outs] == [2, 2, 3]
    for o in outs:
        assert torch.allclose(torch.tensor(o['sum'], dtype=torch.float64), x.sum(0), rtol=1e-15) and o['sum_dtype'] == 'torch.float64'
        assert o['input_unchanged']   # all_sum returns a new tensor: gloo's in-place all_reduce leaves the caller's alone
        assert o['int_sum'] == [3, 6] and o['int_dtype'] == 'torch.int32' and o['mine_unchanged']
        assert o['rows'] == (x * 2).tolist() and o['words'] == [f'w{int(v)}' for v in x[:, 0]]
        assert o['bf16'] == x.to(torch.bfloat16).float().tolist()
        skip1 = torch.cat([x[:2], x[4:]])   # ranks 0 and 2's rows
        assert o['dict'] == dict(a=skip1[:, :1].tolist(), b=skip1.long().tolist()) and o['none'] is None
        assert o['plain_from_none'] == x[2:].tolist()
        assert o['mismatch'].startswith('ShapeError') and 'Rows of one shape and dtype' in o['mismatch']

def test_launch_reports_a_failing_script(tmp_path):
    (tmp_path/'bad.py').write_text('raise SystemExit("no such luck")')
    with pytest.raises(RuntimeError, match='failed \\(1\\):\n') as e: par.launch(tmp_path/'bad.py', n_procs=1)
    assert 'no such luck' in str(e.value)

def test_launch_runs_two_processes_of_one_thread_by_default(tmp_path):
    (tmp_path/'hi.py').write_text('import os, torch; print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "threads", torch.get_num_threads(), os.environ["OMP_NUM_THREADS"])')
    out = par.launch(tmp_path/'hi.py').stdout
    assert isinstance(out, str) and sorted(l for l in out.splitlines() if l.startswith('rank')) == ['rank 0 of 2 threads 1 1', 'rank 1 of 2 threads 1 1']
