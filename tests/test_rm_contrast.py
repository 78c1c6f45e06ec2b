"""Tests of interpkit.papers.rm_contrast (paper 4: contrastive explanations of reward models by attribute rewrites), against
independent references: rewards of tiny sequence classifiers and of pooled hidden states computed here one unpadded sequence at
a time (pair tokenised by hand); phrase detection and rewriting by a second implementation (`re.sub` with a callback); a hand-made
linear reward model over phrase counts done here, whose counterfactuals, margins and sensitivities have closed forms; Levenshtein by
dynamic programming; cosine distances from our own unpadded mean pooling; Spearman's rho by the 1 - 6 sum d^2 / (n (n^2 - 1))
formula; Bradley-Terry labels by a Poisson-binomial z test; and bad input. Strict xfails mark the bugs found."""
import difflib, math, random, re, string
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np, pandas as pd, pytest, torch
import transformers
from interpkit.errors import ConfigError, NotFiniteError, ShapeError
from interpkit.models import tiny_config, tiny_lm, tiny_tokenizer
from interpkit.testing import snapshot
from interpkit.train import assets_dir
import interpkit.papers.rm_contrast as rmc
from interpkit.papers.rm_contrast import (POLE_DESCRIPTIONS, DescriptionDetector, detector_agreement, detector_shifts, lexicon_detector,
                                          representatives_null, revalidate)
from interpkit.papers.rm_contrast import (RESPONSE_ATTRIBUTES, SIDES, STEP1_TEMPLATE, STEP2_TEMPLATE,
                                          Attribute, PreferencePair, Explanation, LMRewriter, Span, SpanEditor, as_comparisons, attribute,
                                          classifier_reward, coverage, explain, head_features, head_reward, local_sensitivity, orient,
                                          perturbation_view, perturbations, plot_sensitivity, random_edit, representatives, rewards, rewrite_prompts,
                                          semantic_distances, sensitivity, syntactic_distance, _clean_reply)
import interpkit.demos.rm_contrast as rmd
from interpkit.demos.rm_contrast import (PLANTED, RM_ASSET, RESPONSE_TEMPLATE, TOPICS, attribute_levels, demo_comparisons, demo_heldout, demo_prompt,
                                         demo_response, load_rm_demo, planted_reward, train_reward_head)
from interpkit.train import Trained

torch.set_num_threads(1)

# ---------------------------------------------------------------- helpers: an independent phrase counter and a linear reward model

LEXICON = {a.name: [tuple(p) for p in a.pairs] for a in RESPONSE_ATTRIBUTES}

def count(text, phrase):
    "Whole-word, case-insensitive occurrences of `phrase` (lexicon phrases never contain one another as whole words: see the lexicon test)."
    return len(re.findall(r'(?<![A-Za-z0-9_])' + re.escape(phrase) + r'(?![A-Za-z0-9_])', text, flags=re.I))

def level(text, name):
    "Our own attribute level: (high phrases - low phrases) / number of pairs."
    pairs = LEXICON[name]
    return sum(count(text, hi) - count(text, lo) for lo, hi in pairs) / len(pairs)

W = dict(politeness=0.7, conciseness=-0.4, directness=1.3, specificity=0.2, harmlessness=2.1, formality=-1.1, enthusiasm=0.5, correctness=0.9)

class LinearRM:
    "r(x, y) = sum_a W_a level_a(y) + 0.001 len(x), recording every (prompt, response) it scores and the size of each call."
    def __init__(self, w=W): self.w, self.seen, self.calls = dict(w), [], []
    def value(self, p, y): return sum(v*level(y, a) for a, v in self.w.items()) + 0.001*len(p)
    def __call__(self, prompts, responses):
        self.calls.append(len(prompts)); self.seen += list(zip(prompts, responses))
        return [self.value(p, y) for p, y in zip(prompts, responses)]

def poles_all(s): return {a.name: [s]*len(a.pairs) for a in RESPONSE_ATTRIBUTES}

def lev(a, b):
    "Levenshtein distance by dynamic programming."
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1): cur.append(min(prev[j] + 1, cur[j-1] + 1, prev[j-1] + (ca != cb)))
        prev = cur
    return prev[-1]

def tok_pad(pad='<unk>'):
    t = tiny_tokenizer(); t.pad_token = pad
    return t

def ids_of(t, text): return t(text, add_special_tokens=False)['input_ids']

P = ['w1 w2', 'w3', 'w4 w5 w6 w7', 'w8 w9']
R = ['w10', 'w11 w12 w13', 'w14', 'w15 w16 w17 w18 w19']

def seq_cls(arch, seed=0, **kw):
    cfg = tiny_config(arch, d_model=32, n_heads=4, num_labels=kw.pop('num_labels', 1), **kw)
    cfg.pad_token_id = 0
    cfg._attn_implementation = 'eager'
    cls = dict(bert=transformers.BertForSequenceClassification, gpt2=transformers.GPT2ForSequenceClassification,
               llama=transformers.LlamaForSequenceClassification)[arch]
    torch.manual_seed(seed)
    m = cls(cfg).eval()
    with torch.no_grad():
        for p in m.parameters(): p.normal_(0, 0.3)   # scores far from 0 and from each other
    return m

def hand_logit(m, ids):
    with torch.no_grad(): return float(m(input_ids=torch.tensor([ids])).logits[0, 0])

@pytest.fixture(scope='module')
def minilm():
    from interpkit.models import load_encoder
    return load_encoder()

# ---------------------------------------------------------------- 1. PreferencePair, as_comparisons

def test_comparison_and_as_comparisons():
    c = PreferencePair('p', 'c', 'r')
    assert c.swapped() == PreferencePair('p', 'r', 'c') and c.swapped().swapped() == c
    with pytest.raises(Exception): c.prompt = 'x'   # frozen
    want = [PreferencePair('p1', 'c1', 'r1'), PreferencePair('p2', 'c2', 'r2')]
    assert as_comparisons([('p1', 'c1', 'r1'), ['p2', 'c2', 'r2']]) == want
    assert as_comparisons([dict(prompt='p1', chosen='c1', rejected='r1', extra=1), dict(rejected='r2', chosen='c2', prompt='p2')]) == want
    assert as_comparisons(pd.DataFrame(dict(rejected=['r1', 'r2'], prompt=['p1', 'p2'], chosen=['c1', 'c2']))) == want
    assert as_comparisons(want[0]) == [want[0]] and as_comparisons(iter(want)) == want
    assert as_comparisons([want[0], ('p2', 'c2', 'r2')]) == want
    for bad in (dict(prompt='', chosen='c', rejected='r'), dict(prompt='p', chosen='  \n', rejected='r'), dict(prompt='p', chosen='c', rejected=None),
                dict(prompt=3, chosen='c', rejected='r')):
        with pytest.raises(ConfigError): PreferencePair(**bad)
        with pytest.raises(ConfigError): as_comparisons([bad])
    for bad in ([], pd.DataFrame(columns=['prompt', 'chosen', 'rejected']), [('p', 'c')], [dict(prompt='p', chosen='c')], ['pcr'], [('p', 'c', 'r', 's')]):
        with pytest.raises(ConfigError): as_comparisons(bad)

# ---------------------------------------------------------------- 2. rewards

def test_rewards_batching_types_and_errors():
    rm = LinearRM()
    ps, ys = [f'p{i}' for i in range(7)], [demo_response(i % 12, poles_all((-1)**i)) for i in range(7)]
    want = np.array([rm.value(p, y) for p, y in zip(ps, ys)])
    for bs, sizes in ((1, [1]*7), (2, [2, 2, 2, 1]), (7, [7]), (32, [7])):
        rm.calls = []
        r = rewards(rm, ps, ys, batch_size=bs)
        assert r.dtype == np.float64 and r.shape == (7,) and rm.calls == sizes
        np.testing.assert_allclose(r, want, rtol=0, atol=1e-12)
    t = rewards(lambda p, y: torch.arange(len(p), dtype=torch.float32).reshape(-1, 1) + 0.5, ps, ys, batch_size=3)   # (b, 1) tensors flatten
    np.testing.assert_array_equal(t, [0.5, 1.5, 2.5, 0.5, 1.5, 2.5, 0.5])
    assert rewards(rm, [], []).shape == (0,)
    for v in (float('nan'), float('inf'), -float('inf')):
        with pytest.raises(NotFiniteError): rewards(lambda p, y: [1.0]*(len(p) - 1) + [v], ps, ys, batch_size=2)
    with pytest.raises(ShapeError): rewards(lambda p, y: [1.0]*(len(p) + 1), ps, ys)
    with pytest.raises(ShapeError): rewards(lambda p, y: torch.zeros(len(p), 2), ps, ys)
    with pytest.raises(ShapeError): rewards(rm, ps, ys[:-1])
    for bs in (0, -1, 1.5, True):
        with pytest.raises(ConfigError): rewards(rm, ps, ys, batch_size=bs)

def test_rewards_keep_float64_tensor_scores():
    r = rewards(lambda p, y: torch.tensor([1.0 + 1e-10, 1.0], dtype=torch.float64), ['a', 'b'], ['c', 'd'])
    assert r[0] - r[1] == pytest.approx(1e-10, rel=1e-3)

# ---------------------------------------------------------------- 3. classifier_reward

@pytest.mark.parametrize('arch', ['bert', 'gpt2', 'llama'])
def test_classifier_reward_is_the_logit_of_the_pair(arch, untouched):
    m, t = seq_cls(arch), tok_pad()
    rm = classifier_reward(m, t)
    want = [hand_logit(m, ids_of(t, p) + ids_of(t, r)) for p, r in zip(P, R)]   # the tiny tokenizer joins a text pair without specials
    with untouched(m, t):
        got = rm(P, R)
        one = [float(rm([p], [r])[0]) for p, r in zip(P, R)]
        via = rewards(rm, P, R, batch_size=3)
    assert got.dtype == torch.float32 and got.shape == (4,)
    np.testing.assert_allclose(got.numpy(), want, atol=2e-5)
    np.testing.assert_allclose(one, want, atol=2e-5)
    np.testing.assert_allclose(via, want, atol=2e-5)
    assert len(set(np.round(want, 4))) == 4   # the check sees which logit goes where
    assert 'classifier_reward' in repr(rm)

