"""RMU along unlearning runs, per layer, on the shipped model of `nbs/papers/05_g_effect.ipynb`: `python tools/g_effect_rmu_runs.py`.

The notebook measures RMU's first step only (its G-effects at the original weights, per layer). This script runs the notebook's
protocol (AdamW at 1e-4, batches of 8 forget questions, at most 150 steps, stop when the forget NLL reaches 1 nat, three batch seeds)
with RMU at hidden_states 1-4 and with GA, and prints the steps each needed and the retain NLL when the forget NLL reached 1 nat
(`retain_at`). About 2 minutes on one thread; its numbers are quoted in the notebook's "Differences from the paper".
"""
import time
import pandas as pd, torch
from interpkit.models import encode_queries
from interpkit.papers.g_effect import objective, retain_at, unlearn
from interpkit.demos.g_effect import author_qa, load_qa_lm

if __name__ == '__main__':
    torch.set_num_threads(1)
    t0 = time.time()
    model, tokenizer, meta = load_qa_lm()
    qa = author_qa(**meta['author_qa'])
    forget, retain = (encode_queries(tokenizer, *qa.pairs(ix)) for ix in (qa.forget, qa.retain))
    objs = {'GA': objective('ga'), **{f'RMU hidden_states[{l}]': objective('rmu', layer=l) for l in range(1, model.config.num_hidden_layers + 1)}}
    rows = []
    for label, obj in objs.items():
        for seed in range(3):
            h = unlearn(model, obj, forget, retain, steps=150, lr=1e-4, measure_every=2, g_effect_every=None, stop_at=1.0, seed=seed).history
            rows.append(dict(objective=label, seed=seed, steps=int(h['step'].iloc[-1]), retain_nll_at_1=retain_at(h, 1.0)))
    df = pd.DataFrame(rows)
    table = df.groupby('objective', sort=False).agg(steps_mean=('steps', 'mean'), retain_mean=('retain_nll_at_1', 'mean'),
                                                    retain_min=('retain_nll_at_1', 'min'), retain_max=('retain_nll_at_1', 'max'))
    print(df.to_string(index=False, float_format=lambda v: f'{v:.4f}'))
    print(table.to_string(float_format=lambda v: f'{v:.4f}'))
    print(f'{time.time() - t0:.0f} s')
