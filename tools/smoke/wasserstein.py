"Smoke checks of interpkit.papers.wasserstein (and interpkit.demos.wasserstein, whose loader has nothing device-specific): W1 to N(0, 1), neuron scores and picks, Hessians and row pruning (Llama, GPT-2's Conv1D), SparseGPT (unstructured, N:M, rows, fixed mask), Sparse Expansion of one layer and of a model, perplexity and the experiments."
import math
import torch
from _util import lm, on, finite, ids, untouched
from interpkit.hooks import weight_matrix
from interpkit.papers.wasserstein import (ExpandedLinear, collect, expand_linear, expansion_by_neuron, expansion_sweep, ffn_linears, improvement, input_hessians, neuron_scores,
                                          perplexity, pick_neurons, prune_neurons, pruning_harm, sparsegpt, sparsify, standardize, w1_gaussian)

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'Sparsified': 'made by sparsify', 'ShippedResults': 'made by load_results',
    'load_results': 'loads the shipped SmolLM2 results (tables on the CPU), no model',
    'FFNLinears': 'made by ffn_linears', 'InputHessians': 'made by input_hessians', 'NeuronPicks': 'made by pick_neurons', 'w1_by_layer': 'pandas on a scores table, no model',
    'plot_w1_layers': 'matplotlib on a scores table, no model', 'plot_neuron': "matplotlib on one neuron's values (standardised in float64 on the CPU)",
}