def test_classifier_reward_templates_and_errors(untouched):
    m, t = seq_cls('llama', seed=1), tok_pad()
    chat = classifier_reward(m, t, template='chat')
    want = [hand_logit(m, ids_of(t, f"user {p} <eos> assistant {r} <eos> ")) for p, r in zip(P, R)]
    with untouched(m, t): np.testing.assert_allclose(chat(P, R).numpy(), want, atol=2e-5)
    fmt = classifier_reward(m, t, template='w100 {response} w101 {prompt}')
    want = [hand_logit(m, ids_of(t, f"w100 {r} w101 {p}")) for p, r in zip(P, R)]
    np.testing.assert_allclose(fmt(P, R).numpy(), want, atol=2e-5)
    short = classifier_reward(m, t, max_length=3)
    want = [hand_logit(m, ids_of(t, "w4 w5 w7"))]   # a text pair is cut longest first
    np.testing.assert_allclose(short(['w4 w5 w6'], ['w7']).numpy(), want, atol=2e-5)
    for bad in ('{prompt} only', 'only {response}', 'chat2', 5):
        with pytest.raises(ConfigError): classifier_reward(m, t, template=bad)
    with pytest.raises(ConfigError): classifier_reward(seq_cls('llama', num_labels=2), t)
    with pytest.raises(ConfigError): classifier_reward(tiny_lm('llama', d_model=32), t)   # a causal LM: no num_labels=1
    nopad = tiny_tokenizer()
    b = seq_cls('bert', seed=2)
    with untouched(b, nopad): got = classifier_reward(b, nopad)(P, R)   # pads with eos on a copy
    assert nopad.pad_token is None
    np.testing.assert_allclose(got.numpy(), [hand_logit(b, ids_of(nopad, p) + ids_of(nopad, r)) for p, r in zip(P, R)], atol=2e-5)

def test_template_with_unknown_field_is_refused_early():
    with pytest.raises(ConfigError): classifier_reward(seq_cls('llama'), tok_pad(), template='{prompt} {response} {extra}')

def test_classifier_reward_left_padding_tokenizer():
    m, t = seq_cls('gpt2'), tok_pad()
    t.padding_side = 'left'
    rm = classifier_reward(m, t)
    np.testing.assert_allclose(rm(P, R).numpy(), [hand_logit(m, ids_of(t, p) + ids_of(t, r)) for p, r in zip(P, R)], atol=2e-5)

# ---------------------------------------------------------------- 4. head_reward, head_features

def llama_and_head(seed=0):
    m = tiny_lm('llama', d_model=32, seed=seed)
    torch.manual_seed(seed + 10)
    return m, torch.nn.Linear(32, 1)

def hand_pooled(m, t, pooling):
    "Pooled last hidden states, one unpadded sequence at a time, through the base model."
    base = m.model if hasattr(m, 'model') else m.bert
    out = []
    with torch.no_grad():
        for p, r in zip(P, R):
            h = base(input_ids=torch.tensor([ids_of(t, p) + ids_of(t, r)])).last_hidden_state[0]
            out.append(h[-1] if pooling == 'last' else h.mean(0))
    return torch.stack(out)

def test_head_reward_last_pooling_on_llama(untouched):
    m, head = llama_and_head()
    t = tiny_tokenizer()
    want = hand_pooled(m, t, 'last')
    with torch.no_grad(): want_r = head(want)[:, 0]
    with untouched(m, t, head):
        rm = head_reward(m, t, head)
        got = rm(P, R)
        f = [head_features(m, t, P, R, batch_size=bs) for bs in (1, 2, 7)]
    assert t.pad_token is None
    torch.testing.assert_close(got, want_r, atol=2e-5, rtol=0)
    for x in f:
        assert x.shape == (4, 32) and x.dtype == torch.float32 and x.device.type == 'cpu'
        torch.testing.assert_close(x, want, atol=2e-5, rtol=0)
    assert (want[0] - want[1]).abs().max() > 1e-2
    vec = head_reward(m, t, lambda h: h[:, 3])   # a plain callable returning (batch,)
    torch.testing.assert_close(vec(P, R), want[:, 3], atol=2e-5, rtol=0)
    assert head_features(m, t, [], []).shape == (0, 32)

def test_head_reward_mean_pooling_on_bert(untouched):
    m = tiny_lm('bert', d_model=32, seed=3)
    t = tiny_tokenizer()
    torch.manual_seed(4)
    head = torch.nn.Linear(32, 1).double()   # a float64 head gets float64 features
    want = hand_pooled(m, t, 'mean')
    with untouched(m, t, head):
        got = head_reward(m, t, head, pooling='mean')(P, R)
        f = head_features(m, t, P, R, pooling='mean', batch_size=3)
    with torch.no_grad(): want_r = head(want.double())[:, 0]
    torch.testing.assert_close(got.double(), want_r, atol=2e-5, rtol=0)
    torch.testing.assert_close(f, want, atol=2e-5, rtol=0)
    one = head_features(m, t, ['w', 'w4 w5'], ['1', 'w6'], pooling='mean', template='{prompt}{response}')   # 'w1': a single token
    with torch.no_grad(): ref = torch.stack([m.bert(input_ids=torch.tensor([ids_of(t, x)])).last_hidden_state[0].mean(0) for x in ('w1', 'w4 w5w6')])
    torch.testing.assert_close(one, ref, atol=2e-5, rtol=0)
    last = head_features(m, t, P, R, pooling='last')
    assert (last - f).abs().max() > 1e-2   # the pooling option matters

def test_head_reward_errors(untouched):
    m, head = llama_and_head()
    t = tiny_tokenizer()
    with pytest.raises(ConfigError): head_reward(m, t, head, pooling='max')
    with pytest.raises(ConfigError): head_features(m, t, P, R, pooling='cls')
    with pytest.raises(ShapeError): head_features(m, t, P, R[:-1])
    with pytest.raises(ConfigError): head_features(m, t, P, R, batch_size=0)
    with pytest.raises(ConfigError): head_reward(m, t, head, template='{prompt}')
    wide = torch.nn.Linear(32, 2)
    for bad in (wide, lambda h: h, lambda h: h[:1, 0]):
        with untouched(m, t, wide):
            with pytest.raises(ShapeError): head_reward(m, t, bad)(P, R)
    assert snapshot(t) == snapshot(tiny_tokenizer())

def test_head_reward_last_pooling_left_padding_tokenizer():
    m, head = llama_and_head()
    t = tiny_tokenizer(); t.padding_side = 'left'
    torch.testing.assert_close(head_features(m, t, P, R), hand_pooled(m, t, 'last'), atol=2e-5, rtol=0)

# ---------------------------------------------------------------- 5. Attribute, RESPONSE_ATTRIBUTES, attribute

TOY = Attribute('toy', 'a toy', (('bad', 'good'), ('not good', 'very good'), ('Meh.', 'Wow!')))

def test_spans_and_score():
    text = "Good, not good. VERY GOOD goodness bad-ish meh. badly Meh.Wow! wow!"
    sp = TOY.spans(text)
    assert [(s.text, s.pole) for s in sp] == [('Good', 1), ('not good', -1), ('VERY GOOD', 1), ('bad', -1), ('meh.', -1), ('Wow!', 1), ('wow!', 1)]
    assert all(text[s.start:s.end] == s.text for s in sp) and all(isinstance(s, Span) for s in sp)
    assert TOY.score(text) == 4 - 3 and TOY.score('good good very good') == 3 and TOY.score('nothing here') == 0
    assert TOY.score('not good') == -1   # longest first: not 'good'
    assert TOY.spans('Meh.Wow!') == [Span(4, 8, 'Wow!', 1)]   # 'Meh.' runs into a word: not a whole phrase

def second_rewrite(attr, text, direction):
    "A second implementation: re.sub over the lexicon (longest first) with a callback."
    pole = {p.lower(): s for lo, hi in attr.pairs for p, s in ((lo, -1), (hi, 1))}
    other = {p.lower(): q for lo, hi in attr.pairs for p, q in ((lo, hi), (hi, lo))}
    alts = sorted(pole, key=lambda p: -len(p))
    rx = '|'.join(r'(?<!\w)' + re.escape(p) + r'(?!\w)' for p in alts)
    changed = []
    def sub(m):
        s = m.group()
        if pole[s.lower()] != -direction: return s
        changed.append(s)
        new = other[s.lower()]
        return new[0].upper() + new[1:] if s[0].isupper() else new[0].lower() + new[1:] if s[0].islower() else new
    out = re.sub(rx, sub, text, flags=re.I)
    return out if changed else None

def test_rewrite_against_a_second_implementation():
    assert TOY.rewrite('Bad, bad! very good', 1) == 'Good, good! very good'
    assert TOY.rewrite('Bad, bad! Very good', -1) == 'Bad, bad! Not good'
    assert TOY.rewrite('BAD day', 1) == 'Good day'   # only the first letter's case is kept
    digit = Attribute('d', 'digits', (('1 thing', 'Two things'),))
    assert digit.rewrite('so 1 thing', 1) == 'so Two things' and digit.rewrite('Two things', -1) == '1 thing'   # no letter first: kept as is
    assert TOY.rewrite('nothing here', 1) is None and TOY.rewrite('good', 1) is None and TOY.rewrite('bad', -1) is None
    rng = random.Random(0)
    words = ['good', 'Bad', 'not good', 'Very good', 'meh.', 'Wow!', 'x', 'goods', 'y,', 'BAD', '\n', 'notgood']
    for _ in range(300):
        text = ' '.join(rng.choice(words) for _ in range(rng.randrange(1, 9)))
        for d in (-1, 1):
            assert TOY.rewrite(text, d) == second_rewrite(TOY, text, d), (text, d)
    for a in RESPONSE_ATTRIBUTES:
        for topic in range(12):
            y = demo_response(topic, {b.name: [rng.choice((-1, 1)) for _ in b.pairs] for b in RESPONSE_ATTRIBUTES})
            for d in (-1, 1):
                new = a.rewrite(y, d)
                assert new == second_rewrite(a, y, d)
                if new is None: continue
                # outside the changed spans, byte-identical: rebuild the original from the new text and the spans
                todo = [s for s in a.spans(y) if s.pole == -d]
                rebuilt, pos = '', 0
                for s in todo:
                    rebuilt += y[pos:s.start] + s.text
                    pos = s.end
                assert rebuilt + y[pos:] == y
                assert a.score(new) == len(a.pairs) * d and level(new, a.name) == d
                assert all(b.score(new) == b.score(y) for b in RESPONSE_ATTRIBUTES if b is not a)

def test_rewrite_and_attribute_errors():
    for d in (0, 2, -2, '1', None):
        with pytest.raises(ConfigError): TOY.rewrite('bad', d)
    for pairs in ((('a', 'b'), ('A', 'c')), (('a', 'a'),), ()):
        with pytest.raises(ConfigError): Attribute('x', 'y', pairs)
    with pytest.raises(ConfigError, match='politeness'): attribute('politness')
    assert attribute('directness') is RESPONSE_ATTRIBUTES[2] and attribute(TOY) is TOY and attribute('toy', [TOY]) is TOY
    with pytest.raises(ConfigError): attribute('politeness', [TOY])
    assert SpanEditor()(['bad x', 'x'], TOY, 1) == ['good x', None]

def test_the_lexicon():
    assert len(RESPONSE_ATTRIBUTES) == 8 and len({a.name for a in RESPONSE_ATTRIBUTES}) == 8
    assert [a.name for a in RESPONSE_ATTRIBUTES] == ['politeness', 'conciseness', 'directness', 'specificity', 'harmlessness', 'formality', 'enthusiasm', 'correctness']
    flat = [(a.name, p) for a in RESPONSE_ATTRIBUTES for pair in a.pairs for p in pair]
    assert all(len(pair) == 2 for a in RESPONSE_ATTRIBUTES for pair in a.pairs)
    for n1, p1 in flat:
        for n2, p2 in flat:
            if (n1, p1) != (n2, p2): assert count(p2, p1) == 0, (p1, p2)   # not equal, not a whole-word sub-phrase
    fields = [f for _, f, _, _ in string.Formatter().parse(RESPONSE_TEMPLATE) if f]
    assert len(fields) == len(set(fields))
    assert set(fields) == {'action', 'object'} | {f'{a.name}{k}' for a in RESPONSE_ATTRIBUTES for k in range(len(a.pairs))}

