"""Make the asset of paper 16 (ORION): `python tools/make_orion_assets.py`.

Trains the tiny Llama of `nbs/papers/16_orion.ipynb` with `interpkit.demos.orion.train_task_lm` (fixed seed) on task documents
mixed half and half with associative-recall documents, scores it on held-out items, and writes `interpkit/assets/orion_task_lm.safetensors`
with its `.json` (shape, vocabulary, recipe, held-out accuracy).
"""
import time
import torch
from interpkit.papers.orion import DOMAINS, make_items, sweep
from interpkit.demos.orion import TASK_LM, train_task_lm
from interpkit.train import save_tiny_lm

if __name__ == '__main__':
    torch.set_num_threads(1)
    recipe = dict(steps=3000, recall_frac=0.5, n_questions=6, batch_size=32, lr=1e-3, seed=0)
    t0 = time.time()
    model, tokenizer, res = train_task_lm(**recipe)
    secs = time.time() - t0
    held = [it for d in DOMAINS for it in make_items(d, 24, seed=100)]
    base = sweep(model, tokenizer, held, []).base
    meta = dict(tiny_lm=TASK_LM, recipe=dict(recipe, fn='interpkit.demos.orion.train_task_lm'),
                final_loss=res.history.loss.iloc[-100:].mean(), heldout=base.round(4).reset_index().to_dict('records'), train_seconds=round(secs, 1))
    path = save_tiny_lm(model, tokenizer, 'orion_task_lm', meta)   # adds meta['vocab']: the tokenizer's tokens in id order
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB): loss {res.history.loss.iloc[:100].mean():.3f} -> {meta['final_loss']:.3f} in {secs:.0f} s")
    print(base.round(3).to_string())
