"""Speed of exact-match evaluation in `interpkit.papers.position_coupling`, side by side with decoding token by token.

usage: python benchmarks/bench_position_coupling.py [--digits 9] [--count 6] [--n 64] [--threads 1]

The official code scores a problem by generating its answer greedily, one token at a time, and comparing strings.
`exact_match` gets the same verdict from one teacher-forced forward pass per batch (greedy decoding reproduces the
target iff the target token is the argmax at every answer position). On one grid cell of the shipped coupled adder
(or of a fresh model of the same shape if the asset is missing) this prints the time per problem of both, and checks
that their verdicts agree problem by problem (the default cell, 9 digits x 6 operands, is one the adder solves about a third of).
"""
import argparse, time
import torch
from interpkit.papers.position_coupling import evaluation_problems, exact_match, greedy_answer
from interpkit.demos.position_coupling import ADDER_RECIPES, load_adder

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--digits', type=int, default=9); ap.add_argument('--count', type=int, default=6)
    ap.add_argument('--n', type=int, default=64); ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    try: model, what = load_adder('coupled')[0], 'shipped coupled adder'
    except FileNotFoundError: model, what = ADDER_RECIPES['coupled'].build().eval(), 'untrained model of the coupled recipe'
    problems = evaluation_problems(a.digits, a.count, n=a.n)
    t = time.perf_counter(); fast = exact_match(model, problems); t_fast = time.perf_counter() - t
    t = time.perf_counter(); slow = torch.tensor([greedy_answer(model, p) == p.answer for p in problems]); t_slow = time.perf_counter() - t
    print(f"{what}; {a.n} problems of {a.count} operands x {a.digits} digits ({len(problems[0].text)} tokens), {a.threads} thread(s)")
    print(f"{'method':<36}{'ms / problem':>14}{'accuracy':>10}")
    print(f"{'exact_match (teacher-forced)':<36}{1e3 * t_fast / a.n:>14.2f}{fast.float().mean():>10.3f}")
    print(f"{'generate + compare (token by token)':<36}{1e3 * t_slow / a.n:>14.2f}{slow.float().mean():>10.3f}")
    print(f"speed-up {t_slow / t_fast:.0f}x; verdicts agree on {int((fast == slow).sum())}/{a.n} problems")
