"""Make the asset of paper 14 (diffusion influence): the retrained models of the linear datamodelling score (LDS).

Run each phase under torch.distributed (models are split over the processes; a finished model is kept, so a phase
can be resumed), then `measure` and `write` in one process:

    torchrun --nproc_per_node 2 tools/make_diffusion_influence_assets.py train WORK     # 3 full + 32 subsets x 3 seeds
    torchrun --nproc_per_node 2 tools/make_diffusion_influence_assets.py measure WORK   # queries, measurements
    torchrun --nproc_per_node 2 tools/make_diffusion_influence_assets.py remove WORK    # retrain without top influences
    python tools/make_diffusion_influence_assets.py write WORK                           # interpkit/assets/diffusion_influence_digits.*

Every model is `tiny_ddpm(seed)` trained by `train_influence_demo` (600 full-batch steps, lr 3e-3) on the digits 0 and 1 of the
training split (`demo_images()`, N = 269); a subset keeps a random half. Seed s fixes the initial weights and the
(t, ε) draws, shared by all subsets (common random numbers). Queries are 16 DDPM samples (1000 steps) of the full
seed-0 model; measurements average 512 (t, ε) draws per query, the same draws for every model.
"""
import json, os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from diffusers import DDPMScheduler
from interpkit.diffusion import sample
from interpkit.papers.diffusion_influence import DDPM_SCHEDULER, MEASUREMENTS, measurement_grads, ggn_curvature, influence_scores, measure, top_influences
from interpkit.demos.diffusion_influence import DDPM_UNET, DIGIT_CLASSES, demo_images, tiny_ddpm, train_influence_demo
from interpkit.train import save_asset

SUBSETS, SEEDS, STEPS, LR = 32, 3, 600, 3e-3
QUERIES, QUERY_SEED, MEASURE_K, MEASURE_SEED = 16, 7, 512, 11
REMOVE_QUERIES, REMOVE_K, REMOVE_SEEDS = 4, 27, 2   # removal: 4 queries, their top 10% (27) vs 27 random examples, 2 seeds
INFLUENCE = dict(k_train=32, k_query=256, samples=8, damping=1e-4)   # the settings the removal phase ranks with (the notebook's defaults)

