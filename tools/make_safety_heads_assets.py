"""Make the asset of paper 7 (safety heads): `python tools/make_safety_heads_assets.py [steps [threads]]`.

Gives SmolLM2-135M-Instruct a refusal behaviour with LoRA adapters (rank 4 on q/k/v/o of every layer, trained with `peft`
by the recipe `interpkit.demos.safety_heads.train_aligned_lm`: harmful training requests -> refusals, harmless ones -> the
model's own greedy answers), measures refusal rates of the base and the aligned model with the keyword judge, and writes
`interpkit/assets/safety_heads_smollm2_lora.safetensors` (the adapter matrices only, read back from the recipe's FitResult with
`adapter_tensors`) and its `.json` (recipe, rates).
`python tools/make_safety_heads_assets.py rates` re-measures the refusal rates of the shipped adapter (e.g. after the request
sets changed) and rewrites the asset with the same tensors and recipe.
`python tools/make_safety_heads_assets.py sweep [k [n_random]]` writes `interpkit/assets/safety_heads_head_sweep.{safetensors,json}`:
on the aligned model, Ships of every head on the notebook's 12 attribution requests (the tensor `ships`), Sahara's three heads
among the top 20, and, for each of the `k` (20) heads with the largest Ships ablated alone, for the Ships top-3 and Sahara sets,
and for `n_random` (10) random single heads and random triples, the held-out outcomes of `ablation_outcomes` (12 greedy tokens;
answered harmful, refused harmless, harmless changed) with their replies, in the JSON. The notebook shows this table (the
specificity of each head: refusals removed on harmful requests minus harmless replies changed) and recomputes a few rows live.

The shipped asset was made (2078 s on 2 shared CPU cores) by this recipe when it was still called `align`; the training code
is the same, so its meta's `recipe` field names the old function.
"""
import random, sys, time
import pandas as pd, torch
from interpkit.hooks import layout
from interpkit.models import load_lm
from interpkit.papers.safety_heads import ablation_outcomes, generate, harmful_batch, refusal_rate, sahara, ships
from interpkit.demos.safety_heads import (ALIGNED_LM_ASSET, HARMFUL_TASKS, HARMLESS_TASKS, REQUEST_TEMPLATES, adapter_tensors, load_aligned_lm, merge_adapter,
                                          requests, train_aligned_lm)
from interpkit.train import load_asset, save_asset

def rates(model, tokenizer, n_tokens=16):
    "Refusal rates on the four request sets (train sets: their first template only)."
    sets = {'harmful_train': requests('harmful')[:24], 'harmful_test': requests('harmful', 'test'),
            'harmless_train': requests('harmless')[:24], 'harmless_test': requests('harmless', 'test')}
    return {k: refusal_rate(generate(model, tokenizer, v, n_tokens)) for k, v in sets.items()}

def remeasure():
    "Recompute the refusal rates of the shipped adapter and rewrite its asset (same tensors, same recipe)."
    tensors, meta = load_asset(ALIGNED_LM_ASSET)
    base, tokenizer = load_lm()
    r_base, r_aligned = rates(base, tokenizer), rates(merge_adapter(base, tensors, meta['scaling']), tokenizer)
    print('refusal rates, base:', r_base, '\naligned:', r_aligned, flush=True)
    keep = {k: v for k, v in meta.items() if k not in ('name', 'command', 'date', 'versions', 'n_params', 'sha256')}
    path = save_asset(ALIGNED_LM_ASSET, tensors, dict(keep, refusal_base=r_base, refusal_aligned=r_aligned, rates_remeasured=True))
    print(f"rewrote {path}")

SWEEP_ASSET, N_TOK = 'safety_heads_head_sweep', 12

def attribution_requests():
    "The notebook's 12 harmful training requests that Ships and Sahara score heads on: every other task, the training templates in turn."
    tps = REQUEST_TEMPLATES['train']
    return [tps[i % len(tps)].format(t=t) for i, t in enumerate(HARMFUL_TASKS['train'][::2])]

def random_sets(lay, n):
    "The notebook's random baselines: single heads from `random.Random(s)`, triples from `random.Random(100 + s)`, s = 0..n-1."
    every = [(l, h) for l in range(lay.n_layers) for h in range(lay.n_heads)]
    return {**{f'random 1, seed {s}': random.Random(s).sample(every, 1) for s in range(n)},
            **{f'random 3, seed {s}': random.Random(100 + s).sample(every, 3) for s in range(n)}}

