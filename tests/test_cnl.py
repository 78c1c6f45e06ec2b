"""Tests of interpkit.papers.cnl (paper 13, Huang et al. ICLR 2025: capability localisation by commonality neurons) against
independent references: token ids read off the tiny tokenizer's words ('wN' is id N + 5); answer log-probabilities summed by a
loop over one unpadded sequence at a time; greedy decoding by an argmax loop; central finite differences through a
hand-written forward pre-hook that scales one neuron at chosen positions (float64 models); integrated gradients checked by
completeness (the layer's neurons zeroed by that hook) and by a hand-written midpoint-rule integral; top sets by sorting,
commonality by exact fractions, overlaps by Python sets and a Monte-Carlo of random sets; the fact-fidelity means by loops
over (fact, phrasing) pairs; fine-tuning masks rebuilt from the architectures' weight layouts; the data sets parsed back from
their text; and bad input."""
import contextlib, copy, inspect, math, re
from fractions import Fraction
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np, pytest, torch
from scipy import stats
import interpkit.models, interpkit.train
from interpkit.errors import ConfigError, NotFiniteError, ShapeError, SiteError
from interpkit.models import tiny_lm, tiny_tokenizer
from interpkit.train import assets_dir, load_asset, save_asset
import interpkit.papers.cnl as cnl
import interpkit.demos.cnl as demo
from tiny_models import unit_scale_lm
from interpkit.papers.cnl import (Capability, encode_answers, answer_scores, _answer_scores, NeuronSites, neuron_sites, ATTRIBUTIONS, POSITIONS,
                                  NeuronScores, neuron_attributions, Neurons, top_sets, commonality_neurons, Overlap, overlap, split_halves,
                                  halves_overlap, pairwise_overlap, amplified, random_neurons, neuron_parameters, finetune_neurons,
                                  NeuronRows, neuron_rows, with_rows, FactFidelity, fact_fidelity, overlap_table, across_table, plot_neuron_map,
                                  explore_localization, template_pairs)
from interpkit.demos.cnl import (addition, multiplication, sentiment, code, CAPABILITIES, FACTS, PARAPHRASES, fact_paraphrases, CNL_RECIPE, FINETUNED,
                                 KINDS, capability_data, train_neuron_finetune, load_neuron_finetune, TEMPLATES, WRAPPERS, GRID, GRID_SHOTS,
                                 TemplateGrid, load_template_grid)

def neuron_counts(m, layers=None): return neuron_sites(m, layers).counts

torch.set_num_threads(1)

D_MODEL, D_FF = 32, 128          # tiny_lm(d_model=32) has 4 * 32 MLP neurons per layer

# ---------------------------------------------------------------- helpers

def model(arch='llama', seed=0, dtype=torch.float32, gain=1.0):
    "A tiny LM with unit-scale weights, so that logits are peaked and attributions far from 0 (see tiny_models.py)."
    return unit_scale_lm(arch, seed, dtype, gain, D_MODEL)

@pytest.fixture(scope='module')
def tok(): return tiny_tokenizer()

def ids_of(text:str) -> list:
    "The tiny tokenizer's ids, from its vocabulary's layout: 5 special tokens, then 'w0', 'w1', ..."
    return [5 + int(w[1:]) for w in text.split()]

def words(g, n): return ' '.join(f'w{int(i)}' for i in torch.randint(0, 123, (n,), generator=g))

def word_data(n=4, seed=0, lo=2, hi=6, alo=1, ahi=4):
    "n prompts of lo..hi-1 words and answers of alo..ahi-1 words (with their leading space), seeded."
    g = torch.Generator().manual_seed(seed)
    P, A = [], []
    for _ in range(n):
        P.append(words(g, int(torch.randint(lo, hi, (1,), generator=g))))
        A.append(' ' + words(g, int(torch.randint(alo, ahi, (1,), generator=g))))
    return P, A

def mlp_in(m, l):
    "The module whose input is layer l's MLP neurons, found by hand."
    return m.transformer.h[l].mlp.c_proj if m.config.model_type == 'gpt2' else m.model.layers[l].mlp.down_proj

@contextlib.contextmanager
def neuron_hook(m, l, fn):
    "A forward pre-hook on layer l's MLP output projection (not interpkit.hooks): its input x becomes fn(x)."
    h = mlp_in(m, l).register_forward_pre_hook(lambda mod, args: (fn(args[0]),) + tuple(args[1:]))
    try: yield
    finally: h.remove()

def scale_at(j, factor, pos=None):
    "x with channel j (an int or a list) multiplied by factor at the positions pos (None: all)."
    def fn(x):
        x = x.clone()
        if pos is None: x[..., j] = x[..., j] * factor
        else: x[:, pos, j] = x[:, pos, j] * factor
        return x
    return fn

def ref_logprob(m, prompt, answer) -> float:
    "log p(answer | prompt): a loop over the answer's tokens of log_softmax, the model run on this one unpadded sequence (float64 sums)."
    p, a = ids_of(prompt), ids_of(answer)
    with torch.no_grad(): lg = m(torch.tensor([p + a])).logits[0].double()
    return sum(float(torch.log_softmax(lg[len(p) + i - 1], -1)[t]) for i, t in enumerate(a))

def ref_greedy(m, prompt, answer) -> bool:
    "Whether greedy decoding from the prompt (argmax, one token at a time) writes the answer."
    seq = ids_of(prompt)
    for t in ids_of(answer):
        with torch.no_grad(): nxt = int(m(torch.tensor([seq])).logits[0, -1].argmax())
        if nxt != t: return False
        seq.append(nxt)
    return True

def rand(*shape, seed=0): return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

def scores_of(s, layers=None, method='grad_x_act', positions='all'):
    layers = list(range(s.shape[1])) if layers is None else layers
    return NeuronScores(s, layers, torch.zeros(len(s)), method, positions)

def ref_tops(s, k) -> list:
    "Each sample's top set by sorting its flattened scores, positive ones only: a list of sets of flat indices."
    out = []
    for row in s.reshape(len(s), -1).tolist():
        out.append({i for i in sorted(range(len(row)), key=lambda i: -row[i])[:k] if row[i] > 0})
    return out

def ref_common(s, k, f) -> set:
    "Flat indices whose count of top sets, as an exact fraction of the samples, is at least f (read as the nearest fraction of denominator <= 10**6, so 7 / 12 is 7/12)."
    tops = ref_tops(s, k)
    N = s.shape[1] * s.shape[2]
    return {i for i in range(N) if Fraction(sum(i in t for t in tops), len(tops)) >= Fraction(repr(f)).limit_denominator(10**6)}

def ref_overlap(A:set, B:set, N:int) -> dict:
    c = len(A & B)
    e = len(A) * len(B) / N
    return dict(rate=c / len(A), iou=c / len(A | B), size_a=len(A), size_b=len(B), common=c, chance_rate=len(B) / N,
                chance_iou=e / (len(A) + len(B) - e))

def flat_set(mask) -> set: return set(torch.as_tensor(mask).flatten().nonzero()[:, 0].tolist())

def assert_overlap(o, want, tol=1e-12):
    assert (o.size_a, o.size_b, o.common) == (want['size_a'], want['size_b'], want['common'])
    for k in ('rate', 'iou', 'chance_rate', 'chance_iou'): assert getattr(o, k) == pytest.approx(want[k], abs=tol), k

# ---------------------------------------------------------------- constants and defaults

def test_constants_and_documented_defaults():
    assert ATTRIBUTIONS == ('grad_x_act', 'ig') and POSITIONS == ('all', 'last') and KINDS == ('commonality', 'random')
    assert FINETUNED == 'cnl_smollm2_neurons' and set(CAPABILITIES) == {'addition', 'multiplication', 'sentiment', 'code'}
    assert CNL_RECIPE == dict(n=40, k=100, f=0.3, train_seed=0, test_seed=1, steps=20, lr=1e-3, batch_size=8, controls=(0, 1, 2), factor=1.5)
    sig = lambda fn: {k: v.default for k, v in inspect.signature(fn).parameters.items() if v.default is not inspect.Parameter.empty}
    assert sig(neuron_attributions) == dict(layers=None, method='grad_x_act', positions='all', batch_size=8, n_steps=16)
    assert sig(answer_scores) == dict(batch_size=16)
    assert sig(finetune_neurons) == dict(steps=20, lr=1e-3, batch_size=8, seed=0)
    assert sig(amplified) == dict(factor=2.0) and sig(random_neurons) == dict(seed=0, per_layer=True)
    assert sig(halves_overlap) == dict(seed=0) and sig(split_halves) == dict(seed=0) and sig(overlap_table) == dict(seed=0)
    assert sig(across_table) == dict(measure='iou') and sig(explore_localization) == dict(f=0.3, top_k=100)
    assert sig(addition) == sig(multiplication) == dict(n=40, seed=0, shots=3, template='native')
    assert sig(sentiment) == sig(code) == dict(n=40, seed=0, shots=2, template='native') and sig(capability_data) == dict(split='train', template='native')
    assert TEMPLATES == ('native', 'qa', 'io', 'arrow') and GRID == 'cnl_smollm2_templates' and GRID_SHOTS == 2
    assert WRAPPERS == {'qa': ('Q: {x}\nA:', '\n\n'), 'io': ('Input: {x}\nOutput:', '\n\n'), 'arrow': ('{x} =>', '\n')}
    assert sig(template_pairs) == dict(shared=('qa', 'io', 'arrow')) and sig(load_template_grid) == dict(name='cnl_smollm2_templates')

# ---------------------------------------------------------------- data builders

LINE = r'([0-9]) \{op} ([0-9]) = '

@pytest.mark.parametrize('make,op,fn', [(addition, '+', lambda a, b: a + b), (multiplication, '*', lambda a, b: a * b)])
@pytest.mark.parametrize('shots', [0, 1, 3])
def test_arithmetic_prompts_parse_and_are_right(make, op, fn, shots):
    d = make(60, seed=3, shots=shots)
    assert isinstance(d, Capability) and d.name == ('addition' if op == '+' else 'multiplication') and len(d) == len(d.answers) == 60
    seen = set()
    for p, a in zip(d.prompts, d.answers):
        lines = p.split('\n')
        assert len(lines) == shots + 1
        for ln in lines[:-1]:
            mt = re.fullmatch(LINE.format(op=op) + r'([0-9]+)', ln)
            assert mt, ln
            x, y, z = map(int, mt.groups())
            assert z == fn(x, y)
            seen |= {x, y}
        mt = re.fullmatch(LINE.format(op=op), lines[-1])
        assert mt, lines[-1]
        x, y = map(int, mt.groups())
        assert a == str(fn(x, y))                        # no leading space: the prompt ends in '= '
        seen |= {x, y}
    assert d.questions == [p.split('\n')[-1] for p in d.prompts]   # the question is the last line, without the solved examples
    assert seen == set(range(1, 10))                     # one-digit operands 1..9, both ends drawn
    lines = [ln for p in d.prompts for ln in p.split('\n')]
    for side in (0, 1):                                  # the first and the second operand each take every digit 1..9
        assert {int(re.match(LINE.format(op=op), ln).group(side + 1)) for ln in lines} == set(range(1, 10))
    assert make(60, seed=3, shots=shots) == d and make(60, seed=4, shots=shots).prompts != d.prompts

def test_arithmetic_defaults_and_bad_n():
    d = addition()
    assert len(d) == 40 and all(p.count('\n') == 3 for p in d.prompts) and d == addition(40, 0, 3)
    assert multiplication() == multiplication(40, 0, 3) and len(addition(1)) == 1
    for make in (addition, multiplication, sentiment, code):
        for bad in (0, -1, True, 2.5, '3', None):
            with pytest.raises(ConfigError): make(bad)

GOOD = {'wonderful', 'delightful', 'brilliant', 'excellent', 'charming', 'superb', 'lovely', 'moving', 'fantastic', 'great'}
BAD = {'terrible', 'awful', 'boring', 'dreadful', 'dull', 'horrible', 'painful', 'bad', 'disappointing', 'tedious'}

def polarity(review:str) -> bool:
    ws = set(re.findall(r'[a-z]+', review.lower()))
    g, b = ws & GOOD, ws & BAD
    assert len(g) + len(b) == 1, review
    return bool(g)

@pytest.mark.parametrize('n,shots', [(40, 2), (7, 3), (10, 0)])
def test_sentiment_labels_match_the_words_half_positive_shots_alternate(n, shots):
    d = sentiment(n, seed=5, shots=shots)
    assert d.name == 'sentiment' and len(d) == n
    assert sum(a == ' positive' for a in d.answers) == (n + 1) // 2 and set(d.answers) <= {' positive', ' negative'}
    for p, a in zip(d.prompts, d.answers):
        blocks = p.split('\n\n')
        assert len(blocks) == shots + 1
        labels = []
        for b in blocks[:-1]:
            mt = re.fullmatch(r'Review: (.+)\nSentiment: (positive|negative)', b)
            assert mt, b
            assert polarity(mt.group(1)) == (mt.group(2) == 'positive')
            labels.append(mt.group(2))
        assert all(x != y for x, y in zip(labels, labels[1:]))          # the shots alternate
        mt = re.fullmatch(r'Review: (.+)\nSentiment:', blocks[-1])
        assert mt, blocks[-1]
        assert polarity(mt.group(1)) == (a == ' positive')
    assert d.questions == [p.split('\n\n')[-1] for p in d.prompts]  # the last review, without the labelled ones
    assert sentiment(n, seed=5, shots=shots) == d and sentiment(n, seed=6, shots=shots).prompts != d.prompts

def test_sentiment_order_and_shot_start_are_random():
    d = sentiment(40, seed=0)
    assert d == sentiment() and d.answers != [' positive', ' negative'] * 20     # shuffled, not alternating
    firsts = {re.match(r'Review: .+\nSentiment: (\w+)', p).group(1) for p in d.prompts}
    assert firsts == {'positive', 'negative'}                                     # both labels start a prompt's shots

