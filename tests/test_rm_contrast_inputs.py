"""Tests of interpkit.papers.rm_contrast and its demo module on models, dtypes, tokenizers and inputs as users have them (issue 51):
a reward does not depend on its batch (each reward of a right-padded batch against the model's own forward on the pair alone,
unpadded, for reward models whose config pad id differs from the tokenizer's, is missing, or ends the pair); float64 stays float64
(to 1e-12 of the model's own float64 output); inputs longer than the model reads are cut with a warning (against the model's own
forward on the cut ids, RoBERTa's position offset included); a missing chat template is refused when the reward is made; token ids
outside the model's vocabulary raise a typed error; a response too short for a random edit marks that edit invalid (against the
explanation without that comparison); and the same classes elsewhere: one string or one attribute where a list is expected,
NaN shifts and features, indices and counts out of range, a plain `nn.Module` under `head_reward` (against a hand computation),
and bad arguments as typed errors that say what was given, what is valid and what to do."""
import warnings
import numpy as np, pandas as pd, pytest, torch
import transformers
from interpkit.errors import ConfigError, NotFiniteError
from interpkit.models import tiny_config, tiny_lm, tiny_tokenizer
from interpkit.papers.rm_contrast import (LMRewriter, PreferencePair, classifier_reward, explain, head_features, head_reward, perturbations,
                                          random_edit, rewards, attribute)

torch.set_num_threads(1)

P = ['w1 w2', 'w3', 'w4 w5 w6 w7', 'w8 w9']
R = ['w10', 'w11 w12 w13', 'w14', 'w15 w16 w17 w18 w19']

def seq_cls(arch, dtype=torch.float32, seed=0, **kw):
    "A tiny one-logit sequence classifier with weights far from 0; `kw` go to its config (pad_token_id, max_len, ...)."
    cfg = tiny_config(arch, d_model=32, n_heads=4, num_labels=1, **kw)
    cfg._attn_implementation = 'eager'
    torch.manual_seed(seed)
    m = transformers.AutoModelForSequenceClassification.from_config(cfg).eval().to(dtype)
    with torch.no_grad():
        for p in m.parameters(): p.normal_(0, 0.3)
    return m

def ids_of(t, text): return t(text, add_special_tokens=False)['input_ids']

def alone(m, ids):
    "The model's own logit on one unpadded row (transformers reads its last token: no id of the row is the config's pad id)."
    assert m.config.pad_token_id not in ids
    with torch.no_grad(): return m(input_ids=torch.tensor([ids])).logits[0, 0].item()

# ---------------------------------------------------------------- a reward does not depend on its batch

# qwen2: config pad id 127, the tokenizer pads with eos (1); llama: config pad id 5 ('w0'), not a token of these texts;
# gpt2: no pad id in the config (transformers refuses batches > 1); neox: config pad id None as well
CASES = [('qwen2', {}), ('llama', dict(pad_token_id=5)), ('gpt2', {}), ('neox', {})]

