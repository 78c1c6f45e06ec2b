"""Memory and time of the main entry points on a randomly initialised Llama-style model of a given size (issue 52).

usage: python benchmarks/bench_scale.py [--size 8b|1b|135m|tiny] [--dtype bfloat16] [--device cpu|cuda] [--rows 2] [--tokens 48]
                                        [--threads 2] [--only name,name] [--json out.json] [--nnsight PYTHON]

Each row runs in a fresh Python process: the process builds the model in the target dtype (never float32 first: a float32
build leaves a peak that hides later growth), runs the entry point on a fixed batch, then its reference pass on the same inputs (a
forward without gradients, or a forward and backward for the gradient methods). It reports the growth of the peak above the
built model and inputs, during the entry point (CPU: the process's peak resident memory, `ru_maxrss`; CUDA: `torch.cuda.max_memory_allocated`,
reset after the build) as a multiple of the parameters' bytes, and the time relative to the reference pass. On the CPU the rows
run with glibc's `MALLOC_MMAP_THRESHOLD_=65536`, so that blocks a method frees go back to the system and the peak counts what it
holds; under glibc's default, which keeps freed blocks for reuse, a process's peak can be larger (1.7x for W1 at 1B). Before the
baseline each process makes one short forward, one LAPACK call and the imports the rows need: their one-time allocations are not
a method's. Run it at two
sizes to see how each cost grows with the model.

Each entry point's page states what it holds beyond the model (its **Cost.** paragraph); `COSTS` below restates that figure as a
formula in the model's sizes, and the table's `documented` column is that formula plus the measured peak of the reference row
(a forward, or a forward and backward: the working memory the method's own passes need). A row whose measurement is more than 25%
away from its documented figure (and more than 4 MiB: the resident set grows by pages and arenas) is marked `!!` and makes the
script exit with status 1 (checked from 100M parameters up: below, a few MB of allocator noise outweigh the figures). `--nnsight PYTHON` adds nnsight's way of
capturing and patching the same sites, run by an interpreter that has nnsight (it needs only torch and transformers).
The default size is `1b` on the CPU and `8b` (a Llama-3-8B-shaped model) with `--device cuda`.
"""
import argparse, json, os, resource, subprocess, sys, time
os.environ.setdefault('HF_HUB_OFFLINE', '1')

SIZES = {  # Llama-style configs: Llama-3-8B's shape (the GPU default), ~1.0B (the CPU default), SmolLM2-135M's shape (the notebooks' scale), and a tiny one for a quick check
    '8b': dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    '1b': dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=20, num_attention_heads=32, num_key_value_heads=8, vocab_size=32000),
    '135m': dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152),
    'tiny': dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256),
}
GRAD_ROWS = {'forward_backward', 'capture_grads', 'trackstar.example_grads', 'g_effect', 'cnl.neuron_attributions', 'ted.operational_embeddings'}   # run with autograd on
NNSIGHT_ROWS = ['nnsight capture (every resid_post)', 'nnsight patch (one resid_post)']

