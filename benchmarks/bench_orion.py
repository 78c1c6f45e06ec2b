"""Cost of a request-patching layer sweep (`interpkit.papers.orion.request_patch`) on SmolLM2-135M-Instruct, against the
plain way of doing it: one full forward pass of the destination prompts per patched site.

usage: python benchmarks/bench_orion.py [--items 3] [--layers 30] [--repeats 1] [--threads 1] [--batch-size 16]

`request_patch` runs the source prompts once (capturing every site at the last position), the destination prefix once
with a key-value cache, and then one single-token step per site. The reference runs, per site, a full forward of the
destination prompts with the last position patched (`interpkit.hooks.patch`). Both give the same logits (checked before
timing); the script prints the median time of each over `--repeats` interleaved rounds, their ratio, and the
marginal cost of one more site (request_patch timed again with a single site).
"""
import argparse, os, statistics, time
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import torch
from interpkit.hooks import capture, patch, layout
from interpkit.models import encode_left, load_lm
from interpkit.papers.orion import DOMAINS, make_items, prompt, request_patch

def full_forward_sweep(model, src, dst, sites):
    "Reference: one full forward of `dst` per site, with the site's last position taken from `src`."
    with torch.no_grad():
        with capture(model, sites, positions=-1) as cache: model(**src, logits_to_keep=1)
        out = {}
        for s in sites:
            with patch(model, {s: cache[s]}, positions=-1): out[s] = model(**dst, logits_to_keep=1).logits[:, -1].clone()  # a copy: a view would keep every position's logits alive
    return out

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--items', type=int, default=3, help='items per domain')
    ap.add_argument('--layers', type=int, default=30, help='layers swept (3 sites each)')
    ap.add_argument('--repeats', type=int, default=1)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--batch-size', type=int, default=16, help='prompt pairs per forward pass of request_patch')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tokenizer = load_lm()
    n = min(a.layers, layout(model).n_layers)
    sites = [f'{s}({l})' for l in range(n) for s in ('resid_post', 'attn_out', 'mlp_out')]
    items = [it for d in DOMAINS for it in make_items(d, a.items, n_keys=2, seed=0)]
    src = encode_left(tokenizer, [prompt(tokenizer, it.domain, it.c1, it.r1) for it in items])
    dst = encode_left(tokenizer, [prompt(tokenizer, it.domain, it.c2, it.r2) for it in items])
    print(f"{len(items)} prompt pairs of {src['input_ids'].shape[1]} and {dst['input_ids'].shape[1]} tokens, {len(sites)} sites, {a.threads} thread(s)")
    fast, ref = request_patch(model, src, dst, sites, batch_size=a.batch_size), full_forward_sweep(model, src, dst, sites)
    err = max((fast.patched[s] - ref[s]).abs().max().item() for s in sites)
    print(f"max |logit difference| between the two: {err:.2e}")
    runs = {'request_patch (cached prefix)': lambda: request_patch(model, src, dst, sites, batch_size=a.batch_size),
            'request_patch, one site': lambda: request_patch(model, src, dst, sites[:1], batch_size=a.batch_size),
            'one full forward per site': lambda: full_forward_sweep(model, src, dst, sites)}
    times = {k: [] for k in runs}
    for _ in range(a.repeats):
        for name, fn in runs.items():
            t = time.perf_counter(); fn(); times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items(): print(f"{k:32s} {v:7.2f} s")
    per_site = (med['request_patch (cached prefix)'] - med['request_patch, one site']) / max(1, len(sites) - 1)
    print(f"one more site: {per_site * 1e3:.0f} ms with request_patch, {med['one full forward per site'] / len(sites) * 1e3:.0f} ms with a full forward")
    print(f"speed-up of the sweep: {med['one full forward per site'] / med['request_patch (cached prefix)']:.1f}x")