@pytest.mark.parametrize('arch,kw', CASES)
def test_classifier_reward_does_not_depend_on_its_batch(arch, kw, untouched):
    m, t = seq_cls(arch, **kw), tiny_tokenizer()
    assert t.pad_token is None and m.config.pad_token_id != t.eos_token_id
    want = [alone(m, ids_of(t, p) + ids_of(t, r)) for p, r in zip(P, R)]   # the tiny tokenizer joins a pair without specials
    rm = classifier_reward(m, t)
    with untouched(m, t):
        batch = rm(P, R)
        one = [rm([p], [r]).item() for p, r in zip(P, R)]
        via = rewards(rm, P, R, batch_size=3)
    assert t.pad_token is None
    np.testing.assert_allclose(batch.numpy(), want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(one, want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(via, want, rtol=0, atol=2e-5)
    assert np.ptp(want) > 1e-2

def test_the_models_own_pooling_reads_padding():
    "Why: transformers pools at the last id that is not the config's pad id, so eos padding is read (the issue's 0.0044 vs -0.0020)."
    m, t = seq_cls('qwen2'), tiny_tokenizer()
    t.pad_token = t.eos_token
    enc = t(P, R, padding=True, return_tensors='pt')
    with torch.no_grad(): theirs = m(**enc).logits[:, 0].numpy()
    want = [alone(m, ids_of(t, p) + ids_of(t, r)) for p, r in zip(P, R)]
    assert np.abs(theirs - want).max() > 1e-2
    np.testing.assert_allclose(classifier_reward(m, t)(P, R).numpy(), want, rtol=0, atol=2e-5)

def test_gpt2_reward_model_without_pad_token_in_batches(untouched):
    m, t = seq_cls('gpt2', seed=3), tiny_tokenizer()
    assert m.config.pad_token_id is None and t.pad_token is None
    with pytest.raises(ValueError, match='padding token'):   # what the model itself does with a batch
        m(**_eos_padded(t, P, R))
    with untouched(m, t): got = rewards(classifier_reward(m, t), P, R, batch_size=4)
    np.testing.assert_allclose(got, [alone(m, ids_of(t, p) + ids_of(t, r)) for p, r in zip(P, R)], rtol=0, atol=2e-5)

def _eos_padded(t, prompts, responses):
    t = __import__('copy').deepcopy(t); t.pad_token = t.eos_token
    return dict(t(prompts, responses, padding=True, return_tensors='pt'))

def test_encoder_classifier_batch_equals_alone():
    "BERT pools its first token: its own logits, right-padded, are those of the pair alone."
    m, t = seq_cls('bert', seed=2), tiny_tokenizer()
    want = [alone(m, ids_of(t, p) + ids_of(t, r)) for p, r in zip(P, R)]
    np.testing.assert_allclose(classifier_reward(m, t)(P, R).numpy(), want, rtol=0, atol=2e-5)

# ---------------------------------------------------------------- float64 stays float64

@pytest.mark.parametrize('arch', ['qwen2', 'gpt2', 'bert'])
def test_float64_reward_model_keeps_float64(arch):
    m, t = seq_cls(arch, torch.float64, seed=4), tiny_tokenizer()
    want = [alone(m, ids_of(t, p) + ids_of(t, r)) for p, r in zip(P, R)]
    got = classifier_reward(m, t)(P, R)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rewards(classifier_reward(m, t), P, R, batch_size=3), want, rtol=0, atol=1e-12)

def test_float64_head_reward_and_features_keep_float64():
    m, t = tiny_lm('llama', d_model=32, seed=5).double(), tiny_tokenizer()
    torch.manual_seed(6); head = torch.nn.Linear(32, 1).double()
    with torch.no_grad():
        h = torch.stack([m.model(input_ids=torch.tensor([ids_of(t, p) + ids_of(t, r)])).last_hidden_state[0, -1] for p, r in zip(P, R)])
        want = head(h)[:, 0]
    got, f = head_reward(m, t, head)(P, R), head_features(m, t, P, R, batch_size=3)
    assert got.dtype == f.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(f, h, rtol=0, atol=1e-12)
    assert classifier_reward(seq_cls('qwen2'), t)(P, R).dtype == torch.float32   # float32 stays float32

# ---------------------------------------------------------------- a chat template that is missing is refused when the reward is made

def test_chat_template_missing_is_refused_early():
    m, t = seq_cls('llama'), tiny_tokenizer()
    t.chat_template = None
    lm = tiny_lm('llama', d_model=32)
    for make in (lambda: classifier_reward(m, t, template='chat'), lambda: head_reward(lm, t, torch.nn.Linear(32, 1), template='chat'),
                 lambda: head_features(lm, t, P, R, template='chat')):
        with pytest.raises(ConfigError, match="template='chat'.*no chat template") as e: make()
        assert 'template=None' in str(e.value)   # what to do
    classifier_reward(m, t, template='{prompt} w0 {response}')(P, R)   # a format string needs no template

# ---------------------------------------------------------------- inputs longer than the model reads

LONG = ' '.join(f'w{20 + i % 100}' for i in range(91))   # a 91-token response

@pytest.mark.parametrize('arch', ['bert', 'gpt2'])
def test_long_response_on_a_64_position_model_is_cut_with_a_warning(arch, untouched):
    m, t = seq_cls(arch, max_len=64, seed=7), tiny_tokenizer()
    ids = ids_of(t, 'w1 w2') + ids_of(t, LONG)[:62]   # longest first: the response loses its tail
    rm = classifier_reward(m, t)
    with untouched(m, t), pytest.warns(UserWarning, match=r'1 of 2 .*longer than the 64 positions .*max_length=64'):
        got = rm(['w1 w2', 'w3'], [LONG, 'w4'])
    np.testing.assert_allclose(got.numpy(), [alone(m, ids), alone(m, ids_of(t, 'w3 w4'))], rtol=0, atol=2e-5)
    with warnings.catch_warnings():
        warnings.simplefilter('error')   # cut on purpose: no warning
        np.testing.assert_allclose(classifier_reward(m, t, max_length=64)(['w1 w2'], [LONG]).numpy(), [alone(m, ids)], rtol=0, atol=2e-5)
        rm(['w1'], ['w2 w3'])   # short inputs: no warning

def test_roberta_positions_count_from_its_padding_index():
    cfg = transformers.RobertaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=66, pad_token_id=0, num_labels=1)   # position ids start at pad + 1: 65 positions
    torch.manual_seed(8)
    m, t = transformers.RobertaForSequenceClassification(cfg).eval(), tiny_tokenizer()
    ids = ids_of(t, 'w1') + ids_of(t, LONG)[:64]
    with pytest.warns(UserWarning, match='longer than the 65 positions'): got = classifier_reward(m, t)(['w1'], [LONG])
    with torch.no_grad(): want = m(input_ids=torch.tensor([ids])).logits[0, 0].item()
    np.testing.assert_allclose(got.numpy(), [want], rtol=0, atol=2e-5)

