"""Make the asset of paper 7 (safety heads): `python tools/make_safety_heads_assets.py [steps [threads]]`.

Gives SmolLM2-135M-Instruct a refusal behaviour with LoRA adapters (rank 4 on q/k/v/o of every layer, trained with `peft`
by the recipe `interpkit.papers.safety_heads.train_aligned_lm`: harmful training requests -> refusals, harmless ones -> the
model's own greedy answers), measures refusal rates of the base and the aligned model with the keyword judge, and writes
`interpkit/assets/safety_heads_smollm2_lora.safetensors` (the adapter matrices only, read back from the recipe's FitResult with
`adapter_tensors`) and its `.json` (recipe, rates).
`python tools/make_safety_heads_assets.py rates` re-measures the refusal rates of the shipped adapter (e.g. after the request
sets changed) and rewrites the asset with the same tensors and recipe.

The shipped asset was made (2078 s on 2 shared CPU cores) by this recipe when it was still called `align`; the training code
is the same, so its meta's `recipe` field names the old function.
"""
import sys, time
import torch
from interpkit.models import load_lm
from interpkit.papers.safety_heads import (ALIGNED_LM_ASSET, HARMLESS_TASKS, adapter_tensors, generate, merge_adapter, refusal_rate, requests,
                                           train_aligned_lm)
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

if __name__ == '__main__':
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)  # measured: 1 thread is far faster than 2 when other jobs share the 2 cores
    if sys.argv[1:2] == ['rates']:
        remeasure(); sys.exit()
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
                                                      base_model='smollm2-135m-instruct', recipe='interpkit.papers.safety_heads.train_aligned_lm',
                                                      loss_first10=hist['loss'].iloc[:10].mean(), loss_last20=hist['loss'].iloc[-20:].mean(),
                                                      train_seconds=round(secs, 1), refusal_base=r_base, refusal_aligned=r_aligned,
                                                      judge='interpkit.papers.safety_heads.is_refusal, 16 greedy new tokens',
                                                      adapter_fraction=sum(v.numel() for v in tensors.values()) / n_model))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
