"""Overhead of capturing every `resid_post` of SmolLM2-135M-Instruct (8 x 128 tokens, torch.no_grad, CPU):
plain forward vs `interpkit.hooks.capture` vs nnsight 0.8 vs TransformerLens 4.x `TransformerBridge`.

usage: python benchmarks/bench_hooks.py [--repeats 7] [--batch 8] [--seq 128] [--threads N]

Runs are interleaved (each round times every method once, in a rotating order) and the median is reported with
its overhead against the plain forward, both as a ratio of medians and as the median of the per-round ratios
(which cancels slow drifts in machine load). A second, small input (1x8 tokens) shows each library's fixed cost per forward. nnsight and transformer-lens are optional (`pip install -e ".[bench]"`);
a reference that is missing or fails is reported and skipped. Each reference gets its own deep copy of the model,
because both wrap the model they are given. Before timing, the captured tensors of all methods are compared.
"""
import argparse, copy, os, statistics, sys, time, traceback, warnings
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_NO_ADVISORY_WARNINGS', '1')
import torch
from interpkit.models import load_lm
from interpkit.hooks import capture, resid_post, layout

HF_NAME = 'HuggingFaceTB/SmolLM2-135M-Instruct'

def make_methods(model, tok, ids):
    "{name: fn(ids) -> list of resid_post tensors (or logits for 'plain')}, and {name: reason} for references that failed."
    n = layout(model).n_layers
    sites = [resid_post(l) for l in range(n)]
    methods, failed = {}, {}

    def plain(ids): return [model(ids).logits]
    def interpkit_(ids):
        with capture(model, sites) as c: model(ids)
        return [c[s] for s in sites]
    methods['plain'], methods['interpkit'] = plain, interpkit_

    try:
        from nnsight import LanguageModel
        warnings.filterwarnings('ignore', message='LanguageModel is deprecated')  # 0.8.1 prefers TransformersModel(repo_id): we pass a loaded model
        lm = LanguageModel(copy.deepcopy(model), tokenizer=tok)
        def nnsight_(ids):
            saved = []  # filled inside the trace (nnsight runs the block's source itself: mutate, do not assign)
            with lm.trace(ids):
                for l in range(n): saved.append(lm.model.layers[l].output.save())
            return [s[0] if isinstance(s, tuple) else s for s in saved]
        nnsight_(ids)  # the first trace compiles; fail here rather than in the timing loop
        methods['nnsight'] = nnsight_
    except Exception as e:
        failed['nnsight'] = f'{type(e).__name__}: {e}'; traceback.print_exc()

    try:
        from transformer_lens.model_bridge import TransformerBridge
        bridge = TransformerBridge.boot_transformers(HF_NAME, hf_model=copy.deepcopy(model), tokenizer=tok)
        names = [f'blocks.{l}.hook_resid_post' for l in range(n)]
        keep = set(names)
        def tlens(ids):
            _, cache = bridge.run_with_cache(ids, names_filter=lambda name: name in keep)
            return [cache[k] for k in names]
        def tlens_plain(ids): return [bridge(ids)]
        tlens(ids)
        methods['transformer-lens'] = tlens
        methods['tl bridge, no hooks'] = tlens_plain  # the bridge runs its copy with eager attention: its own baseline
    except Exception as e:
        failed['transformer-lens'] = f'{type(e).__name__}: {e}'; traceback.print_exc()
    return methods, failed

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--repeats', type=int, default=7)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--seq', type=int, default=128)
    ap.add_argument('--threads', type=int, default=0, help='torch threads; 0 keeps the default')
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    model, tok = load_lm()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=g)
    with torch.no_grad():
        methods, failed = make_methods(model, tok, ids)
        ref = methods['interpkit'](ids)
        for name in methods:  # every method sees the same activations
            if name in ('plain', 'interpkit', 'tl bridge, no hooks'): continue
            got = methods[name](ids)
            err = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item() for x, y in zip(got, ref))
            print(f'{name}: max |difference| / max |activation| against interpkit, over {len(ref)} resid_post tensors: {err:.1e}')
        small = ids[:1, :8]
        print(f"\nSmolLM2-135M-Instruct, torch {torch.__version__}, {torch.get_num_threads()} threads; capture of all {layout(model).n_layers} resid_post")
        report(f'{a.batch}x{a.seq} tokens, {a.repeats} interleaved repeats', time_methods(methods, ids, a.repeats), 's')
        report(f'1x8 tokens (fixed cost per forward), {3 * a.repeats} interleaved repeats', time_methods(methods, small, 3 * a.repeats), 'ms')
    for k, why in failed.items(): print(f"{k:20} not measured: {why}")

def time_methods(methods, ids, repeats):
    "{name: [seconds per run]}, runs interleaved in a rotating order after one warm-up each."
    times, order = {k: [] for k in methods}, list(methods)
    for k in order: methods[k](ids)
    for r in range(repeats):
        for k in order[r % len(order):] + order[:r % len(order)]:
            t0 = time.perf_counter(); methods[k](ids); times[k].append(time.perf_counter() - t0)
    return times

def report(title, times, unit):
    "Print medians, minima, and overheads against 'plain': of the medians, and the median of per-round ratios."
    f = 1 if unit == 's' else 1e3
    base = statistics.median(times['plain'])
    print(f"\n{title}")
    print(f"{'method':20} {'median '+unit:>10} {'min '+unit:>8} {'overhead':>9} {'paired':>8}")
    for k, ts in times.items():
        med = statistics.median(ts)
        paired = statistics.median(t / p for t, p in zip(ts, times['plain'])) - 1
        print(f"{k:20} {med*f:10.3f} {min(ts)*f:8.3f} {100 * (med / base - 1):+8.1f}% {100 * paired:+7.1f}%")

if __name__ == '__main__': main()