def keep_masks(n):
    "The random halves: subset j keeps a fixed random 50% of the N images."
    g = torch.Generator().manual_seed(1234)
    keep = torch.zeros(SUBSETS, n, dtype=torch.bool)
    for j in range(SUBSETS): keep[j, torch.randperm(n, generator=g)[:n // 2]] = True
    return keep

def _save(obj, f):
    torch.save(obj, str(f) + '.tmp'); os.replace(str(f) + '.tmp', f)

def _trained(work, name, seed, x, keep):
    "Train one model unless its weights are already in `work`."
    f = work / f'{name}-{seed}.pt'
    if not f.exists():
        t0 = time.time()
        u, _, res = train_influence_demo(x, keep, steps=STEPS, lr=LR, seed=seed, progress=False)
        _save(u.state_dict(), f)
        print(f"rank {dist.get_rank()}: {name} seed {seed} in {time.time() - t0:.0f} s, last-50 loss {res.history['loss'].iloc[-50:].mean():.4f}", flush=True)
    return f

def _model(work, name, seed):
    u = tiny_ddpm(seed)
    u.load_state_dict(torch.load(work / f'{name}-{seed}.pt'))
    return u.eval()

def _mine(jobs):
    r, w = dist.get_rank(), dist.get_world_size()
    return [j for i, j in enumerate(jobs) if i % w == r]

def train(work, x):
    keep = keep_masks(len(x))
    jobs = [('full', s, None) for s in range(SEEDS)] + [(f'subset{j}', s, keep[j]) for j in range(SUBSETS) for s in range(SEEDS)]
    for name, s, k in _mine(jobs): _trained(work, name, s, x, k)

def queries(work):
    f = work / 'queries.pt'
    if not f.exists() and dist.get_rank() == 0:
        q = sample(_model(work, 'full', 0), DDPMScheduler(**DDPM_SCHEDULER), None, None, (1, 8, 8), n_steps=1000, n=QUERIES, seed=QUERY_SEED)
        _save(q.clamp(-1, 1), f)
    dist.barrier()
    return torch.load(f)

def measure_all(work, x):
    q = queries(work)
    sched = DDPMScheduler(**DDPM_SCHEDULER)
    names = ['full'] + [f'subset{j}' for j in range(SUBSETS)]
    for name, s in _mine([(n, s) for n in names for s in range(SEEDS)]):
        f = work / f'{name}-{s}.measure.pt'
        if f.exists(): continue
        u = _model(work, name, s)
        _save({m: measure(u, sched, q, m, n_draws=MEASURE_K, seed=MEASURE_SEED, batch_size=1024) for m in MEASUREMENTS}, f)

def ranking(work, x):
    "K-FAC influence of the training images on the first queries' loss under the full seed-0 model (the notebook's default settings)."
    u, sched, q = _model(work, 'full', 0), DDPMScheduler(**DDPM_SCHEDULER), torch.load(work / 'queries.pt')[:REMOVE_QUERIES]
    g_train = measurement_grads(u, sched, x, 'loss', n_draws=INFLUENCE['k_train'], seed=0, batch_size=512)
    g_query = measurement_grads(u, sched, q, 'loss', n_draws=INFLUENCE['k_query'], seed=1, batch_size=512)
    curv = ggn_curvature(u, sched, x, 'kfac', n_draws=INFLUENCE['samples'], seed=2)
    return influence_scores(g_query, g_train, curv, INFLUENCE['damping'])

def remove(work, x):
    f = work / 'removed.pt'
    if dist.get_rank() == 0 and not f.exists():
        scores = ranking(work, x)
        g = torch.Generator().manual_seed(99)
        top = torch.stack([top_influences(scores, i, REMOVE_K)[0] for i in range(REMOVE_QUERIES)])
        rnd = torch.stack([torch.randperm(len(x), generator=g)[:REMOVE_K] for _ in range(REMOVE_QUERIES)])
        _save(dict(top=top, random=rnd, scores=scores), f)
    dist.barrier()
    rem = torch.load(f)
    jobs = []
    for i in range(REMOVE_QUERIES):
        for kind in ('top', 'random'):
            keep = torch.ones(len(x), dtype=torch.bool); keep[rem[kind][i]] = False
            jobs += [(f'no-{kind}{i}', s, keep) for s in range(REMOVE_SEEDS)]
    for name, s, k in _mine(jobs):
        _trained(work, name, s, x, k)
        u = _model(work, name, s)
        _save(measure(u, DDPMScheduler(**DDPM_SCHEDULER), torch.load(work / 'queries.pt'), 'loss', n_draws=MEASURE_K, seed=MEASURE_SEED, batch_size=1024), work / f'{name}-{s}.measure.pt')

def write(work, x):
    "Collect everything into the asset."
    m = lambda name, s: torch.load(work / f'{name}-{s}.measure.pt')
    t = {f'unet.{k}': v for k, v in torch.load(work / 'full-0.pt').items()}
    t['keep'], t['queries'] = keep_masks(len(x)), torch.load(work / 'queries.pt')
    for meas in MEASUREMENTS:
        t[f'subsets.{meas}'] = torch.stack([torch.stack([m(f'subset{j}', s)[meas] for j in range(SUBSETS)]) for s in range(SEEDS)]).float()   # (S, M, Q)
        t[f'full.{meas}'] = torch.stack([m('full', s)[meas] for s in range(SEEDS)]).float()   # (S, Q)
    rem = torch.load(work / 'removed.pt')
    t['removal.top'], t['removal.random'] = rem['top'], rem['random']
    for kind in ('top', 'random'):
        t[f'removal.{kind}.loss'] = torch.stack([torch.stack([m(f'no-{kind}{i}', s)[i] for s in range(REMOVE_SEEDS)]) for i in range(REMOVE_QUERIES)]).float()   # (R, seeds)
    meta = dict(unet=DDPM_UNET, scheduler=DDPM_SCHEDULER, classes=list(DIGIT_CLASSES), n_train=len(x), subsets=SUBSETS, seeds=SEEDS, steps=STEPS, lr=LR,
                queries=QUERIES, query_seed=QUERY_SEED, query_steps=1000, measure_k=MEASURE_K, measure_seed=MEASURE_SEED,
                remove_queries=REMOVE_QUERIES, remove_k=REMOVE_K, remove_seeds=REMOVE_SEEDS, influence=INFLUENCE,
                recipe='tools/make_diffusion_influence_assets.py (train, measure, remove, write)')
    path = save_asset('diffusion_influence_digits', t, meta)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")

if __name__ == '__main__':
    torch.set_num_threads(1)
    phase, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    x = demo_images()
    if phase == 'write': write(work, x); sys.exit()
    dist.init_process_group('gloo')
    {'train': train, 'measure': measure_all, 'remove': remove}[phase](work, x)
    dist.barrier()
    dist.destroy_process_group()
