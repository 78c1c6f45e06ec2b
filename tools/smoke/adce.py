"Smoke checks of interpkit.papers.adce and its demo module interpkit.demos.adce: interventions and readers, greedy completions of tiny GPT-2 and Llama LMs, causal effects of a tiny story-addition LM with their tables and views, the demo data and a short training run, few-shot tasks and random_like, and the shipped arithmetic LMs and SmolLM2 trials."
import random, re
import numpy as np, torch
from _util import lm, finite, untouched, tiny_tokenizer
from interpkit.models import generate_greedy
from interpkit.papers.adce import (MASK, NoCorrectAnswers, Question, ComprehensionTask, words_of, is_core_word, deep_intervention, surface_intervention,
                                   interventions, read_number, read_word, as_answerer, effect_sizes, causal_effects, effects_table,
                                   random_like, effects_from_trials, trial_table, plot_effects)
from interpkit.demos.adce import (story_question, addend_pairs, story_task, arith_tokenizer, arith_lm, story_batch, train_arith_lm, few_shot_task,
                                  load_arith_lms, load_smollm2_runs)

NOT_SMOKED = {'Word': 'made by words_of', 'Intervention': 'made by deep_intervention and surface_intervention',
              'CausalEffects': 'made by causal_effects and effects_from_trials', 'ArithLMs': 'made by load_arith_lms',
              'NoCorrectAnswers': 'an exception, raised by causal_effects', 'EffectSizes': 'made by effect_sizes',
              'SmolLM2Runs': 'made by load_smollm2_runs'}

PROMPTS = ['w5 w9 w13', 'w7', 'w20 w21 w22 w23', 'w3 w4']

def checks(device, dtype):
    bf16 = dtype == torch.bfloat16

    def words_and_interventions():
        t = 'Tom has 2 7 apples and buys 4 8 more . How many now ?'
        ws = words_of(t)
        d = deep_intervention(t, random.Random(0))
        s = surface_intervention(t, d.position, random.Random(0), how='swap')
        pairs = interventions(t, 3, seed=1, how='replace', surface_how='mask', words=['5', '6'])
        assert len(ws) == 15 and is_core_word(d.old) and MASK in d.text and not is_core_word(s.old) and len(pairs) == 3
        assert read_number(' 1,234 apples') == '1234' and read_word(' Seven.') == 'seven'
        task = ComprehensionTask('t', [Question('What is 1 plus 2?', '3')], '{question} Answer:')
        assert task.prompt('q') == 'q Answer:'
        return f"{len(ws)} words, deep {d.old!r}, swap {s.old!r}<->{s.new!r}"

    def generation():
        out = []
        tok = tiny_tokenizer()
        for arch in ('gpt2', 'llama'):
            m = lm(arch, device, dtype, d_model=32, seed=1)
            with untouched(m, tok):
                b = generate_greedy(m, tok, PROMPTS, max_new_tokens=4, batch_size=3)
                one = [generate_greedy(m, tok, [p], max_new_tokens=4, batch_size=1)[0] for p in PROMPTS]
                f = as_answerer(m, tok, max_new_tokens=4, batch_size=2)(PROMPTS[:2])
            assert len(b) == len(f) + 2 == 4 and all(isinstance(x, str) for x in b + f)
            same = sum(x == y for x, y in zip(b, one))
            if not bf16: assert same == len(PROMPTS), (b, one)
            out.append(f"{arch} batched=single {same}/{len(PROMPTS)}")
        return ', '.join(out) + f" ({dtype})"

    effects = {}
    def causal():
        tok = arith_tokenizer()
        m = arith_lm(tok, seed=2).to(device=device, dtype=dtype)
        task = story_task(addend_pairs()[1][:12])
        with untouched(m, tok):
            r = causal_effects(m, task, tok, n=2, correct_only=False, max_new_tokens=3, batch_size=8)
            try: causal_effects(m, task, tok, max_new_tokens=3, batch_size=8); hit = 'some right'
            except NoCorrectAnswers: hit = 'none right'
        oracle = lambda ps: ['  ' + str(sum(int(x) for x in re.findall(r'\d+', re.sub(r'(?<=\d) (?=\d)', '', p)))) for p in ps]
        o = causal_effects(oracle, task)
        assert (o.adce, o.aice) == (1.0, 0.0), o
        e = effect_sizes(r.trials[r.trials.kind == 'deep'].changed.to_numpy(), r.trials[r.trials.kind == 'surface'].changed.to_numpy(),
                         r.trials[r.trials.kind == 'deep'].question.to_numpy())
        assert abs(e.adce - r.adce) < 1e-12 and abs(effects_from_trials(r.trials).aice - r.aice) < 1e-12
        finite(torch.tensor([r.adce, r.aice, r.sufficiency, r.necessity]), 'effects')
        tab = effects_table({'random': r, 'oracle': o})
        tt = trial_table(r, 0)
        import matplotlib.pyplot as plt
        plt.close(plot_effects(tab).figure)
        effects['r'] = r
        return f"random LM adce {r.adce:.2f} aice {r.aice:.2f} ({hit}), {len(tt)} rows of question 0 ({dtype})"

    def demo_data_and_training():
        tok = arith_tokenizer()
        q = story_question(12, 34, random.Random(0), cue=True)
        train, test = addend_pairs()
        b = story_batch(tok, train, random.Random(0), batch_size=8)
        saved = {}
        m, tok2, res = train_arith_lm(8, checkpoints=(0, 8), batch_size=8, d_model=16, n_heads=2, n_layers=1, states=saved)
        assert q.answer == '46' and len(train) == 1280 and b['labels'].shape == b['input_ids'].shape and sorted(saved) == [0, 8]
        finite(torch.tensor(res.history.loss.to_numpy()), 'training loss')
        return f"{len(test)} held-out pairs, loss {res.history.loss.iloc[0]:.2f} -> {res.history.loss.iloc[-1]:.2f} (training runs on the CPU)"

    def few_shot_and_random():
        t = few_shot_task('*', n=5, shots=2)
        m = lm('llama', device, dtype, d_model=32, seed=3)
        with untouched(m):
            r = random_like(m, seed=1)
        p = next(r.parameters())
        assert p.device.type == torch.device(device).type and p.dtype == dtype, (p.device, p.dtype)
        assert not torch.equal(p, next(m.parameters()))
        finite(p, 'random weights')
        return f"{len(t)} questions, random_like on {p.device} in {p.dtype}"

    def shipped():
        lms = load_arith_lms()
        m = lms.clean.to(device=device, dtype=dtype)
        task = story_task(addend_pairs()[1][:48])
        with untouched(m, lms.tokenizer):
            r = causal_effects(m, task, lms.tokenizer, max_new_tokens=4, batch_size=16)
        assert r.accuracy >= (0.85 if bf16 else 0.95), r.accuracy
        runs, meta = load_smollm2_runs()
        worst = max(abs(getattr(effects_from_trials(t), k) - meta['runs'][' | '.join(key)][k]) for key, t in runs.items() for k in ('adce', 'aice', 'adce_se'))
        assert worst < 1e-9, worst
        return f"clean LM accuracy {r.accuracy:.2f}, ADCE {r.adce:.2f}, AICE {r.aice:.2f}; {len(runs)} shipped runs recomputed ({dtype})"

    return [('words_and_interventions', words_and_interventions), ('generation', generation), ('causal', causal),
            ('demo_data_and_training', demo_data_and_training), ('few_shot_and_random', few_shot_and_random), ('shipped', shipped)]
