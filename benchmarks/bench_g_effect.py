"""Time and memory of `interpkit.papers.g_effect.g_effect` on SmolLM2-135M-Instruct (and the tiny QA model), side by side with
the way the official G-effect code measures (`loss.backward()` into `.grad`, every gradient kept as a copy: the objective's
and both risks', then the dot products).

usage: python benchmarks/bench_g_effect.py [--repeats 3] [--threads 1] [--skip-smollm2]

Each method runs in its own subprocess, so that the peak resident memory (ru_maxrss) belongs to it alone; the table gives
the median time over repeats, the peak memory above what the loaded model and data already took, and the two G-effects
(the same numbers from both: a check that the comparison is fair).
"""
import argparse, json, os, resource, statistics, subprocess, sys, time
os.environ.setdefault('HF_HUB_OFFLINE', '1')

def rss_mb() -> float: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def setup(model_name):
    import torch
    from interpkit.models import encode_queries, load_lm
    from interpkit.demos.g_effect import author_qa, load_qa_lm
    if model_name == 'tiny':
        model, tokenizer, meta = load_qa_lm(); qa = author_qa(**meta['author_qa'])
    else:
        model, tokenizer = load_lm(model_name); qa = author_qa()
    forget = encode_queries(tokenizer, *qa.pairs(qa.forget[:16]))
    retain = encode_queries(tokenizer, *qa.pairs(qa.retain[:32]))
    return torch, model, forget, retain

def official_style(torch, model, forget, retain):
    "The official code's way: backward into .grad, copy every gradient, dot products at the end."
    from interpkit.papers.g_effect import forget_term, objective, risk_term
    def grads(fn, data):
        model.zero_grad(set_to_none=True)
        s, c = fn(data); (s / c).backward()
        out = [p.grad.detach().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return out
    gL = grads(lambda b: forget_term(model, objective('ga'), b), forget)
    gu, gr = grads(lambda b: risk_term(model, b), forget), grads(lambda b: risk_term(model, b), retain)
    dot = lambda a, b: sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    return dot(gL, gu), dot(gL, gr)

def interpkit_style(torch, model, forget, retain):
    from interpkit.papers.g_effect import g_effect
    ge = g_effect(model, 'ga', forget, retain, batch_size=16)
    return ge.unlearning, ge.retention

def child(model_name, method, repeats, threads):
    torch, model, forget, retain = setup(model_name)
    torch.set_num_threads(threads)
    base = rss_mb()
    fn = official_style if method == 'official' else interpkit_style
    times, res = [], None
    for _ in range(repeats):
        t = time.perf_counter(); res = fn(torch, model, forget, retain); times.append(time.perf_counter() - t)
    print(json.dumps(dict(model=model_name, method=method, seconds=statistics.median(times), extra_mb=rss_mb() - base,
                          e_u=res[0], e_r=res[1], params_mb=sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20)))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--repeats', type=int, default=3); ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--skip-smollm2', action='store_true'); ap.add_argument('--child', nargs=2)
    a = ap.parse_args()
    if a.child: return child(*a.child, a.repeats, a.threads)
    rows = []
    for model_name in ['tiny'] + ([] if a.skip_smollm2 else ['smollm2-135m-instruct']):
        for method in ('official', 'interpkit'):
            out = subprocess.run([sys.executable, __file__, '--child', model_name, method, '--repeats', str(a.repeats), '--threads', str(a.threads)],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'model':24s} {'method':10s} {'seconds':>8s} {'extra MB':>9s} {'params MB':>9s} {'e_u':>12s} {'e_r':>12s}")
    for r in rows: print(f"{r['model']:24s} {r['method']:10s} {r['seconds']:8.2f} {r['extra_mb']:9.0f} {r['params_mb']:9.0f} {r['e_u']:12.5g} {r['e_r']:12.5g}")

if __name__ == '__main__': main()