# ---------------------------------------------------------------- 6. demo data

def test_demo_responses_hold_exactly_their_poles():
    rng = random.Random(1)
    for topic in range(len(TOPICS)):
        for _ in range(6):
            poles = {a.name: [rng.choice((-1, 1)) for _ in a.pairs] for a in RESPONSE_ATTRIBUTES}
            y = demo_response(topic, poles)
            lv = attribute_levels(y)
            assert list(lv.index) == [a.name for a in RESPONSE_ATTRIBUTES]
            for a in RESPONSE_ATTRIBUTES:
                assert lv[a.name] == np.mean(poles[a.name]) == level(y, a.name)
                for k, s in enumerate(poles[a.name]): assert count(y, a.pairs[k][(s + 1)//2]) == 1 and count(y, a.pairs[k][(1 - s)//2]) == 0
            assert TOPICS[topic][1] in y and TOPICS[topic][2] in y
            for sent in re.split(r'(?<=[.!?])\s+', y): assert sent[0].isupper(), sent
    assert demo_prompt(0) == 'How do I reset my router?' and demo_prompt(11) == 'How do I descale the kettle?'
    hi = ("Hello, Thanks for asking. I am sure the fix is simple. Please hold the reset button for ten seconds, because it clears the old settings. "
          "Before you start, make a backup first and follow the safety instructions. The manual says that this tested method will work. "
          "This is going to take two minutes, and the result should be great. You can carry on now. Have fun, you've got this! I hope this helps.")
    assert demo_response(0, poles_all(1)) == hi
    assert attribute_levels('nothing', [TOY]).to_dict() == {'toy': 0.0}

def test_planted_reward_by_hand():
    w = dict(politeness=2.0, conciseness=-1.0, correctness=0.5)
    poles = poles_all(-1) | dict(politeness=[1, 1, -1], conciseness=[1, -1], correctness=[1, 1])
    y = demo_response(3, poles)
    want = 2.0*(1/3) - 1.0*0 + 0.5*1
    np.testing.assert_allclose(planted_reward([y, demo_response(3, poles_all(1)), demo_response(3, poles_all(-1))], w),
                               [want, 1.5, -1.5], rtol=0, atol=1e-12)
    np.testing.assert_allclose(planted_reward([demo_response(5, poles_all(1))], PLANTED['helpful']), [sum(PLANTED['helpful'].values())], atol=1e-12)
    assert sum(PLANTED['helpful'].values()) == pytest.approx(11.0) and set(PLANTED) == {'helpful', 'harmless'}

def test_demo_comparisons_with_infinite_beta():
    for w in (PLANTED['helpful'], PLANTED['harmless'], dict(directness=1.0)):
        cs = demo_comparisons(60, w, seed=4, beta=np.inf)
        assert len(cs) == 60 and all(isinstance(c, PreferencePair) for c in cs)
        d = planted_reward([c.chosen for c in cs], w) - planted_reward([c.rejected for c in cs], w)
        assert (d >= 0).all() and (d > 0).sum() >= 30
        for c in cs:
            topic = [t for t in range(12) if demo_prompt(t) == c.prompt]
            assert len(topic) == 1 and TOPICS[topic[0]][2] in c.chosen and TOPICS[topic[0]][2] in c.rejected
    assert demo_comparisons(5, W, seed=9) == demo_comparisons(5, W, seed=9) != demo_comparisons(5, W, seed=10)

@pytest.mark.parametrize('beta', [0.0, 2.0, 5.0])
def test_demo_comparisons_follow_bradley_terry(beta):
    # Given the drawn pair, the label is a Bernoulli draw with P(higher planted reward first) = sigmoid(beta |d|); the count over
    # n pairs is Poisson-binomial. |z| < 5 is a two-sided test at level 6e-7 (the seed is fixed, so it is deterministic anyway);
    # small weights keep beta |d| around 1, where a wrong sign, a wrong scale of beta or a swapped label moves z by more than 6.
    w = dict(specificity=0.3, correctness=0.25, directness=-0.2, politeness=0.15)
    cs = demo_comparisons(500, w, seed=11, beta=beta)
    d = planted_reward([c.chosen for c in cs], w) - planted_reward([c.rejected for c in cs], w)
    d = d[np.abs(d) > 1e-12]
    p = 1/(1 + np.exp(-beta*np.abs(d)))
    z = ((d > 0).sum() - p.sum()) / math.sqrt((p*(1 - p)).sum())
    assert abs(z) < 5, z
    assert len(d) > 400

# ---------------------------------------------------------------- 7. random_edit

def word_ops(a, b):
    return [(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a.split(), b.split(), autojunk=False).get_opcodes() if tag != 'equal']

def test_random_edit_size_and_protection():
    rng = random.Random(5)
    n = 0
    for name in ('directness', 'formality'):
        a = attribute(name)
        for topic in range(12):
            poles = {b.name: [rng.choice((-1, 1)) for _ in b.pairs] for b in RESPONSE_ATTRIBUTES}
            y = demo_response(topic, poles)
            for d in (-1, 1):
                e = a.rewrite(y, d)
                if e is None: continue
                ops = word_ops(y, e)
                if max(k for k, _ in ops) > 1: continue   # multi-word deletions: see the xfails below
                for seed in range(4):
                    x = random_edit(y, e, a, words=['XQ'], seed=seed)
                    assert x.split().count('XQ') == sum(j for _, j in ops)
                    assert len(x.split()) - x.split().count('XQ') == len(y.split()) - sum(i for i, _ in ops)
                    assert [s.text for s in a.spans(x)] == [s.text for s in a.spans(y)] and a.score(x) == a.score(y)
                    assert random_edit(y, e, a, words=['XQ'], seed=seed) == x
                    n += 1
                outs = {random_edit(y, e, a, seed=s) for s in range(8)}
                assert len(outs) > 1
    assert n >= 40
    y = demo_response(2, poles_all(1))
    assert random_edit(y, y, attribute('politeness'), seed=3) == y
    assert random_edit('a b c', 'a b c', None) == 'a b c'
    # without an attribute every word may go; pool defaults to the original's words
    x = random_edit('a b c d', 'a X c d', None, seed=1)
    assert len(x.split()) == 4 and set(x.split()) <= set('abcd') and sum(u != v for u, v in zip(x.split(), 'a b c d'.split())) <= 1

def test_random_edit_never_touches_the_attribute():
    a = attribute('conciseness')
    y = demo_response(0, poles_all(-1))
    x = random_edit(y, a.rewrite(y, 1), a, seed=0)
    assert [s.text for s in a.spans(x)] == [s.text for s in a.spans(y)]

def test_random_edit_has_the_size_of_the_attribute_edit():
    a = attribute('conciseness')
    y = demo_response(0, poles_all(-1))
    e = a.rewrite(y, 1)
    x = random_edit(y, e, a, seed=1)
    assert len(x.split()) - len(y.split()) == len(e.split()) - len(y.split())

# ---------------------------------------------------------------- 8. distances

def test_syntactic_distance_is_normalised_levenshtein():
    rng = random.Random(6)
    for _ in range(300):
        a, b = (''.join(rng.choice('ab c') for _ in range(rng.randrange(0, 9))) for _ in range(2))
        want = lev(a, b) / max(len(a), len(b)) if a or b else 0.0
        assert syntactic_distance(a, b) == pytest.approx(want, abs=1e-12)
    assert syntactic_distance('kitten', 'sitting') == pytest.approx(3/7) and syntactic_distance('', 'abc') == 1.0

def hand_embed(m, t, text):
    with torch.no_grad(): h = m(input_ids=torch.tensor([ids_of(t, text)])).last_hidden_state[0].double().mean(0)
    return h / h.norm()

def test_semantic_distances_against_our_embeddings(untouched):
    m, t = tiny_lm('bert', d_model=32, seed=7).bert, tiny_tokenizer()
    a, b = ['w1 w2 w3', 'w4', 'w1 w2 w3', 'w9 w8'], ['w4', 'w5 w6', 'w1 w2 w3', 'w7 w7 w7 w7 w7']
    want = [1 - float(hand_embed(m, t, x) @ hand_embed(m, t, y)) for x, y in zip(a, b)]
    with untouched(m, t):
        got = semantic_distances(a, b, m, t, batch_size=2)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got[2] == pytest.approx(0, abs=1e-6) and min(want[:2] + want[3:]) > 1e-3
    with pytest.raises(ShapeError): semantic_distances(a, b[:-1], m, t)
    assert semantic_distances([], [], m, t).shape == (0,)

# ---------------------------------------------------------------- 9. orient, perturbations, explain

def comparisons_for_rm(n=6, seed=3):
    return demo_comparisons(n, PLANTED['harmless'], seed=seed, beta=np.inf)

def test_orient():
    rm, cs = LinearRM(), comparisons_for_rm()
    oc, m, sw = orient(rm, cs, batch_size=4)
    raw = np.array([rm.value(c.prompt, c.chosen) - rm.value(c.prompt, c.rejected) for c in cs])
    assert sw.dtype == bool and 0 < sw.sum() < len(cs)   # some comparisons disagree with W
    np.testing.assert_array_equal(sw, raw < 0)
    np.testing.assert_allclose(m, np.abs(raw), atol=1e-12)
    assert oc == [c.swapped() if s else c for c, s in zip(cs, raw < 0)]
    assert rm.calls == [4, 4, 4]
    _, m0, sw0 = orient(lambda p, y: [0.5]*len(p), cs)   # ties are not swapped
    assert not sw0.any() and (m0 == 0).all()

def expected_rows(cs, attrs, sides):
    "Closed forms for a span-edited demo comparison under LinearRM: every slot of the attribute goes to the edited pole."
    rm, out = LinearRM(), []
    for a in attrs:
        for i, c in enumerate(cs):
            m = rm.value(c.prompt, c.chosen) - rm.value(c.prompt, c.rejected)
            lc, lr = level(c.chosen, a), level(c.rejected, a)
            for side in sides:
                vc, vr = lc > -1, lr < 1
                dc = W[a]*(lc + 1) if side in ('chosen', 'both') and vc else 0.0
                dr = W[a]*(1 - lr) if side in ('rejected', 'both') and vr else 0.0
                valid = dict(chosen=vc, rejected=vr, both=vc and vr)[side]
                out.append(dict(comparison=i, attribute=a, side=side, valid=valid, margin=m, new_margin=m - dc - dr,
                                chosen_level=-1.0 if side in ('chosen', 'both') and vc else lc, rejected_level=1.0 if side in ('rejected', 'both') and vr else lr))
    return pd.DataFrame(out)

def test_explain_against_closed_forms():
    rm, raw = LinearRM(), comparisons_for_rm()
    ex = explain(rm, raw, embedder=False, batch_size=5)
    assert isinstance(ex, Explanation) and 'semantic' not in ex.table
    cs = ex.comparisons
    attrs = [a.name for a in RESPONSE_ATTRIBUTES]
    t = ex.table
    assert list(t.columns[:7]) == ['comparison', 'attribute', 'side', 'editor', 'valid', 'chosen', 'rejected']
    want = expected_rows(cs, attrs, SIDES)
    assert len(t) == len(want) == 6*8*3 and (t.editor == 'attribute').all()
    np.testing.assert_array_equal(t.comparison, want.comparison); np.testing.assert_array_equal(t.side, want.side)
    np.testing.assert_array_equal(t.attribute, want.attribute); np.testing.assert_array_equal(t.valid, want.valid)
    np.testing.assert_allclose(t.margin, want.margin, atol=1e-12); np.testing.assert_allclose(t.new_margin, want.new_margin, atol=1e-9)
    assert (t.margin >= 0).all() and np.array_equal(t.margin, ex.margins[t.comparison])
    nm = want.new_margin.where(want.new_margin.abs() > 1e-9, 0.0)   # an edit that ties the rewards exactly keeps the preference
    np.testing.assert_array_equal(t.counterfactual, want.valid & (nm < 0))
    np.testing.assert_array_equal(t.semifactual, want.valid & (nm >= 0))
    assert t.counterfactual.any() and t.semifactual.any() and (~t.valid).any() and not (t.counterfactual & t.semifactual).any()
    assert not (t[~t.valid].counterfactual | t[~t.valid].semifactual).any()
    for (_, row), (_, w) in zip(t.iterrows(), want.iterrows()):
        c = cs[row.comparison]
        assert level(row.chosen, row.attribute) == w.chosen_level and level(row.rejected, row.attribute) == w.rejected_level
        if row.side == 'chosen': assert row.rejected == c.rejected
        if row.side == 'rejected': assert row.chosen == c.chosen
        pairs = [(n, o) for n, o in ((row.chosen, c.chosen), (row.rejected, c.rejected)) if n != o]
        assert row.syntactic == pytest.approx(np.mean([lev(n, o)/max(len(n), len(o)) for n, o in pairs]) if pairs else 0.0, abs=1e-12)
    # each distinct (prompt, response) is scored once: the originals when orienting, the perturbed ones after, never again
    originals = {(c.prompt, y) for c in cs for y in (c.chosen, c.rejected)}
    later = rm.seen[2*len(raw):]
    assert set(rm.seen[:2*len(raw)]) == originals and len(later) == len(set(later))
    assert set(later) == {(cs[i].prompt, y) for i, a, b in zip(t.comparison, t.chosen, t.rejected) for y in (a, b)} - originals
    assert rm.calls[:3] == [5, 5, 2] and all(k <= 5 for k in rm.calls)
    np.testing.assert_array_equal(ex.swapped, orient(LinearRM(), raw)[2])

class DriftingRM(LinearRM):
    "LinearRM plus 0.01 times the index of the call: a pair scored in two calls gets two different rewards."
    def __init__(self): super().__init__(); self.got = {}
    def __call__(self, prompts, responses):
        k = len(self.calls)
        out = [v + 0.01*k for v in super().__call__(prompts, responses)]
        for p, y, v in zip(prompts, responses, out): self.got.setdefault((p, y), []).append(v)
        return out

def test_explain_scores_each_pair_once_and_reuses_the_originals():
    # Before the fix, `explain` scored the originals again beside the perturbed responses (604 scorings for 524 distinct pairs in the
    # notebook's first version): with this reward model every original then had two rewards, and a side left unedited moved the margin.
    rm, raw = DriftingRM(), comparisons_for_rm(5, seed=4)
    ex = explain(rm, raw, baseline=True, embedder=False, batch_size=7)
    cs, t = ex.comparisons, ex.table
    needed = {(c.prompt, y) for c in cs for y in (c.chosen, c.rejected)} | {(cs[i].prompt, y) for i, a, b in zip(t.comparison, t.chosen, t.rejected) for y in (a, b)}
    assert len(rm.seen) == len(set(rm.seen)) == len(needed) and set(rm.seen) == needed and sum(rm.calls) == len(needed)
    assert len(rm.calls) >= 10 and all(len(v) == 1 for v in rm.got.values())   # many calls: a second scoring would drift by >= 0.01
    r = {k: v[0] for k, v in rm.got.items()}
    signed = np.array([r[c.prompt, c.chosen] - r[c.prompt, c.rejected] for c in cs])
    np.testing.assert_array_equal(ex.margins, signed)
    assert (signed >= 0).all()
    np.testing.assert_array_equal(t.new_margin, [r[cs[i].prompt, a] - r[cs[i].prompt, b] for i, a, b in zip(t.comparison, t.chosen, t.rejected)])
    np.testing.assert_array_equal(t.margin, ex.margins[t.comparison])
    same = (t.chosen.to_numpy() == np.array([cs[i].chosen for i in t.comparison])) & (t.rejected.to_numpy() == np.array([cs[i].rejected for i in t.comparison]))
    orig_r = np.array([cs[i].rejected for i in t.comparison])
    assert same.sum() >= 5 and (t.rejected.to_numpy() == orig_r)[t.side.to_numpy() == 'chosen'].all()
    np.testing.assert_array_equal(t.new_margin[same], t.margin[same])   # nothing edited: the very same margin
    one = (t.side == 'chosen') & ~same   # only the chosen response edited: the margin moves by its reward change alone
    assert one.sum() >= 20
    np.testing.assert_allclose(t.new_margin[one] - t.margin[one], [r[cs[i].prompt, a] - r[cs[i].prompt, cs[i].chosen] for i, a in zip(t.comparison[one], t.chosen[one])],
                               rtol=0, atol=1e-12)
    rm2 = DriftingRM()
    oc, m, sw = orient(rm2, raw + raw[:2], batch_size=3)   # a repeated comparison: its pairs are scored once, and both copies get one margin
    assert len(rm2.seen) == len(set(rm2.seen)) == 2*len(raw) and m[len(raw)] == m[0] and m[len(raw) + 1] == m[1]

def test_explain_sides_names_and_swaps():
    rm, raw = LinearRM(), comparisons_for_rm(4, seed=8)
    ex = explain(rm, [(c.prompt, c.rejected, c.chosen) for c in raw], attributes=['harmlessness', 'formality'], sides=('rejected',), embedder=False)
    want = expected_rows(ex.comparisons, ['harmlessness', 'formality'], ('rejected',))
    assert len(ex.table) == 8 and set(ex.table.side) == {'rejected'}
    np.testing.assert_allclose(ex.table.new_margin, want.new_margin, atol=1e-9)
    np.testing.assert_array_equal(ex.swapped, ~orient(LinearRM(), raw)[2] & (orient(LinearRM(), raw)[1] > 0))

def test_perturbations_rewriter_contract():
    cs = comparisons_for_rm(3)
    calls = []
    def same(texts, a, d, prompts):
        calls.append((a.name, d, list(prompts)))
        return list(texts)   # changes nothing: every row invalid
    t = perturbations(cs, ['politeness'], same, sides=('chosen', 'both'))
    assert len(t) == 6 and not t.valid.any() and calls == [('politeness', -1, [c.prompt for c in cs]), ('politeness', 1, [c.prompt for c in cs])]
    calls.clear()
    perturbations(cs, ['politeness'], same, sides=('rejected',))
    assert [d for _, d, _ in calls] == [1]
    wrong_way = lambda texts, a, d, prompts: [a.rewrite(x, -d) for x in texts]
    assert not perturbations(cs, RESPONSE_ATTRIBUTES, wrong_way).valid.any()
    with pytest.raises(ShapeError): perturbations(cs, ['politeness'], lambda texts, a, d, p: texts[:-1])
    with pytest.raises(ConfigError): perturbations(cs, [])
    with pytest.raises(ConfigError): perturbations(cs, ['politness'])
    with pytest.raises(ConfigError): perturbations(cs, sides=('chosen', 'neither'))
    with pytest.raises(ConfigError): perturbations([], RESPONSE_ATTRIBUTES)

def test_random_baseline_rows():
    rm, raw = LinearRM(), comparisons_for_rm(4, seed=12)
    ex = explain(rm, raw, attributes=['directness', 'formality'], baseline=True, embedder=False, seed=3)
    t = ex.table
    att, rnd = t[t.editor == 'attribute'].reset_index(drop=True), t[t.editor == 'random'].reset_index(drop=True)
    assert len(t) == 2*len(att) == 4*2*3*2 and list(t.editor[:2]) == ['attribute', 'random']
    for k in ('comparison', 'attribute', 'side'): np.testing.assert_array_equal(att[k], rnd[k])
    for (_, r), (_, a) in zip(rnd.iterrows(), att.iterrows()):
        c, attr = ex.comparisons[r.comparison], attribute(r.attribute)
        j = ['directness', 'formality'].index(r.attribute)
        k = 3 + 7919*r.comparison + 104729*j
        want_c = random_edit(c.chosen, a.chosen, attr, seed=k) if r.side != 'rejected' and a.chosen != c.chosen else c.chosen
        want_r = random_edit(c.rejected, a.rejected, attr, seed=k + 1) if r.side != 'chosen' and a.rejected != c.rejected else c.rejected
        assert (r.chosen, r.rejected) == (want_c, want_r)
        assert r.valid == (a.valid and (r.side == 'rejected' or r.chosen != c.chosen) and (r.side == 'chosen' or r.rejected != c.rejected))
        assert r.new_margin == pytest.approx(rm.value(c.prompt, r.chosen) - rm.value(c.prompt, r.rejected), abs=1e-9)
        assert attr.score(r.chosen) == attr.score(c.chosen) and attr.score(r.rejected) == attr.score(c.rejected)
    assert rnd.valid.sum() >= rnd.valid.size // 3
    other = explain(LinearRM(), raw, attributes=['directness', 'formality'], baseline=True, embedder=False, seed=4).of('random')
    assert (other.chosen.to_numpy() != t[t.editor == 'random'].chosen.to_numpy()).any()
    with pytest.raises(ConfigError): ex.of('lm')

def test_explain_semantic_locality(minilm):
    enc, tok = minilm
    rm, raw = LinearRM(), comparisons_for_rm(1, seed=2)
    ex = explain(rm, raw, attributes=['conciseness', 'enthusiasm'], embedder=enc, embedder_tokenizer=tok, batch_size=4)
    c = ex.comparisons[0]
    def e(x):
        with torch.no_grad(): h = enc(**tok(x, return_tensors='pt')).last_hidden_state[0].double().mean(0)
        return h / h.norm()
    for _, row in ex.table.iterrows():
        pairs = [(n, o) for n, o in ((row.chosen, c.chosen), (row.rejected, c.rejected)) if n != o]
        want = np.mean([1 - float(e(n) @ e(o)) for n, o in pairs]) if pairs else 0.0
        assert row.semantic == pytest.approx(want, abs=2e-5)
    assert (ex.table.semantic > 1e-3).sum() >= 3

# ---------------------------------------------------------------- 9b. detectors independent of the lexicon, revalidate, calibration

def test_pole_descriptions_share_nothing_with_the_lexicon():
    assert list(POLE_DESCRIPTIONS) == [a.name for a in RESPONSE_ATTRIBUTES]
    for name, pair in POLE_DESCRIPTIONS.items():
        assert len(pair) == 2 and pair[0] != pair[1]
        for d in pair:
            for lo, hi in (p for a in RESPONSE_ATTRIBUTES for p in a.pairs): assert count(d, lo) == count(d, hi) == 0, (name, d)
            assert all(a.score(d) == 0 and not a.spans(d) for a in RESPONSE_ATTRIBUTES)

def test_description_detector_against_our_embeddings(untouched):
    m, t = tiny_lm('bert', d_model=32, seed=7).bert, tiny_tokenizer()
    desc = {'toy': ('w1 w2', 'w3 w4 w5'), 'other': ('w6', 'w7 w7')}
    det = DescriptionDetector(desc, m, t, batch_size=2)
    texts = ['w8 w9', 'w3 w4', 'w10', 'w8 w9', 'w1 w11 w12 w13']
    def want(name):
        lo, hi = (hand_embed(m, t, x) for x in desc[name])
        return [float(hand_embed(m, t, x) @ hi - hand_embed(m, t, x) @ lo) for x in texts]
    with untouched(m, t):
        got = det(texts, 'toy')
        got_other = det(texts, Attribute('other', 'x', (('a', 'b'),)))   # an Attribute goes by its name
    assert got.dtype == np.float64 and got.shape == (5,)
    np.testing.assert_allclose(got, want('toy'), atol=1e-5)
    np.testing.assert_allclose(got_other, want('other'), atol=1e-5)
    assert got[0] == got[3] and len(set(np.round(got, 5))) == 4   # the check sees which score goes where
    assert set(det._e) == set(texts) | {x for p in desc.values() for x in p}   # each distinct text embedded once, kept
    assert det([], 'toy').shape == (0,) and 'DescriptionDetector(2' in repr(det)
    with pytest.raises(ConfigError, match='toy'): det(texts, 'tox')
    for bad in ({'a': ('x',)}, {'a': ('x', '')}, {'a': 'xy'}, {'a': ('x', 3)}):
        with pytest.raises(ConfigError): DescriptionDetector(bad, m, t)
    with pytest.raises(ConfigError): DescriptionDetector(desc, m, t, batch_size=0)

def hand_validity(ex, score):
    "Validity and shifts by loops: each edited response's score change, chosen down and rejected up, all edited sides of the row."
    out = []
    for r in ex.table.itertuples():
        c, a = ex.comparisons[r.comparison], r.attribute
        dc = score(r.chosen, a) - score(c.chosen, a) if r.chosen != c.chosen else 0.0
        dr = score(r.rejected, a) - score(c.rejected, a) if r.rejected != c.rejected else 0.0
        ok_c, ok_r = r.chosen != c.chosen and dc < 0, r.rejected != c.rejected and dr > 0
        out.append((dc, dr, dict(chosen=ok_c, rejected=ok_r, both=ok_c and ok_r)[r.side]))
    return pd.DataFrame(out, columns=['d_chosen', 'd_rejected', 'valid'])

def test_revalidate_with_the_lexicon_and_with_another_detector():
    rm, raw = LinearRM(), demo_comparisons(6, PLANTED['helpful'], seed=23, beta=np.inf)
    ex = explain(rm, raw, baseline=True, embedder=False, seed=2)
    lex = revalidate(ex, lexicon_detector)
    att = (ex.table.editor == 'attribute').to_numpy()
    np.testing.assert_array_equal(lex.table.valid[att], ex.table.valid[att])   # the span edits' own validity, exactly
    np.testing.assert_array_equal(lex.table.valid_lexicon, ex.table.valid)
    want = hand_validity(ex, lambda y, a: level(y, a) * len(LEXICON[a]))
    for k in ('d_chosen', 'd_rejected'): np.testing.assert_allclose(lex.table[k], want[k], atol=1e-12)
    np.testing.assert_array_equal(lex.table.valid, want.valid)
    assert not lex.table.valid[~att].any() and ex.table.valid[~att].any()   # random edits leave the lexicon alone: valid before only by inheritance
    # a detector that reads something else: the number of words with a "t" in them
    tee = lambda texts, a: np.array([sum('t' in w for w in x.split()) + 0.1*len(a.name) for x in texts])
    other = revalidate(ex, tee)
    want = hand_validity(ex, lambda y, a: sum('t' in w for w in y.split()) + 0.1*len(a))
    for k in ('d_chosen', 'd_rejected'): np.testing.assert_allclose(other.table[k], want[k], atol=1e-9)
    np.testing.assert_array_equal(other.table.valid, want.valid)
    assert other.table.valid.any() and (~other.table.valid & ex.table.valid).any()
    np.testing.assert_array_equal(other.table.counterfactual, other.table.valid & (other.table.new_margin < 0))
    np.testing.assert_array_equal(other.table.semifactual, other.table.valid & (other.table.new_margin >= 0))
    for k in ('comparison', 'attribute', 'side', 'editor', 'chosen', 'rejected', 'new_margin', 'margin'): np.testing.assert_array_equal(other.table[k], ex.table[k])
    np.testing.assert_array_equal(revalidate(other, lexicon_detector).table.valid_lexicon, ex.table.valid)   # the first verdict is kept
    assert 'valid_lexicon' not in ex.table   # the explanation given is left as it was
    calls = []
    def spy(texts, a): calls.append((a.name, len(texts), len(set(texts)))); return lexicon_detector(texts, a)
    detector_shifts(ex, spy)
    assert {n for n, _, _ in calls} == set(ex.table.attribute) and all(n == u for _, n, u in calls)   # distinct texts only
    with pytest.raises(ShapeError): revalidate(ex, lambda texts, a: np.zeros(len(texts) + 1))
    with pytest.raises(NotFiniteError): revalidate(ex, lambda texts, a: np.full(len(texts), np.nan))
    with pytest.raises(ConfigError): revalidate(ex, lexicon_detector, attributes=[TOY])

def test_detector_agreement_by_hand():
    rng = random.Random(8)
    texts = [demo_response(i % 12, {a.name: [rng.choice((-1, 1)) for _ in a.pairs] for a in RESPONSE_ATTRIBUTES}) for i in range(10)]
    cal = detector_agreement(lexicon_detector, texts, seed=3)
    assert list(cal.columns) == ['attribute', 'text', 'direction', 'd_span', 'd_random', 'agrees', 'random_agrees']
    assert len(cal) == 8*10 and list(cal.attribute.unique()) == [a.name for a in RESPONSE_ATTRIBUTES] and set(cal.direction) == {-1, 1}
    for r in cal.itertuples():
        a = attribute(r.attribute)
        y = texts[r.text]
        assert a.rewrite(y, r.direction) is not None
        assert r.d_span == (level(a.rewrite(y, r.direction), r.attribute) - level(y, r.attribute)) * len(a.pairs)
    assert cal.agrees.all() and not cal.random_agrees.any() and (cal.d_random == 0).all()
    neg = detector_agreement(lambda t, a: -lexicon_detector(t, a), texts, seed=3)
    assert not neg.agrees.any() and (neg.direction == cal.direction).all()
    assert not detector_agreement(lexicon_detector, texts, seed=4).direction.equals(cal.direction)
    np.testing.assert_array_equal(detector_agreement(lexicon_detector, texts, seed=3).d_span, cal.d_span)
    one_way = detector_agreement(lexicon_detector, [demo_response(0, poles_all(1))], ['politeness'])   # every slot high: only down
    assert list(one_way.direction) == [-1]
    assert detector_agreement(lexicon_detector, ['no phrases'], ['politeness']).empty

# ---------------------------------------------------------------- 10. coverage

def hand_explanation(rows, n, cs=None):
    t = pd.DataFrame(rows)
    t = t.assign(editor=t.get('editor', 'attribute'), chosen='c', rejected='r')
    t['counterfactual'] = t.valid & (t.new_margin < 0)
    t['semifactual'] = t.valid & (t.new_margin >= 0)
    cs = cs or [PreferencePair(f'p{i}', f'c{i}', f'r{i}') for i in range(n)]
    return Explanation(cs, np.ones(n), np.zeros(n, bool), t)

def test_coverage_on_a_hand_made_table():
    R_ = [  # comparison, side, valid, new_margin, syntactic, semantic
        (0, 'chosen', True, -1.0, 0.1, 0.01), (0, 'chosen', True, 2.0, 0.2, 0.02), (1, 'chosen', True, -0.5, 0.3, 0.03),
        (1, 'chosen', False, -3.0, 0.9, 0.09), (2, 'chosen', True, 0.0, 0.4, 0.04), (3, 'chosen', False, 1.0, 0.0, 0.0),
        (0, 'rejected', True, 1.0, 0.5, 0.05), (2, 'rejected', True, 3.0, 0.7, 0.07), (2, 'rejected', False, -1.0, 0.6, 0.06),
        (1, 'both', False, -2.0, 0.8, 0.08)]
    ex = hand_explanation([dict(comparison=c, attribute='a', side=s, valid=v, margin=1.0, new_margin=m, syntactic=x, semantic=y) for c, s, v, m, x, y in R_], 5)
    cov = coverage(ex)
    assert cov.index.name == 'side' and list(cov.index) == ['chosen', 'rejected', 'both']
    assert set(cov.columns) == {'cf_coverage', 'sf_coverage', 'cf_syntactic', 'cf_semantic', 'sf_syntactic', 'sf_semantic'}
    want = dict(chosen=[2/5, 2/5, (0.1 + 0.3)/2, (0.01 + 0.03)/2, (0.2 + 0.4)/2, (0.02 + 0.04)/2],
                rejected=[0, 2/5, np.nan, np.nan, (0.5 + 0.7)/2, (0.05 + 0.07)/2], both=[0, 0, np.nan, np.nan, np.nan, np.nan])
    cols = ['cf_coverage', 'sf_coverage', 'cf_syntactic', 'cf_semantic', 'sf_syntactic', 'sf_semantic']
    for side, w in want.items(): np.testing.assert_allclose(cov.loc[side, cols].to_numpy(float), w, atol=1e-12)
    no_sem = hand_explanation([dict(comparison=0, attribute='a', side='chosen', valid=True, margin=1.0, new_margin=-1.0, syntactic=0.5)], 2)
    assert set(coverage(no_sem).columns) == {'cf_coverage', 'sf_coverage', 'cf_syntactic', 'sf_syntactic'}
    assert coverage(no_sem).loc['chosen', 'cf_coverage'] == 0.5
    with pytest.raises(ConfigError): coverage(no_sem, editor='random')

# ---------------------------------------------------------------- 11. sensitivity, local_sensitivity, representatives

def test_sensitivity_closed_form():
    rm, raw = LinearRM(), demo_comparisons(10, PLANTED['helpful'], seed=21, beta=np.inf)
    ex = explain(rm, raw, embedder=False)
    want = expected_rows(ex.comparisons, [a.name for a in RESPONSE_ATTRIBUTES], SIDES)
    for sides in (('chosen', 'rejected'), ('both',), ('chosen',)):
        s = sensitivity(ex, sides=sides) if sides != ('chosen', 'rejected') else sensitivity(ex)
        w = want[want.side.isin(sides) & want.valid]
        assert set(s.index) == set(w.attribute) and list(s.columns) == ['flip_rate', 'shift', 'n']
        for a, g in w.groupby('attribute'):
            cf = (g.new_margin < 0).sum()
            assert s.loc[a, 'n'] == len(g) and s.loc[a, 'flip_rate'] == pytest.approx(cf / len(g), abs=1e-12)
            # shift = W_a * mean level change (each valid row moves level_a to the edited pole: -1 for chosen, +1 for rejected)
            change = [(level(ex.comparisons[i].chosen, a) + 1 if sd in ('chosen', 'both') else 0) + (1 - level(ex.comparisons[i].rejected, a) if sd in ('rejected', 'both') else 0)
                      for i, sd in zip(g.comparison, g.side)]
            change = np.array(change)
            assert s.loc[a, 'shift'] == pytest.approx(W[a]*change.mean(), abs=1e-9)
        keys = list(zip(s.flip_rate, s['shift']))
        assert keys == sorted(keys, reverse=True)
    assert sensitivity(ex).flip_rate.max() > 0 and sensitivity(ex)['shift'].min() < 0   # conciseness and formality weigh against

def test_local_sensitivity_by_loops():
    rm, raw = LinearRM(), demo_comparisons(6, PLANTED['helpful'], seed=22, beta=np.inf)
    ex = explain(rm, raw, embedder=False, baseline=True)
    for editor in ('attribute', 'random'):
        for sides in (('chosen', 'rejected'), ('both',)):
            loc = local_sensitivity(ex, editor, sides)
            t = ex.table
            for i in range(6):
                for a in [x.name for x in RESPONSE_ATTRIBUTES]:
                    sel = [r.margin - r.new_margin for r in t.itertuples() if r.editor == editor and r.side in sides and r.valid and r.comparison == i and r.attribute == a]
                    got = loc.loc[i, a] if i in loc.index and a in loc.columns else np.nan
                    if sel: assert got == pytest.approx(np.mean(sel), abs=1e-12)
                    else: assert np.isnan(got)

def ranks(x): return np.argsort(np.argsort(x))

def rep_rows():
    "Comparisons 0..6 with random valid shifts on some attributes (2 has only two), and 7 whose local shifts all tie."
    rng = np.random.default_rng(0)
    rows = []
    valid_sets = {0: 'abcde', 1: 'abcd', 2: 'ab', 3: 'abc', 4: 'abcde', 5: 'bcde', 6: 'abcd'}
    for i, names in valid_sets.items():
        for a in 'abcde':
            for side in ('chosen', 'rejected'):
                v = a in names
                rows.append(dict(comparison=i, attribute=a, side=side, valid=v, margin=1.0, new_margin=float(rng.normal()) if v else 5.0, syntactic=0.0))
    return rows + [dict(comparison=7, attribute=a, side='chosen', valid=True, margin=1.0, new_margin=0.25, syntactic=0.0) for a in 'abc']

def test_representatives_by_brute_force():
    attrs = list('abcde')
    rows = rep_rows()
    ex = hand_explanation(rows, 8)
    t = ex.table[ex.table.valid]
    glob = {a: (t[t.attribute == a].margin - t[t.attribute == a].new_margin).mean() for a in attrs}
    assert len(set(np.round(list(glob.values()), 9))) == 5
    want = []
    for i in range(8):
        loc = {a: (g.margin - g.new_margin).mean() for a, g in t[t.comparison == i].groupby('attribute')}
        if len(loc) < 3 or len(set(loc.values())) < 2: continue
        x, y = np.array(list(loc.values())), np.array([glob[a] for a in loc])
        n = len(x)
        d = ranks(x) - ranks(y)
        want.append((i, 1 - 6*(d**2).sum()/(n*(n*n - 1)), n))
    want.sort(key=lambda r: (-round(r[1], 9), r[0]))
    got = representatives(ex, top_k=10)
    assert list(got.columns) == ['comparison', 'rho', 'n_attributes'] and len(got) == len(want) == 6
    np.testing.assert_allclose(got.rho, [w[1] for w in want], atol=1e-12)
    tied = lambda rows: sorted((round(r, 9), c, n) for c, r, n in rows)   # order up to exact ties in rho (see the xfail below)
    assert tied(zip(got.comparison, got.rho, got.n_attributes)) == tied((c, r, n) for c, r, n in want)
    for k in (1, 3):
        top = representatives(ex, top_k=k)
        assert len(top) == k and list(top.comparison) == list(got.comparison[:k])
    assert want[0][1] == 1.0 and want[1][1] == 1.0 and {want[0][0], want[1][0]} == {0, 3}
    assert 2 in set(representatives(ex, top_k=10, min_attributes=2).comparison)
    assert representatives(ex, top_k=10, min_attributes=1).equals(representatives(ex, top_k=10, min_attributes=2))
    assert set(representatives(ex, top_k=10, min_attributes=5).comparison) == {0, 4}

def test_representatives_break_exact_ties_by_comparison():
    got = representatives(hand_explanation(rep_rows(), 8), top_k=2)
    assert list(got.comparison) == [0, 3]

def test_representatives_null_by_brute_force():
    # One comparison with three distinct local shifts: a shuffle gives each of the 3! orders with probability 1/6, so rho is 1 or -1
    # with probability 1/6 each and 0.5 or -0.5 with 1/3 each. Over 1200 shuffles each count is binomial; |z| < 5 fails with
    # probability below 3e-6 per count (the seed is fixed, so it is deterministic anyway).
    rows = [dict(comparison=0, attribute=a, side='chosen', valid=True, margin=1.0, new_margin=1.0 - s, syntactic=0.0) for a, s in zip('abc', (0.3, 0.7, 0.1))]
    rows += [dict(comparison=1, attribute=a, side='chosen', valid=True, margin=1.0, new_margin=1.0 - s, syntactic=0.0) for a, s in zip('abc', (0.2, 0.9, 0.5))]
    ex = hand_explanation(rows, 2)
    glob = sensitivity(ex)['shift']
    null = representatives_null(ex, top_k=1, n_permutations=1200, min_attributes=3, seed=5)
    assert null.shape == (1200,)
    # both comparisons shuffled independently; the statistic is the larger rho: P(max = v) from the 6 x 6 equally likely pairs
    vals = [1.0, 0.5, 0.5, -0.5, -0.5, -1.0]
    p = {v: sum(max(x, y) == v for x in vals for y in vals) / 36 for v in set(vals)}
    for v, pv in p.items():
        k = int(np.isclose(null, v).sum())
        assert abs(k - 1200*pv) / math.sqrt(1200*pv*(1 - pv)) < 5, (v, k, pv)
    assert np.isin(np.round(null, 9), list(p)).all()
    np.testing.assert_array_equal(null, representatives_null(ex, top_k=1, n_permutations=1200, min_attributes=3, seed=5))
    assert not np.array_equal(null, representatives_null(ex, top_k=1, n_permutations=1200, min_attributes=3, seed=6))
    both = representatives_null(ex, top_k=2, n_permutations=50, seed=1)   # k = 2: the mean of both comparisons' rhos
    assert np.isin(np.round(2*both, 9), [x + y for x in vals for y in vals]).all()
    assert np.isnan(representatives_null(ex, top_k=1, n_permutations=3, min_attributes=4)).all()   # no comparison qualifies
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError): representatives_null(ex, n_permutations=bad)
    # unshuffled, the statistic is what representatives reports: a shuffle that keeps the order gives it back
    assert representatives(ex, top_k=1).rho.iloc[0] == max(float(np.round(np.corrcoef(ranks(np.array(v)), ranks(glob[list('abc')].to_numpy()))[0, 1], 12)) for v in ((0.3, 0.7, 0.1), (0.2, 0.9, 0.5)))

# ---------------------------------------------------------------- views

def test_perturbation_view_and_plot():
    cs = [PreferencePair('p0', 'good c', 'bad r'), PreferencePair('p1', 'c1', 'r1')]
    rows = [dict(comparison=0, attribute='toy', side='chosen', valid=True, margin=1.0, new_margin=-0.25, syntactic=0.1),
            dict(comparison=0, attribute='toy', side='rejected', valid=True, margin=1.0, new_margin=0.5, syntactic=0.1),
            dict(comparison=1, attribute='toy', side='chosen', valid=False, margin=2.0, new_margin=2.0, syntactic=0.0),
            dict(comparison=1, attribute='other', side='chosen', valid=True, margin=2.0, new_margin=1.0, syntactic=0.0)]
    ex = hand_explanation(rows, 2, cs)
    ex.table.loc[0, 'chosen'] = 'bad c'
    v = perturbation_view(ex, 0, 'toy')
    assert v.index.name == 'counterfactual' and list(v.index) == ['chosen', 'rejected', 'margin r(c) - r(r)']
    assert list(v.original) == ['good c', 'bad r', '+1.000'] and list(v.perturbed) == ['bad c', 'r', '-0.250']
    assert perturbation_view(ex, 0, 'toy', 'rejected').index.name == 'semifactual'
    assert perturbation_view(ex, np.int64(1), 'toy').index.name == 'no valid perturbation'
    for bad in (dict(comparison=2, attribute='toy'), dict(comparison=-1, attribute='toy'), dict(comparison=0.0, attribute='toy'),
                dict(comparison=0, attribute='tox'), dict(comparison=0, attribute='toy', side='left'), dict(comparison=0, attribute='toy', side='both'),
                dict(comparison=1, attribute='other', side='rejected'), dict(comparison=0, attribute='toy', editor='random')):
        with pytest.raises(ConfigError): perturbation_view(ex, **bad)
    with pytest.raises(ConfigError, match='toy'): perturbation_view(ex, 0, 'tox')
    prof = {'A': pd.DataFrame({'flip_rate': [0.5, 0.25], 'shift': [1.0, 2.0]}, index=['x', 'y']), 'B': pd.DataFrame({'flip_rate': [0.75]}, index=['z'])}
    ax = plot_sensitivity(prof, planted={'A': dict(x=2.0, y=4.0, z=1.0)})
    arr = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    want = np.array([[0.5, 0.25, np.nan], [np.nan, np.nan, 0.75], [0.5, 1.0, 0.25]])
    np.testing.assert_allclose(arr, want, equal_nan=True)
    assert [x.get_text() for x in ax.get_yticklabels()] == ['A (flip_rate)', 'B (flip_rate)', 'A (planted)']
    plt.close(ax.figure)
    ax = plot_sensitivity({'A': prof['A']}, column='shift')
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array(), float), [[1.0, 2.0]])
    plt.close(ax.figure)

