"""Make the asset of paper 19 (Wasserstein neurons): `python tools/make_wasserstein_assets.py` (~25 minutes on one thread).

On SmolLM2-135M-Instruct with Shakespeare (`interpkit.data.corpus`, 256-token rows, seed 0; the first 32 rows calibrate, the
next 16 are held out) it computes, with `interpkit.papers.wasserstein`:
- `neuron_scores` of every FFN linear (30 blocks x gate/up/down = 109,440 neurons: W1, mean, std, kurtosis, weight-row norm);
- `pruning_harm`: held-out perplexity after SparseGPT-pruning 95% of the weights of the top-3% neurons of every FFN linear by W1,
  |mean|, variance, weight norm, or at random (3 seeds);
- `expansion_sweep`: SparseGPT against Sparse Expansion (16 experts) at 50/70/90% sparsity on the FFN linears of six blocks,
  and the per-neuron relative improvement of expansion at 70% beside each neuron's W1 (`improvement`).
It writes `interpkit/assets/wasserstein_smollm2.safetensors` (per-neuron scores and improvements) and its `.json` (the tables).

`--stage layer` (~3 minutes) writes `wasserstein_smollm2_layer`: `expansion_by_neuron` on block 17's up_proj at 90% sparsity with 1, 4
and 16 experts, fitted on 64 calibration rows (16,384 tokens, about 1,000 per expert) and measured on 16 held-out rows as well.
`--stage all` (the default) makes both.
"""
import argparse, time
import torch
from interpkit.data import corpus
from interpkit.models import load_lm
from interpkit.papers.wasserstein import (EXPANSION_BLOCKS, LAYER_STUDY, expansion_by_neuron, expansion_sweep, ffn_linears, improvement,
                                          input_hessians, neuron_scores, pruning_harm)
from interpkit.train import save_asset

def main():
    t0, log = time.time(), {}
    def tick(what): log[what] = round(time.time() - t0, 1); print(f"{what}: {log[what]:.0f} s", flush=True)
    model, tok = load_lm('smollm2-135m-instruct')
    rows = corpus(48 * 256, tok, block=256, seed=0)
    calib, held = rows[:32], rows[32:48]
    scores = neuron_scores(model, calib, batch_size=8, max_bytes=2**32); tick('scores')
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
                harm=harm.to_dict('list'), expansion=table.to_dict('list'), expansion_blocks=list(EXPANSION_BLOCKS), seconds=log)
    p = save_asset('wasserstein_smollm2', tensors, meta)
    print(f"wrote {p} ({p.stat().st_size / 1e3:.0f} kB) in {time.time() - t0:.0f} s")

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
    ap.add_argument('--stage', choices=('all', 'main', 'layer'), default='all')
    stage = ap.parse_args().stage
    torch.set_num_threads(1)
    if stage in ('all', 'main'): main()
    if stage in ('all', 'layer'): layer()
