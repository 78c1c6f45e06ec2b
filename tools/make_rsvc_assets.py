"""Make the asset of paper 2 (RSVC): `python tools/make_rsvc_assets.py`.

Trains the three `ToyCNN`s of `nbs/papers/02_rsvc.ipynb` with fixed seeds (`interpkit.papers.rsvc.train_toy_cnn`, batches of 64):
A and A' on coloured digits with a red square in 70% of the 3s (seeds 0 and 1), B on the same digits without squares (seed 0).
Writes `interpkit/assets/rsvc_toy_cnns.safetensors` (keys `A/...`, `A'/...`, `B/...`) and its `.json`;
`interpkit.papers.rsvc.load_toy_models()` reads them back as `(ToyModels, None, meta)`.
"""
import time
import torch
from interpkit.papers.rsvc import TOY_MODELS, toy_digits, train_toy_cnn
from interpkit.train import save_asset

if __name__ == '__main__':
    torch.set_num_threads(2)
    steps, tensors, info = 1500, {}, {}
    test = toy_digits('test', square_class=None)
    for key, spec in TOY_MODELS.items():
        t0 = time.time()
        model, _, res = train_toy_cnn(toy_digits('train', square_class=spec['square_class']), steps=steps, seed=spec['seed'])
        with torch.no_grad(): acc = (model(test.x).argmax(-1) == test.y).float().mean().item()
        tensors.update({f'{key}/{k}': v for k, v in model.state_dict().items()})
        info[key] = dict(spec, final_loss=res.final_loss, clean_test_accuracy=acc, train_seconds=round(time.time() - t0, 1))
        print(f"{key}: loss {res.history['loss'].iloc[0]:.3f} -> {res.final_loss:.3f}, clean test accuracy {acc:.4f}, {time.time() - t0:.1f} s", flush=True)
    path = save_asset('rsvc_toy_cnns', tensors, dict(models=info, steps=steps, data="toy_digits('train', square_class=3 or None, p=0.7, seed=0)",
                                                     recipe='interpkit.papers.rsvc.train_toy_cnn'))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