# Each documented cost: row -> (the page that states it, the words it states it in, the figure in bytes beside the reference pass's own
# peak, as a function of the sizes: P parameters, b bytes per parameter element, B rows, T tokens per row, d width, L layers, I MLP width,
# V vocabulary, K key-value width[, the reference row it adds to, when not the row's own reference]). tests/test_tools.py checks that each
# page says what this table says.
COSTS = {
    'capture (every resid_post)': ('nbs/core/02_hooks.ipynb', 'one (batch, tokens, d_model) activation per site', lambda s: s.L * s.B * s.T * s.d * s.b),
    'patch (one resid_post)': ('nbs/core/02_hooks.ipynb', 'holds nothing beyond the forward pass', lambda s: 0),
    'capture_grads': ('nbs/core/02_hooks.ipynb', 'one gradient per site beside the activations autograd keeps anyway, and no parameter gradients', lambda s: s.L * s.B * s.T * (8 * s.d + 7 * s.d * s.b + 4 * s.I * s.b) + s.B * s.T * s.V * (s.b + 4) + s.L * s.B * s.T * s.d * s.b, 'forward'),
    'generate_greedy (8 tokens)': ('nbs/core/01_models.ipynb', 'each new token adds its keys and values', lambda s: 2 * s.L * s.B * s.K * s.b * 8),
    'g_effect': ('nbs/papers/05_g_effect.ipynb', "holds one float32 copy of the trainable parameters' gradients", lambda s: max(4, s.b) * s.P - s.b * s.P),
    'trackstar.example_grads': ('nbs/papers/10_trackstar.ipynb', 'what autograd keeps for one backward pass over B = `batch_size` rows of T tokens',
                                lambda s: s.L * s.B * s.T * (8 * s.d + 7 * s.d * s.b + 4 * s.I * s.b) + 2 * s.B * (s.T - 1) * s.V * s.b + 4 * min(s.B * (s.T - 1) * s.V, 2**22) + 4 * s.B * 7 * s.L * 16 * 16, 'forward'),
    'sae.stream_activations': ('nbs/core/06_sae.ipynb', '4BTd − BTVb bytes beside a forward', lambda s: 4 * s.B * s.T * s.d - s.B * s.T * s.V * s.b),
    'wasserstein.neuron_scores': ('nbs/papers/19_wasserstein.ipynb', 'n·L·(2I + d)·b bytes', lambda s: s.B * s.T * s.L * (2 * s.I + s.d) * s.b),
    'cnl.neuron_attributions': ('nbs/papers/13_cnl.ipynb', '4d·b + 5I·b) + 12·B·T·I + 4·B·L·I bytes beside a forward',
                                lambda s: s.B * s.T * s.L * (8 * s.d + 4 * s.d * s.b + 5 * s.I * s.b) + 12 * s.B * s.T * s.I + 4 * s.B * s.L * s.I, 'forward'),
    'safety_heads.ships (4 heads)': ('nbs/papers/07_safety_heads.ipynb', "holds the key-value cache of the queries' prefix and a few float64 next-token distributions",
                                     lambda s: 40 * s.B * s.V),
    'ted.operational_embeddings': ('nbs/papers/08_ted.ipynb', 'the activations autograd keeps for the gradient at the input embeddings of one batch, and nothing per parameter',
                                   lambda s: s.L * s.B * s.T * (8 * s.d + (2 * s.d + 2 * s.K + 3 * s.I) * s.b) + 8 * s.B * (s.T // 4) * s.V, 'forward'),
    'logits_at (last)': ('nbs/core/01_models.ipynb', 'the vocabulary projection at the positions asked for only', lambda s: -(s.T - 1) * s.B * s.V * s.b),
}

def peak_bytes(device) -> int:
    import torch
    if device == 'cuda': return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def build(size, dtype, device, rows, tokens, need_tokenizer=True):
    "The model (eval mode, built in `dtype`), a word tokenizer over its vocabulary (None unless `need_tokenizer`), and a (rows, tokens) batch with labels."
    import torch, transformers
    cfg = transformers.LlamaConfig(max_position_embeddings=max(512, tokens * 2), tie_word_embeddings=False, **SIZES[size])
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=getattr(torch, dtype), attn_implementation='sdpa').eval()
    tokenizer = None
    if need_tokenizer:
        from interpkit.models import tiny_tokenizer
        tokenizer = tiny_tokenizer(cfg.vocab_size)
    ids = torch.randint(3, cfg.vocab_size, (rows, tokens), generator=torch.Generator().manual_seed(1)).to(device)
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids.clone())
    return model, tokenizer, batch