def test_long_input_on_head_reward_is_cut_too():
    m, t = tiny_lm('bert', d_model=32, seed=9, max_len=64), tiny_tokenizer()
    with pytest.warns(UserWarning, match='64 positions'): f = head_features(m, t, ['w1'], [LONG], pooling='mean')
    with torch.no_grad(): want = m.bert(input_ids=torch.tensor([ids_of(t, 'w1') + ids_of(t, LONG)[:63]])).last_hidden_state[0].mean(0)
    torch.testing.assert_close(f[0], want, rtol=0, atol=2e-5)

@pytest.mark.parametrize('bad', [0, -1, 2.5, True, None])
def test_bad_max_length_is_refused(bad):
    with pytest.raises(ConfigError, match='max_length'): classifier_reward(seq_cls('bert'), tiny_tokenizer(), max_length=bad)

# ---------------------------------------------------------------- token ids the model does not embed

def test_another_vocabulary_is_a_typed_error(untouched):
    m, big = seq_cls('llama'), tiny_tokenizer(256)   # the model embeds 128 ids
    rm = classifier_reward(m, big)
    rm(['w1'], ['w2'])   # ids the model has: fine
    with untouched(m, big), pytest.raises(ConfigError, match=r'token id\(s\) \[205\].*embeds ids 0 to 127'): rm(['w1'], ['w200'])
    lm = tiny_lm('llama', d_model=32)
    with pytest.raises(ConfigError, match='embeds ids 0 to 127'): head_features(lm, big, ['w1'], ['w200'])

# ---------------------------------------------------------------- a response too short for a random edit

