"""Run every public entry point of interpkit on tiny models on one device, in float32 and bfloat16.

    python tools/gpu_smoke.py                          # cuda if there is one, else the CPU; float32 and bfloat16
    python tools/gpu_smoke.py --device cuda --dtypes bfloat16 --only core,apg

Each module of the library has a file `tools/smoke/<module>.py` with `checks(device, dtype)`, which yields
(name, function) pairs; each function runs entry points on a tiny model on `device` in `dtype`, checks that the
results are finite and where they should be, that the model was left untouched, and returns a few words on
what it saw. One line is printed per check; the exit status is 1 if any failed. CI has no GPU: the tests run this
script on the CPU so it keeps working, and it runs on a GPU wherever one is lent.
"""
import argparse, importlib, sys, time, traceback
from pathlib import Path
import torch

SMOKE = Path(__file__).resolve().parent/'smoke'

def modules(only=None):
    "The smoke modules in tools/smoke, `core` first."
    names = sorted(p.stem for p in SMOKE.glob('*.py') if not p.stem.startswith('_'))
    names = ['core'] + [n for n in names if n != 'core'] if 'core' in names else names
    if only:
        unknown = set(only) - set(names)
        if unknown: sys.exit(f"unknown smoke module(s) {sorted(unknown)}; there are: {names}")
        names = [n for n in names if n in only]
    return names

def run(device, dtypes, only=None, out=sys.stdout):
    "Run the checks; return the list of (module, check, dtype, ok, seconds, message)."
    sys.path.insert(0, str(SMOKE))
    rows = []
    for name in modules(only):
        mod = importlib.import_module(name)
        for dtype in dtypes:
            try: checks = list(mod.checks(torch.device(device), dtype))
            except Exception as e: checks = [('(setting up)', lambda e=e: (_ for _ in ()).throw(e))]
            for check, fn in checks:
                t0 = time.time()
                try: ok, msg = True, fn() or ''
                except Exception as e: ok, msg = False, f"{type(e).__name__}: {e}".replace('\n', ' ')[:300] + ' @ ' + _where(e)
                secs = time.time() - t0
                rows.append((name, check, str(dtype).replace('torch.', ''), ok, secs, msg))
                print(f"{'ok  ' if ok else 'FAIL'} {name + '.' + check:48} {device} {rows[-1][2]:9} {secs:6.2f}s  {msg}", file=out, flush=True)
    return rows

def _where(e):
    "The last frame of the traceback inside interpkit or tools/smoke."
    frames = [f for f in traceback.extract_tb(e.__traceback__) if 'interpkit' in f.filename or 'smoke' in f.filename]
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else '?'

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    ap.add_argument('--dtypes', default='float32,bfloat16', help='comma-separated torch dtypes')
    ap.add_argument('--only', default='', help='comma-separated smoke modules (default: all)')
    a = ap.parse_args()
    torch.manual_seed(0)
    dtypes = [getattr(torch, d) for d in a.dtypes.split(',')]
    print(f"interpkit smoke on {a.device}" + (f" ({torch.cuda.get_device_name()})" if a.device.startswith('cuda') else '') + f", torch {torch.__version__}", flush=True)
    rows = run(a.device, dtypes, [s for s in a.only.split(',') if s])
    bad = [r for r in rows if not r[3]]
    print(f"{len(rows) - len(bad)} of {len(rows)} checks passed in {sum(r[4] for r in rows):.1f} s")
    sys.exit(1 if bad else 0)