def data(n=6, t=10, seed=0):
    "Token ids with a right-padded attention mask (on the CPU: the library moves them)."
    b = dict(input_ids=ids(n, t, seed=seed), attention_mask=torch.ones(n, t, dtype=torch.long))
    b['attention_mask'][1, t // 2:] = 0; b['attention_mask'][3, t - 2:] = 0
    return b

def on_model(m, device, dtype, what):
    "Every parameter of `m` on `device` in `dtype`, finite."
    for n, p in m.named_parameters():
        assert p.device.type == device.type and p.dtype == dtype, f"{what}: {n} is {p.dtype} on {p.device}"
        finite(p.detach(), f"{what}: {n}")

def checks(device, dtype):
    calib, held = data(), data(4, 8, seed=1)
    def model(arch='llama'): return lm(arch, device, dtype, n_layers=2, d_model=32)

    def w1():
        x = torch.distributions.Gamma(2.0, 1.0).sample((500, 6)).to(device, dtype)
        z = on(standardize(x), device, 'standardised values')
        w = on(w1_gaussian(x), device, 'W1 exact'); q = on(w1_gaussian(x, 'quantile'), device, 'W1 quantile')
        assert z.dtype == torch.float64 and w.shape == (6,)
        assert ((w - q).abs() < 0.05).all(), f"exact {w.tolist()} vs quantile {q.tolist()}"
        g = on(w1_gaussian(torch.randn(20_000, device=device).to(dtype)), device, 'W1 of a Gaussian')
        return f"gamma(2) W1 {w.mean():.3f} (quantile {q.mean():.3f}), Gaussian {float(g):.4f}"

    def scores():
        out = []
        for arch in ('llama', 'gpt2'):
            m = model(arch)
            with untouched(m):
                sites = list(ffn_linears(m))
                seen = []
                collect(m, calib, sites[:2], lambda o: seen.extend(on(t, device, f'{arch} collected') for t in o.values()), batch_size=4)
                sc = neuron_scores(m, calib, batch_size=4)
                finite(sc[['w1', 'mean', 'std', 'kurtosis', 'weight_norm']].to_numpy(dtype=float, copy=True), f'{arch} neuron scores')
                picks = {by: pick_neurons(sc, by, 0.05, seed=1) for by in ('w1', 'mean', 'variance', 'magnitude', 'random')}
                Hs = input_hessians(m, calib, batch_size=4)
                for s, H in Hs.items(): finite(H, f'{arch} Hessian {s}')
                pruned = prune_neurons(m, Hs, picks['w1'], sparsity=0.9)
                on_model(pruned, device, dtype, f'{arch} pruned')
                W = weight_matrix(pruned.get_submodule(sites[0]))[picks['w1'][sites[0]].to(device)]
                assert (W == 0).float().mean() >= 0.85, f'{arch} pruned rows hold {(W == 0).float().mean():.2f} zeros'
                ppl = perplexity(pruned, held, batch_size=2)
                assert math.isfinite(ppl)
            out.append(f"{arch} {len(sc)} neurons, W1 mean {sc.w1.mean():.3f}, pruned ppl {ppl:.1f}")
        return ', '.join(out)

    def sparse():
        g = torch.Generator().manual_seed(0)
        X = (torch.randn(300, 4, generator=g) @ torch.randn(4, 64, generator=g) + torch.randn(300, 64, generator=g)).to(device)
        H = X.T @ X / len(X)
        W = torch.randn(16, 64, generator=g).to(device, dtype)
        s = on(sparsegpt(W, H, 0.5), device, 'unstructured')
        assert s.dtype == dtype and int((s == 0).sum()) == 513, f"{int((s == 0).sum())} zeros, not 513"   # one block of 1,024: the official rule prunes int(n s) + 1
        nm = on(sparsegpt(W, H, n_m=(2, 4), blocksize=32), device, '2:4')
        assert ((nm == 0).view(16, -1, 4).sum(-1) == 2).all(), '2:4 pattern'
        r = on(sparsegpt(W, H, 0.75, rows=[0, 5]), device, 'rows')
        assert torch.equal(r[1:5], W[1:5]), 'rows not picked changed'
        mask = torch.rand(16, 64, generator=g).to(device) < 0.3
        fm = on(sparsegpt(W, H.double(), mask=mask, blocksize=24), device, 'fixed mask')
        assert torch.equal(fm == 0, mask), 'fixed mask'
        err = lambda Wh: float(((X @ (W - Wh).float().T) ** 2).sum())
        mag = W.clone(); mag.view(-1)[W.float().abs().flatten().argsort()[:512]] = 0
        return f"reconstruction error SparseGPT / magnitude {err(s) / err(mag):.3f}"

    def expansion():
        m = model()
        with untouched(m):
            site = 'model.layers.0.mlp.up_proj'
            xs = []
            collect(m, calib, [site], lambda o: xs.append(o[site]), batch_size=4, inputs=True)
            X = on(torch.cat(xs), device, 'inputs')
            layer = m.get_submodule(site)
            with untouched(layer): ex = expand_linear(layer, X, 0.5, n_experts=3, pca_dim=2, n_init=1)
            assert isinstance(ex, ExpandedLinear)
            on(ex.experts.detach(), device, 'experts'); assert ex.experts.dtype == dtype
            r = ex.route(X); assert r.device.type == device.type and int(r.max()) < 3
            y = on(ex(X[None]), device, 'expanded output'); assert y.dtype == dtype
            one = sparsify(m, calib, 0.5, n_experts=1, batch_size=4)
            on_model(one.model, device, dtype, 'sparsified')
            two = sparsify(m, calib, 0.5, n_experts=2, sites=[site, 'model.layers.1.mlp.down_proj'], pca_dim=2, n_init=1, batch_size=4)
            on_model(two.model, device, dtype, 'expanded model')
            finite(two.errors[['error', 'sparsegpt_error', 'power']].to_numpy(dtype=float, copy=True), 'errors')
            p1, p2 = perplexity(one.model, held), perplexity(two.model, held)
            table, errs = expansion_sweep(m, calib, held, sparsities=(0.6,), n_experts=(1, 2), sites=[site], batch_size=4, pca_dim=2, n_init=1)
            finite(table[['perplexity', 'rel_error']].to_numpy(dtype=float, copy=True), 'sweep')
            sc = neuron_scores(m, calib, [site, 'model.layers.1.mlp.down_proj'])
            imp = improvement(two.errors, sc)
            harm = pruning_harm(m, sc, input_hessians(m, calib, list(sc.site.unique())), held, frac=0.1, sparsity=0.9, random_seeds=(0,), batch_size=4)
            finite(harm.perplexity.to_numpy(dtype=float, copy=True), 'pruning harm')
            by = expansion_by_neuron(m, calib, held, site, 0.5, (1, 2), batch_size=4, pca_dim=2, n_init=1)
            finite(by[['w1', 'error', 'held_out_error']].to_numpy(dtype=float, copy=True), 'expansion by neuron')
        return (f"ppl SparseGPT {p1:.1f}, expanded {p2:.1f}; sweep rel. error {table.rel_error.round(3).tolist()}; "
                f"mean ri {imp.ri.mean():.2f}; harm ppl {harm.perplexity.round(1).tolist()}")

    return [('w1', w1), ('scores', scores), ('sparsegpt', sparse), ('expansion', expansion)]