# ---------------------------------------------------------------- 12. prompts and the LM rewriter

def test_rewrite_prompts_and_clean_reply():
    a = attribute('specificity')
    one, two = rewrite_prompts('How do X?', 'Do it for a while.', a, 1)
    assert one == STEP1_TEMPLATE.format(prompt='How do X?', response='Do it for a while.', name='specificity', description=a.description)
    assert 'Request: How do X?\nResponse: Do it for a while.' in one and 'specificity (precise quantities' in one
    assert 'better' in two and 'worse' not in two and 'specificity' in two
    one_, two_ = rewrite_prompts('How do X?', 'Do it for a while.', a, -1)
    assert one_ == one and 'worse' in two_ and 'better' not in two_
    assert two == STEP2_TEMPLATE.format(overall='better', more='more', name='specificity')
    with pytest.raises(ConfigError): rewrite_prompts('p', 'r', a, 0)
    orig = 'Do it for a while.'
    assert _clean_reply('Rewritten response: "Do it for ten seconds."', orig) == 'Do it for ten seconds.'
    assert _clean_reply('  **Response**:  Do it now. ', orig) == 'Do it now.'
    assert _clean_reply('response:x', orig) == 'x' and _clean_reply('"quoted"', orig) == 'quoted'
    assert _clean_reply('My response: x', orig) == 'My response: x'
    for none in ('', '   ', '""', 'Rewritten response:', ' Do it for a while. ', 'Response: "Do it for a while."'):
        assert _clean_reply(none, orig) is None, none