def test_code_answers_are_the_loop_variable():
    d = code(50, seed=2)
    assert d.name == 'code' and len(d) == 50
    for p, a in zip(d.prompts, d.answers):
        mt = re.fullmatch(r'(\w+) = load\(\)\nfor (\w+) in (\w+):\n    ([\w.]+)\(', p)
        assert mt, p
        assert mt.group(1) == mt.group(3) and a == mt.group(2) and a != mt.group(1)
    assert code(50, seed=2) == d and code(50, seed=3).prompts != d.prompts and code() == code(40, 0)
    assert len({a for a in d.answers}) > 3
    assert d.questions == d.prompts   # no solved examples: the prompt is the question

def test_fact_paraphrases():
    sets = fact_paraphrases()
    capitals = dict(France='Paris', Japan='Tokyo', Italy='Rome', Germany='Berlin', Spain='Madrid', Russia='Moscow', Egypt='Cairo', Greece='Athens',
                    England='London', China='Beijing', Austria='Vienna', Peru='Lima')
    assert len(sets) == len(FACTS) == 12 and all(len(s) == len(PARAPHRASES) == 8 for s in sets)
    by = {s.name: s for s in sets}
    assert set(by) == {f'capital of {c}' for c in capitals}
    for c, cap in capitals.items():
        s = by[f'capital of {c}']
        assert s.answers == [' ' + cap] * 8
        assert all(c in p and cap not in p and not p.endswith(' ') for p in s.prompts)
        assert len(set(s.prompts)) == 8
    # the same phrasing at the same index for every fact
    for i in range(8):
        assert len({s.prompts[i].replace(s.name[len('capital of '):], '#') for s in sets}) == 1
    custom = fact_paraphrases([('Chile', 'Santiago'), ('Kenya', 'Nairobi')], ['{country} has its capital in', 'Capital of {country}:'])
    assert [s.prompts for s in custom] == [['Chile has its capital in', 'Capital of Chile:'], ['Kenya has its capital in', 'Capital of Kenya:']]
    assert [s.answers for s in custom] == [[' Santiago'] * 2, [' Nairobi'] * 2] and custom[1].name == 'capital of Kenya'
    for bad in (dict(facts=[]), dict(templates=[])):
        with pytest.raises(ConfigError): fact_paraphrases(**bad)

def test_capability_data_splits():
    for name in CAPABILITIES:
        tr, te = capability_data(name), capability_data(name, 'test')
        assert len(tr) == len(te) == 40 and tr.name == te.name == name
        assert tr == CAPABILITIES[name](40, seed=0)
        assert not set(tr.questions) & set(te.questions)  # held out: no test question is asked in training
        pool = CAPABILITIES[name](320, seed=1)  # the test split: the first 40 items of seed 1 whose question training does not ask
        kept = [i for i, q in enumerate(pool.questions) if q not in set(tr.questions)][:40]
        assert te.prompts == [pool.prompts[i] for i in kept] and te.answers == [pool.answers[i] for i in kept]
    with pytest.raises(ConfigError): capability_data('division')
    with pytest.raises(ConfigError): capability_data('addition', 'val')

# the shared templates, parsed by hand: (solved block, query block, separator) regexes; an item has no newline in them
BLOCKS = {'qa': (r'Q: (.+)\nA: (.+)', r'Q: (.+)\nA:', '\n\n'), 'io': (r'Input: (.+)\nOutput: (.+)', r'Input: (.+)\nOutput:', '\n\n'),
          'arrow': (r'(.+) => (.+)', r'(.+) =>', '\n')}

def check_item(name, x, y):
    "Whether y (no leading space) answers the item x of capability `name`, by parsing x."
    if name in ('addition', 'multiplication'):
        op = '+' if name == 'addition' else '*'
        mt = re.fullmatch(r'([1-9]) \{} ([1-9])'.format(op), x)
        assert mt, x
        a, b = map(int, mt.groups())
        assert int(y) == (a + b if op == '+' else a * b) and y == str(int(y)), (x, y)
    elif name == 'sentiment': assert polarity(x) == (y == 'positive') and y in ('positive', 'negative'), (x, y)
    else:
        mt = re.fullmatch(r'for (\w+) in (\w+): ([\w.]+)\(', x)
        assert mt and mt.group(1) == y and mt.group(2) != y, (x, y)

@pytest.mark.parametrize('template', ['qa', 'io', 'arrow'])
@pytest.mark.parametrize('name', ['addition', 'multiplication', 'sentiment', 'code'])
@pytest.mark.parametrize('shots', [0, 2, 3])
def test_shared_templates_parse_and_are_right(name, template, shots):
    d = CAPABILITIES[name](30, seed=4, shots=shots, template=template)
    solved, query, sep = BLOCKS[template]
    assert d.name == name and len(d) == 30
    for p, a, q in zip(d.prompts, d.answers, d.questions):
        blocks = p.split(sep)
        assert len(blocks) == shots + 1 and a.startswith(' ') and q == blocks[-1]
        labels = []
        for b in blocks[:-1]:
            mt = re.fullmatch(solved, b)
            assert mt, b
            check_item(name, *mt.groups()); labels.append(mt.group(2))
        mt = re.fullmatch(query, blocks[-1])
        assert mt, blocks[-1]
        check_item(name, mt.group(1), a[1:])
        if name == 'sentiment': assert all(x != y for x, y in zip(labels, labels[1:]))   # the solved reviews alternate
    if name == 'sentiment': assert [a == ' positive' for a in d.answers] == [i % 2 == 0 for i in range(30)]
    assert CAPABILITIES[name](30, seed=4, shots=shots, template=template) == d and CAPABILITIES[name](30, seed=5, shots=shots, template=template).prompts != d.prompts

@pytest.mark.parametrize('template', ['qa', 'io', 'arrow'])
def test_a_shared_template_is_the_same_text_around_every_capability(template):
    "With the items blanked out, the prompts of every capability in one shared template are the same text."
    solved, query, sep = BLOCKS[template]
    def skeleton(p):
        blocks = p.split(sep)
        return sep.join([re.sub(r'\(\.\+\)', '#', solved)] * (len(blocks) - 1) + [re.sub(r'\(\.\+\)', '#', query)]) if all(
            re.fullmatch(solved, b) for b in blocks[:-1]) and re.fullmatch(query, blocks[-1]) else None
    skel = {name: {skeleton(p) for p in fn(20, seed=1, shots=2, template=template).prompts} for name, fn in CAPABILITIES.items()}
    assert all(len(v) == 1 and None not in v for v in skel.values()) and len({next(iter(v)) for v in skel.values()}) == 1, skel
    # and the native formats differ from one capability to the next
    assert len({fn(1, seed=1).prompts[0].split('\n')[-1][:3] for fn in CAPABILITIES.values()}) > 2

def test_capability_data_in_templates():
    for name in CAPABILITIES:
        for i, t in enumerate(TEMPLATES):
            tr, te = capability_data(name, template=t), capability_data(name, 'test', t)
            kw = {} if t == 'native' else dict(shots=2, template=t)
            assert tr == CAPABILITIES[name](40, seed=1000 * i, **kw) and len(te) == 40 and not set(tr.questions) & set(te.questions)
            pool = CAPABILITIES[name](320, seed=1000 * i + 1, **kw)
            kept = [j for j, q in enumerate(pool.questions) if q not in set(tr.questions)][:40]
            assert te.prompts == [pool.prompts[j] for j in kept]
        assert capability_data(name, template='native') == capability_data(name)
    with pytest.raises(ConfigError, match="template"): capability_data('code', template='chat')
    for bad in ('chat', None):
        with pytest.raises(ConfigError): addition(3, template=bad)
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError, match='shots'): sentiment(3, shots=bad, template='qa')

def test_capability_subset():
    d = Capability('x', ['a', 'b', 'c'], ['1', '2', '3'])
    s = d.subset(torch.tensor([2, 0]))
    assert s == Capability('x', ['c', 'a'], ['3', '1']) and len(s) == 2 and len(d) == 3
    assert s.questions == ['c', 'a']  # questions default to the prompts
    q = Capability('x', ['A: a', 'A: b'], ['1', '2'], ['a', 'b']).subset([1])
    assert q.questions == ['b'] and q.prompts == ['A: b']

# ---------------------------------------------------------------- encode_answers

def test_encode_answers_labels_last_and_right_padding(tok):
    P, A = ['w3 w4 w9', 'w10', 'w1 w2'], [' w6 w7', ' w8 w11 w12', ' w0']
    b = encode_answers(tok, (P, A))
    rows = [ids_of(p) + ids_of(a) for p, a in zip(P, A)]
    T = max(map(len, rows))
    assert b['input_ids'].shape == b['labels'].shape == b['attention_mask'].shape == (3, T)
    for i, (p, r) in enumerate(zip(P, A)):
        full = ids_of(p) + ids_of(r)
        n = len(full)
        assert b['input_ids'][i].tolist() == full + [tok.eos_token_id] * (T - n)      # no pad token: the eos id, on the right
        assert b['attention_mask'][i].tolist() == [1] * n + [0] * (T - n)
        assert b['labels'][i].tolist() == [-100] * len(ids_of(p)) + ids_of(r) + [-100] * (T - n)
        assert int(b['last'][i]) == len(ids_of(p)) - 1
    assert b['last'].dtype == torch.long
    assert all(torch.equal(b[k], encode_answers(tok, Capability('c', P, A))[k]) for k in b)

def test_encode_answers_uses_the_pad_token():
    t = tiny_tokenizer()
    t.pad_token = 'w0'
    b = encode_answers(t, (['w3', 'w4 w5 w6'], [' w7', ' w8']))
    assert b['input_ids'][0].tolist() == [8, 12, 5, 5]

def test_encode_answers_errors(tok):
    for P, A in [(['w3 w4'], ['w5']),            # 'w4w5' is one (unknown) word: not a continuation
                 (['w3 w4'], ['w5 w6']),         # longer than the prompt, but not starting with its tokens
                 (['w3 w4'], ['']),              # nothing to score
                 (['w3 w4'], [' ']),
                 (['w3', 'w3 w4'], [' w5', 'w6'])]:
        with pytest.raises(ConfigError, match='continuation'): encode_answers(tok, (P, A))
    for bad in [([], []), Capability('none', [], []), (['w1', 'w2'], [' w3']), 'w1 w2', (['w1'],), ('w1', ' w2'), None]:
        with pytest.raises(ConfigError): encode_answers(tok, bad)

# ---------------------------------------------------------------- answer scores

def test__answer_scores_by_hand():
    lg = rand(2, 4, 5, seed=1).double()
    lab = torch.tensor([[-100, -100, 3, 1], [-100, 2, -100, -100]])
    lab_am = torch.tensor([[-100, -100, int(lg[0, 1].argmax()), int(lg[0, 2].argmax())], [-100, int(lg[1, 0].argmax()), -100, -100]])
    lp, ok = _answer_scores(lg, lab)
    ls = torch.log_softmax(lg, -1)
    assert lp.dtype == torch.float64 and ok.dtype == torch.bool
    assert torch.allclose(lp, torch.stack([ls[0, 1, 3] + ls[0, 2, 1], ls[1, 0, 2]]), atol=1e-12)
    want_ok = [int(lg[0, 1].argmax()) == 3 and int(lg[0, 2].argmax()) == 1, int(lg[1, 0].argmax()) == 2]
    assert ok.tolist() == want_ok
    lp2, ok2 = _answer_scores(lg, lab_am)
    assert ok2.tolist() == [True, True]
    lab_half = lab_am.clone(); lab_half[0, 3] = (lab_am[0, 3] + 1) % 5        # first token greedy, second not
    assert _answer_scores(lg, lab_half)[1].tolist() == [False, True]
    # low-precision logits: the log-softmax is taken in float32
    lp16, _ = _answer_scores(lg.to(torch.bfloat16), lab)
    ls16 = torch.log_softmax(lg.to(torch.bfloat16).float(), -1)
    assert lp16.dtype == torch.float32
    assert torch.allclose(lp16, torch.stack([ls16[0, 1, 3] + ls16[0, 2, 1], ls16[1, 0, 2]]), atol=1e-6)

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_answer_scores_match_a_per_sequence_loop(arch, tok, untouched):
    m = model(arch, seed=1, dtype=torch.float64)
    P, A = word_data(7, seed=2)
    with untouched(m, tok): got = answer_scores(m, tok, (P, A), batch_size=3)
    assert list(got.columns) == ['logprob', 'correct'] and len(got) == 7 and got['logprob'].dtype == np.float64
    want = [ref_logprob(m, p, a) for p, a in zip(P, A)]
    assert np.allclose(got['logprob'], want, rtol=1e-9, atol=1e-9)
    for bs in (1, 2, 7, 16):
        assert np.allclose(answer_scores(m, tok, Capability('d', P, A), batch_size=bs)['logprob'], want, rtol=1e-9, atol=1e-9)
    m.train()                                   # scored in eval mode (GPT-2's dropout off), the flags restored
    with untouched(m, tok): tr = answer_scores(m, tok, (P, A), batch_size=3)
    assert m.training and np.allclose(tr['logprob'], want, rtol=1e-9, atol=1e-9)

class NoKeep(torch.nn.Module):
    "A causal LM whose forward has no `logits_to_keep`: every position's logits are computed (the fallback path)."
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, input_ids, attention_mask=None): return self.m(input_ids=input_ids, attention_mask=attention_mask)

