"""Make the asset of paper 19 (Wasserstein neurons): `python tools/make_wasserstein_assets.py` (~35 minutes on one thread; ~23 with `--reuse-scores`).

On SmolLM2-135M-Instruct with Shakespeare (`interpkit.data.corpus`, 256-token rows, seed 0; the first 32 rows calibrate, the
next 16 are held out) it computes, with `interpkit.papers.wasserstein`:
- `neuron_scores` of every FFN linear (30 blocks x gate/up/down = 109,440 neurons: W1, mean, std, kurtosis, weight-row norm);
- `pruning_harm`: held-out perplexity after SparseGPT-pruning 95% of the weights of the top-3% neurons of every FFN (its gate, up
  and down neurons pooled, as the paper) by W1, |mean|, variance, weight norm, or at random (3 seeds);
- `expansion_sweep`: SparseGPT against Sparse Expansion (16 experts) at 50/70/90% sparsity on the FFN linears of six blocks,
  and the per-neuron relative improvement of expansion at 70% beside each neuron's W1 (`improvement`).
It writes `interpkit/assets/wasserstein_smollm2.safetensors` (per-neuron scores and improvements) and its `.json` (the tables).
Timings on one thread (2026-12): scores ~11 minutes, Hessians ~1.5, harm ~5, expansion ~16. `--reuse-scores` takes the per-neuron
scores from the shipped asset instead of recomputing them (they depend on neither SparseGPT nor the picks; they are stored in
float32, and the picks and the harm table's W1 means are then computed from exactly what ships).

`--stage layer` (~3 minutes) writes `wasserstein_smollm2_layer`: `expansion_by_neuron` on block 17's up_proj at 90% sparsity with 1, 4
and 16 experts, fitted on 64 calibration rows (16,384 tokens, about 1,000 per expert) and measured on 16 held-out rows as well.
`--stage all` (the default) makes both.

`--stage harm` (~7 minutes) recomputes only the Hessians and `pruning_harm` (with the shipped scores) and replaces the harm table in
the shipped `wasserstein_smollm2.json`, keeping its per-neuron tensors and the expansion results as they are; the meta's
`rebuilt` entry says which parts were made when, and with which SparseGPT mask rule.
"""
import argparse, time
import torch
from interpkit.data import corpus
from interpkit.models import load_lm
from interpkit.papers.wasserstein import (expansion_by_neuron, expansion_sweep, ffn_linears, improvement, input_hessians, neuron_scores,
                                          pruning_harm)
from interpkit.demos.wasserstein import EXPANSION_BLOCKS, LAYER_STUDY, load_results
from interpkit.train import load_asset, save_asset

def main(reuse_scores=False):
    t0, log = time.time(), {}
    def tick(what): log[what] = round(time.time() - t0, 1); print(f"{what}: {log[what]:.0f} s", flush=True)
    model, tok = load_lm('smollm2-135m-instruct')
    rows = corpus(48 * 256, tok, block=256, seed=0)
    calib, held = rows[:32], rows[32:48]
    if reuse_scores:
        scores = load_results().scores; tick('scores (shipped)')
        assert list(dict.fromkeys(scores.site)) == list(ffn_linears(model))
    else: scores = neuron_scores(model, calib, batch_size=8, max_bytes=2**32); tick('scores')
    hess = input_hessians(model, calib, batch_size=8); tick('hessians')
    harm = pruning_harm(model, scores, hess, held, frac=0.03, sparsity=0.95); tick('harm'); print(harm)
    sites = [p for p in ffn_linears(model) if int(p.split('.')[2]) in EXPANSION_BLOCKS]
    table, errs = expansion_sweep(model, calib, held, (0.5, 0.7, 0.9), (1, 16), sites=sites, batch_size=8); tick('expansion'); print(table)
    imp = improvement(errs[0.7, 16], scores)
    tensors = {f"{c}": torch.tensor(scores[c].to_numpy(), dtype=torch.float32) for c in ('w1', 'mean', 'std', 'kurtosis', 'weight_norm')}
    tensors.update({f"imp_{c}": torch.tensor(imp[c].to_numpy(), dtype=torch.float32) for c in ('w1', 'ri', 'error', 'sparsegpt_error', 'power')})
    meta = dict(model='smollm2-135m-instruct', data=dict(corpus='shakespeare', block=256, seed=0, calibration_rows=32, held_out_rows=16),
                sites=list(dict.fromkeys(scores.site)), site_sizes=scores.groupby('site', sort=False).size().tolist(),
                imp_sites=list(dict.fromkeys(imp.site)), imp_site_sizes=imp.groupby('site', sort=False).size().tolist(),
                harm=harm.to_dict('list'), expansion=table.to_dict('list'), expansion_blocks=list(EXPANSION_BLOCKS), seconds=log,
                scores_reused=bool(reuse_scores), picks_per='ffn')
    p = save_asset('wasserstein_smollm2', tensors, meta)
    print(f"wrote {p} ({p.stat().st_size / 1e3:.0f} kB) in {time.time() - t0:.0f} s")