def test_explain_baseline_marks_a_random_edit_that_does_not_fit_invalid():
    class RM:
        def __call__(self, prompts, responses): return [attribute('politeness').score(y) + 0.01*len(y) for y in responses]
    long = [PreferencePair('q', 'Please hold the reset button for ten seconds and wait.', 'Just hold the button for a while and wait.'),
            PreferencePair('q', 'Thanks for asking. Please wait a while, then try it.', 'Listen. Just wait a while, then try it.')]
    short = PreferencePair('q', 'Please', 'Just hold it and wait.')   # 'Please' is all attribute: no free word for a random edit
    with pytest.raises(ConfigError, match='No run of 1 free words'): random_edit('Please', 'Just', attribute('politeness'))
    ex = explain(RM(), long + [short], attributes=['politeness'], baseline=True, embedder=False)
    ref = explain(RM(), long, attributes=['politeness'], baseline=True, embedder=False)   # the short one last: the others keep their seeds
    t = ex.table
    pd.testing.assert_frame_equal(t[t.comparison < 2].reset_index(drop=True), ref.table.reset_index(drop=True))
    r = t[(t.comparison == 2) & (t.editor == 'random')].set_index('side')
    assert r.valid.tolist() == [False, True, False] and (r.chosen == 'Please').all()
    assert r.loc['chosen', 'new_margin'] == r.loc['chosen', 'margin'] and not r.loc[['chosen', 'both']].counterfactual.any()
    a = t[(t.comparison == 2) & (t.editor == 'attribute')]
    assert a.valid.all()   # the attribute edits of that comparison stay

# ---------------------------------------------------------------- the same classes elsewhere in the module

def test_lm_rewriter_refuses_a_tokenizer_without_chat_template_when_made():
    m, t = tiny_lm('llama', d_model=32), tiny_tokenizer()
    t.chat_template = None
    with pytest.raises(ConfigError, match='no chat template'): LMRewriter(m, t)
    for bad in (dict(max_new_tokens=0), dict(list_tokens=-1), dict(max_new_tokens=2.5)):
        with pytest.raises(ConfigError, match=list(bad)[0]): LMRewriter(m, tiny_tokenizer(), **bad)

class LexRM:
    "r(x, y) = 2 politeness(y) - directness(y) + 0.01 len(y): a reward model we can read."
    def __call__(self, prompts, responses):
        return [2*attribute('politeness').score(y) - attribute('directness').score(y) + 0.01*len(y) for y in responses]

@pytest.fixture(scope='module')
def lex_explanation():
    from interpkit.demos.rm_contrast import PLANTED, demo_comparisons
    return explain(LexRM(), demo_comparisons(6, PLANTED['helpful'], seed=0, beta=np.inf), attributes=['politeness', 'directness', 'formality'],
                   baseline=True, embedder=False)

def test_one_side_given_as_a_string_is_that_side(lex_explanation):
    from interpkit.papers.rm_contrast import sensitivity, local_sensitivity, representatives, coverage
    ex = lex_explanation
    by_hand = ex.table[(ex.table.editor == 'attribute') & (ex.table.side == 'chosen') & ex.table.valid]
    s = sensitivity(ex, sides='chosen')
    assert len(s) and s.n.sum() == len(by_hand)   # before: every row dropped ('chosen' read as six letters)
    pd.testing.assert_frame_equal(s, sensitivity(ex, sides=('chosen',)))
    np.testing.assert_allclose(s.loc['politeness', 'shift'], (by_hand.margin - by_hand.new_margin)[by_hand.attribute == 'politeness'].mean())
    pd.testing.assert_frame_equal(local_sensitivity(ex, sides='chosen'), local_sensitivity(ex, sides=['chosen']))
    pd.testing.assert_frame_equal(representatives(ex, sides='chosen', min_attributes=2), representatives(ex, sides=['chosen'], min_attributes=2))
    assert perturbations(ex.comparisons, ['politeness'], sides='chosen').side.unique().tolist() == ['chosen']
    with pytest.raises(ConfigError, match='side'): sensitivity(ex, sides=('chosen', 'neither'))