def test_lm_rewriter_on_a_tiny_llama(untouched):
    from interpkit.models import chat_replies
    m, t = tiny_lm('llama', d_model=32, seed=5), tiny_tokenizer()
    assert t.chat_template is not None
    a = attribute('politeness')
    texts, prompts = ['w1 w2', 'w3 w4 w5'], ['w7', 'w8']
    lm = LMRewriter(m, t, max_new_tokens=6, list_tokens=3, batch_size=1)
    with untouched(m, t): out = lm(texts, a, -1, prompts)
    assert len(out) == 2 and all(o is None or isinstance(o, str) for o in out) and 'LlamaForCausalLM' in repr(lm)
    for x, p, o, tr in zip(texts, prompts, out, lm.transcripts):
        one, two = rewrite_prompts(p, x, a, -1)
        phrases = chat_replies(m, t, [one], max_new_tokens=3, batch_size=1)[0]
        reply = chat_replies(m, t, [[{'role': 'user', 'content': one}, {'role': 'assistant', 'content': phrases}, {'role': 'user', 'content': two}]],
                             max_new_tokens=6, batch_size=1)[0]
        assert tr == dict(attribute='politeness', direction=-1, response=x, phrases=phrases, reply=reply)
        assert o == _clean_reply(reply, x)
    lm(['w9'], a, 1)
    assert len(lm.transcripts) == 3 and lm.transcripts[-1]['direction'] == 1
    with pytest.raises(ConfigError): LMRewriter(tiny_lm('bert', d_model=32), t)
    with pytest.raises(ConfigError): LMRewriter(m, t, batch_size=0)