def sweep(k=20, n_random=10):
    "Ships, Sahara and the held-out outcomes of single heads, the top sets and random heads on the aligned model; writes the sweep asset."
    t0 = time.time()
    model, tokenizer, _ = load_aligned_lm()
    lay = layout(model)
    batch = harmful_batch(tokenizer, attribution_requests())
    S = ships(model, batch)
    order = sorted(((l, h) for l in range(lay.n_layers) for h in range(lay.n_heads)), key=lambda lh: -S[lh].item())
    sah = sahara(model, batch, budget=3, candidates=order[:20])
    print(f"Ships and Sahara in {time.time() - t0:.0f} s; top heads {order[:5]}, Sahara {sah}", flush=True)
    harm, safe = requests('harmful', 'test'), requests('harmless', 'test')
    aligned = ablation_outcomes(model, tokenizer, harm, {'none': []}, harmless=safe, max_new_tokens=N_TOK)
    own = aligned.replies['none']['harmless']
    sets = {**{f'L{l}H{h}': [(l, h)] for l, h in order[:k]}, 'Ships top-3': order[:3], 'Sahara (3)': sah.heads, **random_sets(lay, n_random)}
    tables, replies = [aligned.table], dict(aligned.replies)
    for i, (name, hs) in enumerate(sets.items()):
        o = ablation_outcomes(model, tokenizer, harm, {name: hs}, harmless=safe, max_new_tokens=N_TOK, own=own)
        tables.append(o.table); replies.update(o.replies)
        print(f"[{i + 1}/{len(sets)}] {name}: {o.table.iloc[0].round(3).to_dict()} ({time.time() - t0:.0f} s)", flush=True)
    table = pd.concat(tables)
    print(table.round(3).to_string(), flush=True)
    meta = dict(n_tokens=N_TOK, k=k, n_random=n_random, attribution_requests=attribution_requests(), harmful=harm, harmless=safe,
                order=[list(lh) for lh in order[:k]], sahara=dict(heads=[list(lh) for lh in sah.heads], angles=sah.angles),
                heads={name: [list(lh) for lh in sorted(hs)] for name, hs in {'none': [], **sets}.items()},
                table={name: {c: float(v) for c, v in row.items()} for name, row in table.to_dict(orient='index').items()},
                replies=replies, seconds=round(time.time() - t0, 1), threads=torch.get_num_threads(),
                how='scale_query, eps 1e-4, at every position of prompt and reply', judge='interpkit.papers.safety_heads.is_refusal')
    path = save_asset(SWEEP_ASSET, {'ships': S.double().cpu()}, meta)
    print(f"wrote {path} and its .json in {time.time() - t0:.0f} s")

if __name__ == '__main__':
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] != 'sweep' else 1)  # measured: 1 thread is far faster than 2 when other jobs share the 2 cores
    if sys.argv[1:2] == ['rates']:
        remeasure(); sys.exit()
    if sys.argv[1:2] == ['sweep']:
        sweep(*map(int, sys.argv[2:4])); sys.exit()
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    base, tokenizer = load_lm()
    # CPU budget (2 shared cores): 60 steps, own answers of 12 tokens to the first three training templates' harmless requests
    recipe = dict(steps=steps, batch_size=8, lr=2e-3, seed=0, rank=4, alpha=8., targets=['q_proj', 'k_proj', 'v_proj', 'o_proj'], max_len=64,
                  answer_tokens=12)
    harmless = requests('harmless')[:3 * len(HARMLESS_TASKS['train'])]
    t0 = time.time()
    aligned, _, res = train_aligned_lm(base, tokenizer, harmless=harmless, **recipe)
    secs = time.time() - t0
    tensors, hist = adapter_tensors(res), res.history
    print(f"loss {hist['loss'].iloc[:10].mean():.3f} (first 10 steps) -> {hist['loss'].iloc[-20:].mean():.3f} (last 20), {secs:.0f} s", flush=True)
    r_base, r_aligned = rates(base, tokenizer), rates(aligned, tokenizer)
    print('refusal rates, base:', r_base, '\naligned:', r_aligned, flush=True)
    n_model = sum(p.numel() for p in base.parameters())
    path = save_asset(ALIGNED_LM_ASSET, tensors, dict(recipe, scaling=recipe['alpha'] / recipe['rank'], n_harmful=len(requests('harmful')), n_harmless=len(harmless),
                                                      base_model='smollm2-135m-instruct', recipe='interpkit.demos.safety_heads.train_aligned_lm',
                                                      loss_first10=hist['loss'].iloc[:10].mean(), loss_last20=hist['loss'].iloc[-20:].mean(),
                                                      train_seconds=round(secs, 1), refusal_base=r_base, refusal_aligned=r_aligned,
                                                      judge='interpkit.papers.safety_heads.is_refusal, 16 greedy new tokens',
                                                      adapter_fraction=sum(v.numel() for v in tensors.values()) / n_model))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
