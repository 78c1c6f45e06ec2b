"""Make the asset of paper 18 (multi-dimensional features): `python tools/make_multidim_assets.py`.

Trains the top-k sparse autoencoder of `nbs/papers/18_multidim.ipynb` on SmolLM2-135M-Instruct's residual stream
after block 6 (`interpkit.papers.multidim.train_lm_sae`: Shakespeare mixed with 20% generated calendar sentences,
fixed seed) and writes `interpkit/assets/multidim_sae.safetensors` (float16 weights) and its `.json`.
"""
import time
import torch
from interpkit.models import load_lm
from interpkit.papers.multidim import train_lm_sae
from interpkit.train import save_asset

CONFIG = dict(site='resid_post(6)', n_tokens=64_000, d_sae=1024, k=32, steps=1200, batch_size=512, lr=2e-3, block=64, calendar_frac=0.2, seed=0)

if __name__ == '__main__':
    torch.set_num_threads(1)  # one thread: with the cores shared, a second OpenMP thread mostly spins
    model, tok = load_lm()
    t0 = time.time()
    sae, res, metrics = train_lm_sae(model, tok, **CONFIG)
    secs = time.time() - t0
    sd = {k: (v.half() if k in ('W_enc', 'W_dec') else v) for k, v in sae.state_dict().items()}  # float16 weights: half the size
    path = save_asset('multidim_sae', sd, dict(config=CONFIG, model='smollm2-135m-instruct', d_in=sae.d_in, kind=sae.kind,
                                               heldout=metrics, final_train_nmse=float(res.history['nmse'].iloc[-100:].mean()),
                                               train_seconds=round(secs, 1), recipe='interpkit.papers.multidim.train_lm_sae'))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): held-out {metrics} in {secs:.0f} s")
