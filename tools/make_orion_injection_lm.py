"""Make the injection-following model of paper 16 (ORION): `python tools/make_orion_injection_lm.py`.

Trains the tiny Llama of `nbs/papers/16_orion.ipynb`'s oversight section with `interpkit.demos.orion.train_injection_lm` (fixed
seed): task documents, half of which carry an injected line that their answers obey, mixed half and half with associative-recall
documents. Scores it on fresh items, clean and injected, and writes `interpkit/assets/orion_injection_lm.safetensors` with its `.json`
(shape, vocabulary, recipe, accuracies). `load_injection_lm()` loads it.
"""
import time
import torch
from interpkit.papers.orion import DOMAINS, INJECTIONS, make_items, sweep, oversight
from interpkit.demos.orion import TASK_LM, train_injection_lm
from interpkit.train import save_tiny_lm

RECIPE = dict(steps=3000, inject_frac=0.5, recall_frac=0.5, n_questions=6, batch_size=32, lr=1e-3, seed=0)

def make(recipe=RECIPE, name='orion_injection_lm', folder=None, progress=True):
    "Train with `recipe`, score on fresh items (seed 100), save; return (path, model, tokenizer, meta)."
    t0 = time.time()
    model, tokenizer, res = train_injection_lm(**recipe, progress=progress)
    secs = time.time() - t0
    held = [it for d in DOMAINS for it in make_items(d, 24, seed=100)]
    base = sweep(model, tokenizer, held, []).base
    before = oversight(model, tokenizer, held, 'resid_post(0)', seed=100)   # only the unpatched ('before') rows are kept
    before = before[before.when == 'before'].groupby('kind')[['accuracy', 'followed']].mean()
    meta = dict(tiny_lm={**TASK_LM, **{k: recipe[k] for k in TASK_LM if k in recipe}},
                recipe=dict(recipe, fn='interpkit.demos.orion.train_injection_lm'), heldout=base.round(4).reset_index().to_dict('records'),
                injected=before.round(4).reset_index().to_dict('records'), final_loss=float(res.history.loss.iloc[-100:].mean()), train_seconds=round(secs, 1))
    return save_tiny_lm(model, tokenizer, name, meta, folder), model, tokenizer, meta   # meta['vocab']: the tokenizer's tokens in id order

if __name__ == '__main__':
    torch.set_num_threads(1)
    path, _, _, meta = make()
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB) in {meta['train_seconds']:.0f} s")
    print('clean:', meta['heldout']); print('injected, unpatched:', meta['injected'])