def test_answer_scores_without_logits_to_keep(tok):
    m = model('llama', seed=1, dtype=torch.float64)
    P, A = word_data(6, seed=5)
    want = [ref_logprob(m, p, a) for p, a in zip(P, A)]
    got = answer_scores(NoKeep(m), tok, (P, A), batch_size=4)
    assert np.allclose(got['logprob'], want, rtol=1e-9, atol=1e-9)
    assert got['correct'].tolist() == answer_scores(m, tok, (P, A))['correct'].tolist()
    calls = []
    h = m.lm_head.register_forward_hook(lambda mod, a, out: calls.append(out.shape[1]))
    try: answer_scores(m, tok, (P, A), batch_size=6)
    finally: h.remove()
    lab = encode_answers(tok, (P, A))['labels']
    assert calls == [int((lab[:, 1:] != -100).any(0).sum())] and calls[0] < lab.shape[1] - 1  # only the positions that predict an answer token

def greedy_data(m, n=8, seed=0):
    "Prompts with answers: the model's own greedy continuation (1-3 tokens), or one whose last token is changed."
    g = torch.Generator().manual_seed(seed)
    P, A = [], []
    for i in range(n):
        p = words(g, 2 + i % 3)
        seq = ids_of(p)
        for _ in range(1 + i % 3):
            with torch.no_grad(): seq.append(int(m(torch.tensor([seq])).logits[0, -1].argmax()))
        ans = seq[len(ids_of(p)):]
        if i % 2: ans[-1] = 5 + (ans[-1] - 5 + 1) % 123
        P.append(p); A.append(' ' + ' '.join(f'w{t - 5}' for t in ans))
    return P, A

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_answer_scores_correct_is_greedy_decoding(arch, tok):
    m = model(arch, seed=2)
    P, A = greedy_data(m, 10, seed=3)
    want = [ref_greedy(m, p, a) for p, a in zip(P, A)]
    assert want == [i % 2 == 0 for i in range(10)]                   # the set-up: even rows are greedy continuations
    for bs in (1, 4):
        got = answer_scores(m, tok, (P, A), batch_size=bs)
        assert got['correct'].tolist() == want and got['correct'].dtype == bool

def test_answer_scores_bf16_model_gives_float32_sums(tok, untouched):
    m = model('llama', seed=3).to(torch.bfloat16)
    P, A = word_data(5, seed=4)
    with untouched(m, tok): got = answer_scores(m, tok, (P, A), batch_size=2)
    assert got['logprob'].dtype == np.float64
    want = []
    for p, a in zip(P, A):                                            # the bf16 model's logits, log-softmax in float32
        pi, ai = ids_of(p), ids_of(a)
        with torch.no_grad(): lg = m(torch.tensor([pi + ai])).logits[0].float()
        want.append(sum(float(torch.log_softmax(lg[len(pi) + i - 1], -1)[t]) for i, t in enumerate(ai)))
    assert np.allclose(got['logprob'], want, atol=3e-2, rtol=1e-2)   # padding changes bf16 logits a little
    single = [answer_scores(m, tok, ([p], [a]))['logprob'][0] for p, a in zip(P, A)]
    assert np.allclose(single, want, atol=1e-4, rtol=1e-5)            # unpadded: the same float32 arithmetic

def test_answer_scores_errors(tok):
    m = model('llama')
    with pytest.raises(ConfigError): answer_scores(m, None, (['w1'], [' w2']))
    with pytest.raises(ConfigError): answer_scores(tiny_lm('bert', d_model=32, n_heads=4), tok, (['w1'], [' w2']))
    for bs in (0, -1, True, 1.5):
        with pytest.raises(ConfigError): answer_scores(m, tok, (['w1'], [' w2']), batch_size=bs)
    with pytest.raises(ConfigError): answer_scores(m, tok, ([], []))

# ---------------------------------------------------------------- sites

def test_neuron_sites_and_counts():
    m, g = model('llama'), model('gpt2')
    assert neuron_sites(m).sites == {0: 'model.layers.0.mlp.down_proj:in', 1: 'model.layers.1.mlp.down_proj:in'}
    assert neuron_sites(g).sites == {0: 'transformer.h.0.mlp.c_proj:in', 1: 'transformer.h.1.mlp.c_proj:in'}
    assert neuron_sites(m, 1).sites == {1: 'model.layers.1.mlp.down_proj:in'} and list(neuron_sites(g, [1, 0]).sites) == [1, 0]
    assert neuron_sites(m, (0, 1)).sites == neuron_sites(m, range(2)).sites == neuron_sites(m).sites
    assert neuron_counts(m) == neuron_counts(g) == {0: D_FF, 1: D_FF} and neuron_counts(m, [1]) == {1: D_FF}
    n = tiny_lm('neox', d_model=16, n_heads=2, n_layers=3)
    assert neuron_sites(n, 2).sites == {2: 'gpt_neox.layers.2.mlp.dense_4h_to_h:in'} and neuron_counts(n) == {0: 64, 1: 64, 2: 64}

def test_neuron_sites_negative_layers_count_from_the_end():
    m = model('llama')
    assert neuron_sites(m, -1).sites == {1: 'model.layers.1.mlp.down_proj:in'} and neuron_sites(m, [-2, 1]).sites == neuron_sites(m).sites
    assert list(neuron_sites(m, [-1, -2]).sites) == [1, 0] and neuron_counts(m, -2) == {0: D_FF}

def test_neuron_sites_errors():
    m = model('llama')
    for bad in (2, 5, -3, 'a', True, False, [0, 2], [0, -3], [1.0], [None], [True]):
        with pytest.raises(SiteError): neuron_sites(m, bad).sites
    for bad in ([], (), [0, 0], [1, -1], [0, 1, 0]):
        with pytest.raises(ConfigError): neuron_sites(m, bad).sites
    for unknown in (torch.nn.Linear(3, 3), torch.nn.Sequential(torch.nn.Linear(3, 3))):
        with pytest.raises(SiteError): neuron_sites(unknown).sites
        with pytest.raises(SiteError): neuron_counts(unknown)
    with pytest.raises(SiteError): neuron_counts(m, 7)

def test_neuron_sites_scalar_non_int_layer_raises_site_error():
    for bad in (1.0, np.int64(1), torch.tensor(1)):
        with pytest.raises(SiteError): neuron_sites(model('llama'), bad).sites

def test_smollm2_sites_and_shipped_neurons(untouched):
    "The only test that loads SmolLM2 (a few seconds): 30 layers of 1536 neurons; the shipped neurons when the asset exists."
    from interpkit.models import load_lm
    try: m, tk = load_lm()
    except Exception as e: pytest.skip(f'SmolLM2 is not available offline: {e}')
    assert neuron_counts(m) == {l: 1536 for l in range(30)}
    assert neuron_sites(m, [0, 29]).sites == {0: 'model.layers.0.mlp.down_proj:in', 29: 'model.layers.29.mlp.down_proj:in'}
    if (assets_dir()/f'{GRID}.safetensors').exists():   # the template grid: the first prompts of two cells attributed again here
        grid, meta = load_template_grid()
        assert set(grid) == {(c, t) for c in CAPABILITIES for t in TEMPLATES} and meta['K'] == CNL_RECIPE['k'] and meta['n'] == CNL_RECIPE['n']
        for cap, t in (('sentiment', 'qa'), ('code', 'arrow')):
            with untouched(m): live = neuron_attributions(m, tk, capability_data(cap, template=t).subset(range(3)))
            lt, at = top_sets(live, 100).flatten(1), top_sets(grid[cap, t].subset(range(3)), 100).flatten(1)
            assert ((lt & at).sum(1) / lt.sum(1)).min() >= 0.98, (cap, t)   # float32 round-off on another CPU may swap a neuron at the 100th place
            assert torch.allclose(live.logprob, grid[cap, t].logprob[:3], atol=1e-4)
    if not (assets_dir()/f'{FINETUNED}.safetensors').exists(): pytest.skip(f'{FINETUNED} not built yet (tools/make_cnl_assets.py)')
    with untouched(m):
        tuned, none, meta = load_neuron_finetune(m, tk, 'addition')
    mask = meta['neurons'].mask
    assert none is tk and mask.shape == (30, 1536) and mask.any() and set(meta) == {'neurons', 'recipe', 'training'}
    changed = torch.zeros_like(mask)
    for (n, p), q in zip(m.named_parameters(), tuned.parameters()):
        if torch.equal(p, q): continue
        l, kind = int(n.split('.')[2]), n.split('.')[4]
        diff = (p != q).any(1) if kind in ('gate_proj', 'up_proj') else (p != q).any(0)
        assert kind in ('gate_proj', 'up_proj', 'down_proj') and not (diff & ~mask[l]).any(), n
        changed[l] |= diff
    assert changed.sum() > 0.9 * mask.sum()

# ---------------------------------------------------------------- attributions: activation x gradient

def fd_attribution(m, prompt, answer, l, j, pos, e=1e-4) -> float:
    "Central difference of log p(answer) in the factor (1 + e) on neuron j of layer l at positions pos, divided by e."
    hi = lo = None
    with neuron_hook(m, l, scale_at(j, 1 + e, pos)): hi = ref_logprob(m, prompt, answer)
    with neuron_hook(m, l, scale_at(j, 1 - e, pos)): lo = ref_logprob(m, prompt, answer)
    return (hi - lo) / (2 * e)

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
@pytest.mark.parametrize('positions', ['last', 'all'])
def test_grad_x_act_matches_finite_differences(arch, positions, tok, untouched):
    m = model(arch, seed=4, dtype=torch.float64)
    P, A = word_data(3, seed=5)
    with untouched(m, tok): s = neuron_attributions(m, tok, (P, A), positions=positions, batch_size=2)
    assert s.scores.shape == (3, 2, D_FF) and s.scores.dtype == torch.float32 and s.scores.device.type == 'cpu'
    assert (s.layers, s.method, s.positions) == ([0, 1], 'grad_x_act', positions)
    g = torch.Generator().manual_seed(0)
    for i, (p, a) in enumerate(zip(P, A)):
        pos = None if positions == 'all' else len(ids_of(p)) - 1
        for l in (0, 1):
            row = s.scores[i, l]
            js = row.abs().topk(3).indices.tolist() + torch.randint(0, D_FF, (2,), generator=g).tolist()
            for j in js:
                assert float(row[j]) == pytest.approx(fd_attribution(m, p, a, l, j, pos), rel=1e-4, abs=1e-6), (i, l, j)
    assert s.scores.abs().max() > 1e-2

def test_all_positions_is_the_sum_over_positions(tok):
    m = model('llama', seed=5, dtype=torch.float64)
    P, A = ['w4 w8 w15 w16'], [' w23 w42']
    all_, last = (neuron_attributions(m, tok, (P, A), positions=p) for p in ('all', 'last'))
    T = len(ids_of(P[0]) + ids_of(A[0]))
    for l, j in [(0, int(all_.scores[0, 0].abs().argmax())), (1, int(all_.scores[0, 1].abs().argmax())), (1, 7)]:
        per = [fd_attribution(m, P[0], A[0], l, j, t) for t in range(T)]
        assert abs(per[-1]) < 1e-9                                    # the last token's activation feeds no answer logit
        assert float(all_.scores[0, l, j]) == pytest.approx(sum(per), rel=1e-4, abs=1e-6)
        assert float(last.scores[0, l, j]) == pytest.approx(per[len(ids_of(P[0])) - 1], rel=1e-4, abs=1e-6)
    assert not torch.allclose(all_.scores, last.scores)

def test_grad_x_act_is_per_example_and_logprob_is_answer_scores(tok, untouched):
    m = model('gpt2', seed=6, dtype=torch.float64)
    P, A = word_data(6, seed=7, lo=1, hi=8)
    full = neuron_attributions(m, tok, (P, A), batch_size=6)
    for bs in (1, 4):
        assert torch.allclose(neuron_attributions(m, tok, (P, A), batch_size=bs).scores, full.scores, rtol=1e-5, atol=1e-7)
    # the same sample among other batch mates
    other = neuron_attributions(m, tok, ([P[2], 'w1 w2 w3 w4 w5 w6 w7 w8 w9'], [A[2], ' w9']), batch_size=2)
    assert torch.allclose(other.scores[0], full.scores[2], rtol=1e-5, atol=1e-7)
    want = answer_scores(m, tok, (P, A))['logprob'].to_numpy()
    assert full.logprob.shape == (6,) and np.allclose(full.logprob.numpy(), want, rtol=1e-6, atol=1e-6)
    # a model in training mode (GPT-2 has dropout) is attributed in eval mode and left in training mode
    m.train()
    with untouched(m, tok): tr = neuron_attributions(m, tok, (P, A), batch_size=3)
    assert m.training and torch.allclose(tr.scores, full.scores, rtol=1e-5, atol=1e-7)

def test_attribution_layers_subset(tok):
    m = model('llama', seed=7, dtype=torch.float64)
    P, A = word_data(3, seed=8)
    full = neuron_attributions(m, tok, (P, A))
    one = neuron_attributions(m, tok, (P, A), layers=[1])
    assert one.layers == [1] and one.scores.shape == (3, 1, D_FF)
    assert torch.allclose(one.scores[:, 0], full.scores[:, 1], rtol=1e-5, atol=1e-7)
    rev = neuron_attributions(m, tok, (P, A), layers=[1, 0])
    assert rev.layers == [1, 0] and torch.allclose(rev.scores, full.scores.flip(1), rtol=1e-5, atol=1e-7)

def test_neuron_scores_subset():
    s = NeuronScores(rand(4, 2, 3), [3, 5], torch.arange(4.), 'ig', 'last')
    t = s.subset([3, 1])
    assert len(s) == 4 and len(t) == 2 and torch.equal(t.scores, s.scores[[3, 1]]) and t.logprob.tolist() == [3., 1.]
    assert (t.layers, t.method, t.positions) == ([3, 5], 'ig', 'last')

class Boom(Exception): pass