# ---------------------------------------------------------------- 13. train_reward_head

def test_train_reward_head_recovers_the_preference_direction():
    # Chosen = the one of two isotropic Gaussian feature vectors with the larger f @ w_true. By symmetry the expected gradient of the
    # Bradley-Terry loss on the differences f_c - f_r is along w_true (the components orthogonal to w_true are symmetric given the
    # label); with n = 400 pairs in d = 8 the sampling noise in the orthogonal directions is ~ sqrt(d / n) ~ 0.14 of the signal, so
    # the learned direction has cosine ~ 0.99 with w_true. Measured over 200 seeds of these draws: cosine 0.989 ± 0.007 (min 0.955), so
    # 0.9 is 12 sd below the mean; the accuracy on the training pairs 0.962 ± 0.015 (min 0.925), so 0.88 is 5.5 sd below it (a false
    # failure below 1e-6 whatever the seed; this seed gives 0.989 and 0.960). A flipped loss gives cosine ~ -1.
    g = torch.Generator().manual_seed(0)
    w_true = torch.randn(8, generator=g)
    f1, f2 = torch.randn(400, 8, generator=g), torch.randn(400, 8, generator=g)
    first = (f1 - f2) @ w_true > 0
    c, r = torch.where(first[:, None], f1, f2), torch.where(first[:, None], f2, f1)
    trained = train_reward_head(c, r, seed=1)
    h, tokenizer, res = trained
    assert isinstance(trained, Trained) and trained.model is h and tokenizer is None
    assert isinstance(h, torch.nn.Linear) and not h.training and not any(p.requires_grad for p in h.parameters())
    # the fit's history is the Bradley-Terry loss of the head as it was at each step: its last entry is one step before the end
    assert len(res.history) == 300 and res.history.loss.iloc[-1] < res.history.loss.iloc[0] < math.log(2) + 0.5
    cos = float(torch.nn.functional.cosine_similarity(h.weight[0], w_true, dim=0))
    assert cos > 0.9, cos
    with torch.no_grad(): acc = float(((h(c) - h(r))[:, 0] > 0).float().mean())
    assert acc > 0.88, acc
    h2 = train_reward_head(c, r, seed=1).model
    assert torch.equal(h.weight, h2.weight) and torch.equal(h.bias, h2.bias)
    assert not torch.equal(train_reward_head(c, r, seed=2).model.weight, h.weight)
    assert train_reward_head(c, r, weight_decay=0.5, seed=1).model.weight.norm() < 0.9*h.weight.norm()
    assert (train_reward_head(c, r, lr=0.001, seed=1).model.weight - h.weight).abs().max() > 0.05
    short = train_reward_head(c, r, steps=1, lr=0.01, seed=1).model
    assert (short.weight - h.weight).abs().max() > 0.05
    # the initialisation is torch's default for a Linear drawn from seed 1, as before (torch.random.fork_rng + manual_seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        init = torch.nn.Linear(8, 1)
    frozen = train_reward_head(c, r, steps=1, lr=0.0, seed=1).model
    assert torch.equal(frozen.weight, init.weight) and torch.equal(frozen.bias, init.bias)
    for bad in ((c, r[:, :7]), (c[:, 0], r[:, 0]), (c[:0], r[:0]), (c, r[:-1])):
        with pytest.raises(ShapeError): train_reward_head(*bad)

