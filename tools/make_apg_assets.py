"""Make the asset of paper 17 (APG): `python tools/make_apg_assets.py [steps]`.

Trains the class-conditional digit UNet of `nbs/papers/17_apg.ipynb` once with a fixed seed
(`interpkit.demos.apg.train_digit_diffusion`, the core's `train_ddpm` with the demo's settings: ε-prediction, label dropout 0.1 to
the null class 10) and writes
`interpkit/assets/apg_digit_unet.safetensors` and its `.json`, whose 'scheduler' entry (= `DIGIT_SCHEDULER`) is the noise
schedule to sample it with (`load_digit_diffusion() -> (unet, None, meta)`; e.g. `DDIMScheduler(**meta['scheduler'])`).
"""
import sys, time
import torch
from interpkit.demos.apg import DIGIT_SCHEDULER, DIGIT_UNET, train_digit_diffusion
from interpkit.train import save_asset

if __name__ == '__main__':
    torch.set_num_threads(1)   # measured: faster than 2 threads when another job shares the 2 cores
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 800
    t0 = time.time()
    unet, _, res = train_digit_diffusion(steps=steps, seed=0)
    secs = time.time() - t0
    h = res.history['loss']
    print(f"loss {h.iloc[:50].mean():.4f} (first 50 steps) -> {h.iloc[-100:].mean():.4f} (last 100), {secs:.0f} s", flush=True)
    path = save_asset('apg_digit_unet', unet, dict(unet=DIGIT_UNET, scheduler=DIGIT_SCHEDULER, steps=steps, batch_size=128, p_uncond=0.1, lr=2e-3, seed=0,
                                                   loss_first50=h.iloc[:50].mean(), loss_last100=h.iloc[-100:].mean(), train_seconds=round(secs, 1),
                                                   recipe='interpkit.demos.apg.train_digit_diffusion'))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