@pytest.mark.parametrize('method', ['grad_x_act', 'ig'])
def test_attributions_leave_the_model_untouched_when_they_raise(method, tok, untouched):
    m = model('llama', seed=8)
    def boom(mod, args, out): raise Boom()
    h = m.lm_head.register_forward_hook(boom)                         # raises after the neuron sites ran
    try:
        with untouched(m, tok), pytest.raises(Boom): neuron_attributions(m, tok, word_data(2), method=method, n_steps=4)
    finally: h.remove()
    # a bad item in the second batch: the first batch's hooks are gone
    with untouched(m, tok), pytest.raises(ConfigError): neuron_attributions(m, tok, (['w1', 'w2'], [' w3', 'w4']), method=method, batch_size=1, n_steps=4)

def test_attributions_not_finite(tok, untouched):
    m = model('llama', seed=9)
    with torch.no_grad(): m.model.layers[0].mlp.down_proj.weight[0, 0] = float('inf')
    with untouched(m, tok), pytest.raises(NotFiniteError): neuron_attributions(m, tok, word_data(2))

def test_attributions_bad_arguments(tok):
    m, d = model('llama'), word_data(2)
    for kw in (dict(method='grad'), dict(method='IG'), dict(positions='first'), dict(positions=None), dict(batch_size=0), dict(layers=[3]),
               dict(layers=[]), dict(method='ig', n_steps=1), dict(method='ig', n_steps=0), dict(method='ig', n_steps=True), dict(method='ig', n_steps=4.0)):
        with pytest.raises((ConfigError, SiteError)): neuron_attributions(m, tok, d, **kw)
    with pytest.raises(SiteError): neuron_attributions(m, tok, d, layers=[3])
    with pytest.raises(ConfigError): neuron_attributions(m, None, d)
    with pytest.raises(ConfigError): neuron_attributions(m, tok, ([], []))
    assert neuron_attributions(m, tok, d, method='ig', n_steps=2).scores.shape == (2, 2, D_FF)

# ---------------------------------------------------------------- attributions: integrated gradients

def zero_layer(pos):
    def fn(x):
        x = x.clone()
        if pos is None: x[:] = 0
        else: x[:, pos] = 0
        return x
    return fn

def ig_case(arch, positions, seed):
    m = model(arch, seed=seed, dtype=torch.float64)
    P, A = word_data(3, seed=seed + 1)
    return m, P, A

def completeness_gaps(m, P, A, positions):
    "Per sample and layer: logprob(model) - logprob(that layer's neurons zeroed at the chosen positions), by the hand-written hook."
    out = torch.zeros(len(P), 2, dtype=torch.float64)
    for i, (p, a) in enumerate(zip(P, A)):
        pos = None if positions == 'all' else len(ids_of(p)) - 1
        full = ref_logprob(m, p, a)
        for l in (0, 1):
            with neuron_hook(m, l, zero_layer(pos)): out[i, l] = full - ref_logprob(m, p, a)
    return out

IG_STEPS = 64

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
@pytest.mark.parametrize('positions', ['last', 'all'])
def test_ig_completeness(arch, positions, tok):
    "Per sample and layer: the attributions sum to logprob(model) - logprob(that layer's neurons zeroed at the chosen positions)."
    m, P, A = ig_case(arch, positions, 10)
    s = neuron_attributions(m, tok, (P, A), method='ig', positions=positions, n_steps=IG_STEPS, batch_size=2)
    want = completeness_gaps(m, P, A, positions)
    assert (want.abs() > 1e-2).all()
    assert torch.allclose(s.scores.double().sum(-1), want, rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
@pytest.mark.parametrize('positions', ['last', 'all'])
def test_ig_fields_untouched_and_logprob(arch, positions, tok, untouched):
    m, P, A = ig_case(arch, positions, 10)
    with untouched(m, tok): s = neuron_attributions(m, tok, (P, A), method='ig', positions=positions, n_steps=IG_STEPS, batch_size=2)
    assert (s.method, s.positions, s.scores.dtype, s.scores.shape) == ('ig', positions, torch.float32, (3, 2, D_FF))
    lp = torch.tensor([ref_logprob(m, p, a) for p, a in zip(P, A)], dtype=torch.float64)
    assert torch.allclose(s.logprob.double(), lp, rtol=1e-6, atol=1e-6)

def ref_ig(m, prompt, answer, l, pos, M=64) -> torch.Tensor:
    """Integrated gradients of log p(answer) in layer l's neuron activations at positions pos, from zero, by the midpoint rule:
    act_j * mean over alpha of d logp / d a_j at a = alpha * act (the whole layer scaled together), summed over the positions."""
    p, a = ids_of(prompt), ids_of(answer)
    ids = torch.tensor([p + a])
    T = ids.shape[1]
    m_pos = torch.zeros(1, T, 1, dtype=torch.float64)
    if pos is None: m_pos[:] = 1
    else: m_pos[0, pos] = 1
    total, act = 0, None
    for k in range(M):
        alpha = (k + 0.5) / M
        z = torch.zeros(1, T, D_FF, dtype=torch.float64, requires_grad=True)
        seen = {}
        def fn(x):
            seen['act'] = x.detach()
            return x * (1 - m_pos) + (alpha * x.detach() + z) * m_pos
        with neuron_hook(m, l, fn):
            lg = m(ids).logits[0]
            lp = sum(torch.log_softmax(lg[len(p) + i - 1], -1)[t] for i, t in enumerate(a))
        total = total + torch.autograd.grad(lp, z)[0]
        act = seen['act']
    return (act * total / M * m_pos).sum(1)[0]

def test_ig_matches_a_hand_written_riemann_integral(tok):
    "Neuron by neuron, against a midpoint-rule integral written here (Captum's Gauss-Legendre rule and the midpoint rule agree closely at 64 points)."
    m = model('llama', seed=12, dtype=torch.float64)
    P, A = ['w10 w20 w30', 'w7'], [' w40 w50', ' w60 w61 w62']
    for positions in ('all', 'last'):
        s = neuron_attributions(m, tok, (P, A), method='ig', positions=positions, n_steps=IG_STEPS)
        for i in range(2):
            pos = None if positions == 'all' else len(ids_of(P[i])) - 1
            want = ref_ig(m, P[i], A[i], 1, pos)
            got = s.scores[i, 1].double()
            assert want.abs().max() > 1e-2
            assert torch.allclose(got, want, atol=2e-3 * float(want.abs().max()), rtol=0)
    gxa = neuron_attributions(m, tok, (P, A), positions='all')
    assert not torch.allclose(gxa.scores, s.scores, atol=1e-3)        # the model is not linear in its neurons

def test_ig_is_per_example_and_logprob_is_answer_scores(tok):
    m = model('gpt2', seed=13, dtype=torch.float64)
    P, A = word_data(4, seed=14, lo=1, hi=7)
    a = neuron_attributions(m, tok, (P, A), method='ig', batch_size=4, n_steps=8)
    b = neuron_attributions(m, tok, (P, A), method='ig', batch_size=1, n_steps=8)
    assert torch.allclose(a.scores, b.scores, rtol=1e-5, atol=1e-7)
    assert np.allclose(a.logprob.numpy(), answer_scores(m, tok, (P, A))['logprob'], rtol=1e-6, atol=1e-6)
    c = neuron_attributions(m, tok, (P, A), method='ig', batch_size=4, n_steps=9)
    assert not torch.allclose(a.scores, c.scores, rtol=0, atol=1e-9)  # steps reaches the integral

# ---------------------------------------------------------------- top sets and commonality

def test_top_sets_against_sorting():
    s = rand(5, 3, 7, seed=15)
    for k in (1, 4, 10, 21):
        t = top_sets(s, k)
        assert t.shape == s.shape and t.dtype == torch.bool
        assert (t.flatten(1).sum(1) == torch.minimum(torch.tensor(k), (s.flatten(1) > 0).sum(1))).all()
        assert [flat_set(r) for r in t] == ref_tops(s, k)
    assert torch.equal(top_sets(scores_of(s), 4), top_sets(s, 4))
    assert torch.equal(top_sets(s, 21), s > 0)                  # all neurons asked for: every one that supports the answer
    assert torch.equal(top_sets(s.abs() + 1e-3, 21), torch.ones_like(s, dtype=torch.bool))
    assert not top_sets(-s.abs(), 3).any()                      # no neuron supports the answer: empty top sets
    small = torch.tensor([[[0.3, 0.0, 0.2, -0.1]]])              # small positive scores count, a zero does not
    assert top_sets(small, 3)[0, 0].tolist() == [True, False, True, False]
    for bad in (0, -1, 22, True, 2.0, None):
        with pytest.raises(ConfigError): top_sets(s, bad)
    for bad in (rand(5, 7), rand(2, 3, 4, 5), [[[1.]]], torch.zeros(0, 2, 3)):
        with pytest.raises((ShapeError, ConfigError)): top_sets(bad, 1)
    with pytest.raises(ShapeError): top_sets(rand(5, 7), 1)
    with pytest.raises(ConfigError): top_sets(torch.zeros(0, 2, 3), 1)

def planted():
    """10 samples, 2 layers x 5 neurons, k = 3. Top sets: samples 0-5 {A, B, D}, sample 6 {A, B, E}, samples 7-9 {A, C, E}, so the
    counts are A (0,0): 10, B (0,1): 7, C (0,2): 3, D (1,0): 6, E (1,1): 4, the rest 0."""
    A, B, C, Dn, E = 0, 1, 2, 5, 6
    sets = [{A, B, Dn}] * 6 + [{A, B, E}] + [{A, C, E}] * 3
    s = -torch.rand(10, 10, generator=torch.Generator().manual_seed(0))
    for i, st in enumerate(sets):
        for j in st: s[i, j] = 1 + torch.rand(1, generator=torch.Generator().manual_seed(i * 10 + j)).item()
    return s.reshape(10, 2, 5), {A: 10, B: 7, C: 3, Dn: 6, E: 4}

def test_commonality_neurons_planted_counts():
    s, counts = planted()
    want_freq = torch.zeros(10)
    for j, c in counts.items(): want_freq[j] = c / 10
    for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1, 0.35, 0.61, 0.05, 1e-6):
        c = commonality_neurons(s, 3, f)
        want = {j for j, n in counts.items() if Fraction(n, 10) >= Fraction(repr(f))}
        assert flat_set(c.mask) == want == ref_common(s, 3, f), f
        assert c.mask.shape == (2, 5) and c.mask.dtype == torch.bool and len(c) == len(want)
        assert torch.allclose(c.frequency.flatten(), want_freq) and c.layers == [0, 1]
    # exactly count / n is included, a hair above is not
    assert flat_set(commonality_neurons(s, 3, 0.7).mask) == {0, 1}
    assert flat_set(commonality_neurons(s, 3, 0.7 + 1e-7).mask) == {0}
    assert flat_set(commonality_neurons(s, 3, 0.3).mask) == {0, 1, 2, 5, 6}
    assert flat_set(commonality_neurons(s, 3, 0.3 + 1e-7).mask) == {0, 1, 5, 6}
    c = commonality_neurons(scores_of(s, layers=[4, 9]), 3, 0.5)
    assert c.layers == [4, 9] and c.per_layer.tolist() == [2, 1] and list(c.per_layer.index) == [4, 9] and c.share == 3 / 10

@pytest.mark.parametrize('n', [3, 7, 10, 12])
def test_commonality_matches_exact_fractions_on_random_scores(n):
    s = rand(n, 2, 6, seed=n)
    for f in [i / n for i in range(1, n + 1)] + [0.25, 0.5, 0.3, 0.7, 0.9]:
        c = commonality_neurons(s, 4, f)
        assert flat_set(c.mask) == ref_common(s, 4, f), (n, f)
        tops = ref_tops(s, 4)
        assert c.frequency.flatten().tolist() == pytest.approx([sum(j in t for t in tops) / n for j in range(12)])

def test_commonality_bad_f():
    s = rand(4, 2, 3)
    for bad in (0, 0.0, -0.1, 1.0000001, 1.5, 2, True, False, '0.5', None, float('nan')):
        with pytest.raises(ConfigError): commonality_neurons(s, 2, bad)
    with pytest.raises(ConfigError): commonality_neurons(s, 0, 0.5)

# ---------------------------------------------------------------- overlap

def test_overlap_hand_made_sets():
    a = torch.zeros(2, 5, dtype=torch.bool); b = torch.zeros(2, 5, dtype=torch.bool)
    a.view(-1)[[0, 1, 2, 3]] = True; b.view(-1)[[2, 3, 7]] = True
    o = overlap(a, b)
    assert isinstance(o, Overlap)
    assert (o.size_a, o.size_b, o.common) == (4, 3, 2)
    assert o.rate == pytest.approx(2 / 4) and o.iou == pytest.approx(2 / 5) and o.chance_rate == pytest.approx(3 / 10)
    assert o.chance_iou == pytest.approx(1.2 / (4 + 3 - 1.2))
    r = overlap(Neurons(b, [0, 1]), Neurons(a, [0, 1]))                     # not symmetric in the rate
    assert r.rate == pytest.approx(2 / 3) and r.iou == pytest.approx(2 / 5) and r.chance_rate == pytest.approx(4 / 10)
    assert r.chance_iou == pytest.approx(o.chance_iou)
    s = overlap(a, a)
    assert s.rate == s.iou == 1 and s.common == 4
    d = torch.zeros(2, 5, dtype=torch.bool); d[1, 4] = True
    assert overlap(a, d).rate == 0 and overlap(a, d).iou == 0