# ---------------------------------------------------------------- 14. the shipped demo

ASSET = assets_dir()/f'{RM_ASSET}.safetensors'

@pytest.mark.skipif(not ASSET.exists(), reason=f'{RM_ASSET} not built yet')
def test_load_rm_demo(minilm):
    enc, tok = minilm
    dm = load_rm_demo(enc, tok)
    meta = dm.meta
    n = meta['n_test']
    assert set(dm.reward_models) == set(dm.explanations) == set(dm.comparisons) == set(PLANTED) and dm.planted == PLANTED
    for name, ex in dm.explanations.items():
        t = ex.table
        assert len(ex.comparisons) == n and ex.margins.shape == (n,) and ex.swapped.shape == (n,) and (ex.margins >= 0).all()
        assert len(t) == n*len(RESPONSE_ATTRIBUTES)*len(SIDES)*2 and set(t.editor) == {'attribute', 'random'}
        assert {'margin', 'new_margin', 'syntactic', 'semantic', 'counterfactual', 'semifactual'} <= set(t.columns)
        assert np.isfinite(t[['margin', 'new_margin', 'syntactic', 'semantic']].to_numpy(float)).all()
        np.testing.assert_array_equal(t.counterfactual, t.valid & (t.new_margin < 0))
        raw = demo_comparisons(n, PLANTED[name], seed=meta['test_seed'], beta=np.inf)
        assert [c.swapped() if s else c for c, s in zip(raw, ex.swapped)] == ex.comparisons
    name = 'helpful'
    ex = dm.explanations[name]
    live = explain(dm.reward_models[name], ex.comparisons[:2], embedder=False, baseline=True, seed=meta['seed'])
    shipped = ex.table[ex.table.comparison < 2].reset_index(drop=True)
    assert len(live.table) == len(shipped)
    for k in ('comparison', 'attribute', 'side', 'editor', 'chosen', 'rejected'): np.testing.assert_array_equal(live.table[k], shipped[k])
    # live against shipped margins, measured on three CPUs' kernels: at most 6e-6 (AVX-512), 1e-5 (AVX2), 1.2e-5 (no vector instructions)
    np.testing.assert_allclose(live.table.new_margin, shipped.new_margin, atol=1e-4)
    np.testing.assert_allclose(live.margins, ex.margins[:2], atol=1e-4)
    np.testing.assert_allclose(live.table.syntactic, shipped.syntactic, atol=1e-9)
    assert not live.swapped.any()
    v = perturbation_view(ex, 0, 'politeness', 'both')
    assert v.loc['chosen', 'original'] == ex.comparisons[0].chosen
    ax = plot_sensitivity({k: sensitivity(e) for k, e in dm.explanations.items()}, dm.planted)
    plt.close(ax.figure)
    for bad in (dict(comparison=n, attribute='politeness'), dict(comparison=0, attribute='politness'), dict(comparison=0, attribute='politeness', side='neither')):
        with pytest.raises(ConfigError): perturbation_view(ex, **bad)
    assert isinstance(dm.rewrites, pd.DataFrame) and len(dm.rewrites)
    # the independent detector's verdicts: shipped shifts against a live DescriptionDetector on the first two comparisons
    det = DescriptionDetector(embedder=enc, tokenizer=tok)
    d = detector_shifts(live, det)
    ind = dm.independent[name].table
    part = ind[ind.comparison < 2].reset_index(drop=True)
    # measured like the margins: float32 MiniLM embeddings move a shift by ~1e-6 across kernels
    np.testing.assert_allclose(d.d_chosen, part.d_chosen, atol=1e-4); np.testing.assert_allclose(d.d_rejected, part.d_rejected, atol=1e-4)
    for nm, ex in dm.independent.items():
        t, t0 = ex.table, dm.explanations[nm].table
        np.testing.assert_array_equal(t.valid_lexicon, t0.valid)
        ec = t.chosen.to_numpy() != np.array([ex.comparisons[i].chosen for i in t.comparison])
        er = t.rejected.to_numpy() != np.array([ex.comparisons[i].rejected for i in t.comparison])
        assert ((t.d_chosen == 0) | ec).all() and ((t.d_rejected == 0) | er).all()
        ok_c, ok_r = ec & (t.d_chosen < 0), er & (t.d_rejected > 0)
        np.testing.assert_array_equal(t.valid, np.where(t.side == 'chosen', ok_c, np.where(t.side == 'rejected', ok_r, ok_c & ok_r)))
        assert 0.2 < t.valid.mean() < 0.9   # neither all nor nothing: a detector that reads the texts
        # held-out margins: the accuracies the tool wrote, and two margins recomputed live
        m = dm.heldout_margins[nm]
        assert m.shape == (meta['n_train'] - meta['n_fit'],)
        assert (m > 0).mean() == pytest.approx(meta['training'][nm]['heldout_accuracy_labels'], abs=1e-12)
        held = demo_heldout(nm, meta)[:2]
        r = rewards(dm.reward_models[nm], [c.prompt for c in held]*2, [c.chosen for c in held] + [c.rejected for c in held])
        np.testing.assert_allclose(r[:2] - r[2:], m[:2], atol=1e-4)
    assert demo_heldout('helpful', meta) == demo_comparisons(meta['n_train'], PLANTED['helpful'], seed=meta['train_seeds']['helpful'], beta=meta['beta'])[meta['n_fit']:]