def test_comparison_and_min_attributes_are_checked(lex_explanation):
    from interpkit.papers.rm_contrast import perturbation_view, representatives, representatives_null
    ex = lex_explanation
    for bad in (True, -1, 6, 1.0):
        with pytest.raises(ConfigError, match='comparison'): perturbation_view(ex, bad, 'politeness')
    perturbation_view(ex, np.int64(1), 'politeness')
    for bad in (0, -1, 2.5, None):
        with pytest.raises(ConfigError, match='min_attributes'): representatives(ex, min_attributes=bad)
        with pytest.raises(ConfigError, match='min_attributes'): representatives_null(ex, min_attributes=bad, n_permutations=2)

def test_revalidate_refuses_non_finite_shifts(lex_explanation):
    from interpkit.papers.rm_contrast import revalidate, detector_shifts, lexicon_detector
    d = detector_shifts(lex_explanation, lexicon_detector)
    revalidate(lex_explanation, d)
    d.loc[d.index[3], 'd_rejected'] = np.nan   # before: NaN > 0 is False, the row silently invalid
    with pytest.raises(NotFiniteError, match='1 of .* shifts are not finite .*row 3'): revalidate(lex_explanation, d)

def test_head_features_refuse_non_finite_features():
    m, t = tiny_lm('llama', d_model=32, seed=1), tiny_tokenizer()
    with torch.no_grad(): m.model.norm.weight[3] = float('nan')   # before: NaN features returned, and a head trained on them
    with pytest.raises(NotFiniteError, match='4 pair'): head_features(m, t, P, R)

def test_head_reward_refuses_a_readout_that_is_not_callable():
    with pytest.raises(ConfigError, match='readout is a NoneType'): head_reward(tiny_lm('llama', d_model=32), tiny_tokenizer(), None)

def test_detector_agreement_skips_a_random_edit_that_does_not_fit():
    from interpkit.papers.rm_contrast import detector_agreement, lexicon_detector
    long = 'Listen. Just hold the reset button for a while, then wait and try again.'
    alone_ = detector_agreement(lexicon_detector, [long], ['politeness'], seed=1)
    both = detector_agreement(lexicon_detector, [long, 'Please'], ['politeness'], seed=1)   # the short text comes after: the long one keeps its draws
    assert both.random_agrees.dtype == 'boolean' and alone_.random_agrees.dtype == bool
    pd.testing.assert_frame_equal(both.iloc[:1].astype({'random_agrees': bool}), alone_)
    r = both.iloc[1]
    assert r.agrees and r.direction == -1 and r.d_span == -2 and np.isnan(r.d_random) and pd.isna(r.random_agrees)   # 'Please' -> 'Just'
    assert both.random_agrees.mean() == alone_.random_agrees.mean()   # NA is left out, not counted as a miss

# ---------------------------------------------------------------- the demo module

def test_demo_topics_poles_n_and_beta_are_checked():
    from interpkit.demos.rm_contrast import PLANTED, TOPICS, demo_comparisons, demo_prompt, demo_response
    for bad in (-1, len(TOPICS), 1.0, True):
        with pytest.raises(ConfigError, match='topic'): demo_response(bad)
        with pytest.raises(ConfigError, match='topic'): demo_prompt(bad)
    assert demo_prompt(len(TOPICS) - 1) == f"How do I {TOPICS[-1][0]}?"
    with pytest.raises(ConfigError, match=r"poles of \['politeness'\]"): demo_response(0, {a.name: [1]*len(a.pairs) for a in __import__('interpkit').papers.rm_contrast.RESPONSE_ATTRIBUTES} | {'politeness': [1, 0, 1]})
    with pytest.raises(ConfigError, match='conciseness'): demo_response(0, {'politeness': [1, 1, 1]})
    for bad in (dict(n=0), dict(n=-2), dict(n=2.0), dict(beta=float('nan')), dict(beta=-1.0), dict(beta=None)):
        with pytest.raises(ConfigError, match=list(bad)[0]): demo_comparisons(**{'n': 3, 'weights': PLANTED['helpful'], **bad})
    assert len(demo_comparisons(2, PLANTED['helpful'], beta=0)) == 2

