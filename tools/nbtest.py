"""Run every notebook's checks as `nbdev_test` does, but so that a check which depends on what ran before it fails here.

    python tools/nbtest.py                      # a new run seed each time (printed); notebooks in a shuffled order
    python tools/nbtest.py --seed 1234          # replay a run: the same order and the same starting states
    python tools/nbtest.py nbs/papers/03_graphnorm.ipynb --seed 1234

`nbdev_test` runs notebooks in reused worker processes, so the global random state (and the order of the work)
a notebook starts with depends on which notebooks ran before it in its worker. Here every notebook starts from
its own random state, drawn from the run seed and its name, in `random`, numpy and torch; the order of the
notebooks is shuffled by the same seed. A notebook whose verdict depends on an unseeded draw then fails in your
own runs, with the seed to replay it, rather than by chance on someone else's machine.

`--isa avx2` (or `default`, no vector instructions) runs torch, MKL and OpenBLAS as a CPU without AVX-512 would
(`ATEN_CPU_CAPABILITY`, `MKL_ENABLE_INSTRUCTIONS`, `OPENBLAS_CORETYPE`): a check whose verdict depends on the CPU's
vector instructions fails here too.

The claims the notebooks record (`interpkit.report.record_claim`) go to a scratch folder and are compared with the
committed ones in nbs/_records: a claim whose record is stale (a number moved beyond its tolerance, a verdict or a
text changed, a claim added or removed) fails the run, saying to re-execute that notebook.

A notebook over `--budget` seconds (120: the project's budget on two cores) fails too; `--budget 0` turns that off.
"""
import argparse, hashlib, os, random, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def notebook_seed(run_seed:int, path) -> int:
    "The seed a notebook starts from: a hash of the run seed and the notebook's path relative to nbs/."
    p = Path(path).resolve()
    rel = p.relative_to(ROOT/'nbs').as_posix() if p.is_relative_to(ROOT/'nbs') else p.name
    return int.from_bytes(hashlib.sha256(f'{run_seed}:{rel}'.encode()).digest()[:4], 'little')

ISA = {'native': {}, 'avx2': dict(ATEN_CPU_CAPABILITY='avx2', MKL_ENABLE_INSTRUCTIONS='AVX2', OPENBLAS_CORETYPE='Haswell'),
       'default': dict(ATEN_CPU_CAPABILITY='default', MKL_ENABLE_INSTRUCTIONS='SSE4_2', OPENBLAS_CORETYPE='Nehalem')}

def seed_everything(seed:int):
    "Put `random`, numpy and torch (CPU and every GPU) into the state `seed` gives."
    import numpy as np, torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

def test_one(path, run_seed, skip_flags, basepath):
    "Test one notebook from its own random state; return (passed, seconds, seed)."
    from nbdev.test import test_nb
    seed = notebook_seed(run_seed, path)
    seed_everything(seed)
    passed, secs = test_nb(Path(path), skip_flags=skip_flags, basepath=basepath)
    if not passed: sys.stderr.write(f"\n{Path(path).name} failed from random state {seed} (run seed {run_seed}); replay: python tools/nbtest.py {path} --seed {run_seed}\n")
    return passed, secs, seed

def notebooks(paths):
    "The notebooks to test: those given, else every notebook under nbs/ that nbdev_test would test."
    if paths: return [Path(p).resolve() for p in paths]
    return sorted(p for p in (ROOT/'nbs').rglob('*.ipynb') if not any(part.startswith(('.', '_')) for part in p.relative_to(ROOT/'nbs').parts))

def print_drift(fresh:dict, committed:dict):
    "Each claim of this run: its number, the committed one, their relative difference and the record's rtol (to measure an rtol across CPUs and seeds)."
    for paper, claims in fresh.items():
        for key, c in claims.items():
            b = committed.get(paper, {}).get(key)
            if b is None: continue
            rel = abs(c.ours - b.ours) / max(abs(b.ours), 1e-12)
            print(f"drift {paper}/{key}: {c.ours:.8g} vs {b.ours:.8g}: relative {rel:.2e} (rtol {b.rtol:g}{', OVER' if rel > b.rtol else ''})")

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('paths', nargs='*', help='notebooks to test (default: all)')
    ap.add_argument('--seed', type=int, default=None, help='run seed (default: a new one, printed)')
    ap.add_argument('--n_workers', type=int, default=2)
    ap.add_argument('--isa', choices=list(ISA), default='native', help="vector instructions torch, MKL and OpenBLAS may use (default: all the CPU has)")
    ap.add_argument('--drift', action='store_true', help="print each recorded claim's relative change against its committed record, beside its rtol")
    ap.add_argument('--budget', type=float, default=120., help='seconds one notebook may take (0: no limit)')
    args = ap.parse_args(argv)
    run_seed = int(os.environ.get('NBTEST_SEED', random.SystemRandom().randrange(2**31))) if args.seed is None else args.seed
    os.environ.update(ISA[args.isa])
    records = tempfile.mkdtemp(prefix='nbtest-records-')
    os.environ['INTERPKIT_RECORDS'] = records   # the workers inherit it
    files = notebooks(args.paths)
    random.Random(run_seed).shuffle(files)
    print(f"nbtest: run seed {run_seed} ({len(files)} notebooks, {args.n_workers} workers, vector instructions: {args.isa}); replay with `make nbtest SEED={run_seed}`", flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import nbtest   # the workers find `test_one` by module name
    from fastcore.parallel import parallel
    from nbdev.config import get_config
    cfg = get_config()
    t0 = time.time()
    os.chdir(cfg.nbs_path)
    results = parallel(nbtest.test_one, files, run_seed=run_seed, skip_flags=cfg.tst_flags.split(), basepath=cfg.config_path,
                       n_workers=args.n_workers, pause=0.01)
    failed = [f for f, (ok, _, _) in zip(files, results) if not ok]
    slow = [(f, s) for f, (ok, s, _) in zip(files, results) if args.budget and s > args.budget]
    for f, (ok, secs, seed) in sorted(zip(files, results), key=lambda r: -r[1][1]):
        print(f"{secs:6.0f} s  {'ok  ' if ok else 'FAIL'}  seed {seed:>10}  {f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}")
    print(f"nbtest: {len(files) - len(failed)}/{len(files)} passed in {time.time() - t0:.0f} s (run seed {run_seed})")
    from interpkit.report import load_claims, stale_claims
    stale = stale_claims(records, ROOT/'nbs'/'_records')
    if args.drift: print_drift(load_claims(records), load_claims(ROOT/'nbs'/'_records'))
    if stale: print('stale records of claims (the Reproduction report is built from them):', *stale, sep='\n  ', file=sys.stderr)
    if slow: print('over the budget of', args.budget, 's:', *[f'{f.name} ({s:.0f} s)' for f, s in slow], sep='\n  ', file=sys.stderr)
    if failed: print('failed:', *[f.name for f in failed], f'replay: make nbtest SEED={run_seed}', sep='\n  ', file=sys.stderr)
    return 1 if failed or slow or stale else 0

if __name__ == '__main__': sys.exit(main())
