"""Make the asset of paper 11 (bilinear MLPs): `python tools/make_bilinear_assets.py`.

Trains the one-layer bilinear character-level Llama of `nbs/papers/11_bilinear.ipynb` with a fixed seed
(`interpkit.demos.bilinear.train_char_lm`) and writes `interpkit/assets/bilinear_char_lm.safetensors` and its `.json`.
"""
import time
import torch
from interpkit.demos.bilinear import CHAR_LM, train_char_lm
from interpkit.train import save_asset

if __name__ == '__main__':
    torch.set_num_threads(2)
    steps, seed = 1000, 0
    t0 = time.time()
    model, _, res = train_char_lm(steps=steps, seed=seed)   # Trained (model, tokenizer, fit); the tokenizer is char_tokenizer(), not saved
    secs = time.time() - t0
    path = save_asset('bilinear_char_lm', model, dict(tiny_lm=CHAR_LM, steps=steps, seed=seed, final_loss=res.final_loss,
                                                     train_seconds=round(secs, 1), data='Shakespeare, 400,000 characters, corpus(seed=0, block=65)',
                                                     recipe='interpkit.demos.bilinear.train_char_lm'))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB): loss {res.history['loss'].iloc[0]:.3f} -> {res.final_loss:.3f} in {secs:.1f} s")