def test_train_reward_head_keeps_float64_features_in_float64():
    from interpkit.demos.rm_contrast import train_reward_head
    g = torch.Generator().manual_seed(2)
    c, r = torch.randn(64, 6, generator=g, dtype=torch.float64) + 0.3, torch.randn(64, 6, generator=g, dtype=torch.float64)
    h64, h32 = train_reward_head(c, r, steps=50, seed=0).model, train_reward_head(c.float(), r.float(), steps=50, seed=0).model
    assert h64.weight.dtype == torch.float64 and h32.weight.dtype == torch.float32
    torch.testing.assert_close(h64.weight.float(), h32.weight, rtol=0, atol=1e-4)   # the same initialisation and fit, up to float32 rounding
    with torch.no_grad(): loss = -torch.nn.functional.logsigmoid(h64(c) - h64(r)).mean()
    assert abs(loss.item() - h64_loss(h64, c, r)) < 1e-12

def h64_loss(head, c, r):
    "The Bradley-Terry loss by hand, in float64: mean log(1 + exp(-(w.(c - r)))) (the bias cancels)."
    w = head.weight.detach()[0].numpy()
    d = (c.numpy() - r.numpy()) @ w
    return float(np.mean(np.log1p(np.exp(-d))))

# ---------------------------------------------------------------- bad arguments: a typed error saying what was given, what is valid, what to do

def test_one_string_for_a_list_of_texts_is_refused():
    from interpkit.papers.rm_contrast import rewards
    rm = lambda p, y: [float(len(x)) for x in y]
    for p, r in (('abc', ['x', 'y', 'z']), (['a'], 'x'), (['a', 3], ['x', 'y'])):   # before: 'abc' scored as three prompts 'a', 'b', 'c'
        with pytest.raises(ConfigError, match='(prompts|responses) is a'): rewards(rm, p, r)
        with pytest.raises(ConfigError, match='(prompts|responses) is a'): head_features(tiny_lm('llama', d_model=32), tiny_tokenizer(), p, r)
    with pytest.raises(ConfigError, match='The reward model is a int'): rewards(5, ['a'], ['b'])

def test_one_attribute_alone_is_that_attribute():
    from interpkit.papers.rm_contrast import detector_agreement, lexicon_detector
    cs = [PreferencePair('q', 'Please wait a while.', 'Just wait ten seconds.')]
    want = perturbations(cs, ['politeness'], baseline=True)
    pd.testing.assert_frame_equal(perturbations(cs, 'politeness', baseline=True), want)   # before: ConfigError "Unknown attribute 'p'"
    pd.testing.assert_frame_equal(perturbations(cs, attribute('politeness'), baseline=True), want)   # before: TypeError
    texts = ['Listen. Just wait a while, then try again.']
    pd.testing.assert_frame_equal(detector_agreement(lexicon_detector, texts, 'politeness'), detector_agreement(lexicon_detector, texts, ['politeness']))

@pytest.mark.parametrize('call,match', [
    (lambda R, D, ex: R.as_comparisons(None), 'Comparisons given as a NoneType'),
    (lambda R, D, ex: R.as_comparisons(5), 'Comparisons given as a int'),
    (lambda R, D, ex: R.random_edit(None, 'a b'), 'random_edit got a NoneType'),
    (lambda R, D, ex: R.random_edit('a b c', 'a x c', words='zz'), "words='zz' is one string"),
    (lambda R, D, ex: R.revalidate(ex, 5), 'detector is a int'),
    (lambda R, D, ex: R.plot_sensitivity({'rm': R.sensitivity(ex)}, column='flips'), "column='flips'"),
    (lambda R, D, ex: R.plot_sensitivity({}), 'No sensitivity profiles'),
    (lambda R, D, ex: R.DescriptionDetector(None), 'descriptions is None'),
    (lambda R, D, ex: R.head_reward(tiny_lm('llama', d_model=32), __import__('interpkit.models', fromlist=['w']).word_tokenizer(['<unk>', 'a'], pad=None, bos=None),
                                    torch.nn.Linear(32, 1)), 'neither a pad nor an end-of-sequence'),
    (lambda R, D, ex: D.train_reward_head([[1.0]], [[0.0]]), 'chosen is a list'),
    (lambda R, D, ex: D.demo_heldout('helpfull', {}), "name='helpfull'"),
    (lambda R, D, ex: D.planted_reward(['Please wait.'], {'politeness': float('nan')}), "Planted weights {'politeness': nan}"),
])
def test_bad_arguments_are_typed_errors(call, match, lex_explanation):
    import interpkit.papers.rm_contrast as R, interpkit.demos.rm_contrast as D
    from interpkit.errors import ShapeError
    with pytest.raises((ConfigError, ShapeError), match=match) as e: call(R, D, lex_explanation)
    assert all(isinstance(x, str) and x for x in (e.value.given, e.value.valid, e.value.todo))   # what was given, what is valid, what to do

