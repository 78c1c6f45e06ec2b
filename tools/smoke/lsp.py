"Smoke checks of interpkit.papers.lsp and its demo module interpkit.demos.lsp: programs, printouts and the interpreter, the learner with exact executors, HFLLM's option scores and generation on tiny GPT-2 and Llama LMs (batch-calibrated learning included), tasks and references, the shipped runs and the explorer."
import torch
from _util import lm, finite, untouched, tiny_tokenizer
from interpkit.papers.lsp import (Module, LSP, leaf_name, node_at, replace_leaf, print_program, parse_program, read_answer, one_at_a_time, ask, CachedExecutor,
                                  run_program, HFLLM, OpenAIChat, KeywordExecutor, majority_label, examples_block, parse_module, QuestionBank, label_branches,
                                  gini, learn_module, leaf_errors, learn_lsp, accuracy, leaf_table, plot_leaves)
from interpkit.demos.lsp import (OBJECT_ATTRIBUTES, OBJECT_QUESTIONS, describe, true_label, make_task, attribute_matrix, tree_baseline, chance_accuracy,
                                 load_lsp_runs, runs_table, plot_runs, proposal_stats, explore_task)

NOT_SMOKED = {'ProgramError': 'an exception', 'ProgramSyntaxError': 'an exception, raised by parse_program', 'Run': 'made by run_program',
              'Example': 'made by make_task', 'Task': 'made by make_task', 'ModuleChoice': 'made by learn_module', 'Learned': 'made by learn_lsp',
              'LspRuns': 'made by load_lsp_runs', 'OpenAIChat': 'needs a server; the tests run it against one on localhost'}

def checks(device, dtype):
    bf16 = dtype == torch.bfloat16

    def programs():
        task = make_task('hard', seed=0)
        p = task.program
        grown = replace_leaf(LSP('zup', ('zup', 'mip')), (), Module('Q?', ('a', 'b'), {'a': 'zup', 'b': 'mip'}))
        assert parse_program(print_program(p)) == p and node_at(grown, ('a',)) == 'zup' and leaf_name(('a', 'b')) == '/a/b'
        xs = [e.x for e in task.test]
        r = run_program(str(p), xs, KeywordExecutor(), batch_size=7)
        assert r.predictions == [true_label(p, e.attributes) for e in task.test]
        assert read_answer(' Red.', ['red', 'blue']) == 'red' and ask(one_at_a_time(lambda q: 'blue'), ['x'], 'Q?', ['red', 'blue']) == ['blue']
        assert describe(task.test[0].attributes) == xs[0]
        return f"{len(p.modules())} modules, {len(xs)} test objects routed"

    def learner():
        task = make_task('medium', seed=0)
        xs, ys = [e.x for e in task.train], [e.y for e in task.train]
        bank = QuestionBank({OBJECT_QUESTIONS[a]: OBJECT_ATTRIBUTES[a] for a in OBJECT_ATTRIBUTES})
        c = learn_module(xs, ys, KeywordExecutor(), bank, task.labels, n_candidates=5)
        r = learn_lsp(xs, ys, CachedExecutor(KeywordExecutor()), bank, task.labels, n_candidates=5)
        assert r.program == task.program and c.module.prompt == task.program.root.prompt
        m = label_branches(parse_module(bank(['p'])[0], task.labels), ['small'] * len(ys), ys, task.labels)
        e = leaf_errors(r.program, run_program(r.program, xs, KeywordExecutor()), ys)
        assert e.errors.sum() == 0 and m.branches['small'] == majority_label(ys, task.labels) and 0 <= gini(ys, ys) < 1e-12
        assert examples_block(['a'], ['b']) == 'Example: a Label: b'
        return f"planted tree recovered in {len(r.steps)} steps"

    def hf_llm():
        tok = tiny_tokenizer()
        out = []
        for arch in ('gpt2', 'llama'):
            m = lm(arch, device, dtype, d_model=32, seed=1)
            llm = HFLLM(m, tok, max_new_tokens=3, batch_size=2)
            with untouched(m, tok):
                s = llm.option_scores(['w1 w2', 'w3'], ['w4', 'w5 w6'])
                one = torch.stack([llm.option_scores([p], ['w4', 'w5 w6'])[0] for p in ['w1 w2', 'w3']])
                texts = llm(['w1 w2', 'w3'])
                xs, ys = ['w1 w2', 'w3 w4', 'w5', 'w6 w7'], ['zup', 'mip', 'zup', 'mip']
                r = learn_lsp(xs, ys, llm, QuestionBank({'w8 w9': ('w10', 'w11')}), max_modules=2, n_candidates=1)
                t = leaf_table(r.program, xs, ys, llm, reference=xs)
            finite(s, 'option scores')
            gap = (s - one).abs().max().item()
            assert gap < (0.1 if bf16 else 1e-3), gap
            assert len(texts) == 2 and t.n.sum() == 4 and llm.choose(['w1'], ['w4', 'w5']) [0] in ('w4', 'w5')
            out.append(f"{arch} batched-single gap {gap:.1e}")
        return ', '.join(out) + f" ({dtype})"

    def references_and_shipped():
        task = make_task('easy', seed=1)
        assert attribute_matrix(task.train).shape == (96, 15) and tree_baseline(task) == 1.0 and 0 < chance_accuracy(task) < 1
        runs = load_lsp_runs()
        table = runs_table(runs)
        import matplotlib.pyplot as plt
        plt.close(plot_runs(table))
        stats = proposal_stats(runs)
        shipped = [r['test_accuracy'] for t in runs.tasks for r in t['runs'].values()]
        assert abs(sum(shipped) - sum(table[list(runs.tasks[0]['runs'])].to_numpy().ravel())) < 1e-9
        learned, leaves = explore_task('medium', 2, 0)
        plt.close(plot_leaves(leaves))
        assert accuracy(['a'], ['a']) == 1.0
        return f"{len(table)} shipped tasks recomputed, {int(stats.replies.sum())} proposals; explorer {len(leaves)} leaves"

    return [('programs', programs), ('learner', learner), ('hf_llm', hf_llm), ('references_and_shipped', references_and_shipped)]
