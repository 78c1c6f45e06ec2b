"""Time and memory of `interpkit.papers.g_effect.g_effect`, side by side with the way the official G-effect code measures
(tmlr-group/G-effect, `dataloader_ge.py`), on the same model and data.

usage: python benchmarks/bench_g_effect.py [--models tiny,smollm2-135m-instruct] [--repeats 3] [--threads 1]
       python benchmarks/bench_g_effect.py --models 135m,1b [--rows 4] [--tokens 48] [--batch-size 2] [--repeats 1]

Models: 'tiny' (the demo's QA model) and 'smollm2-135m-instruct' on the demo's author QA (16 forget, 32 retain questions), or a
random Llama-style model in bfloat16 of a size of `bench_scale.py` ('135m', '1b') on random token rows (`--rows` forget and as
many retain rows of `--tokens` tokens, every token a label).

"official (reimpl.)" is OUR reimplementation of the official code's way, written from reading it (no code copied): for each
micro-batch, three `loss.backward()` into `.grad` (the forget risk, the objective, the retain risk), each gradient kept per
parameter, flattened, in the model's dtype, in a moving average g <- 0.6 g + 0.4 g_b (three full gradients kept), then per
parameter `(g_L * g_R).sum()` in the model's dtype. "interpkit" is `g_effect(model, 'ga', forget, retain, batch_size,
smoothing=0.6)`: the same moving average over the same micro-batches. GA is the objective in both.

Each measurement runs in its own subprocess, so that the peak resident memory (ru_maxrss) belongs to it alone; the table gives
the median time over repeats, the growth of the peak above the loaded model and data (after a warm-up forward), and the two
G-effects (the same numbers from both, up to the official way's model-dtype products: a check that the comparison is fair); the
last two columns dot the official way's kept gradients in float64 after the measurement, which shows how much of a difference
comes from those products.
"""
import argparse, json, os, resource, statistics, subprocess, sys, time
os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def rss_bytes() -> int: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def setup(model_name, rows, tokens):
    import torch
    from interpkit.models import encode_queries, load_lm
    if model_name in ('135m', '1b'):
        from bench_scale import build
        model, _, batch = build(model_name, 'bfloat16', 'cpu', 2 * rows, tokens)
        half = lambda s: {k: v[s] for k, v in batch.items()}
        return torch, model, half(slice(0, rows)), half(slice(rows, 2 * rows))
    from interpkit.demos.g_effect import author_qa, load_qa_lm
    if model_name == 'tiny':
        model, tokenizer, meta = load_qa_lm(); qa = author_qa(**meta['author_qa'])
    else:
        model, tokenizer = load_lm(model_name); qa = author_qa()
    return torch, model, encode_queries(tokenizer, *qa.pairs(qa.forget[:16])), encode_queries(tokenizer, *qa.pairs(qa.retain[:32]))

def official_style(torch, model, forget, retain, batch_size):
    "OUR reimplementation of the official code's way (see the module docstring): backward into .grad, three moving averages of flattened model-dtype gradients, model-dtype dot products."
    from interpkit.models import iter_batches
    from interpkit.papers.g_effect import forget_term, objective, risk_term
    avg = {'objective': {}, 'unlearn': {}, 'retain': {}}
    def keep(which, loss):
        loss.backward()
        for name, p in model.named_parameters():
            if not p.requires_grad: continue
            g = p.grad.view(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype)
            d = avg[which]
            d[name] = g if name not in d else .6 * d[name] + .4 * g
        model.zero_grad(set_to_none=True)
    mean = lambda s_c: s_c[0] / s_c[1]
    for f, r in zip(iter_batches(forget, batch_size), iter_batches(retain, batch_size)):   # the official loader pairs a forget and a retain micro-batch
        keep('unlearn', mean(risk_term(model, f)))
        keep('objective', mean(forget_term(model, objective('ga'), f)))
        keep('retain', mean(risk_term(model, r)))
    dot = lambda a: sum((avg['objective'][n] * avg[a][n]).sum().item() for n in avg['objective'])
    return dot('unlearn'), dot('retain'), avg

