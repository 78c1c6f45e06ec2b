"""Make the asset of paper 15 (position coupling): `python tools/make_position_coupling_assets.py`.

Trains the four adders of `nbs/papers/15_position_coupling.ipynb` (`interpkit.demos.position_coupling.ADDER_RECIPES`:
coupled ids with the scratchpad, ordinary absolute positions, no positions, coupled ids without the scratchpad) with
fixed seeds and the official 'partially uniform' sampler (`sample_operands`), measures each one's exact-match grid (1-10 digits x 2-10 operands, 200 problems a cell) and writes
`interpkit/assets/position_coupling_adders.safetensors` and its `.json`.

Stages, so that two recipes can train at once on two cores:
  --stage train --recipe NAME   train one recipe, write its weights and curve to --work (default /tmp/position_coupling)
  --stage pack [--keep NAME ...] measure the grids of the trained recipes and write the asset; --keep takes the named recipes
                                as they are from the current asset (each recipe's `training.sampler` says how it was trained)
  --stage all                   (default) train every recipe in turn, then pack
"""
import argparse, dataclasses, json, time
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from interpkit.papers.position_coupling import accuracy_grid
from interpkit.demos.position_coupling import ADDER_RECIPES, ADDERS_ASSET, GRID_COUNTS, GRID_DIGITS, train_adder
from interpkit.train import load_asset, save_asset

SEED, GRID_N = 0, 200
SAMPLER = "official 'partially uniform' (threshold 0.5): each operand's length uniform on 1..max_digits"
OLD_SAMPLER = "earlier, skewed: a length n uniform on 1..max_digits, then each operand's length uniform on 1..n (half the problems: all n)"

def train(name:str, work:Path):
    t0 = time.time()
    model, _, res = train_adder(name, seed=SEED, progress=True)   # the bar (stderr) shows how far a background run is
    secs = time.time() - t0
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, work/f'{name}.safetensors')
    h = res.history
    curve = h.iloc[::max(1, len(h) // 200)][['step', 'loss']].to_dict('list')
    (work/f'{name}.json').write_text(json.dumps(dict(seconds=round(secs, 1), final_loss=res.final_loss, curve=curve)))
    print(f"{name}: loss {h['loss'].iloc[0]:.3f} -> {res.final_loss:.5f} in {secs:.0f} s", flush=True)

def pack(work:Path, keep:list):
    "Measure the grids of the recipes trained in `work` and write the asset; `keep`: recipes taken as they are from the current asset."
    tensors, meta = {}, dict(seed=SEED, grid_n=GRID_N, recipes={}, training={}, grids={},
                             recipe='interpkit.demos.position_coupling.train_adder, interpkit.papers.position_coupling.accuracy_grid(n=200, seed=0)')
    if keep: prev_tensors, prev = load_asset(ADDERS_ASSET)
    for name, recipe in ADDER_RECIPES.items():
        if name in keep:                       # weights, training record and grid of the current asset (the earlier sampler unless it says otherwise)
            assert prev['recipes'][name] == json.loads(json.dumps(dataclasses.asdict(recipe))), f"{name}: the recipe changed; retrain it"
            tensors |= {k: v for k, v in prev_tensors.items() if k.startswith(name + '.')}
            meta['recipes'][name], meta['grids'][name] = prev['recipes'][name], prev['grids'][name]
            meta['training'][name] = {'sampler': OLD_SAMPLER} | prev['training'][name]
            print(f"{name}: kept from the current asset ({meta['training'][name]['sampler']})", flush=True)
            continue
        model = recipe.build()
        model.load_state_dict(load_file(work/f'{name}.safetensors'))
        model.eval()
        t0 = time.time()
        grid = accuracy_grid(model, GRID_DIGITS, GRID_COUNTS, n=GRID_N, seed=SEED, scratchpad=recipe.scratchpad)
        print(f"{name}: grid in {time.time() - t0:.0f} s\n{grid.round(2)}", flush=True)
        tensors |= {f'{name}.{k}': v for k, v in model.state_dict().items()}
        meta['recipes'][name] = dataclasses.asdict(recipe)
        meta['training'][name] = json.loads((work/f'{name}.json').read_text()) | dict(sampler=SAMPLER)
        meta['grids'][name] = {str(d): [float(v) for v in grid.loc[d]] for d in grid.index}
    path = save_asset(ADDERS_ASSET, tensors, meta)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--stage', default='all', choices=['all', 'train', 'pack'])
    ap.add_argument('--recipe', choices=list(ADDER_RECIPES))
    ap.add_argument('--work', default='/tmp/position_coupling')
    ap.add_argument('--keep', nargs='*', default=[], choices=list(ADDER_RECIPES),
                    help="pack: recipes not retrained, taken with their grids from the current asset (marked with the sampler they were trained with)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work); work.mkdir(parents=True, exist_ok=True)
    if args.stage == 'train': train(args.recipe, work)
    else:
        if args.stage == 'all':
            for name in ADDER_RECIPES: train(name, work)
        pack(work, args.keep)
