"""Peak memory of TrackStar's per-example gradients on SmolLM2-135M-Instruct against a plain backward pass and a forward pass.

usage: python benchmarks/bench_trackstar_memory.py [--batch 8] [--tokens 256]

Each mode runs in a fresh subprocess (one torch thread) and reports the growth of the peak resident set size over what the
process held after a warm-up call on one example, so the number is the call's own working memory:
  forward      the per-example losses under torch.no_grad()
  plain        the same losses, then torch.autograd.grad to every parameter (a training step without the optimizer)
  trackstar    `example_grads`: two-sided 16 x 16 per module, projected inside the backward pass, autograd asked for the
               input embeddings' gradient only
  all-at-once  the same, but autograd asked for every module's output gradient (returned together at the end)
"""
import argparse, os, resource, subprocess, sys, time
os.environ.setdefault('HF_HUB_OFFLINE', '1')

def worker(mode, batch, tokens):
    import torch
    torch.set_num_threads(1)
    import interpkit.grads as grads
    import interpkit.papers.trackstar as ts
    from interpkit.data import shakespeare_docs
    from interpkit.models import encode_texts, load_lm
    lm, tok = load_lm()
    docs = [d.replace('\n', ' ') for d in shakespeare_docs(words=2 * tokens)[:batch]]
    b = encode_texts(tok, docs, max_len=tokens)
    proj = grads.make_projection(grads.grad_modules(lm))
    if mode == 'all-at-once': grads._root_site = lambda m: None   # without the engine's root site every layer's output gradient is kept to the end of the backward pass
    def run(x):
        if mode == 'forward':
            with torch.no_grad(): ts.example_losses(lm, x, batch_size=batch)
        elif mode == 'plain': torch.autograd.grad(ts.example_losses(lm, x, batch_size=batch).sum(), list(lm.parameters()))
        else: ts.example_grads(lm, x, proj, batch_size=batch)
    run({k: v[:1] for k, v in b.items()})
    r0, t = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.time()
    run(b)
    print(f"{(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - r0) / 1024:.0f} {time.time() - t:.2f} {tuple(b['input_ids'].shape)}")

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--batch', type=int, default=8); ap.add_argument('--tokens', type=int, default=256)
    ap.add_argument('--worker', default=None)
    a = ap.parse_args()
    if a.worker: worker(a.worker, a.batch, a.tokens); sys.exit()
    print(f"| mode | peak growth (MB) | per example (MB) | seconds |\n|---|---|---|---|")
    for mode in ('forward', 'plain', 'trackstar', 'all-at-once'):
        out = subprocess.run([sys.executable, __file__, '--worker', mode, '--batch', str(a.batch), '--tokens', str(a.tokens)], capture_output=True, text=True,
                             env={**os.environ, 'OMP_NUM_THREADS': '1'}).stdout.split()
        mb, secs, shape = float(out[0]), float(out[1]), ' '.join(out[2:])
        print(f"| {mode} | {mb:.0f} | {mb / a.batch:.0f} | {secs:.1f} |")
    print(f"SmolLM2-135M-Instruct, batch {a.batch} x {a.tokens} tokens, one thread")