@pytest.mark.parametrize('seed', range(4))
def test_overlap_random_sets_against_sets(seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.rand(3, 11, generator=g) < 0.3, torch.rand(3, 11, generator=g) < 0.5
    assert_overlap(overlap(a, b), ref_overlap(flat_set(a), flat_set(b), 33))

def test_overlap_chance_rate_monte_carlo():
    "Random sets of sizes |A| = 6 and |B| = 9 among N = 40: the mean rate is |B| / N; the IoU of the means is chance_iou."
    rng = np.random.default_rng(0)
    N, na, nb, R = 40, 6, 9, 20000
    common = np.array([len(set(rng.choice(N, na, replace=False)) & set(rng.choice(N, nb, replace=False))) for _ in range(R)])
    a = torch.zeros(4, 10, dtype=torch.bool); a.view(-1)[:na] = True
    b = torch.zeros(4, 10, dtype=torch.bool); b.view(-1)[20:20 + nb] = True
    o = overlap(a, b)
    se = (common / na).std() / math.sqrt(R)
    assert abs((common / na).mean() - o.chance_rate) < 6 * se   # 6 standard errors: a correct chance_rate fails with probability 2e-9
    ec = common.mean()
    se_iou = (na + nb) / (na + nb - ec) ** 2 * common.std() / math.sqrt(R)   # the IoU of the mean common count, by the delta method
    assert abs(ec / (na + nb - ec) - o.chance_iou) < 6 * se_iou

def test_overlap_errors():
    a = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ShapeError): overlap(a, torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ShapeError): overlap(a, torch.ones(10, dtype=torch.bool))
    with pytest.raises(ConfigError): overlap(torch.zeros(2, 5, dtype=torch.bool), a)
    with pytest.raises(ConfigError): overlap(a, torch.zeros(2, 5, dtype=torch.bool))
    for bad in (torch.ones(2, 5), torch.ones(2, 5, dtype=torch.long), [[True]], None):
        with pytest.raises(ConfigError): overlap(a, bad)

def test_split_halves():
    for n in range(2, 12):
        a, b = split_halves(n, seed=n)
        assert len(a) == n // 2 and len(b) == n - n // 2 and not set(a) & set(b) and sorted(a + b) == list(range(n))
        assert a == sorted(a) and b == sorted(b)
        assert split_halves(n, seed=n) == (a, b)
    assert split_halves(30) == split_halves(30, seed=0) and split_halves(30, seed=1) != split_halves(30, seed=0)
    assert len({tuple(split_halves(30, seed=s)[0]) for s in range(10)}) == 10
    for bad in (1, 0, -2, True, 2.0, None):
        with pytest.raises(ConfigError): split_halves(bad)

def structured(n, layers=2, d=8, seed=0, strength=2.0):
    "Scores with a common pattern (some neurons high in most samples) plus noise."
    g = torch.Generator().manual_seed(seed)
    return strength * torch.randn(1, layers, d, generator=g) + torch.randn(n, layers, d, generator=g)

@pytest.mark.parametrize('seed', [0, 3])
def test_halves_overlap_by_hand(seed):
    s = structured(12, seed=5)
    a, b = split_halves(12, seed)
    o = halves_overlap(scores_of(s), 4, 0.5, seed)
    assert_overlap(o, ref_overlap(ref_common(s[a], 4, 0.5), ref_common(s[b], 4, 0.5), 16))
    assert halves_overlap(s, 4, 0.5, seed) == o
    if seed == 0: assert halves_overlap(s, 4, 0.5) == o
    with pytest.raises(ConfigError): halves_overlap(s[:1], 4, 0.5)

def test_pairwise_overlap_loop():
    s = structured(6, seed=7, strength=1.0)
    for k in (1, 3, 8):
        tops = ref_tops(s, k)
        want = np.mean([len(tops[i] & tops[j]) / len(tops[i]) for i in range(6) for j in range(6) if i != j])
        assert pairwise_overlap(s, k) == pytest.approx(want, abs=1e-7)
        assert pairwise_overlap(scores_of(s), k) == pytest.approx(want, abs=1e-7)
    with pytest.raises(ConfigError): pairwise_overlap(s[:1], 2)
    with pytest.raises(ConfigError): pairwise_overlap(torch.cat([s, -s.abs()[:1]]), 2)  # a sample without a positive attribution

def fact_scores(F_=3, P=4, d=24, seed=0):
    "Scores of facts x phrasings: a fact pattern (weight 3), a phrasing pattern (weight 2) and noise, so the three means differ."
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(F_, 1, 2, d // 2, generator=g), torch.randn(1, P, 2, d // 2, generator=g)
    return 3 * u + 2 * v + 0.5 * torch.randn(F_, P, 2, d // 2, generator=g)

def test_fact_fidelity_loops():
    S = fact_scores(seed=1)
    F_, P, k = 3, 4, 5
    tops = [ref_tops(S[a], k) for a in range(F_)]
    r = lambda a, p, b, q: len(tops[a][p] & tops[b][q]) / k
    same_f = np.mean([r(a, p, a, q) for a in range(F_) for p in range(P) for q in range(P) if p != q])
    same_p = np.mean([r(a, p, b, p) for a in range(F_) for b in range(F_) if a != b for p in range(P)])
    neither = np.mean([r(a, p, b, q) for a in range(F_) for b in range(F_) if a != b for p in range(P) for q in range(P) if p != q])
    assert min(abs(same_f - same_p), abs(same_f - neither), abs(same_p - neither)) > 0.05   # the set-up tells them apart
    got = fact_fidelity([scores_of(S[a]) for a in range(F_)], k)
    assert isinstance(got, FactFidelity) and (got.facts, got.phrasings) == (F_, P)
    assert (got.same_fact, got.same_phrasing, got.neither) == pytest.approx((same_f, same_p, neither), abs=1e-6)
    assert fact_fidelity([S[a] for a in range(F_)], k) == got

def test_fact_fidelity_errors():
    S = fact_scores()
    with pytest.raises(ConfigError): fact_fidelity([S[0]], 3)
    with pytest.raises(ConfigError): fact_fidelity([], 3)
    with pytest.raises(ShapeError): fact_fidelity([S[0], S[1][:3]], 3)
    with pytest.raises(ShapeError): fact_fidelity([S[0][:1], S[1][:1]], 3)
    with pytest.raises(ConfigError): fact_fidelity([S[0], S[1]], 0)

# ---------------------------------------------------------------- amplification

def mask_of(shape, idx:dict) -> torch.Tensor:
    m = torch.zeros(shape, dtype=torch.bool)
    for row, js in idx.items(): m[row, js] = True
    return m

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_amplified_factor_zero_is_ablation_and_factor_scales_the_masked_channels(arch, tok, untouched):
    m = model(arch, seed=16, dtype=torch.float64)
    ids = torch.tensor([ids_of('w1 w2 w3 w4 w5'), ids_of('w9 w8 w7 w6 w5')])
    N = Neurons(mask_of((2, D_FF), {0: [3, 17, 100], 1: [5]}), [0, 1])
    with torch.no_grad(): base = m(ids).logits
    for factor in (0, 0.0, 1.5, 3, -1.0):
        with torch.no_grad(), neuron_hook(m, 0, scale_at([3, 17, 100], factor)), neuron_hook(m, 1, scale_at([5], factor)):
            want = m(ids).logits
        with untouched(m, tok):
            with amplified(m, N, factor) as mm, torch.no_grad():
                assert mm is m
                got = m(ids).logits
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), factor
        assert not torch.allclose(got, base, atol=1e-6)
    # what layer 0's output projection reads: masked channels times the factor, the others as they were
    seen = {}
    def grab(key):
        def fn(x): seen[key] = x.detach().clone(); return x
        return fn
    with torch.no_grad(), neuron_hook(m, 0, grab('plain')): m(ids)
    with amplified(m, N, 2.5), torch.no_grad(), neuron_hook(m, 0, grab('amp')): m(ids)   # registered after: sees the patched input
    keep = torch.ones(D_FF, dtype=torch.bool); keep[[3, 17, 100]] = False
    assert torch.equal(seen['amp'][..., keep], seen['plain'][..., keep])
    assert torch.allclose(seen['amp'][..., ~keep], 2.5 * seen['plain'][..., ~keep], rtol=1e-14, atol=0)
    with torch.no_grad(): assert torch.equal(m(ids).logits, base)                     # nothing left behind

def test_amplified_default_factor_layers_subset_and_empty_rows(tok):
    m = model('llama', seed=17, dtype=torch.float64)
    ids = torch.tensor([ids_of('w11 w12 w13')])
    N = Neurons(mask_of((1, D_FF), {0: [0, 9]}), [1])                  # row 0 is layer 1
    with torch.no_grad(), neuron_hook(m, 1, scale_at([0, 9], 2.0)): want = m(ids).logits
    with amplified(m, N), torch.no_grad(): got = m(ids).logits
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    empty = Neurons(torch.zeros(2, D_FF, dtype=torch.bool), [0, 1])
    with torch.no_grad(): base = m(ids).logits
    with amplified(m, empty, 5.0), torch.no_grad(): assert torch.equal(m(ids).logits, base)

def test_amplified_removes_its_hooks_on_an_exception(tok, untouched):
    m = model('gpt2', seed=18)
    N = Neurons(mask_of((2, D_FF), {1: [2]}), [0, 1])
    with untouched(m, tok), pytest.raises(Boom):
        with amplified(m, N, 0.0): raise Boom()
    ids = torch.tensor([ids_of('w1 w2')])
    with untouched(m):
        with pytest.raises(Boom):
            with amplified(m, N, 0.0):
                m(ids); raise Boom()

def test_amplified_bad_input():
    m = model('llama')
    N = Neurons(mask_of((2, D_FF), {0: [1]}), [0, 1])
    for bad in (True, float('nan'), float('inf'), '2', None, torch.tensor(2.0)):
        with pytest.raises(ConfigError):
            with amplified(m, N, bad): pass
    other = Neurons(torch.zeros(2, 64, dtype=torch.bool), [0, 1])      # a mask from a model with 64 neurons per layer
    with pytest.raises(ShapeError):
        with amplified(m, other): pass
    with pytest.raises(ShapeError):
        with amplified(m, Neurons(torch.zeros(3, D_FF, dtype=torch.bool), [0, 1])): pass
    with pytest.raises(SiteError):
        with amplified(m, Neurons(torch.zeros(1, D_FF, dtype=torch.bool), [4])): pass
    with pytest.raises(ConfigError):
        with amplified(m, N.mask): pass
    # layers of different widths cannot share one mask
    from transformers.models.llama.modeling_llama import LlamaMLP
    cfg = copy.deepcopy(m.config); cfg.intermediate_size = 64
    m.model.layers[1].mlp = LlamaMLP(cfg)
    assert neuron_counts(m) == {0: D_FF, 1: 64}
    for mask in (torch.zeros(2, D_FF, dtype=torch.bool), torch.zeros(2, 64, dtype=torch.bool)):
        with pytest.raises(ShapeError):
            with amplified(m, Neurons(mask, [0, 1])): pass

# ---------------------------------------------------------------- random neurons

def test_random_neurons_counts_disjoint_seeded():
    given = Neurons(mask_of((3, 20), {0: [0, 1, 2, 3, 4], 2: [7, 8]}), [2, 4, 6])
    r = random_neurons(given, seed=3)
    assert r.layers == [2, 4, 6] and r.mask.dtype == torch.bool and r.frequency is None
    assert r.mask.sum(1).tolist() == [5, 0, 2] and not (r.mask & given.mask).any()
    assert torch.equal(random_neurons(given, seed=3).mask, r.mask) and not torch.equal(random_neurons(given, seed=4).mask, r.mask)
    assert torch.equal(random_neurons(given).mask, random_neurons(given, 0, True).mask)
    spread = [random_neurons(given, seed=s, per_layer=False).mask for s in range(5)]
    for t in spread: assert t.sum() == 7 and not (t & given.mask).any()
    assert any(t.sum(1).tolist() != [5, 0, 2] for t in spread)          # the total only: layers are drawn too
    assert not torch.equal(random_neurons(given, 1, False).mask, random_neurons(given, 2, False).mask)
    bare = random_neurons(given.mask, seed=1)
    assert bare.layers == [0, 1, 2] and bare.mask.sum(1).tolist() == [5, 0, 2]
    with pytest.raises(ConfigError): random_neurons(torch.ones(2, 3))

def test_random_neurons_are_uniform_over_the_free_neurons():
    given = mask_of((1, 12), {0: [0, 1, 2, 3]})
    counts = sum(random_neurons(given, seed=s).mask[0].long() for s in range(400))
    assert counts[:4].sum() == 0
    assert stats.chisquare(counts[4:].numpy()).pvalue > 1e-3
    counts = sum(random_neurons(mask_of((2, 6), {0: [0, 1]}), seed=s, per_layer=False).mask.flatten().long() for s in range(400))
    assert counts[:2].sum() == 0 and stats.chisquare(counts[2:].numpy()).pvalue > 1e-3

def test_random_neurons_over_half_a_layer_exactly_as_many_or_a_typed_error():
    "Issue 51: a set that fills over half a layer got fewer random neurons than it holds; now exactly as many, or a ConfigError where that is impossible."
    given = Neurons(mask_of((2, 8), {0: [0, 1, 2, 3, 4], 1: [0]}), [3, 5])      # layer 3: 5 of 8 neurons, 3 left; 6 of 16 in all, 10 left
    with pytest.raises(ConfigError, match=r"layer 3: 5 of its 8 neurons \(only 3 others\).*per_layer=False"): random_neurons(given, seed=0)
    counts = torch.zeros(16)
    for s in range(600):                                                      # the total only: exactly 6, disjoint, uniform over the 10 free neurons
        r = random_neurons(given, seed=s, per_layer=False).mask
        assert int(r.sum()) == 6 and not (r & given.mask).any()
        counts += r.flatten().float()
    free = (~given.mask).flatten()
    assert counts[~free].sum() == 0 and counts.sum() == 600 * 6
    assert stats.chisquare(counts[free].numpy(), np.full(10, 600 * 6 / 10)).pvalue > 1e-3   # each free neuron drawn with probability 6/10
    half = Neurons(mask_of((2, 8), {0: [0, 2, 4, 6], 1: [1]}), [0, 1])           # exactly half a layer: its other half, the only draw
    for s in range(3):
        r = random_neurons(half, seed=s).mask
        assert torch.equal(r[0], ~half.mask[0]) and r.sum(1).tolist() == [4, 1] and not (r & half.mask).any()
    full = mask_of((2, 8), {0: list(range(8)), 1: [0, 1, 2]})                  # 11 of 16 in all: impossible both ways
    with pytest.raises(ConfigError, match=r"8 of its 8 neurons \(only 0 others\).*smaller set"): random_neurons(full)
    with pytest.raises(ConfigError, match=r"11 of the 16 neurons \(only 5 others\).*smaller set"): random_neurons(full, per_layer=False)

# ---------------------------------------------------------------- neuron parameters and fine-tuning

def test_neuron_parameters_llama_gpt2_neox():
    m = model('llama')
    got = neuron_parameters(m, 1)
    mlp = m.model.layers[1].mlp
    assert [(id(p), d, b) for p, d, b in got] == [(id(mlp.gate_proj.weight), 0, 1), (id(mlp.up_proj.weight), 0, 1), (id(mlp.down_proj.weight), 1, 1)]
    g = model('gpt2')
    mlp = g.transformer.h[0].mlp
    got = neuron_parameters(g, 0)
    assert [(id(p), d, b) for p, d, b in got] == [(id(mlp.c_fc.weight), 1, 1), (id(mlp.c_fc.bias), 0, 1), (id(mlp.c_proj.weight), 0, 1)]
    assert all(p.shape[d] == D_FF for p, d, _ in got)
    n = tiny_lm('neox', d_model=16, n_heads=2)
    mlp = n.gpt_neox.layers[1].mlp
    got = neuron_parameters(n, 1)
    assert [(id(p), d, b) for p, d, b in got] == [(id(mlp.dense_h_to_4h.weight), 0, 1), (id(mlp.dense_h_to_4h.bias), 0, 1), (id(mlp.dense_4h_to_h.weight), 1, 1)]
    for bad in (2, -3, True):
        with pytest.raises(SiteError): neuron_parameters(m, bad)

def test_neuron_parameters_negative_layer():
    m = model('llama')
    assert [id(p) for p, _, _ in neuron_parameters(m, -1)] == [id(p) for p, _, _ in neuron_parameters(m, 1)]

def test_neuron_parameters_phi3_fused_gate_up(tok):
    "Phi-3 fuses gate and up into one (2 d_ff, d) weight, gate first: neuron j owns its rows j and d_ff + j."
    m = tiny_lm('phi3', d_model=32, n_heads=4)
    mlp = m.model.layers[0].mlp
    got = neuron_parameters(m, 0)
    assert [(id(p), d, b) for p, d, b in got] == [(id(mlp.gate_up_proj.weight), 0, 2), (id(mlp.down_proj.weight), 1, 1)]
    d_ff = mlp.down_proj.in_features
    chosen = torch.zeros(m.config.num_hidden_layers, d_ff, dtype=torch.bool); chosen[0, [1, 5]] = True
    neurons = Neurons(chosen, list(range(m.config.num_hidden_layers)))
    tuned, _ = finetune_neurons(m, tok, (['w1 w2 w3', 'w4 w5'], [' w6', ' w7 w8']), neurons, steps=3, lr=1e-2)
    changed = (tuned.model.layers[0].mlp.gate_up_proj.weight != mlp.gate_up_proj.weight).any(1).nonzero()[:, 0].tolist()
    assert changed == [1, 5, d_ff + 1, d_ff + 5]
    assert ((tuned.model.layers[0].mlp.down_proj.weight != mlp.down_proj.weight).any(0).nonzero()[:, 0].tolist()) == [1, 5]
    assert all(torch.equal(p, q) for (n, p), q in zip(m.named_parameters(), tuned.parameters()) if 'layers.0.mlp' not in n)
    back = with_rows(m, neuron_rows(tuned, neurons).tensors)
    assert all(torch.equal(p, q) for p, q in zip(back.parameters(), tuned.parameters()))

def neuron_mask(m, name, neurons:Neurons) -> torch.Tensor|None:
    "Which entries of parameter `name` belong to the neurons, from the architectures' layouts (Llama's Linear, GPT-2's Conv1D)."
    parts = name.split('.')
    gpt2 = m.config.model_type == 'gpt2'
    if len(parts) < 5 or parts[-3] != 'mlp': return None
    l = int(parts[2])
    if l not in neurons.layers: return None
    idx = neurons.mask[neurons.layers.index(l)]
    p = m.get_parameter(name)
    out = torch.zeros_like(p, dtype=torch.bool)
    kind, what = parts[-2], parts[-1]
    if gpt2:
        if kind == 'c_fc' and what == 'weight': out[:, idx] = True     # (in, out)
        elif kind == 'c_fc' and what == 'bias': out[idx] = True
        elif kind == 'c_proj' and what == 'weight': out[idx, :] = True
    else:
        if kind in ('gate_proj', 'up_proj'): out[idx, :] = True
        elif kind == 'down_proj': out[:, idx] = True
    return out

def check_only_neurons_changed(m, tuned, neurons):
    for (name, p), (name2, q) in zip(m.named_parameters(), tuned.named_parameters()):
        assert name == name2
        allowed = neuron_mask(m, name, neurons)
        if allowed is None:
            assert torch.equal(p, q), f"{name} changed"
            continue
        assert torch.equal(p[~allowed], q[~allowed]), f"{name}: entries outside the neurons changed"
        if allowed.any():
            assert (p != q)[allowed].float().mean() > 0.9, f"{name}: the neurons' entries did not change"

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_finetune_neurons_changes_only_the_neurons(arch, tok, untouched):
    m = model(arch, seed=19, gain=0.5)
    m.get_input_embeddings().weight.requires_grad_(False)             # a frozen parameter keeps its flag in the copy
    P, A = word_data(8, seed=20)
    N = Neurons(mask_of((2, D_FF), {1: [4, 40, 90, 127]}), [0, 1])
    before = answer_scores(m, tok, (P, A))['logprob'].mean()
    with untouched(m, tok): tuned, res = finetune_neurons(m, tok, (P, A), N, steps=12, lr=2e-2, batch_size=4)
    assert tuned is not m and not tuned.training and not any(x.training for x in tuned.modules())
    check_only_neurons_changed(m, tuned, N)
    assert [p.requires_grad for p in tuned.parameters()] == [p.requires_grad for p in m.parameters()]
    assert all(p.grad is None and not getattr(p, '_backward_hooks', None) for p in tuned.parameters())
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in tuned.modules())
    assert len(res.history) == 12 and np.isfinite(res.history['loss']).all()
    after = answer_scores(tuned, tok, (P, A))['logprob'].mean()
    assert after > before + 0.5
    assert res.history['loss'].iloc[-4:].mean() < res.history['loss'].iloc[:4].mean()

