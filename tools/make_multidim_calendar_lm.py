"""Make the toy model of paper 18 (multi-dimensional features): `python tools/make_multidim_calendar_lm.py`.

Trains the tiny Llama of `nbs/papers/18_multidim.ipynb` with `interpkit.demos.multidim.train_calendar_lm` (fixed seed) on
day and month arithmetic mixed with neighbour sentences, scores it on the training facts and on the facts held out of training,
and writes `interpkit/assets/multidim_calendar_lm.safetensors` with its `.json` (shape, vocabulary, recipe, accuracies).
`load_calendar_lm()` loads it.
"""
import time
import torch
from interpkit.papers.multidim import calendar_accuracy
from interpkit.demos.multidim import CALENDAR_LM, calendar_split, train_calendar_lm
from interpkit.train import save_tiny_lm

RECIPE = dict(steps=4000, near_frac=0.3, test_frac=0.2, batch_size=32, lr=1e-3, weight_decay=1.0, seed=0)

def make(recipe=RECIPE, name='multidim_calendar_lm', folder=None, progress=True):
    "Train with `recipe`, score, save; return (path, model, tokenizer, meta)."
    t0 = time.time()
    model, tokenizer, res = train_calendar_lm(**recipe, progress=progress)
    secs = time.time() - t0
    train, held = calendar_split(recipe['test_frac'], recipe['seed'])
    acc = {'train': calendar_accuracy(model, tokenizer, train).round(4).to_dict(), 'heldout': calendar_accuracy(model, tokenizer, held).round(4).to_dict()}
    meta = dict(tiny_lm={**CALENDAR_LM, **{k: recipe[k] for k in CALENDAR_LM if k in recipe}},
                recipe=dict(recipe, fn='interpkit.demos.multidim.train_calendar_lm'), accuracy=acc, n_heldout=len(held),
                final_loss=float(res.history.loss.iloc[-100:].mean()), train_seconds=round(secs, 1))
    return save_tiny_lm(model, tokenizer, name, meta, folder), model, tokenizer, meta

if __name__ == '__main__':
    torch.set_num_threads(1)
    path, _, _, meta = make()
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB) in {meta['train_seconds']:.0f} s: accuracy {meta['accuracy']}")
