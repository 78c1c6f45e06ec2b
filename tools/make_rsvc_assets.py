"""Make the asset of paper 2 (RSVC): `python tools/make_rsvc_assets.py [--models NAME ...]`.

Trains the four `ToyCNN`s of `nbs/papers/02_rsvc.ipynb` with fixed seeds (`interpkit.demos.rsvc.train_toy_cnn`, batches of 64),
each on `toy_digits('train', ...)` as `TOY_MODELS` says:
A and A' on coloured digits with a red square in 70% of the 3s (seeds 0 and 1), B on the same digits without squares (seed 0),
and B' (seed 0) with a square in 50% of the images of every class, the official toy experiment's model B
(nkondapa/RSVC, `datasets/synthetic_concept_configs/config_mod_all=0.5.json`).
Writes `interpkit/assets/rsvc_toy_cnns.safetensors` (keys `A/...`, `A'/...`, `B/...`, `B'/...`) and its `.json`;
`interpkit.demos.rsvc.load_toy_models()` reads them back as a `Shipped` `(ToyModels, None, meta)`.
`--models B\\'` retrains only the models named and keeps the others (tensors and records) from the existing asset.
"""
import argparse, time
import torch
from interpkit.demos.rsvc import TOY_MODELS, toy_digits, train_toy_cnn
from interpkit.train import load_asset, save_asset

NAME = 'rsvc_toy_cnns'

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--models', nargs='*', default=list(TOY_MODELS), choices=list(TOY_MODELS))
    ap.add_argument('--threads', type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    steps, tensors, info = 1500, {}, {}
    old_tensors, old_meta = load_asset(NAME) if set(args.models) != set(TOY_MODELS) else ({}, {})
    test = toy_digits('test', square_class=None)
    for key, spec in TOY_MODELS.items():
        if key not in args.models:   # kept as trained before
            tensors.update({k: v for k, v in old_tensors.items() if k.split('/', 1)[0] == key})
            info[key] = old_meta['models'][key]
            continue
        t0 = time.time()
        data = toy_digits('train', **{k: v for k, v in spec.items() if k != 'seed'})
        model, _, res = train_toy_cnn(data, steps=steps, seed=spec['seed'])   # Trained (model, tokenizer, fit)
        with torch.no_grad(): acc = (model(test.x).argmax(-1) == test.y).float().mean().item()
        tensors.update({f'{key}/{k}': v for k, v in model.state_dict().items()})
        info[key] = dict(spec, final_loss=res.final_loss, clean_test_accuracy=acc, train_seconds=round(time.time() - t0, 1),
                         train_images_with_square=int(data.has_square().sum()))
        print(f"{key}: loss {res.history['loss'].iloc[0]:.3f} -> {res.final_loss:.3f}, clean test accuracy {acc:.4f}, {time.time() - t0:.1f} s", flush=True)
    path = save_asset(NAME, tensors, dict(models=info, steps=steps, data="toy_digits('train', **TOY_MODELS[name] without its seed), seed=0",
                                          recipe='interpkit.demos.rsvc.train_toy_cnn'))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
