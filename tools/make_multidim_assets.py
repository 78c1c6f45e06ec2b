"""Make the asset of paper 18 (multi-dimensional features): `python tools/make_multidim_assets.py`.

Trains the top-k sparse autoencoder of `nbs/papers/18_multidim.ipynb` on SmolLM2-135M-Instruct's residual stream
after block 6 with the recipe `interpkit.demos.multidim.train_lm_sae` (Shakespeare mixed with 20% generated calendar
sentences, fixed seed; the last 5% of the activations are held out), scores it on those held-out activations, and
writes `interpkit/assets/multidim_sae.safetensors` (float16 weights) and its `.json`. `load_multidim_sae()` loads it.
"""
import time
import torch
from interpkit.models import load_lm
from interpkit.demos.multidim import train_lm_sae, lm_sae_activations, heldout_split
from interpkit.sae import sae_metrics
from interpkit.train import save_asset

CONFIG = dict(site='resid_post(6)', n_tokens=64_000, d_sae=1024, top_k=32, steps=1200, batch_size=512, lr=2e-3, block=64, calendar_frac=0.2, seed=0)

def make(model, tokenizer, config=CONFIG, name='multidim_sae', folder=None, progress=True):
    "Train the SAE with `config`, score it on the held-out activations, save it; return (path, sae, FitResult, metrics, seconds)."
    t0 = time.time()
    sae, _, res = train_lm_sae(model, tokenizer, **config, progress=progress)
    secs = time.time() - t0
    data = {k: config[k] for k in ('site', 'n_tokens', 'block', 'calendar_frac', 'seed') if k in config}
    _, heldout = heldout_split(lm_sae_activations(model, tokenizer, **data))  # the same activations again: the rows the recipe left out
    metrics = sae_metrics(sae, heldout)
    sd = {k: (v.half() if k in ('W_enc', 'W_dec') else v) for k, v in sae.state_dict().items()}  # float16 weights: half the size
    path = save_asset(name, sd, dict(config=config, model='smollm2-135m-instruct', d_in=sae.d_in, kind=sae.kind,
                                     heldout=metrics, final_train_nmse=float(res.history['nmse'].iloc[-100:].mean()),
                                     train_seconds=round(secs, 1), recipe='interpkit.demos.multidim.train_lm_sae'), folder=folder)
    return path, sae, res, metrics, secs

if __name__ == '__main__':
    torch.set_num_threads(1)  # one thread: with the cores shared, a second OpenMP thread mostly spins
    model, tokenizer = load_lm()
    path, sae, res, metrics, secs = make(model, tokenizer)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): held-out {metrics} in {secs:.0f} s")