def test_finetune_neurons_layer_subset_seed_and_other_layer(tok, untouched):
    m = model('llama', seed=21, gain=0.5)
    d = Capability('d', *word_data(6, seed=22))
    N = Neurons(mask_of((1, D_FF), {0: [1, 2, 3]}), [0])              # layer 0 only: layer 1 is not touched at all
    with untouched(m, tok): t1, r1 = finetune_neurons(m, tok, d, N, steps=3, lr=1e-2, batch_size=2, seed=5)
    check_only_neurons_changed(m, t1, N)
    t2, r2 = finetune_neurons(m, tok, d, N, steps=3, lr=1e-2, batch_size=2, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(t1.parameters(), t2.parameters()))
    t3, _ = finetune_neurons(m, tok, d, N, steps=3, lr=1e-2, batch_size=2, seed=6)
    assert not all(torch.equal(p, q) for p, q in zip(t1.parameters(), t3.parameters()))
    N2 = Neurons(mask_of((2, D_FF), {1: [1, 2, 3]}), [0, 1])            # an empty row: layer 0 is not tuned
    t4, _ = finetune_neurons(m, tok, d, N2, steps=2, lr=1e-2, batch_size=2)
    check_only_neurons_changed(m, t4, N2)

def test_finetune_neurons_batch_size(tok):
    "A batch never exceeds the data set: with one item, batch_size 1 and 8 train alike; batch_size changes what is drawn."
    m = model('llama', seed=29, gain=0.5)
    N = Neurons(mask_of((2, D_FF), {1: [8, 9]}), [0, 1])
    one = (['w5 w6'], [' w7'])
    a, _ = finetune_neurons(m, tok, one, N, steps=3, lr=1e-2, batch_size=1)
    b, _ = finetune_neurons(m, tok, one, N, steps=3, lr=1e-2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    d = word_data(6, seed=30)
    c, _ = finetune_neurons(m, tok, d, N, steps=3, lr=1e-2, batch_size=2)
    e, _ = finetune_neurons(m, tok, d, N, steps=3, lr=1e-2, batch_size=3)
    assert not all(torch.equal(p, q) for p, q in zip(c.parameters(), e.parameters()))

def test_finetune_neurons_errors(tok, untouched):
    m = model('llama')
    d = word_data(2)
    N = Neurons(mask_of((2, D_FF), {0: [1]}), [0, 1])
    with untouched(m, tok):
        with pytest.raises(ConfigError): finetune_neurons(m, tok, d, N.mask)
        with pytest.raises(ShapeError): finetune_neurons(m, tok, d, Neurons(torch.zeros(2, 64, dtype=torch.bool), [0, 1]))
        with pytest.raises(ConfigError): finetune_neurons(m, tok, ([], []), N)
        with pytest.raises(ConfigError): finetune_neurons(m, tok, d, N, batch_size=0)
        with pytest.raises(ConfigError): finetune_neurons(m, tok, d, N, steps=0)
        with pytest.raises(ConfigError): finetune_neurons(m, None, d, N)
        with pytest.raises(ConfigError): finetune_neurons(m, tok, d, Neurons(torch.zeros(2, D_FF, dtype=torch.bool), [0, 1]))  # nothing to train

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_neuron_rows_round_trip(arch, tok, untouched):
    m = model(arch, seed=23, gain=0.5)
    N = Neurons(mask_of((2, D_FF), {0: [7], 1: [0, 33, 64]}), [0, 1])
    tuned, _ = finetune_neurons(m, tok, word_data(4, seed=24), N, steps=3, lr=1e-2, batch_size=2)
    rows = neuron_rows(tuned, N).tensors
    assert rows['index.0'].tolist() == [7] and rows['index.1'].tolist() == [0, 33, 64]
    for l in (0, 1):
        idx = N.mask[l].nonzero()[:, 0]
        if arch == 'llama':
            mlp = tuned.model.layers[l].mlp
            want = {f'model.layers.{l}.mlp.gate_proj.weight|0': mlp.gate_proj.weight[idx], f'model.layers.{l}.mlp.up_proj.weight|0': mlp.up_proj.weight[idx],
                    f'model.layers.{l}.mlp.down_proj.weight|1': mlp.down_proj.weight[:, idx]}
        else:
            mlp = tuned.transformer.h[l].mlp
            want = {f'transformer.h.{l}.mlp.c_fc.weight|1': mlp.c_fc.weight[:, idx], f'transformer.h.{l}.mlp.c_fc.bias|0': mlp.c_fc.bias[idx],
                    f'transformer.h.{l}.mlp.c_proj.weight|0': mlp.c_proj.weight[idx]}
        for k, v in want.items(): assert torch.equal(rows[k], v.detach()), k
    assert len(rows) == 2 + 6
    with untouched(m): back = with_rows(m, rows)
    assert back is not m and all(torch.equal(p, q) for p, q in zip(back.parameters(), tuned.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(m.parameters(), tuned.parameters()))
    only1 = neuron_rows(tuned, Neurons(N.mask[1:], [1])).tensors
    assert set(only1) == {k for k in rows if '.1.' in k or k == 'index.1'}
    part = with_rows(m, only1)
    for (n, p), q, r in zip(m.named_parameters(), part.parameters(), tuned.parameters()):
        assert torch.equal(q, r if '.1.mlp' in n else p), n

def test_with_rows_bad_rows():
    m = model('llama')
    N = Neurons(mask_of((2, D_FF), {1: [3, 7]}), [0, 1])
    rows = neuron_rows(m, N).tensors
    assert set(rows) == {'index.1', 'model.layers.1.mlp.gate_proj.weight|0', 'model.layers.1.mlp.up_proj.weight|0', 'model.layers.1.mlp.down_proj.weight|1'}
    with pytest.raises(ConfigError): with_rows(m, {k: v for k, v in rows.items() if 'up_proj' not in k})
    with pytest.raises(ConfigError): with_rows(m, {k: v for k, v in rows.items() if k != 'index.1'})
    with pytest.raises(ConfigError): with_rows(m, neuron_rows(model('gpt2'), N).tensors)
    with pytest.raises(SiteError): with_rows(m, {**rows, 'index.5': torch.tensor([1])})
    with pytest.raises(ShapeError): with_rows(m, {**rows, 'model.layers.1.mlp.gate_proj.weight|0': torch.zeros(3, D_MODEL)})
    with pytest.raises(ShapeError): with_rows(m, {**rows, 'model.layers.1.mlp.down_proj.weight|1': torch.zeros(D_MODEL, 2, 1)})
    with pytest.raises(ConfigError): neuron_rows(m, N.mask).tensors

def test_with_rows_wrong_rank_or_width_is_a_shape_error():
    m = model('llama')
    rows = neuron_rows(m, Neurons(mask_of((2, D_FF), {1: [3, 7]}), [0, 1])).tensors
    for key, bad in [('model.layers.1.mlp.down_proj.weight|1', torch.zeros(2)), ('model.layers.1.mlp.gate_proj.weight|0', torch.zeros(2, 5))]:
        with pytest.raises(ShapeError): with_rows(m, {**rows, key: bad})

def test_train_neuron_finetune_keeps_the_training_code_alive(tok, untouched):
    m = model('llama', seed=25, gain=0.5)
    N = Neurons(mask_of((2, D_FF), {0: [5, 6]}), [0, 1])
    with untouched(m, tok): tuned, none, res = train_neuron_finetune(m, tok, 'sentiment', N, steps=3)
    assert none is tok and len(res.history) == 3
    check_only_neurons_changed(m, tuned, N)
    # the recipe's learning rate and batch size: the same as finetune_neurons with them
    want, _ = finetune_neurons(m, tok, capability_data('sentiment'), N, 3, CNL_RECIPE['lr'], CNL_RECIPE['batch_size'])
    assert all(torch.equal(p, q) for p, q in zip(tuned.parameters(), want.parameters()))
    _, _, full = train_neuron_finetune(m, tok, 'code', N)
    assert len(full.history) == CNL_RECIPE['steps']
    with pytest.raises(ConfigError): train_neuron_finetune(m, tok, 'division', N, steps=1)

def test_train_neuron_finetune_steps_zero_raises(tok):
    with pytest.raises(ConfigError): train_neuron_finetune(model('llama'), tok, 'code', Neurons(mask_of((2, D_FF), {0: [5]}), [0, 1]), steps=0)

def test_load_neuron_finetune_reads_the_asset_layout(tmp_path, monkeypatch, untouched):
    "A fake asset in the layout tools/make_cnl_assets.py writes ('<capability>/<kind>/<rows key>', '<capability>/<kind>.mask')."
    m = model('llama', seed=26)
    g = torch.Generator().manual_seed(0)
    tensors, masks = {}, {}
    for cap in ('addition', 'code'):
        for kind, js in (('commonality', [2, 9]), ('random', [50])):
            N = Neurons(mask_of((2, D_FF), {1: js, 0: [len(cap)]}), [0, 1])
            src = copy.deepcopy(m)
            with torch.no_grad():
                for p in src.parameters(): p.add_(torch.randn(p.shape, generator=g))
            masks[cap, kind] = (N, src)
            tensors |= {f'{cap}/{kind}/{k}': v.contiguous() for k, v in neuron_rows(src, N).tensors.items()}
            tensors[f'{cap}/{kind}.mask'] = N.mask.to(torch.uint8)
    training = {cap: dict(commonality=dict(loss=[1.0, 0.5]), random=dict(loss=[1.0, 0.9])) for cap in ('addition', 'code')}
    save_asset(FINETUNED, tensors, dict(recipe=CNL_RECIPE, training=training), folder=tmp_path)
    fake = lambda name, folder=None: load_asset(name, tmp_path)
    monkeypatch.setattr(interpkit.train, 'load_asset', fake)
    monkeypatch.setattr(demo, 'load_asset', fake)
    for cap, kind in masks:
        N, src = masks[cap, kind]
        with untouched(m): tuned, none, meta = load_neuron_finetune(m, None, cap, kind)
        assert none is None and torch.equal(meta['neurons'].mask, N.mask) and meta['neurons'].layers == [0, 1]
        assert meta['training'] == training[cap][kind] and meta['recipe']['k'] == 100
        for (name, p), q, r in zip(m.named_parameters(), tuned.parameters(), src.parameters()):   # the neurons' entries from src, the rest from m
            allowed = neuron_mask(m, name, N)
            if allowed is None: allowed = torch.zeros_like(p, dtype=torch.bool)
            assert torch.equal(q[allowed], r[allowed]) and torch.equal(q[~allowed], p[~allowed]), (cap, kind, name)
    assert len(load_neuron_finetune(m, capability='code')[2]['neurons']) == 3          # kind defaults to 'commonality'
    with pytest.raises(ConfigError): load_neuron_finetune(m, capability='division')
    with pytest.raises(ConfigError): load_neuron_finetune(m, None, 'code', 'rand')

# ---------------------------------------------------------------- tables, map and widget view

@pytest.fixture(scope='module')
def table_scores():
    "Three data sets of 12 samples over 2 layers x 8 neurons: A and B share most of their pattern, C has its own."
    g = torch.Generator().manual_seed(1)
    pa, pc = torch.randn(1, 2, 8, generator=g), torch.randn(1, 2, 8, generator=g)
    pb = pa + 0.6 * torch.randn(1, 2, 8, generator=g)
    return {name: scores_of(2 * pat + torch.randn(12, 2, 8, generator=g)) for name, pat in (('A', pa), ('B', pb), ('C', pc))}

def test_overlap_table_by_hand(table_scores):
    for seed in (0, 2):
        t = overlap_table(table_scores, 4, 0.4, seed)
        assert list(t.index) == ['A', 'B', 'C'] and t.index.name == 'dataset'
        assert list(t.columns) == ['neurons', 'share', 'rate', 'iou', 'chance_rate', 'chance_iou']
        a, b = split_halves(12, seed)
        for name, s in table_scores.items():
            want = ref_overlap(ref_common(s.scores[a], 4, 0.4), ref_common(s.scores[b], 4, 0.4), 16)
            row = t.loc[name]
            assert row['neurons'] == len(ref_common(s.scores, 4, 0.4)) and row['share'] == pytest.approx(row['neurons'] / 16)
            for k in ('rate', 'iou', 'chance_rate', 'chance_iou'): assert row[k] == pytest.approx(want[k]), (seed, name, k)
    assert overlap_table(table_scores, 4, 0.4).equals(overlap_table(table_scores, 4, 0.4, 0))

def test_across_table_by_hand(table_scores):
    sets = {n: ref_common(s.scores, 4, 0.4) for n, s in table_scores.items()}
    iou, rate = across_table(table_scores, 4, 0.4), across_table(table_scores, 4, 0.4, 'rate')
    for t in (iou, rate):
        assert list(t.index) == list(t.columns) == ['A', 'B', 'C'] and np.allclose(np.diag(t.to_numpy(float)), 1)
    assert np.allclose(iou.to_numpy(float), iou.to_numpy(float).T)
    for a in sets:
        for b in sets:
            assert iou.loc[a, b] == pytest.approx(len(sets[a] & sets[b]) / len(sets[a] | sets[b]))
            assert rate.loc[a, b] == pytest.approx(len(sets[a] & sets[b]) / len(sets[a]))   # the row's set found in the column's
    assert not np.allclose(rate.to_numpy(float), rate.to_numpy(float).T)
    assert iou.loc['A', 'B'] > iou.loc['A', 'C']
    with pytest.raises(ConfigError): across_table(table_scores, 4, 0.4, 'dice')

@pytest.mark.parametrize('seed', [0, 1])
def test_template_pairs_by_sets(seed):
    "Every unordered pair of a 2 × 3 grid, its kind by the rule written out, and rate and IoU from Python sets of the commonality neurons."
    keys = [('add', 'native'), ('add', 'qa'), ('add', 'io'), ('sent', 'native'), ('sent', 'qa'), ('sent', 'io')]
    g = torch.Generator().manual_seed(seed)
    base = {c: torch.randn(1, 2, 8, generator=g) for c in ('add', 'sent')}
    style = {t: torch.randn(1, 2, 8, generator=g) for t in ('native', 'qa', 'io')}
    grid = {key: scores_of(base[key[0]] + style[key[1]] + 0.7 * torch.randn(10, 2, 8, generator=g)) for key in keys}
    k, f = 4, 0.4
    got = template_pairs(grid, k, f)
    assert len(got) == 15 and list(got.columns) == ['a', 'b', 'kind', 'rate', 'iou']
    sets = {key: ref_common(s.scores, k, f) for key, s in grid.items()}
    kinds = set()
    for row, (a, b) in zip(got.itertuples(), [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:]]):
        assert (row.a, row.b) == (a, b)
        want = 'same capability' if a[0] == b[0] else 'same template' if a[1] == b[1] != 'native' else 'neither'
        A, B = sets[a], sets[b]
        assert row.kind == want and row.iou == pytest.approx(len(A & B) / len(A | B), abs=1e-12)
        assert row.rate == pytest.approx((len(A & B) / len(A) + len(A & B) / len(B)) / 2, abs=1e-12)
        kinds.add(want)
    assert kinds == {'same capability', 'same template', 'neither'}
    assert (got.kind == 'same template').sum() == 2 and (got.kind == 'same capability').sum() == 6
    # 'shared' decides which templates count as the same text: with 'native' shared, the native pair is 'same template'
    assert template_pairs(grid, k, f, shared=('native', 'qa', 'io')).kind.tolist().count('same template') == 3
    with pytest.raises(ConfigError, match='capability, template'): template_pairs({'add': grid[keys[0]], 'sent': grid[keys[3]]}, k, f)
    with pytest.raises(ConfigError): template_pairs({keys[0]: grid[keys[0]]}, k, f)

def test_load_template_grid_reads_the_asset_layout(tmp_path, monkeypatch):
    "A fake asset in the layout of tools/make_cnl_assets.py --stage grid: the top-K scores rebuild top sets equal to the dense ones for every k <= K."
    g = torch.Generator().manual_seed(3)
    K, L, d = 6, 3, 10
    dense, tensors = {}, {}
    for cap in ('addition', 'code'):
        for t in ('native', 'qa'):
            s = torch.randn(5, L, d, generator=g)
            s[0] = -s[0].abs()                                  # a sample with no positive attribution: an empty top set
            s[1, :, :] = -1; s[1, 0, :3] = torch.tensor([3., 2., 1.])   # a sample with fewer than K positive ones
            v, i = s.reshape(5, -1).topk(K, 1)
            dense[cap, t] = s
            tensors |= {f'{cap}/{t}/top': i.int(), f'{cap}/{t}/value': v, f'{cap}/{t}/logprob': -torch.rand(5, generator=g)}
    meta = dict(capabilities=['addition', 'code'], templates=['native', 'qa'], K=K, n=5, shots=2, shape=[L, d], method='grad_x_act', positions='all')
    save_asset(GRID, tensors, meta, folder=tmp_path)
    monkeypatch.setattr(demo, 'load_asset', lambda name, folder=None: load_asset(name, tmp_path))
    grid, got_meta = load_template_grid()
    assert list(grid) == [('addition', 'native'), ('addition', 'qa'), ('code', 'native'), ('code', 'qa')] and got_meta['K'] == K
    for key, s in grid.items():
        assert isinstance(s, NeuronScores) and s.scores.shape == (5, L, d) and s.layers == [0, 1, 2] and (s.method, s.positions) == ('grad_x_act', 'all')
        assert torch.equal(s.logprob, tensors[f'{key[0]}/{key[1]}/logprob'])
        for k in range(1, K + 1):
            assert [set(x) for x in map(flat_set, top_sets(s, k))] == ref_tops(dense[key], k), (key, k)
        assert top_sets(s, 3)[1].sum() == 3 and not top_sets(s, K)[0].any()

def test_plot_neuron_map():
    a = Neurons(mask_of((3, 10), {0: [1, 2], 2: [0, 1, 2, 3]}), [4, 5, 6])
    b = Neurons(mask_of((3, 10), {1: [9]}), [4, 5, 6])
    fig = plot_neuron_map({'a': a, 'b': b})
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [list(l.get_xdata()) for l in lines] == [[4, 5, 6]] * 2
    assert [list(l.get_ydata()) for l in lines] == [[2, 0, 4], [0, 1, 0]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ['a (6)', 'b (1)']
    assert ax.get_xlabel() == 'layer'
    plt.close(fig)
    fig2, ax2 = plt.subplots()
    assert plot_neuron_map({'a': a}, ax=ax2) is fig2 and len(ax2.get_lines()) == 1
    plt.close(fig2)

def test_explore_localization_by_hand(table_scores):
    assert halves_overlap(table_scores['A'], 4, 0.4, 0) != halves_overlap(table_scores['A'], 4, 0.4, 1)   # the set-up: the halves' seed shows
    sets = {n: ref_common(s.scores, 4, 0.4) for n, s in table_scores.items()}
    a, b = split_halves(12, 0)
    for cap in ('A', 'B'):
        fig, df = explore_localization(table_scores, cap, f=0.4, top_k=4)
        others = [n for n in table_scores if n != cap]
        assert list(df.index) == [f'{cap} (halves)'] + others and list(df.columns) == ['rate', 'iou', 'chance_rate']
        halves = ref_overlap(ref_common(table_scores[cap].scores[a], 4, 0.4), ref_common(table_scores[cap].scores[b], 4, 0.4), 16)
        for k in ('rate', 'iou', 'chance_rate'): assert df.loc[f'{cap} (halves)', k] == pytest.approx(halves[k]), (cap, k)
        for n in others:
            want = ref_overlap(sets[cap], sets[n], 16)
            for k in ('rate', 'iou', 'chance_rate'): assert df.loc[n, k] == pytest.approx(want[k]), (cap, n, k)
        line = fig.axes[0].get_lines()
        assert len(line) == 1 and list(line[0].get_ydata()) == [sum(1 for i in sets[cap] if i // 8 == l) for l in (0, 1)]
    with pytest.raises(ConfigError): explore_localization(table_scores, 'A')   # the defaults f=0.3, k=100: k > the 16 neurons
    with pytest.raises(ConfigError): explore_localization(table_scores, 'D', top_k=4)

def test_model_given_by_name_is_loaded_with_its_tokenizer(tok, monkeypatch):
    "A short name, hub id or path goes to `load_lm`; its tokenizer is used unless one is given."
    m = model('llama', seed=30, dtype=torch.float64)
    asked = []
    def fake_load_lm(name, tokenizer=None, **kw):   # what `resolve_lm` calls: a name is loaded, a model object passes through
        if not isinstance(name, str): return name, tokenizer
        asked.append(name); return m, tok if tokenizer is None else tokenizer
    monkeypatch.setattr(interpkit.models, 'load_lm', fake_load_lm)
    P, A = word_data(4, seed=31)
    want = [ref_logprob(m, p, a) for p, a in zip(P, A)]
    assert np.allclose(answer_scores('my/model', None, (P, A))['logprob'], want, rtol=1e-9, atol=1e-9) and asked == ['my/model']
    other = tiny_tokenizer(vocab_size=64)                    # a given tokenizer wins over the loaded one: 'w70' is unknown to it
    assert encode_answers(other, (['w70 w1'], [' w2']))['input_ids'].tolist() != encode_answers(tok, (['w70 w1'], [' w2']))['input_ids'].tolist()
    got = answer_scores('my/model', other, (['w70 w1'], [' w2']))['logprob'][0]
    assert got == pytest.approx(answer_scores(m, other, (['w70 w1'], [' w2']))['logprob'][0]) and got != pytest.approx(ref_logprob(m, 'w70 w1', ' w2'))

# ---------------------------------------------------------------- issue 50: results, the demo module, the old spellings

def test_neuron_sites_is_a_result_with_the_counts():
    m = model('llama')
    ns = neuron_sites(m, [1, 0])
    assert isinstance(ns, NeuronSites) and ns.layers == [1, 0] and len(ns) == 2
    assert ns.counts == {1: D_FF, 0: D_FF} and ns.sites[1] == 'model.layers.1.mlp.down_proj:in'
    assert m.get_submodule(ns.sites[0][:-3]).in_features == ns.counts[0]   # the width the projection reads, from the module itself

def test_neuron_rows_result_and_its_tensors_both_rebuild(tok):
    m = model('llama', seed=31)
    N = Neurons(mask_of((2, D_FF), {0: [2], 1: [4, 9]}), [0, 1])
    tuned, _ = finetune_neurons(m, tok, word_data(3, seed=32), N, steps=2, lr=1e-2, batch_size=2)
    rows = neuron_rows(tuned, N)
    assert isinstance(rows, NeuronRows) and len(rows) == len(rows.tensors) == 2 + 6
    for back in (with_rows(m, rows), with_rows(m, rows.tensors)):
        assert all(torch.equal(p, q) for p, q in zip(back.parameters(), tuned.parameters()))

MOVED = ('WRAPPERS', 'TEMPLATES', 'addition', 'multiplication', 'sentiment', 'code', 'CAPABILITIES', 'FACTS', 'PARAPHRASES', 'fact_paraphrases',
         'CNL_RECIPE', 'FINETUNED', 'KINDS', 'GRID', 'GRID_SHOTS', 'capability_data', 'train_neuron_finetune', 'load_neuron_finetune', 'load_template_grid')

@pytest.mark.parametrize('name', MOVED)
def test_demo_names_moved_still_work_from_the_paper_module(name):
    with pytest.warns(FutureWarning, match=f'interpkit.demos.cnl.{name}'): old = getattr(cnl, name)
    assert old is getattr(demo, name) and name not in cnl.__all__ and name in demo.__all__

def test_paper_module_imports_no_demo_module():
    import pathlib
    assert not [l for l in pathlib.Path(cnl.__file__).read_text().splitlines() if l.lstrip().startswith(('from interpkit.demos', 'import interpkit.demos'))]

@pytest.mark.parametrize('fn, args', [(top_sets, ()), (commonality_neurons, (0.5,)), (halves_overlap, (0.5,)), (pairwise_overlap, ()),
                                      (overlap_table, (0.5,)), (across_table, (0.5,))])
def test_k_is_now_top_k(fn, args):
    toy = torch.tensor([[[5., 4, 0, 0]], [[5., 0, 4, 0]], [[5., 0, 0, 4]], [[0., 5, 4, 0]]])
    s = {'a': toy, 'b': toy[[1, 2, 3]]} if fn in (overlap_table, across_table) else toy
    new = fn(s, *args[:0], top_k=2, **({'f': args[0]} if args else {}))
    with pytest.warns(FutureWarning, match='top_k='): old = fn(s, k=2, **({'f': args[0]} if args else {}))
    if isinstance(new, torch.Tensor): assert torch.equal(old, new)
    elif hasattr(new, 'equals'): assert old.equals(new)   # a DataFrame
    elif isinstance(new, Neurons): assert torch.equal(old.mask, new.mask) and torch.equal(old.frequency, new.frequency)
    else: assert old == new

def test_k_is_now_top_k_fact_fidelity_template_pairs_and_explore():
    toy = torch.tensor([[[5., 4, 0, 0]], [[5., 0, 4, 0]], [[5., 0, 0, 4]], [[0., 5, 4, 0]]])
    facts = [NeuronScores(toy[:2], [0], torch.zeros(2), 'grad_x_act', 'all'), NeuronScores(toy[2:], [0], torch.zeros(2), 'grad_x_act', 'all')]
    with pytest.warns(FutureWarning, match='top_k='): assert fact_fidelity(facts, k=2) == fact_fidelity(facts, top_k=2)
    grid = {('a', 'qa'): toy, ('b', 'qa'): toy[[1, 2, 3]]}
    with pytest.warns(FutureWarning, match='top_k='): assert template_pairs(grid, k=2, f=0.5).equals(template_pairs(grid, top_k=2, f=0.5))
    with pytest.warns(FutureWarning, match='top_k='): _, view = explore_localization({'a': toy, 'b': toy[[1, 2, 3]]}, 'a', f=0.5, k=2)
    plt.close('all')
    assert view.equals(explore_localization({'a': toy, 'b': toy[[1, 2, 3]]}, 'a', f=0.5, top_k=2)[1])

def test_steps_is_now_n_steps(tok):
    m, d = model('llama', seed=33), word_data(2, seed=34)
    with pytest.warns(FutureWarning, match='n_steps='): old = neuron_attributions(m, tok, d, method='ig', steps=3)
    assert torch.equal(old.scores, neuron_attributions(m, tok, d, method='ig', n_steps=3).scores)

def test_neuron_counts_is_deprecated():
    m = model('gpt2')
    with pytest.warns(FutureWarning, match='neuron_sites'): old = cnl.neuron_counts(m, [1])
    assert old == {1: D_FF} and 'neuron_counts' not in cnl.__all__

def test_trainer_and_loader_old_argument_order_warns(tok, tmp_path, monkeypatch):
    m = model('llama', seed=35)
    N = Neurons(mask_of((2, D_FF), {1: [1, 2]}), [0, 1])
    new = train_neuron_finetune(m, tok, 'sentiment', N, steps=2)
    with pytest.warns(FutureWarning, match='first argument'): old = train_neuron_finetune('sentiment', N, m, tok, steps=2)
    assert type(new).__name__ == 'Trained' and all(torch.equal(p, q) for p, q in zip(old.model.parameters(), new.model.parameters()))
    save_asset(FINETUNED, {**{f'code/random/{k}': v.contiguous() for k, v in neuron_rows(new.model, N).tensors.items()}, 'code/random.mask': N.mask.to(torch.uint8)},
               dict(recipe=CNL_RECIPE, training={'code': {'random': {'loss': [1.0]}}}), folder=tmp_path)
    monkeypatch.setattr(demo, 'load_asset', lambda name, folder=None: load_asset(name, tmp_path))
    shipped = load_neuron_finetune(m, tok, 'code', 'random')
    assert type(shipped).__name__ == 'Shipped' and shipped.tokenizer is tok and torch.equal(shipped.meta['neurons'].mask, N.mask)
    assert all(torch.equal(p, q) for p, q in zip(shipped.model.parameters(), new.model.parameters()))
    with pytest.warns(FutureWarning, match='first argument'): old = load_neuron_finetune('code', 'random', m)
    assert old.tokenizer is None and all(torch.equal(p, q) for p, q in zip(old.model.parameters(), new.model.parameters()))

def test_template_grid_is_a_result_that_unpacks(tmp_path, monkeypatch):
    tensors = {'addition/native/top': torch.tensor([[0, 3]], dtype=torch.int32), 'addition/native/value': torch.tensor([[2., 1.]]), 'addition/native/logprob': torch.tensor([-1.])}
    save_asset(GRID, tensors, dict(capabilities=['addition'], templates=['native'], K=2, n=1, shots=2, shape=[2, 2], method='grad_x_act', positions='all'), folder=tmp_path)
    monkeypatch.setattr(demo, 'load_asset', lambda name, folder=None: load_asset(name, tmp_path))
    g = load_template_grid()
    assert isinstance(g, TemplateGrid) and g.meta['K'] == 2
    assert g.scores['addition', 'native'].scores.tolist() == [[[2., 0.], [0., 1.]]]
    scores, meta = g
    assert scores is g.scores and meta is g.meta

# ---------------------------------------------------------------- issue 51: the same classes, searched for in this module

def test_non_finite_scores_are_refused_where_they_would_rank_silently():
    "A NaN attribution ranked somewhere in a top set and commonality_neurons returned a set without a word; now NotFiniteError, naming how many."
    g = torch.Generator().manual_seed(0)
    s = torch.rand(6, 2, 8, generator=g)
    want = commonality_neurons(s, 3, 0.5)
    for bad, n in ((float('nan'), 1), (float('inf'), 1), (-float('inf'), 1)):
        t = s.clone(); t[2, 1, 4] = bad
        for f in (lambda: top_sets(t, 3), lambda: commonality_neurons(t, 3, 0.5), lambda: pairwise_overlap(t, 3), lambda: halves_overlap(t, 3, 0.5)):
            with pytest.raises(NotFiniteError, match=f"{n} NaN or infinite value\\(s\\) of 96"): f()
    assert torch.equal(commonality_neurons(s, 3, 0.5).mask, want.mask)           # finite scores: as before
    top = top_sets(s, 3).reshape(6, -1)                                            # reference: the 3 largest of each sample by sorting
    ref = torch.zeros_like(top)
    for i, row in enumerate(s.reshape(6, -1)): ref[i, sorted(range(16), key=lambda j: -float(row[j]))[:3]] = True
    assert torch.equal(top, ref)

def test_tables_and_random_neurons_refuse_what_they_cannot_use():
    "overlap_table({}) raised a KeyError from pandas and across_table({}) returned an empty frame; random_neurons on a 1-D mask raised an IndexError."
    for f in (overlap_table, across_table):
        with pytest.raises(ConfigError, match=r"got scores=\{\}.*at least one entry"): f({}, 3, 0.5)
        with pytest.raises(ConfigError, match=r"got scores=\["): f([torch.rand(4, 1, 4)], 3, 0.5)
    with pytest.raises(ShapeError, match=r"shape \(8,\).*\(layers, neurons\)"): random_neurons(torch.zeros(8, dtype=torch.bool))

def test_bad_data_seeds_learning_rates_and_rows_get_typed_errors(untouched):
    "A Capability with more prompts than answers was cut silently by zip; a non-string prompt, a float seed, lr=nan and rows=3 raised ValueError, RuntimeError or AttributeError from torch and transformers."
    m, t = tiny_lm('llama', d_model=32), tiny_tokenizer()
    N = Neurons(mask_of((2, 128), {0: [0, 1, 2]}), [0, 1])
    with untouched(m, t):
        for data, match in ((Capability('x', ['w1', 'w2'], [' w3']), '2 prompts and 1 answers'), (Capability('x', ['w1', 3], [' w3', ' w4']), r"of type \['int'\]"),
                            ((['w1'], [None]), r"of type \['NoneType'\]")):
            for f in (lambda: answer_scores(m, t, data), lambda: encode_answers(t, data), lambda: neuron_attributions(m, t, data), lambda: finetune_neurons(m, t, data, N, steps=1)):
                with pytest.raises(ConfigError, match=match): f()
        for lr in (float('nan'), float('inf'), 0, -1e-3, '1e-3', True):
            with pytest.raises(ConfigError, match=r"lr=.*finite positive"): finetune_neurons(m, t, Capability('x', ['w1'], [' w2']), N, steps=1, lr=lr)
        for bad in ('rows', 3, None):
            with pytest.raises(ConfigError, match='with_rows got rows of type'): with_rows(m, bad)
    for seed in (1.5, '0', None, True):
        with pytest.raises(ConfigError, match=r"seed=.* is not valid. seed is an int"): split_halves(6, seed)
        with pytest.raises(ConfigError, match=r"seed=.* is not valid. seed is an int"): random_neurons(N, seed)
        with pytest.raises(ConfigError, match=r"seed=.* is not valid. seed is an int"): halves_overlap(torch.rand(6, 2, 8), 3, 0.5, seed)
    assert split_halves(6, -3) == split_halves(6, -3) and sorted(sum(split_halves(6, -3), [])) == list(range(6))   # any int seeds

def test_demo_generators_refuse_a_negative_number_of_shots():
    "addition(shots=-1) raised an IndexError from the list of solved examples; sentiment(shots=-1) gave prompts without examples."
    for make in (addition, multiplication, sentiment):
        with pytest.raises(ConfigError, match='shots=-1'): make(4, shots=-1)
        assert make(4, shots=0).prompts == make(4, shots=0).prompts and len(make(4, shots=0)) == 4
    assert addition(2, shots=0).prompts[0].count('\n') == 0 and addition(2, shots=2).prompts[0].count('\n') == 2   # 0 and 2 solved lines

@pytest.mark.parametrize('method', ATTRIBUTIONS)
def test_attributions_freeze_the_parameters_and_put_their_flags_back(tok, method):
    "Within the call no parameter asks for a gradient (autograd keeps less, no .grad is made); after it, and after an error, each parameter's flag is as it was."
    m = model()
    m.model.embed_tokens.weight.requires_grad_(False)   # a partly frozen model keeps its mix
    flags = [p.requires_grad for p in m.parameters()]
    seen = []
    h = m.model.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(any(p.requires_grad for p in m.parameters())))
    try: s = neuron_attributions(m, tok, word_data(3), method=method, n_steps=2)
    finally: h.remove()
    assert seen and not any(seen) and s.scores.abs().sum() > 0
    assert [p.requires_grad for p in m.parameters()] == flags and all(p.grad is None for p in m.parameters())
    def boom(mod, args): raise RuntimeError('boom')
    h = m.model.layers[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match='boom'): neuron_attributions(m, tok, word_data(3), method=method, n_steps=2)
    finally: h.remove()
    assert [p.requires_grad for p in m.parameters()] == flags
