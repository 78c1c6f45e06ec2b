"""Train the masked LMs of paper 1 (dual process learning) on the part-of-speech task: vanilla, active and temporary forgetting,
and the Zipf sweep; ship the logged curves of every run and the final weights of the three main runs.

Runs are shared out over the processes of a `torchrun` launch (gloo, one CPU thread each), longest first to the least loaded rank;
rank 0 then packs every run's output into interpkit/assets/dual_process_runs.*:

  torchrun --nproc_per_node 2 tools/make_dual_process_assets.py            # all runs (about 2 hours on 2 cores)
  torchrun --nproc_per_node 2 tools/make_dual_process_assets.py --runs vanilla active   # some of them
  python tools/make_dual_process_assets.py --pack                          # pack what --work holds
"""
import argparse, dataclasses, datetime, json, os, time
from pathlib import Path
import torch, torch.distributed as dist
from interpkit.train import save_asset
from interpkit.papers.dual_process import curves, train_dual_process
from interpkit.demos.dual_process import RUNS_ASSET, SHIPPED_EVAL, SHIPPED_RUNS, SHIPPED_WEIGHTS

def train(name, work):
    torch.set_num_threads(1)
    recipe, t0 = SHIPPED_RUNS[name], time.time()
    model, _, res = train_dual_process(None, recipe, seed=0, progress=False, **SHIPPED_EVAL)
    info = dict(seconds=round(time.time() - t0, 1), recipe=dataclasses.asdict(recipe), eval=SHIPPED_EVAL, curves=curves(res).reset_index().to_dict('list'),
                loss=res.history['loss'].rolling(100, min_periods=1).mean().iloc[99::100].round(4).tolist())
    (work/f'{name}.json').write_text(json.dumps(info))
    if name in SHIPPED_WEIGHTS: torch.save({k: v.half() for k, v in model.state_dict().items()}, work/f'{name}.pt')
    print(name, f"{info['seconds']:.0f} s", {k: v[-1] for k, v in info['curves'].items() if k != 'step'}, flush=True)

def share(runs, rank, world):
    "The runs of this rank: longest first, each to the rank with the least work so far (the same plan on every rank)."
    load, mine = [0] * world, []
    for name in sorted(runs, key=lambda k: -SHIPPED_RUNS[k].steps * SHIPPED_RUNS[k].task.n_tokens ** 0.5):
        r = load.index(min(load))
        load[r] += SHIPPED_RUNS[name].steps * SHIPPED_RUNS[name].task.n_tokens ** 0.5
        if r == rank: mine.append(name)
    return mine

def pack(work):
    runs = {k: json.loads((work/f'{k}.json').read_text()) for k in SHIPPED_RUNS if (work/f'{k}.json').exists()}
    missing = [k for k in SHIPPED_RUNS if k not in runs] + [k for k in SHIPPED_WEIGHTS if not (work/f'{k}.pt').exists()]
    if missing: raise SystemExit(f"runs missing in {work}: {missing}; train them first")
    sd = {f'{k}.{n}': v for k in SHIPPED_WEIGHTS for n, v in torch.load(work/f'{k}.pt').items()}
    print(save_asset(RUNS_ASSET, sd, dict(runs=runs, weights=list(SHIPPED_WEIGHTS), note='float16 copies of the weights; load_run loads them in float32')))

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--runs', nargs='*', default=list(SHIPPED_RUNS), choices=list(SHIPPED_RUNS))
    p.add_argument('--work', default='/tmp/dual_process_assets')
    p.add_argument('--pack', action='store_true', help='only pack the runs --work holds')
    a = p.parse_args()
    work = Path(a.work); work.mkdir(parents=True, exist_ok=True)
    if a.pack: pack(work); raise SystemExit
    launched = 'WORLD_SIZE' in os.environ
    if launched: dist.init_process_group('gloo', timeout=datetime.timedelta(hours=8))   # ranks wait for the slowest at the barrier
    rank, world = (dist.get_rank(), dist.get_world_size()) if launched else (0, 1)
    for name in share(a.runs, rank, world): train(name, work)
    if launched: dist.barrier(); dist.destroy_process_group()
    if rank == 0: pack(work)