# ---------------------------------------------------------------- any module that returns hidden states

class PlainEncoder(torch.nn.Module):
    "A plain module: forward(input_ids, attention_mask) -> (batch, pos, d), no output_hidden_states keyword."
    def __init__(self):
        super().__init__(); torch.manual_seed(11)
        self.emb, self.lin = torch.nn.Embedding(128, 16), torch.nn.Linear(16, 16)
    def forward(self, input_ids, attention_mask): return torch.tanh(self.lin(self.emb(input_ids)))

def test_head_reward_on_a_plain_module(untouched):
    m, t = PlainEncoder(), tiny_tokenizer()
    torch.manual_seed(12); head = torch.nn.Linear(16, 1)
    with torch.no_grad():   # by hand, one unpadded pair at a time
        feats = torch.stack([torch.tanh(m.lin(m.emb.weight[ids_of(t, p) + ids_of(t, r)])).mean(0) for p, r in zip(P, R)])
        want = head(feats)[:, 0]
    with untouched(m, t, head):   # before: TypeError (output_hidden_states)
        got = head_reward(m, t, head, pooling='mean')(P, R)
        f = head_features(m, t, P, R, pooling='mean', batch_size=3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(f, feats, rtol=0, atol=1e-6)
    assert head_features(m, t, [], []).shape == (0, 0)
    bad = lambda input_ids, attention_mask: input_ids.float()   # (batch, pos): no hidden states
    with pytest.raises(ConfigError, match='without \\(batch, pos, d\\) hidden states'): head_reward(bad, t, head)(P, R)

def test_a_rewriter_that_returns_no_text_is_a_typed_error():
    with pytest.raises(ConfigError, match="rewriter returned a int \\(3\\) for 'politeness'"):
        perturbations([('q', 'Please wait.', 'Just wait.')], ['politeness'], rewriter=lambda texts, a, d, p: [3]*len(texts))

def test_a_pair_ending_in_the_config_pad_id_is_read_where_the_model_reads_it_alone():
    "Reward models trained with pad = eos read the last token that is not eos: so does the reward, in any batch."
    m, t = seq_cls('llama', seed=13, pad_token_id=1), tiny_tokenizer()   # config pad id = eos = 1
    rm = classifier_reward(m, t, template='{prompt} {response} <eos>')
    texts = [f'{p} {r} <eos>' for p, r in zip(P, R)]
    with torch.no_grad(): want = [m(input_ids=torch.tensor([ids_of(t, x)])).logits[0, 0].item() for x in texts]   # the model's own rule, unpadded
    with torch.no_grad(): at_eos = [m.score(m.model(input_ids=torch.tensor([ids_of(t, x)])).last_hidden_state[0, -1]).item() for x in texts]
    assert np.abs(np.subtract(want, at_eos)).min() > 1e-3   # reading the trailing eos would differ
    np.testing.assert_allclose(rm(P, R).numpy(), want, rtol=0, atol=2e-5)
    np.testing.assert_allclose([rm([p], [r]).item() for p, r in zip(P, R)], want, rtol=0, atol=2e-5)