def float64_dots(avg):
    "The official way's kept gradients dotted in float64 (after the measurement): how much of a difference from interpkit is the model-dtype products'."
    from interpkit.papers.g_effect import _dot
    return [sum(_dot(avg['objective'][n], avg[a][n]) for n in avg['objective']) for a in ('unlearn', 'retain')]

def interpkit_style(torch, model, forget, retain, batch_size):
    from interpkit.papers.g_effect import g_effect
    ge = g_effect(model, 'ga', forget, retain, batch_size=batch_size, smoothing=0.6)
    return ge.unlearning, ge.retention

def child(a):
    import torch
    torch.set_num_threads(a.threads)
    torch, model, forget, retain = setup(a.model, a.rows, a.tokens)
    bs = (a.batch_size if a.model in ('135m', '1b') else 0) or max(len(forget['input_ids']), len(retain['input_ids']))   # the QA sets: one batch each
    n_batches = [-(-len(d['input_ids']) // bs) for d in (forget, retain)]
    if n_batches[0] != n_batches[1]: sys.exit(f"{n_batches} forget and retain micro-batches: the official loader pairs them, so give as many of each")
    with torch.no_grad(): model(input_ids=forget['input_ids'][:1, :4])   # warm-up: the first pass's lazy allocations are not the method's
    base = rss_bytes()
    fn = official_style if a.method == 'official' else interpkit_style
    times, res = [], None
    for _ in range(a.repeats):
        res = None   # the last repeat's kept gradients are not this one's
        t = time.perf_counter(); res = fn(torch, model, forget, retain, bs); times.append(time.perf_counter() - t)
    extra = rss_bytes() - base
    e64 = float64_dots(res[2]) if a.method == 'official' else res[:2]
    print(json.dumps(dict(model=a.model, method=a.method, seconds=statistics.median(times), extra_bytes=extra, e_u=res[0], e_r=res[1], e_u64=e64[0], e_r64=e64[1],
                          param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--models', default='tiny,smollm2-135m-instruct'); ap.add_argument('--repeats', type=int, default=3); ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--rows', type=int, default=4); ap.add_argument('--tokens', type=int, default=48); ap.add_argument('--batch-size', type=int, default=0)
    ap.add_argument('--model', default=''); ap.add_argument('--method', default='')
    a = ap.parse_args()
    if a.method: return child(a)
    print(f"{'model':24s} {'method':20s} {'seconds':>8s} {'peak above model':>17s} {'x params':>9s} {'e_u':>12s} {'e_r':>12s} {'e_u (f64 dot)':>14s} {'e_r (f64 dot)':>14s}")
    for model_name in a.models.split(','):
        for method in ('official', 'interpkit'):
            out = subprocess.run([sys.executable, __file__, '--model', model_name, '--method', method] +
                                 [f'--{k.replace("_", "-")}={v}' for k, v in vars(a).items() if k not in ('models', 'model', 'method')],
                                 capture_output=True, text=True)
            line = next((l for l in out.stdout.splitlines() if l.startswith('{')), None)
            if out.returncode or line is None: print(f"{model_name:24s} {method:20s} FAILED: {(out.stderr.strip().splitlines() or ['?'])[-1][:100]}"); continue
            r = json.loads(line)
            label = 'official (reimpl.)' if method == 'official' else 'interpkit'
            print(f"{r['model']:24s} {label:20s} {r['seconds']:8.2f} {r['extra_bytes'] / 2**20:14.0f} MB {r['extra_bytes'] / r['param_bytes']:9.2f} {r['e_u']:12.5g} {r['e_r']:12.5g} {r['e_u64']:14.5g} {r['e_r64']:14.5g}", flush=True)

if __name__ == '__main__': main()