def harm_only():
    "Rebuild the harm table alone, from the shipped scores, keeping the rest of the main asset."
    t0 = time.time()
    model, tok = load_lm('smollm2-135m-instruct')
    rows = corpus(48 * 256, tok, block=256, seed=0)
    calib, held = rows[:32], rows[32:48]
    tensors, meta = load_asset('wasserstein_smollm2')
    scores = load_results().scores
    assert list(dict.fromkeys(scores.site)) == list(ffn_linears(model))
    hess = input_hessians(model, calib, batch_size=8)
    harm = pruning_harm(model, scores, hess, held, frac=0.03, sparsity=0.95); print(harm)
    keep = {k: v for k, v in meta.items() if k not in ('name', 'command', 'date', 'versions', 'n_params', 'sha256')}
    rebuilt = dict(keep.get('rebuilt', {}), harm=dict(date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()), seconds=round(time.time() - t0, 1),
                   picks='top 3% per FFN', sparsegpt_mask='official: saliency <= sorted[int(n*s)]'),
                   rest=keep.get('rebuilt', {}).get('rest', dict(date=meta['date'], picks='top 3% per linear', sparsegpt_mask='round(n*s) smallest saliencies')))
    p = save_asset('wasserstein_smollm2', tensors, dict(keep, harm=harm.to_dict('list'), picks_per='ffn', rebuilt=rebuilt))
    print(f"wrote {p} in {time.time() - t0:.0f} s")

def layer():
    t0 = time.time()
    model, tok = load_lm(LAYER_STUDY['model'])
    rows = corpus(96 * 256, tok, block=256, seed=0)
    cal, held = rows[:64], rows[80:96]
    df = expansion_by_neuron(model, cal, held, LAYER_STUDY['site'], LAYER_STUDY['sparsity'], LAYER_STUDY['n_experts'], batch_size=8)
    tensors = {c: torch.tensor(df[c].to_numpy(), dtype=torch.float64 if c in ('w1', 'error', 'held_out_error', 'power', 'held_out_power') else torch.long)
               for c in df.columns}
    meta = dict(LAYER_STUDY, data=dict(corpus='shakespeare', block=256, seed=0, calibration_rows=[0, 64], held_out_rows=[80, 96]),
                seconds=round(time.time() - t0, 1))
    p = save_asset('wasserstein_smollm2_layer', tensors, meta)
    print(f"wrote {p} ({p.stat().st_size / 1e3:.0f} kB) in {time.time() - t0:.0f} s")

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--stage', choices=('all', 'main', 'layer', 'harm'), default='all')
    ap.add_argument('--reuse-scores', action='store_true', help="take the per-neuron scores from the shipped asset (saves ~11 minutes)")
    args = ap.parse_args()
    stage = args.stage
    torch.set_num_threads(1)
    if stage in ('all', 'main'): main(args.reuse_scores)
    if stage in ('all', 'layer'): layer()
    if stage == 'harm': harm_only()