def nnsight_point(name, model, batch):
    "nnsight's way of doing what the row of the same name after 'nnsight ' does: save every decoder layer's output, or add to one."
    import torch, nnsight
    lm, L = nnsight.NNsight(model), model.config.num_hidden_layers
    x = {k: batch[k] for k in ('input_ids', 'attention_mask')}
    if name == 'forward': return lambda: model(**x)
    def run_capture():
        saved = []
        with lm.trace(**x):
            for l in range(L): saved.append(lm.model.layers[l].output.save())
        return saved
    def run_patch():
        v = torch.ones(model.config.hidden_size, dtype=model.dtype, device=batch['input_ids'].device)
        with lm.trace(**x):
            lm.model.layers[L // 2].output[:] += v
            out = lm.output.logits.save()
        return out
    return {'nnsight capture (every resid_post)': run_capture, 'nnsight patch (one resid_post)': run_patch}[name]

def entry_point(name, model, tokenizer, batch):
    "A function running entry point `name` once on the batch."
    import torch
    from interpkit.hooks import add, capture, capture_grads, layout, patch, resid_post
    from interpkit.models import generate_greedy, logits_at
    from interpkit.train import lm_loss
    L, d = layout(model).n_layers, model.config.hidden_size
    sites = [resid_post(l) for l in range(L)]
    words = lambda row: ' '.join(tokenizer.convert_ids_to_tokens(row.tolist()))
    def fb():
        lm_loss(model, batch).backward(); model.zero_grad(set_to_none=True)
    def cg():
        with capture_grads(model, sites) as g:
            g.backward(lm_loss(model, batch))
    def run_capture():
        with torch.no_grad(), capture(model, sites) as c: model(**{k: batch[k] for k in ('input_ids', 'attention_mask')})
    def run_patch():
        v = torch.ones(d, dtype=model.dtype, device=batch['input_ids'].device)
        with torch.no_grad(), patch(model, {resid_post(L // 2): add(v)}): model(**{k: batch[k] for k in ('input_ids', 'attention_mask')})
    def trackstar():
        from interpkit.papers.trackstar import example_grads
        example_grads(model, batch)
    def g_eff():
        from interpkit.papers.g_effect import g_effect
        g_effect(model, 'ga', batch, batch)
    def cnl():
        from interpkit.papers.cnl import neuron_attributions
        rows = batch['input_ids']
        neuron_attributions(model, tokenizer, ([words(r[:-1]) for r in rows], [' ' + words(r[-1:]) for r in rows]), n_steps=4)
    def w1():
        from interpkit.papers.wasserstein import neuron_scores
        neuron_scores(model, {k: batch[k] for k in ('input_ids', 'attention_mask')})
    def sae_stream():
        from interpkit.sae import stream_activations
        for _ in stream_activations(model, [{k: batch[k] for k in ('input_ids', 'attention_mask')}], resid_post(L // 2)): pass
    def ted():
        from interpkit.papers.ted import EditOutputs, operational_embeddings
        rows = batch['input_ids']; T = rows.shape[1]
        n_out = T // 4; n_q = (T - n_out - 21) // 2; n_r = T - n_out - 21 - n_q   # the control prompt's template is 21 word tokens: T tokens per row in all
        data = EditOutputs([words(r[:n_q]) for r in rows], [words(r[n_q:n_q + n_r]) for r in rows], [''] * len(rows), {'w1': [words(r[-n_out:]) for r in rows]})
        operational_embeddings(model, data, tokenizer, batch_size=len(rows))
    def ships():
        from interpkit.papers.safety_heads import ships as ships_
        ships_(model, {k: batch[k] for k in ('input_ids', 'attention_mask')}, heads=[(0, h) for h in range(4)])
    return {
        'forward': lambda: model(**{k: batch[k] for k in ('input_ids', 'attention_mask')}),
        'forward_backward': fb,
        'capture (every resid_post)': run_capture,
        'patch (one resid_post)': run_patch,
        'capture_grads': cg,
        'logits_at (last)': lambda: logits_at(model, {k: batch[k] for k in ('input_ids', 'attention_mask')}, -1),
        'generate_greedy (8 tokens)': lambda: generate_greedy(model, tokenizer, [words(r) for r in batch['input_ids']], max_new_tokens=8),
        'trackstar.example_grads': trackstar,
        'g_effect': g_eff,
        'cnl.neuron_attributions': cnl,
        'wasserstein.neuron_scores': w1,
        'safety_heads.ships (4 heads)': ships,
        'sae.stream_activations': sae_stream,
        'ted.operational_embeddings': ted,
    }[name]

ROWS = ['forward', 'forward_backward', 'capture (every resid_post)', 'patch (one resid_post)', 'capture_grads', 'logits_at (last)',
        'generate_greedy (8 tokens)', 'trackstar.example_grads', 'g_effect', 'cnl.neuron_attributions', 'wasserstein.neuron_scores', 'sae.stream_activations', 'ted.operational_embeddings',
        'safety_heads.ships (4 heads)']

def child(a):
    "One row, in this process: build, reference pass, then the entry point; print one JSON line."
    import torch
    torch.set_num_threads(a.threads)
    model, tokenizer, batch = build(a.size, a.dtype, a.device, a.rows, a.tokens, need_tokenizer=a.row not in NNSIGHT_ROWS)
    n_params = sum(p.numel() for p in model.parameters()); p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ref_name = 'forward_backward' if a.row in GRAD_ROWS else 'forward'
    point = (lambda n, m, t, b: nnsight_point(n, m, b)) if a.row in NNSIGHT_ROWS else entry_point
    ref, fn = point(ref_name, model, tokenizer, batch), point(a.row, model, tokenizer, batch)
    with torch.no_grad(): model(input_ids=batch['input_ids'][:1, :4])   # warm-up on 4 tokens: the first pass's lazy allocations (thread pools, kernels) are not the method's
    torch.linalg.svd(torch.randn(8, 8, dtype=torch.float64)); torch.linalg.eigh(torch.eye(8, dtype=torch.float64))   # LAPACK's first call (~8 MB) neither
    if a.row not in NNSIGHT_ROWS:   # nor the imports of the modules the rows call (~45 MB at 135m)
        import interpkit.sae, interpkit.papers.trackstar, interpkit.papers.g_effect, interpkit.papers.cnl, interpkit.papers.wasserstein, interpkit.papers.safety_heads, interpkit.papers.ted  # noqa: F401
    if a.device == 'cuda': torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    base = peak_bytes(a.device)   # the peak only grows: the row runs first, its reference after it (time only; its memory is its own row's)
    t0 = time.perf_counter()
    with (torch.enable_grad if a.row in GRAD_ROWS else torch.no_grad)(): fn()   # a method that needs no gradient runs as a user would, without autograd
    if a.device == 'cuda': torch.cuda.synchronize()
    t_row, row_peak = time.perf_counter() - t0, peak_bytes(a.device) - base
    with (torch.enable_grad if a.row in GRAD_ROWS else torch.no_grad)():
        ref()   # once untimed: the first backward of a process allocates every .grad
        t0 = time.perf_counter(); ref()
    if a.device == 'cuda': torch.cuda.synchronize()
    c = model.config
    sizes = dict(P=n_params, b=p_bytes // n_params, B=a.rows, T=a.tokens, d=c.hidden_size, L=c.num_hidden_layers, I=c.intermediate_size, V=c.vocab_size,
                 K=c.num_key_value_heads * c.hidden_size // c.num_attention_heads)
    print(json.dumps(dict(row=a.row, params=n_params, param_bytes=p_bytes, ref=ref_name, ref_seconds=time.perf_counter() - t0, seconds=t_row, peak_bytes=row_peak, sizes=sizes)))

def documented(row, table):
    "(the documented peak of `row` in bytes: its formula plus the measured peak of its reference row, or None; the reference row's name)."
    d = table.get(row)
    if row not in COSTS or d is None: return None, None
    ref = reference_of(row)
    if ref not in table: return None, None
    s = argparse.Namespace(**d['sizes'])
    return COSTS[row][2](s) + table[ref]['peak_bytes'], ref

def reference_of(row):
    "The reference row a documented cost adds to: its own in COSTS, else the row's timing reference."
    return COSTS[row][3] if row in COSTS and len(COSTS[row]) > 3 else 'forward_backward' if row in GRAD_ROWS else 'forward'

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--size', default=None, choices=list(SIZES)); p.add_argument('--dtype', default='bfloat16'); p.add_argument('--device', default='cpu')
    p.add_argument('--rows', type=int, default=2); p.add_argument('--tokens', type=int, default=48); p.add_argument('--threads', type=int, default=2)
    p.add_argument('--only', default=''); p.add_argument('--json', default=''); p.add_argument('--row', default='')
    p.add_argument('--nnsight', default='', help="a Python interpreter that can import nnsight: adds nnsight's capture and patching rows")
    a = p.parse_args()
    if a.size is None: a.size = '8b' if a.device == 'cuda' else '1b'
    if a.row: return child(a)
    wanted = [r for r in ROWS + (NNSIGHT_ROWS if a.nnsight else []) if not a.only or any(o in r for o in a.only.split(','))]
    refs = {reference_of(r) for r in wanted if r in COSTS}   # the reference rows documented figures build on
    rows = [r for r in ROWS if r in refs and r not in wanted] + wanted
    table, t_all, bad = {}, time.time(), []
    print(f"bench_scale: a random Llama-style model of size {a.size} in {a.dtype} on {a.device}, {a.rows} rows of {a.tokens} tokens, {a.threads} threads; one process per row")
    print(f"{'entry point':36s} {'peak above model':>17s} {'x params':>9s} {'documented':>11s} {'seconds':>8s} {'x ref':>6s}  reference")
    for r in rows:
        python = a.nnsight if r in NNSIGHT_ROWS else sys.executable
        res = subprocess.run([python, __file__, '--row', r] + [f'--{k}={v}' for k, v in vars(a).items() if k not in ('row', 'only', 'json', 'nnsight')],
                             capture_output=True, text=True, env={**os.environ, 'MALLOC_MMAP_THRESHOLD_': '65536'})   # glibc hands freed blocks back: the peak counts what is held
        line = next((l for l in res.stdout.splitlines() if l.startswith('{')), None)
        if res.returncode or line is None:
            print(f"{r:36s} FAILED: {(res.stderr.strip().splitlines() or ['?'])[-1][:100]}"); bad.append(r); continue
        d = table[r] = json.loads(line)
        doc, _ = documented(r, table)
        d['documented_bytes'] = doc
        checked = d['params'] >= 1e8   # below ~100M parameters a few MB of allocator noise outweigh the figures
        close = doc is not None and abs(d['peak_bytes'] - doc) <= max(0.25 * max(d['peak_bytes'], doc), 4 * 2**20)   # 25%, or 4 MiB: the resident set moves by pages and arenas
        flag = '' if doc is None else f"{doc / 2**20:8.0f} MB" + ((' ok' if close else ' !!') if checked else '   ')
        if flag.endswith('!!'): bad.append(r)
        print(f"{r:36s} {d['peak_bytes'] / 2**20:14.0f} MB {d['peak_bytes'] / d['param_bytes']:9.2f} {flag:>14s} {d['seconds']:8.2f} {d['seconds'] / max(d['ref_seconds'], 1e-9):6.2f}  {d['ref']} {d['ref_seconds']:.2f} s", flush=True)
    if table:
        first = next(iter(table.values()))
        print(f"model: {first['params'] / 1e9:.2f}B parameters, {first['param_bytes'] / 2**30:.2f} GiB; total {time.time() - t_all:.0f} s")
    for r in NNSIGHT_ROWS:
        if r in table and r[len('nnsight '):] in table:
            i, n = table[r[len('nnsight '):]], table[r]
            print(f"interpkit / nnsight, {r[len('nnsight '):]}: peak {i['peak_bytes'] / max(n['peak_bytes'], 1):.2f}x, time {i['seconds'] / max(n['seconds'], 1e-9):.2f}x")
    if bad: print(f"rows that failed or are more than 25% from their documented cost: {bad}")
    if a.json: json.dump(list(table.values()), open(a.json, 'w'), indent=1)
    return 1 if bad else 0

if __name__ == '__main__': sys.exit(main())
