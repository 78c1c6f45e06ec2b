"""Make the asset of paper 6 (LSP): `python tools/make_lsp_assets.py`.

For each task of `RECIPE` (`make_task(difficulty, seed=...)`), SmolLM2-135M-Instruct learns programs in five settings:
  lsp          SmolLM2 as executor and as learner, up to `max_modules` modules (the paper's method)
  flat         the same with one module: a single learned prompt (the prompt-optimisation analogue)
  lsp_bank     SmolLM2 as executor, the true attribute questions proposed by `QuestionBank` (measures the executor)
  flat_bank    the same with one module
  lsp_keyword  `KeywordExecutor` as executor, SmolLM2 as learner (measures the learner)
SmolLM2 is batch-calibrated on the training inputs and remembers its answers across the settings (one `CachedExecutor`).
Each learned program is then run on the test objects by its executor and, as a transfer check, by `KeywordExecutor`. Writes `interpkit/assets/lsp_runs.json` (recipe, printouts, steps, proposals,
predictions, accuracies, baselines, timings).

Two processes can share the work: `--part K --parts N` runs tasks K, K+N, ... into --work (default /tmp/lsp_assets);
`--pack` writes the asset from the parts. Without --part, everything runs in one process and is packed.
"""
import argparse, json, os, time
from pathlib import Path
import torch
from interpkit.models import load_lm
from interpkit.papers.lsp import HFLLM, CachedExecutor, KeywordExecutor, QuestionBank, accuracy, learn_lsp, run_program
from interpkit.demos.lsp import OBJECT_ATTRIBUTES, OBJECT_QUESTIONS, chance_accuracy, make_task, tree_baseline, LSP_ASSET, LSP_RECIPE
from interpkit.train import assets_dir

R = LSP_RECIPE

def _write(p:Path, obj): tmp = p.with_suffix('.tmp'); tmp.write_text(json.dumps(obj, indent=1)); os.replace(tmp, p)

def run_task(difficulty:str, seed:int) -> dict:
    task = make_task(difficulty, R['n_train'], R['n_test'], seed)
    xs, ys = [e.x for e in task.train], [e.y for e in task.train]
    tx, ty = [e.x for e in task.test], [e.y for e in task.test]
    model, tok = load_lm()
    executor = CachedExecutor(HFLLM(model, tok, batch_size=R['batch_size']), reference=xs)   # batch-calibrated on the training inputs, shared by the settings
    learner = HFLLM(model, tok, do_sample=True, temperature=R['temperature'], max_new_tokens=R['max_new_tokens'], batch_size=R['learner_batch_size'], seed=seed)
    bank = QuestionBank({OBJECT_QUESTIONS[a]: OBJECT_ATTRIBUTES[a] for a in OBJECT_ATTRIBUTES})
    keyword = CachedExecutor(KeywordExecutor())
    settings = {'lsp': (executor, learner, R['max_modules'], R['n_candidates']), 'flat': (executor, learner, 1, R['n_candidates']),
                'lsp_bank': (executor, bank, R['max_modules'], len(OBJECT_ATTRIBUTES)), 'flat_bank': (executor, bank, 1, len(OBJECT_ATTRIBUTES)),
                'lsp_keyword': (keyword, learner, R['max_modules'], R['n_candidates'])}
    out = dict(difficulty=difficulty, seed=seed, true_program=str(task.program), tree=tree_baseline(task), chance=chance_accuracy(task), runs={})
    for name, (exe, lrn, max_modules, n_candidates) in settings.items():
        t0 = time.time()
        r = learn_lsp(xs, ys, exe, lrn, task.labels, max_modules=max_modules, max_depth=R['max_depth'], n_candidates=n_candidates,
                      n_shown=R['n_shown'], seed=seed, batch_size=R['batch_size'])
        t1 = time.time()
        test = run_program(r.program, tx, exe, R['batch_size'])
        moved = run_program(r.program, tx, keyword, R['batch_size'])
        out['runs'][name] = dict(program=str(r.program), steps=r.steps.to_dict('records'), proposals=r.proposals.to_dict('records'),
                                 train_accuracy=r.train_accuracy, test_predictions=test.predictions, test_accuracy=accuracy(test.predictions, ty),
                                 keyword_predictions=moved.predictions, keyword_accuracy=accuracy(moved.predictions, ty),
                                 executor_prompts=r.executor_prompts, learner_prompts=r.learner_prompts,
                                 learn_seconds=round(t1 - t0, 1), test_seconds=round(time.time() - t1, 1))
        print(f"{difficulty}-{seed} {name}: train {r.train_accuracy:.3f} test {out['runs'][name]['test_accuracy']:.3f} "
              f"keyword {out['runs'][name]['keyword_accuracy']:.3f} ({t1 - t0:.0f} s + {time.time() - t1:.0f} s)", flush=True)
    return out

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--part', type=int); ap.add_argument('--parts', type=int, default=1)
    ap.add_argument('--pack', action='store_true'); ap.add_argument('--work', default='/tmp/lsp_assets')
    a = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(a.work); work.mkdir(parents=True, exist_ok=True)
    tasks = [(d, s) for s in R['seeds'] for d in R['difficulties']]
    todo = range(len(tasks)) if a.part is None else range(a.part, len(tasks), a.parts)
    if not a.pack:
        for i in todo:
            if not (work/f'task_{i}.json').exists(): _write(work/f'task_{i}.json', run_task(*tasks[i]))   # a task done earlier in --work is kept
    if a.pack or a.part is None:
        parts = [json.loads((work/f'task_{i}.json').read_text()) for i in range(len(tasks))]
        _write(assets_dir()/f'{LSP_ASSET}.json', dict(recipe=R, tasks=parts))
        print('wrote', assets_dir()/f'{LSP_ASSET}.json')

if __name__ == '__main__':
    main()