# Gaps found by mutmut
def test_bad_pooling_and_side_raise():
    torch.manual_seed(0)   # the head's initialisation below plays no part; seeded all the same
    m, tok = tiny_lm('llama'), tiny_tokenizer()
    with pytest.raises(ConfigError, match='pooling'): head_reward(m, tok, torch.nn.Linear(m.config.hidden_size, 1), pooling='max')
    with pytest.raises(ConfigError, match='pooling'): head_features(m, tok, ['w1'], ['w2'], pooling='first')
    with pytest.raises(ConfigError, match='side'): perturbations([('q', 'Please wait.', 'Just wait.')], ['politeness'], sides=('chosen', 'left'))

def test_step2_names_the_direction():
    a = attribute('politeness')
    worse, better = rewrite_prompts('q', 'r', a, -1)[1], rewrite_prompts('q', 'r', a, 1)[1]
    assert 'worse overall and worse in politeness' in worse and 'better overall and better in politeness' in better

def test_one_side_only_is_perturbed_as_asked():
    pairs = [('q', 'Please wait.', 'Just wait.')]
    t = perturbations(pairs, ['politeness'], sides=('chosen',))
    assert list(t.side) == ['chosen'] and bool(t.valid.iloc[0]) and t.chosen.iloc[0] == 'Just wait.' and t.rejected.iloc[0] == 'Just wait.'
    t = perturbations(pairs, ['politeness'], sides=('rejected',))
    assert list(t.side) == ['rejected'] and bool(t.valid.iloc[0]) and t.rejected.iloc[0] == 'Please wait.' and t.chosen.iloc[0] == 'Please wait.'

def test_rewards_keep_float64_lists():
    r = rewards(lambda p, y: [1.0 + 1e-12*len(t) for t in y], ['q', 'q'], ['a', 'aa'])
    assert r.dtype == np.float64 and r[1] - r[0] == pytest.approx(1e-12, rel=1e-3)

def test_a_rewrite_that_does_not_move_the_attribute_is_invalid():
    same = lambda texts, attribute, direction, prompts=None: list(texts)   # returns the text unchanged
    t = perturbations([('q', 'Please wait.', 'Just wait.')], ['politeness'], rewriter=same)
    assert not t.valid.any()
    short = lambda texts, attribute, direction, prompts=None: list(texts)[:-1]
    with pytest.raises(ShapeError, match='rewriter'): perturbations([('q', 'Please wait.', 'Just wait.')], ['politeness'], rewriter=short)

# ---------------------------------------------------------------- renamed and moved names keep working, with a FutureWarning

DEMO_NAMES = ('RESPONSE_TEMPLATE', 'TOPICS', 'PLANTED', 'RM_ASSET', 'RMDemo', 'demo_response', 'demo_prompt', 'attribute_levels', 'planted_reward',
              'demo_comparisons', 'demo_heldout', 'load_rm_demo', 'train_reward_head')

def test_old_import_paths_of_the_demo_names_warn():
    for name in DEMO_NAMES:
        with pytest.warns(FutureWarning, match=f'rm_contrast.{name} is now interpkit.demos.rm_contrast.{name}'):
            assert getattr(rmc, name) is getattr(rmd, name)
    with pytest.raises(AttributeError): rmc.no_such_name
    assert not set(DEMO_NAMES) & set(rmc.__all__) and set(DEMO_NAMES) <= set(rmd.__all__)

def test_the_reward_model_is_now_model():
    rm, raw = LinearRM(), demo_comparisons(3, PLANTED['helpful'], seed=1, beta=np.inf)
    with pytest.warns(FutureWarning, match='reward_model= is now called model='):
        old = rewards(reward_model=rm, prompts=['q'], responses=['Please wait.'])
    assert old.tolist() == rewards(rm, ['q'], ['Please wait.']).tolist()
    with pytest.warns(FutureWarning, match='reward_model= is now called model='):
        oc, m0, sw = orient(reward_model=rm, comparisons=raw)
    assert oc == orient(rm, raw)[0]
    with pytest.warns(FutureWarning, match='reward_model= is now called model='):
        ex = explain(reward_model=rm, comparisons=raw, attributes=['politeness'], embedder=False)
    assert ex.table.equals(explain(rm, raw, ['politeness'], embedder=False).table)
    with pytest.raises(ConfigError, match='both reward_model= and model='): rewards(model=rm, prompts=['q'], responses=['a'], reward_model=rm)

def test_the_sentence_encoder_is_now_embedder(minilm):
    enc, tok = minilm
    a, b = ['Please wait ten seconds.', 'Just wait.'], ['Just wait ten seconds.', 'Please wait.']
    new = semantic_distances(a, b, embedder=enc, tokenizer=tok)
    with pytest.warns(FutureWarning, match='encoder= is now called embedder='):
        old = semantic_distances(a, b, encoder=enc, tokenizer=tok)
    np.testing.assert_array_equal(old, new)
    np.testing.assert_array_equal(semantic_distances(a, b, enc, tok), new)   # a positional caller of the old order gets the same
    raw = demo_comparisons(2, PLANTED['helpful'], seed=1, beta=np.inf)
    with pytest.warns(FutureWarning) as w:
        ex_old = explain(LinearRM(), raw, ['politeness'], encoder=enc, tokenizer=tok)
    assert {'encoder= is now called embedder=', 'tokenizer= is now called embedder_tokenizer='} <= {str(x.message).split(': ', 1)[1].split(';')[0].replace('the argument ', '') for x in w}
    ex_new = explain(LinearRM(), raw, ['politeness'], embedder=enc, embedder_tokenizer=tok)
    assert ex_old.table.equals(ex_new.table)
    ex_pos = explain(LinearRM(), raw, ['politeness'], None, SIDES, False, enc, tok)   # the old positional order: the same
    assert ex_pos.table.equals(ex_new.table)
    with pytest.warns(FutureWarning, match='encoder= is now called embedder='):
        det = DescriptionDetector(encoder=enc, tokenizer=tok)
    assert det.embedder is enc
    np.testing.assert_array_equal(det(a, 'politeness'), DescriptionDetector(POLE_DESCRIPTIONS, enc, tok)(a, 'politeness'))

@pytest.mark.skipif(not ASSET.exists(), reason=f'{RM_ASSET} not built yet')
def test_load_rm_demo_encoder_is_now_embedder(minilm):
    enc, tok = minilm
    with pytest.warns(FutureWarning, match='encoder= is now called embedder='):
        old = load_rm_demo(encoder=enc, tokenizer=tok)
    new = load_rm_demo(embedder=enc, tokenizer=tok)
    assert all(old.explanations[k].table.equals(new.explanations[k].table) for k in PLANTED)
    assert old.reward_models['helpful'].model is enc

def test_head_is_now_readout():
    m, t = tiny_lm('llama', seed=0), tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        h = torch.nn.Linear(m.config.hidden_size, 1)
    with pytest.warns(FutureWarning, match='head= is now called readout='):
        old = head_reward(m, t, head=h)(P, R)
    assert torch.equal(old, head_reward(m, t, readout=h)(P, R)) and torch.equal(old, head_reward(m, t, h)(P, R))

def test_pool_is_now_words():
    a = attribute('politeness')
    y = demo_response(0, poles_all(-1))
    e = a.rewrite(y, 1)
    with pytest.warns(FutureWarning, match='pool= is now called words='):
        old = random_edit(y, e, a, pool=['XQ'], seed=3)
    assert old == random_edit(y, e, a, words=['XQ'], seed=3) == random_edit(y, e, a, ['XQ'], 3) and 'XQ' in old

def test_k_is_now_top_k_and_is_checked():
    ex = hand_explanation(rep_rows(), 8)
    with pytest.warns(FutureWarning, match='k= is now called top_k='):
        old = representatives(ex, k=2)
    assert old.equals(representatives(ex, top_k=2)) and old.equals(representatives(ex, 2))
    with pytest.warns(FutureWarning, match='k= is now called top_k='):
        null = representatives_null(ex, k=1, n_permutations=20, seed=0)
    np.testing.assert_array_equal(null, representatives_null(ex, top_k=1, n_permutations=20, seed=0))
    for bad in (-1, 0, 1.5, True):   # issue 51: k=-1 used to return every row but one
        with pytest.raises(ConfigError, match='top_k'): representatives(ex, top_k=bad)
        with pytest.raises(ConfigError, match='top_k'): representatives_null(ex, top_k=bad, n_permutations=5)
    for bad in (0, 2.0, False):
        with pytest.raises(ConfigError, match='n_permutations'): representatives_null(ex, top_k=1, n_permutations=bad)

def test_revalidate_takes_measured_shifts():
    rm, raw = LinearRM(), demo_comparisons(4, PLANTED['harmless'], seed=3, beta=np.inf)
    ex = explain(rm, raw, ['politeness', 'formality'], baseline=True, embedder=False, seed=1)
    shorter = lambda texts, a: -np.array([len(t) for t in texts], dtype=float)
    d = detector_shifts(ex, shorter)
    assert revalidate(ex, d).table.equals(revalidate(ex, shorter).table)
    with pytest.raises(ConfigError, match='d_chosen'): revalidate(ex, d.rename(columns={'d_chosen': 'x'}))

def test_explanation_from_table_marks_the_factuals():
    rm, raw = LinearRM(), demo_comparisons(3, PLANTED['helpful'], seed=2, beta=np.inf)
    ex = explain(rm, raw, ['politeness', 'directness'], embedder=False)
    bare = ex.table.drop(columns=['counterfactual', 'semifactual'])
    again = Explanation.from_table(ex.comparisons, ex.margins, ex.swapped, bare)
    assert again.table.equals(ex.table) and 'counterfactual' not in bare   # the given table is left as it was

def test_demo_response_draws_its_poles_from_the_seed():
    # the poles a seed gives, drawn here slot by slot as demo_comparisons always drew them (one rng.choice((-1, 1)) per phrase pair, attributes in order)
    for seed in (0, 7):
        rng = random.Random(seed)
        poles = {a.name: [rng.choice((-1, 1)) for _ in a.pairs] for a in RESPONSE_ATTRIBUTES}
        assert demo_response(3, seed=seed) == demo_response(3, poles) == demo_response(3, seed=random.Random(seed))
    shared = random.Random(1)
    a, b = demo_response(0, seed=shared), demo_response(0, seed=shared)   # one stream: two different responses
    assert a != b and a == demo_response(0, seed=1)


def test_description_detector_encoder_is_the_embedder_with_a_warning():
    "DescriptionDetector's attribute `encoder` was renamed `embedder` (issue 50) without an alias."
    from interpkit.papers.rm_contrast import DescriptionDetector
    marker = object()
    d = DescriptionDetector(embedder=marker)
    with pytest.warns(FutureWarning, match=r'\.embedder'): assert d.encoder is marker
