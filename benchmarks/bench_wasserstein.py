"""Speed of the two kernels of `interpkit.papers.wasserstein`, side by side with what a user would otherwise write.

usage: python benchmarks/bench_wasserstein.py [--neurons 256] [--tokens 8192] [--threads 1]

1. W1 of each neuron's standardised outputs to N(0, 1): `w1_gaussian` (exact, and the quantile formula) against scipy's
   `stats.wasserstein_distance` between each neuron's sample and a 200,000-point Gaussian reference sample (one call per
   neuron), on Laplace samples (heavy-tailed, as a Wasserstein neuron). Reports time per neuron and the largest
   difference between the methods.
2. SparseGPT of a SmolLM2-sized layer (1536 x 576, and 16 experts at once, as Sparse Expansion runs them) from a
   Hessian of inputs with outlier features: time, and the output error against magnitude pruning at the same sparsity.
"""
import argparse, time
import numpy as np, torch
from scipy import stats
from interpkit.papers.wasserstein import _sparsegpt, sparsegpt, standardize, w1_gaussian

def timed(fn, repeats=3):
    ts = []
    for _ in range(repeats):
        t = time.perf_counter(); out = fn(); ts.append(time.perf_counter() - t)
    return out, float(np.median(ts))

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--neurons', type=int, default=256); ap.add_argument('--tokens', type=int, default=8192); ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.distributions.Laplace(0., 1.).sample((a.tokens, a.neurons)).double()
    exact, t_exact = timed(lambda: w1_gaussian(x))
    quant, t_quant = timed(lambda: w1_gaussian(x, 'quantile'))
    ref = np.random.default_rng(0).standard_normal(200_000)
    z = standardize(x).numpy()
    sci, t_sci = timed(lambda: np.array([stats.wasserstein_distance(z[:, j], ref) for j in range(a.neurons)]), repeats=1)
    print(f"W1 of {a.neurons} neurons x {a.tokens} tokens ({a.threads} thread(s))")
    print(f"  {'method':<44}{'ms / neuron':>12}{'max |diff| to exact':>22}")
    for name, t, v in (('interpkit w1_gaussian exact', t_exact, exact.numpy()), ('interpkit w1_gaussian quantile', t_quant, quant.numpy()),
                       ('scipy wasserstein_distance vs 200k sample', t_sci, sci)):
        print(f"  {name:<44}{1e3 * t / a.neurons:>12.3f}{np.abs(v - exact.numpy()).max():>22.2e}")
    X = torch.randn(a.tokens, 576, generator=g, dtype=torch.float64) * torch.randn(576, generator=g, dtype=torch.float64).exp()
    W = torch.randn(1536, 576, generator=g, dtype=torch.float64) / 24
    H = X.T @ X / len(X)
    pruned, t_one = timed(lambda: sparsegpt(W, H, 0.7), repeats=1)
    _, t_16 = timed(lambda: _sparsegpt(W[None].expand(16, -1, -1), H[None].expand(16, -1, -1), 0.7, None, None, 128, 0.01), repeats=1)
    mag = W * (W.abs() > W.abs().flatten().kthvalue(round(0.7 * W.numel())).values)
    err = lambda V: float(((X @ (W - V).T) ** 2).mean())
    print(f"SparseGPT of a 1536 x 576 layer at 70%: {t_one:.2f} s (16 experts in one sweep: {t_16:.2f} s, {t_16 / t_one:.1f}x one); "
          f"output error {err(pruned):.4g} against {err(mag):.4g} for magnitude pruning")
