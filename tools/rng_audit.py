"""Find the notebook cells whose results depend on the global random state they start from.

    python tools/rng_audit.py                   # every notebook
    python tools/rng_audit.py nbs/papers/14_diffusion_influence.ipynb

Each notebook runs twice, each time in a fresh process from another global random state (`random`, numpy and
torch). After every cell the three generators' states and the cell's printed output are recorded. A cell is
listed when it drew from a global generator whose state, on entering the cell, differed between the two runs
(an unseeded draw: its numbers depend on what ran before), or when its printed output differs between the runs.
A cell that seeds a generator before drawing from it, or draws inside `interpkit.train.seeded`, is not listed.
Libraries that draw from `random` when first imported (scikit-learn) are imported first.
Timings in printed output (numbers followed by `s`, `secs`, `it/s`) are ignored.
"""
import argparse, hashlib, os, re, sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_timing = re.compile(r'\d+(\.\d+)?\s*(s|secs?|seconds|ms|it/s|s/it|min)\b|\d\d:\d\d')

def _states():
    "A short fingerprint of each global generator's state."
    import random, numpy as np, torch
    h = lambda b: hashlib.sha1(b).hexdigest()[:10]
    return dict(torch=h(torch.get_rng_state().numpy().tobytes()), numpy=h(repr(np.random.get_state()).encode()), random=h(repr(random.getstate()).encode()))

def _text(cell):
    "The cell's printed output, timings removed."
    out = []
    for o in cell.get('outputs', []) or []:
        t = o.get('text') or (o.get('data') or {}).get('text/plain') or ''
        out.append(t if isinstance(t, str) else ''.join(t))
    return _timing.sub('<t>', ''.join(out))

def run(path, seed):
    "Run the notebook from global random state `seed`; return per executed cell (index, states before, states after, output)."
    os.environ.setdefault('OMP_NUM_THREADS', '1'); os.environ['IN_TEST'] = '1'
    import random, numpy as np, torch
    torch.set_num_threads(1)
    import sklearn.datasets, sklearn.linear_model   # noqa: F401  scikit-learn draws from `random` when first imported: not the notebook's doing
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.process import NBProcessor
    from nbdev.frontmatter import FrontmatterProc
    from nbdev.config import get_config
    sys.path.insert(0, str(get_config().config_path))
    nb = NBProcessor(Path(path), procs=FrontmatterProc, process=True).nb
    flags = set(get_config().tst_flags.split())
    rec, cur = [], {}
    def pre(cell):
        if cell.cell_type != 'code' or 'nbdev_export(' in cell.source: return True
        d = getattr(cell, 'directives_', {}) or {}
        if d.get('eval:', [''])[0].lower() == 'false' or flags & d.keys(): return True
        cur.update(idx=cell.idx_, before=_states())
        return False
    def post(cell):
        if cur.get('idx') == cell.idx_: rec.append((cell.idx_, cur['before'], _states(), _text(cell)))
    random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
    shell = CaptureShell(Path(path))
    error = None
    try:
        with working_directory(Path(path).parent): shell.run_all(nb, exc_stop=True, preproc=pre, postproc=post)
    except Exception as e: error = f'{type(e).__name__}: {str(e)[:200]}'
    return rec, error

def compare(path, a, b):
    "Lines naming the cells that depend on the starting random state."
    (ra, ea), (rb, eb) = a, b
    out = []
    if ea or eb: out.append(f"  run errors: {ea!r} / {eb!r}")
    for (i, ba, aa, ta), (_, bb, ab, tb) in zip(ra, rb):
        drew = [g for g in ba if ba[g] != aa[g] and ba[g] != bb[g] and aa[g] != ab[g]]   # drew from a generator whose state differs on entering and on leaving
        if drew or ta != tb:
            why = (f"draws from unseeded {'/'.join(drew)}" if drew else '') + ('; ' if drew and ta != tb else '') + ('output differs' if ta != tb else '')
            out.append(f"  cell {i}: {why}")
    return out

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('paths', nargs='*')
    ap.add_argument('--n_workers', type=int, default=2)
    args = ap.parse_args(argv)
    paths = [str(Path(p).resolve()) for p in args.paths] or sorted(str(p) for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rng_audit
    os.chdir(ROOT/'nbs')
    with ProcessPoolExecutor(args.n_workers, mp_context=get_context('spawn'), max_tasks_per_child=1) as ex:
        futs = {(p, s): ex.submit(rng_audit.run, p, s) for p in paths for s in (11, 22)}
        bad = 0
        for p in paths:
            lines = compare(p, futs[p, 11].result(), futs[p, 22].result())
            print(f"{Path(p).relative_to(ROOT)}: {'ok' if not lines else f'{len(lines)} cell(s)'}", *lines, sep='\n', flush=True)
            bad += bool(lines)
    return 1 if bad else 0

if __name__ == '__main__': sys.exit(main())
