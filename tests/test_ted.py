"""Tests of interpkit.papers.ted (paper 8, Jones, Patrawala & Steinhardt ICLR 2025: TED, operational embeddings of phrases) and
of the core helpers it uses (`chat_replies`, `logits_at`), against independent references: the prompts written out by hand;
greedy decoding by an argmax loop over one unpadded sequence; the operational embedding by `torch.autograd.grad` of a mean
cross-entropy with respect to `inputs_embeds` of one unpadded control prompt, whose instruction is found by matching its own
tokens, and by central finite differences through a hand-written forward hook on the embedding module (float64 models, norms
in float64); cosines by numpy; WordNet labels from nltk queries written here (antonyms, shared synsets, 'similar to' links);
judges by unbatched forwards (the LM judge's ' A' - ' B' logit margins) and by `embed` calls of our own; verification rates
with fake judges whose answers are known (an oracle, always 'A', the longer text); thresholds at exact values; and bad
input."""
import inspect, json, math
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np, pandas as pd, pytest, torch
import torch.nn.functional as F
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, models as tk_models, pre_tokenizers
from interpkit.errors import AssetNotFound, ConfigError, NotFiniteError, ShapeError, SiteError
from interpkit.models import chat_replies, embed, encode_left, logits_at, tiny_lm, tiny_tokenizer
from interpkit.train import assets_dir
import interpkit.papers.ted as ted
from tiny_models import unit_scale_lm
import interpkit.demos.ted as ted_demo
from interpkit.papers.ted import (EDIT_TEMPLATE, JUDGE_TEMPLATE, ATTRIBUTE_TEMPLATE, N_KEEP, TAU_SIMILAR, TAU_DISSIMILAR, EXPECTED, UNEXPECTED,
                                  SIDE_EFFECT, INADEQUATE, followup, edit_request, check_phrases,
                                  EditOutputs, edit_outputs, OperationalEmbeddings, operational_embeddings, Thesaurus, thesaurus, wordnet,
                                  wordnet_label, reference_table, reference_labels, llm_relation, failure_type, failures, candidates,
                                  embedding_judge, lm_judge, Verification, verify, verify_pairs, random_pairs,
                                  plot_thesaurus, output_similarity, _instruction_start)
from interpkit.demos.ted import PHRASES, QUERIES, TED_RECIPE, TED_ASSET, TedDemo, PairReport, load_ted_demo, pair_report

torch.set_num_threads(1)

# ---------------------------------------------------------------- helpers

def model(arch='llama', seed=0, dtype=torch.float64, gain=1.0, d_model=32):
    "A unit-scale tiny LM, float64 by default (see tiny_models.py)."
    return unit_scale_lm(arch, seed, dtype, gain, d_model)

@pytest.fixture(scope='module')
def tok(): return tiny_tokenizer()

def ab_tokenizer():
    "The tiny tokenizer with 'A' and 'B' as words of their own (ids 126, 127), so that the LM judge's letters are distinct tokens."
    t = tiny_tokenizer(126)
    t.add_tokens([AddedToken('A', single_word=True), AddedToken('B', single_word=True)])
    return t

def ws_tokenizer():
    "A word-level fast tokenizer that keeps whitespace runs as tokens (so the token before the instruction ends exactly where it starts), with 'Edit' a known word."
    special = ['<unk>', '<eos>', 'user', 'assistant', 'system']
    words = ['Edit', ' ', '\n', '\n\n']
    vocab = {w: i for i, w in enumerate(special + words + [f'w{i}' for i in range(128 - len(special) - len(words))])}
    tk = Tokenizer(tk_models.WordLevel(vocab, unk_token='<unk>'))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r'\s+'), behavior='isolated')
    t = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token='<unk>', eos_token='<eos>', bos_token='<eos>')
    t.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
    return t

class SlowTok:
    "A tokenizer that says it is not fast (no offsets): `_instruction_start` counts the tokens of the text before the instruction."
    is_fast = False
    def __init__(self, t): self.t = t
    def __call__(self, text, **kw):
        kw.pop('return_offsets_mapping', None)
        return self.t(text, **kw)

def words(g, n): return ' '.join(f'w{int(i)}' for i in torch.randint(0, 120, (n,), generator=g))

def word_data(n_q=3, phrases=('p1', 'p2'), lens=None, seed=0):
    "Queries, responses and outputs of tiny words; lens[w][j] words in the output of phrase w for query j (0: empty)."
    g = torch.Generator().manual_seed(seed)
    qs = [words(g, 2 + j % 3) for j in range(n_q)]
    rs = [words(g, 1 + (j * 2) % 4) for j in range(n_q)]
    lens = lens or {w: [1 + (i + j) % 4 for j in range(n_q)] for i, w in enumerate(phrases)}
    outs = {w: [words(g, k) if k else '' for k in lens[w]] for w in phrases}
    return EditOutputs(qs, rs, [words(g, 2) for _ in qs], outs)

def control_ids(tok, q, r):
    "The control prompt's ids under the chat template (unpadded) and the index where the tokens of 'Edit RESPONSE.' last occur."
    text = tok.apply_chat_template([{'role': 'user', 'content': edit_request(q, r)}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)['input_ids']
    instr = tok('Edit RESPONSE.', add_special_tokens=False)['input_ids']
    at = [i for i in range(len(ids) - len(instr) + 1) if ids[i:i + len(instr)] == instr]
    assert at, 'instruction not found'
    return ids, at[-1]

def ref_grad(m, tok, q, r, out, n_keep=4):
    "∇ of the mean cross-entropy of `out` given the control prompt, w.r.t. inputs_embeds, at the instruction's first n_keep tokens (float64)."
    ids, s = control_ids(tok, q, r)
    t = tok(out, add_special_tokens=False)['input_ids']
    x = m.get_input_embeddings()(torch.tensor([ids + t])).detach().requires_grad_(True)
    lg = m(inputs_embeds=x).logits[0]
    loss = F.cross_entropy(lg[len(ids) - 1:len(ids) + len(t) - 1].double(), torch.tensor(t))
    g, = torch.autograd.grad(loss, x)
    return g[0, s:s + n_keep].double()

def ref_embeddings(m, tok, data, phrases=None, n_keep=4):
    "Each phrase's mean of `ref_grad` over the queries whose output has a token, and those counts."
    vecs, counts = [], []
    for w in phrases or list(data.outputs):
        gs = [ref_grad(m, tok, q, r, o, n_keep) for q, r, o in zip(data.queries, data.responses, data.outputs[w]) if tok(o, add_special_tokens=False)['input_ids']]
        vecs.append(torch.stack(gs).mean(0)); counts.append(len(gs))
    return torch.stack(vecs), counts

def ref_reply(m, tok, conv, n):
    "Greedy reply by an argmax loop on the unpadded chat prompt, stopping after an end-of-sequence id of the generation config or of the tokenizer."
    msgs = [{'role': 'user', 'content': conv}] if isinstance(conv, str) else conv
    ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False)['input_ids']
    eos = m.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id} - {None}   # chat_replies stops at both (interpkit.models, issue 50)
    out = []
    for _ in range(n):
        with torch.no_grad(): t = int(m(torch.tensor([ids + out])).logits[0, -1].argmax())
        out.append(t)
        if t in eos: break
    return tok.decode(out, skip_special_tokens=True)

def emb_of(vectors, phrases=None, counts=None):
    v = torch.as_tensor(vectors, dtype=torch.float32)
    phrases = phrases or [f'p{i}' for i in range(len(v))]
    return OperationalEmbeddings(list(phrases), v, counts or [1] * len(v))

def th_of(cos:dict, phrases):
    "A Thesaurus built by hand from the cosines of unordered pairs (1 on the diagonal)."
    c = pd.DataFrame(np.eye(len(phrases)), index=phrases, columns=phrases)
    for (a, b), v in cos.items(): c.loc[a, b] = c.loc[b, a] = v
    return Thesaurus(list(phrases), c)

def sig(fn): return {k: v.default for k, v in inspect.signature(fn).parameters.items() if v.default is not inspect.Parameter.empty}

# ---------------------------------------------------------------- constants, prompts, phrases

def test_documented_defaults():
    assert TAU_SIMILAR == 0.95 and TAU_DISSIMILAR == -0.5 and N_KEEP == 4        # the official README's τ's; the official code keeps 4 tokens, uses token 0
    assert sig(thesaurus) == dict(token=0) and sig(operational_embeddings)['n_keep'] == 4
    assert sig(Thesaurus.similar) == dict(tau=0.95) and sig(Thesaurus.dissimilar) == dict(tau=-0.5)
    assert sig(llm_relation) == sig(failures) == dict(tau_similar=0.95, tau_dissimilar=-0.5)
    assert sig(edit_outputs)['max_chars'] == 10_000                           # the official code truncates outputs to 10,000 characters
    assert EXPECTED == 'expected' and UNEXPECTED == 'unexpected' and SIDE_EFFECT == 'unexpected side effect' and INADEQUATE == 'inadequate update'
    assert len(PHRASES) == len(set(PHRASES)) == 20 and len(QUERIES) == len(set(QUERIES)) == 20 and TED_ASSET == 'ted_smollm2'
    assert TED_RECIPE['n_keep'] == 4 and TED_RECIPE['token'] == 0 and TED_RECIPE['n_embed'] == 10

def test_followup_and_edit_request_strings():
    assert followup() == followup(None) == 'Edit RESPONSE.'
    assert followup('witty') == 'Edit RESPONSE to be maximally witty.' and followup('value of freedom') == 'Edit RESPONSE to be maximally value of freedom.'
    want = "The following RESPONSE is a response to the question QUESTION.\nQUESTION: Why?\nRESPONSE: Because.\n\nEdit RESPONSE."
    assert edit_request('Why?', 'Because.') == want == edit_request('Why?', 'Because.', None)
    assert edit_request('Why?', 'Because.', 'rude') == want[:-1] + ' to be maximally rude.'
    assert EDIT_TEMPLATE.format(query='Q', response='R', followup='F') == "The following RESPONSE is a response to the question QUESTION.\nQUESTION: Q\nRESPONSE: R\n\nF"
    assert edit_request('{x}', '{response}', '{q}') .endswith('RESPONSE: {response}\n\nEdit RESPONSE to be maximally {q}.')  # fields are not re-formatted

def test_check_phrases():
    assert check_phrases(('a', 'b')) == ['a', 'b'] and check_phrases(iter(['x'])) == ['x'] and isinstance(check_phrases(('a',)), list)
    for bad, msg in [('witty', 'not a list'), (5, 'not a list'), (None, 'not a list'), ([], 'is empty'), ([''], 'holds'), (['a', '  '], 'holds'),
                     (['a', 3], 'holds'), (['a', 'b', 'a'], "repeats \\['a'\\]")]:
        with pytest.raises(ConfigError, match=msg): check_phrases(bad)
    with pytest.raises(ConfigError, match='^w_list='): check_phrases('x', what='w_list')

def test_edit_outputs_result_subset_and_of():
    d = EditOutputs(['q0', 'q1', 'q2'], ['r0', 'r1', 'r2'], ['c0', 'c1', 'c2'], {'a': ['a0', 'a1', 'a2'], 'b': ['b0', 'b1', 'b2']})
    assert d.phrases == ['a', 'b'] and d.of('b') == ['b0', 'b1', 'b2']
    s = d.subset(['b'], [2, 0])
    assert s == EditOutputs(['q2', 'q0'], ['r2', 'r0'], ['c2', 'c0'], {'b': ['b2', 'b0']})
    assert d.subset() == d and d.subset(queries=range(1, 3)).outputs == {'a': ['a1', 'a2'], 'b': ['b1', 'b2']}
    with pytest.raises(SiteError, match="'bb'.*Did you mean 'b'"): d.of('bb')
    with pytest.raises(SiteError): d.subset(['c'])
    with pytest.raises(ConfigError): d.subset('a')

# ---------------------------------------------------------------- core: logits_at, chat_replies

class NoKeep(torch.nn.Module):
    "A causal LM whose forward has no `logits_to_keep` (the fallback path of `logits_at`)."
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, input_ids, attention_mask=None): return self.m(input_ids=input_ids, attention_mask=attention_mask)

def test_logits_at_equals_full_logits_sliced():
    m = model('llama', seed=3, dtype=torch.float32)
    ids = torch.randint(5, 120, (2, 7), generator=torch.Generator().manual_seed(1))
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        full = m(**inputs).logits
        calls = []
        h = m.lm_head.register_forward_hook(lambda mod, a, out: calls.append(out.shape[1]))
        try:
            for k in (1, 3, 7):
                assert torch.allclose(logits_at(m, inputs, k), full[:, -k:], atol=1e-5)
            for pos in ([0, 2, 5], torch.tensor([6, 1]), [4]):
                assert torch.allclose(logits_at(m, inputs, pos), full[:, torch.as_tensor(pos)], atol=1e-5)
        finally: h.remove()
        assert calls == [1, 3, 7, 3, 2, 1]                                     # the vocabulary projection runs at those positions only
        w = NoKeep(m)
        assert torch.allclose(logits_at(w, inputs, 2), full[:, -2:], atol=1e-6) and logits_at(w, inputs, 2).shape == (2, 2, 128)
        assert torch.allclose(logits_at(w, inputs, [3, 0]), full[:, [3, 0]], atol=1e-6)
        f = lambda input_ids, attention_mask: full                             # any callable that returns logits
        assert torch.equal(logits_at(f, inputs, [1, 4]), full[:, [1, 4]]) and torch.equal(logits_at(f, inputs, 1), full[:, -1:])
    for bad in (0, True):
        with pytest.raises(ConfigError, match='positions='): logits_at(m, inputs, bad)
    with torch.no_grad(): assert torch.allclose(logits_at(m, inputs, -1), m(**inputs).logits[:, -1], atol=1e-5)   # -j: position -j alone, (batch, vocab)
    for bad in ([], [[0, 1]], torch.zeros(2, 2, dtype=torch.long)):
        with pytest.raises(ShapeError): logits_at(m, inputs, bad)

def test_chat_replies_batched_equal_greedy_loop(tok, untouched):
    m = model('llama', seed=4, dtype=torch.float64)
    m.generation_config.eos_token_id = [2, 104]                              # 'user' or 'w99' ends a reply: replies of several lengths
    g = torch.Generator().manual_seed(2)
    convs = [words(g, 1 + 3 * (i % 3)) for i in range(5)]
    convs.append([{'role': 'system', 'content': 'w1 w2'}, {'role': 'user', 'content': 'w3'}])
    want = [ref_reply(m, tok, c, 6) for c in convs]
    assert len({len(w.split()) for w in want}) > 1 and all(want)                # the set-up: replies of different lengths
    with untouched(m, tok):
        for bs in (1, 4, 8):
            assert chat_replies(m, tok, convs, 6, bs) == want
    assert chat_replies(m, tok, convs[:2], 2) == [ref_reply(m, tok, c, 2) for c in convs[:2]]
    assert sig(chat_replies) == dict(max_new_tokens=64, batch_size=8)
    m.train()                                                                 # replies in eval mode, the flags restored
    with untouched(m, tok): assert chat_replies(m, tok, convs[:3], 6, 2) == want[:3]
    assert m.training

def test_chat_replies_errors(tok, untouched):
    m = tiny_lm('llama', d_model=32)
    for bad in ('w1', {'role': 'user', 'content': 'w1'}, [], ()):
        with pytest.raises(ConfigError, match='chat_replies got'): chat_replies(m, tok, bad)
    t2 = tiny_tokenizer(); t2.chat_template = None
    with pytest.raises(ConfigError, match='no chat template'): chat_replies(m, t2, ['w1'])
    with pytest.raises(ConfigError): chat_replies(m, tok, ['w1'], batch_size=0)
    with pytest.raises(ConfigError, match='causal language model'): chat_replies(tiny_lm('bert', d_model=32), tok, ['w1'])
    with pytest.raises(ConfigError, match='no `generate`'): chat_replies(torch.nn.Linear(2, 2), tok, ['w1'])
    with untouched(m, tok), pytest.raises(Exception): chat_replies(m, tok, ['w1'], 3, 1, no_such_generate_option=1)

# ---------------------------------------------------------------- edit_outputs

def test_edit_outputs_are_greedy_edits_of_greedy_answers(tok, untouched):
    m = model('llama', seed=5, dtype=torch.float64)
    m.generation_config.eos_token_id = [2, 9]
    qs, phrases = ['w1 w2', 'w3', 'w4 w5 w6 w7'], ['w9', 'w10 w11']
    with untouched(m, tok): d = edit_outputs(m, qs, phrases, tok, max_new_tokens=4, response_tokens=3, batch_size=2)
    rs = [ref_reply(m, tok, q, 3) for q in qs]
    assert d.queries == qs and d.responses == rs and d.phrases == phrases and isinstance(d, EditOutputs)
    assert d.control == [ref_reply(m, tok, edit_request(q, r), 4) for q, r in zip(qs, rs)]
    for w in phrases: assert d.outputs[w] == [ref_reply(m, tok, edit_request(q, r, w), 4) for q, r in zip(qs, rs)]
    assert all(len(o.split()) <= 4 for o in d.control) and any(d.control)
    given = ['w20 w21', 'w22', 'w23 w24 w25']
    e = edit_outputs(m, tuple(qs), phrases, tok, responses=given, max_new_tokens=4, max_chars=5, batch_size=8)
    assert e.responses == given                                               # passed through, not cut
    full = [ref_reply(m, tok, edit_request(q, r, 'w9'), 4) for q, r in zip(qs, given)]
    assert e.outputs['w9'] == [o[:5] for o in full] and any(len(o) > 5 for o in full)
    assert e.control == [ref_reply(m, tok, edit_request(q, r), 4)[:5] for q, r in zip(qs, given)]
    assert sig(edit_outputs) == dict(tokenizer=None, responses=None, max_new_tokens=64, response_tokens=48, max_chars=10_000, batch_size=8)

def test_edit_outputs_errors(tok, untouched):
    m = tiny_lm('llama', d_model=32)
    with untouched(m, tok):
        for bad in ([], [''], ['a', 'a'], 'witty'):
            with pytest.raises(ConfigError): edit_outputs(m, ['w1'], bad, tok)
        for bad in ([], 'w1 w2'):
            with pytest.raises(ConfigError, match='no list of queries'): edit_outputs(m, bad, ['a'], tok)
        with pytest.raises(ConfigError, match='2 responses for 1 queries'): edit_outputs(m, ['w1'], ['a'], tok, responses=['w1', 'w2'])
        with pytest.raises(ConfigError, match='no tokenizer'): edit_outputs(m, ['w1'], ['a'], None)
        with pytest.raises(ConfigError): edit_outputs(m, ['w1'], ['a'], tok, batch_size=0)

# ---------------------------------------------------------------- operational embeddings

def assert_close_emb(got, want, counts, want_counts, rtol=1e-5):
    assert got.vectors.dtype == torch.float32 and got.vectors.device.type == 'cpu' and got.counts == want_counts == counts
    scale = float(want.abs().max())
    assert scale > 1e-3
    assert torch.allclose(got.vectors.double(), want, rtol=rtol, atol=rtol * scale), float((got.vectors.double() - want).abs().max())

@pytest.mark.parametrize('arch', ['llama', 'gpt2', 'neox'])
def test_operational_embeddings_match_autograd_reference(arch, tok, untouched):
    m = model(arch, seed=1)
    d = word_data(3, ('p1', 'p2'), lens={'p1': [1, 4, 2], 'p2': [3, 0, 5]}, seed=1)    # outputs of different lengths, one empty
    want, counts = ref_embeddings(m, tok, d)
    with untouched(m, tok): e = operational_embeddings(m, d, tok, batch_size=3)
    assert isinstance(e, OperationalEmbeddings) and e.phrases == ['p1', 'p2'] and e.vectors.shape == (2, 4, 32)
    assert_close_emb(e, want, e.counts, [3, 2])
    assert torch.equal(e['p2'], e.vectors[1])

def test_operational_embeddings_batch_size_padding_phrases_and_n_keep(tok, untouched):
    m = model('llama', seed=2)
    d = word_data(4, ('a', 'b', 'c'), lens={'a': [1, 5, 2, 3], 'b': [4, 1, 0, 6], 'c': [2, 2, 7, 1]}, seed=3)
    assert len({len(q.split()) for q in d.queries}) > 1                        # prompts of different lengths: left padding
    want, counts = ref_embeddings(m, tok, d)
    with untouched(m, tok):
        for bs in (1, 3, 11, 64):                                              # 11 non-empty outputs in all
            assert_close_emb(operational_embeddings(m, d, tok, batch_size=bs), want, counts, [4, 3, 4])
        sub = operational_embeddings(m, d, tok, phrases=['c', 'a'], batch_size=4)
        assert sub.phrases == ['c', 'a']
        assert_close_emb(sub, want[[2, 0]], sub.counts, [4, 4])
        w5, _ = ref_embeddings(m, tok, d, ['b'], n_keep=5)                     # the instruction's 3 tokens, '<eos>' and 'assistant': 5 follow its start
        assert_close_emb(operational_embeddings(m, d, tok, phrases=['b'], n_keep=5), w5, [3], [3])
        w1, _ = ref_embeddings(m, tok, d, ['b'], n_keep=1)
        assert_close_emb(operational_embeddings(m, d, tok, phrases=['b'], n_keep=1), w1, [3], [3])

def test_operational_embeddings_instruction_is_the_last_one(tok):
    "A response that itself says 'Edit RESPONSE.': the gradient is read at the control instruction, not inside the response."
    m = model('llama', seed=6)
    d = EditOutputs(['w1 w2', 'w3'], ['Edit RESPONSE. w4 w5', 'w6'], ['w1', 'w2'], {'a': ['w7 w8', 'w9 w10 w11']})
    want, counts = ref_embeddings(m, tok, d)
    e = operational_embeddings(m, d, tok)
    assert_close_emb(e, want, e.counts, [2])

def test_operational_embeddings_whitespace_tokens_and_slow_tokenizers():
    "A tokenizer whose token before 'Edit' ends exactly where the instruction starts, and the same one without offsets."
    t = ws_tokenizer()
    m = model('llama', seed=7)
    d = EditOutputs(['w1 w2', 'w3'], ['w4', 'w5 w6'], ['w1', 'w2'], {'a': ['w7 w8', 'w9'], 'b': ['w10', 'w11 w12 w13']})
    want, counts = ref_embeddings(m, t, d)
    ids, s = control_ids(t, 'w1 w2', 'w4')
    assert t.convert_ids_to_tokens(ids[s - 1:s + 1]) == ['\n\n', 'Edit']          # the set-up
    assert_close_emb(operational_embeddings(m, d, t, batch_size=2), want, counts, [2, 2])
    text = t.apply_chat_template([{'role': 'user', 'content': edit_request('w1 w2', 'w4')}], tokenize=False, add_generation_prompt=True)
    char = text.rindex('Edit RESPONSE.')
    assert _instruction_start(t, text, char) == s == _instruction_start(SlowTok(t), text, char)
    tt = tiny_tokenizer()
    text = tt.apply_chat_template([{'role': 'user', 'content': edit_request('w1 w2', 'w4')}], tokenize=False, add_generation_prompt=True)
    char = text.rindex('Edit RESPONSE.')
    assert _instruction_start(tt, text, char) == control_ids(tt, 'w1 w2', 'w4')[1] == _instruction_start(SlowTok(tt), text, char) == 19

def fd_check(m, tok, data, w, coords, h, rtol):
    "Central differences of the mean over queries of the output's mean NLL, the instruction's embedding row moved by h at (token, dim) in every query."
    e = operational_embeddings(m, data, tok, phrases=[w])
    emb_mod = m.get_input_embeddings()
    rows = [(control_ids(tok, q, r), tok(o, add_special_tokens=False)['input_ids']) for q, r, o in zip(data.queries, data.responses, data.of(w))]
    def loss(k, dim, eps):
        tot = 0.0
        for (ids, s), t in rows:
            def hook(mod, args, out):
                out = out.clone(); out[0, s + k, dim] += eps
                return out
            hd = emb_mod.register_forward_hook(hook)
            try:
                with torch.no_grad(): lg = m(torch.tensor([ids + t])).logits[0]
            finally: hd.remove()
            tot += float(F.cross_entropy(lg[len(ids) - 1:len(ids) + len(t) - 1].double(), torch.tensor(t)))
        return tot / len(rows)
    for k, dim in coords:
        fd = (loss(k, dim, h) - loss(k, dim, -h)) / (2 * h)
        assert abs(float(e.vectors[0, k, dim]) - fd) <= rtol * max(abs(fd), 1e-3), (k, dim, float(e.vectors[0, k, dim]), fd)
    return e

@pytest.mark.parametrize('arch', ['gpt2', 'llama'])
def test_operational_embeddings_match_finite_differences(arch, tok):
    m = model(arch, seed=8)
    d = EditOutputs(['w1 w2 w3', 'w4'], ['w5', 'w6 w7'], ['w8', 'w9'], {'a': ['w10 w11', 'w12 w13 w14']})
    e = fd_check(m, tok, d, 'a', [(0, 0), (0, 5), (2, 17), (3, 31)], h=1e-5, rtol=1e-5)
    assert e.vectors[0, 0].abs().max() > 1e-3

def test_operational_embeddings_in_train_mode_and_float32(tok, untouched):
    m = model('gpt2', seed=9)                                                  # GPT-2 has dropout: gradients are taken in eval mode
    d = word_data(2, ('a',), seed=4)
    want, counts = ref_embeddings(m, tok, d)
    m.train()
    with untouched(m, tok): e = operational_embeddings(m, d, tok)
    assert m.training and m.transformer.h[0].training
    assert_close_emb(e, want, counts, [2])
    m32 = model('llama', seed=2, dtype=torch.float32)
    w32, c32 = ref_embeddings(model('llama', seed=2), tok, d)
    assert_close_emb(operational_embeddings(m32, d, tok), w32, c32, [2], rtol=1e-3)

def test_operational_embeddings_empty_outputs_and_errors(tok, untouched):
    m = model('llama', seed=10)
    d = EditOutputs(['w1', 'w2 w3', 'w4'], ['w5', 'w6', 'w7'], ['w8'] * 3, {'a': ['', 'w9', ' '], 'b': ['w1', 'w2', 'w3'], 'none': ['', ' ', '\n']})
    with untouched(m, tok):
        e = operational_embeddings(m, d, tok, phrases=['a', 'b'])
        assert e.counts == [1, 3]
        want = torch.stack([ref_grad(m, tok, 'w2 w3', 'w6', 'w9')])
        assert torch.allclose(e.vectors[0].double(), want[0], rtol=1e-5, atol=1e-7)
        with pytest.raises(ConfigError, match="Every output for phrase 'none' is empty"): operational_embeddings(m, d, tok)
        with pytest.raises(SiteError, match="'bb'"): operational_embeddings(m, d, tok, phrases=['bb'])
        for bad in (0, -1, True, 2.0, None):
            with pytest.raises(ConfigError, match='n_keep='): operational_embeddings(m, d, tok, phrases=['b'], n_keep=bad)
        with pytest.raises(ConfigError, match=r'n_keep=6 runs past the end of the control prompt of queries \[0, 1, 2\]'):
            operational_embeddings(m, d, tok, phrases=['b'], n_keep=6)
        for bad in (0, 1.5, True):
            with pytest.raises(ConfigError, match='batch_size'): operational_embeddings(m, d, tok, phrases=['b'], batch_size=bad)
        with pytest.raises(ConfigError, match='no tokenizer'): operational_embeddings(m, d, None, phrases=['b'])
        with pytest.raises(ConfigError): operational_embeddings(m, d, tok, phrases=[])
    class Bare(torch.nn.Module):
        def forward(self, input_ids, **kw): return input_ids
    with pytest.raises(ConfigError, match='no input embedding module'): operational_embeddings(Bare(), d, tok, phrases=['b'])
    bad = model('llama', seed=10)
    with torch.no_grad(): bad.model.layers[0].mlp.down_proj.weight[0, 0] = float('nan')
    with pytest.raises(NotFiniteError): operational_embeddings(bad, d, tok, phrases=['b'])   # (untouched cannot compare NaN weights)

# ---------------------------------------------------------------- thesaurus

def test_thesaurus_cosines_by_hand():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(4, 3, 8, generator=g)
    e = emb_of(v, ['w', 'x', 'y', 'z'])
    for token in (0, 1, 2, -1, -3):
        th = thesaurus(e, token)
        a = v[:, token].double().numpy()
        want = (a @ a.T) / np.outer(np.linalg.norm(a, axis=1), np.linalg.norm(a, axis=1))
        assert isinstance(th, Thesaurus) and th.phrases == ['w', 'x', 'y', 'z'] and list(th.cosine.index) == list(th.cosine.columns) == th.phrases
        assert np.allclose(th.cosine.to_numpy(), want, atol=1e-12)
        assert th('x', 'z') == pytest.approx(want[1, 3], abs=1e-12) and th('z', 'x') == th('x', 'z') and th('y', 'y') == pytest.approx(1, abs=1e-12)
    assert np.allclose(thesaurus(e).cosine, thesaurus(e, 0).cosine) and not np.allclose(thesaurus(e, 1).cosine, thesaurus(e, 0).cosine)
    same = thesaurus(emb_of(torch.stack([v[0], 3 * v[0], -v[0]])))
    assert same('p0', 'p1') <= 1 and same('p0', 'p1') == pytest.approx(1, abs=1e-12) and same('p0', 'p2') == pytest.approx(-1, abs=1e-12)
    assert same('p0', 'p2') >= -1
    for bad in (3, -4, True, 1.0, None):
        with pytest.raises(ConfigError, match='token='): thesaurus(e, bad)
    z = v.clone(); z[2, 1] = 0
    thesaurus(emb_of(z), 0)
    with pytest.raises(NotFiniteError, match='zero'): thesaurus(emb_of(z), 1)
    with pytest.raises(SiteError, match="'xx'.*Did you mean 'x'"): thesaurus(e)('xx', 'y')
    with pytest.raises(SiteError): thesaurus(e)('w', 'q')

def test_operational_embeddings_getitem():
    e = emb_of(torch.arange(12.).view(3, 2, 2), ['a', 'b', 'c'])
    assert torch.equal(e['c'], torch.tensor([[8., 9.], [10., 11.]]))
    with pytest.raises(SiteError, match="'cc'.*Did you mean 'c'"): e['cc']

def test_pairs_similar_dissimilar_at_exact_thresholds():
    P = ['a', 'b', 'c', 'd', 'e']
    cos = {('a', 'b'): 0.95, ('a', 'c'): 0.96, ('b', 'c'): -0.5, ('c', 'd'): -0.7, ('d', 'e'): 0.99, ('a', 'd'): -0.51, ('b', 'e'): 0.9500001}
    th = th_of(cos, P)
    p = th.pairs()
    assert list(p.columns) == ['w_eval', 'w_edit', 'cosine'] and len(p) == 20
    assert {(a, b) for a, b in zip(p.w_eval, p.w_edit)} == {(a, b) for a in P for b in P if a != b}
    assert list(p.cosine) == sorted(p.cosine, reverse=True)
    full = {**{k: v for k, v in cos.items()}, **{(b, a): v for (a, b), v in cos.items()}}
    assert all(c == full.get((a, b), 0.0) for a, b, c in zip(p.w_eval, p.w_edit, p.cosine))
    s = th.similar()
    assert [tuple(r) for r in s[['w_eval', 'w_edit']].to_numpy()] == [('d', 'e'), ('a', 'c'), ('b', 'e')]   # > 0.95 strictly, highest first
    assert list(s.cosine) == [0.99, 0.96, 0.9500001]
    assert [tuple(r) for r in th.similar(0.96)[['w_eval', 'w_edit']].to_numpy()] == [('d', 'e')]
    assert len(th.similar(0.9499)) == 4 and len(th.similar(-2)) == 10
    ds = th.dissimilar()
    assert [tuple(r) for r in ds[['w_eval', 'w_edit']].to_numpy()] == [('c', 'd'), ('a', 'd')]               # < -0.5 strictly, lowest first
    assert list(ds.cosine) == [-0.7, -0.51] and len(th.dissimilar(-0.4999)) == 3 and len(th.dissimilar(-0.7)) == 0
    assert all(a < b for a, b in zip(s.w_eval, s.w_edit)) and list(s.index) == list(range(len(s))) and list(ds.index) == list(range(len(ds)))
    assert list(s.columns) == list(ds.columns) == ['w_eval', 'w_edit', 'cosine']
    # ties keep the pairs' order (stable)
    tie = th_of({('a', 'b'): 0.5, ('a', 'c'): 0.5}, ['a', 'b', 'c']).pairs()
    assert [tuple(r) for r in tie[['w_eval', 'w_edit']].to_numpy()][:4] == [('a', 'b'), ('a', 'c'), ('b', 'a'), ('c', 'a')]

# ---------------------------------------------------------------- reference

@pytest.fixture(scope='module')
def wn():
    try: return wordnet()
    except AssetNotFound: pytest.skip('WordNet not installed (tools/get_wordnet.py)')

def antonym_link(wn, a, b) -> bool:
    "A lemma of a synset of a has an antonym whose synset is a synset of b, or the reverse."
    one = lambda x, y: bool({ant.synset() for s in wn.synsets(x) for l in s.lemmas() for ant in l.antonyms()} & set(wn.synsets(y)))
    return one(a, b) or one(b, a)

def shared_synset(wn, a, b) -> bool: return bool(set(wn.synsets(a)) & set(wn.synsets(b)))

def similar_link(wn, a, b) -> bool:
    "A synset of a is 'similar to' a synset of b (adjective clusters), either way."
    sa, sb = set(wn.synsets(a)), set(wn.synsets(b))
    return any(set(s.similar_tos()) & sb for s in sa) or any(set(s.similar_tos()) & sa for s in sb)

def test_wordnet_labels_against_nltk_queries(wn):
    for a, b in [('impolite', 'polite'), ('polite', 'impolite'), ('rude', 'polite'), ('polite', 'rude'), ('friendly', 'hostile'), ('honest', 'dishonest')]:
        assert antonym_link(wn, a, b) and wordnet_label(a, b, wn) == UNEXPECTED, (a, b)
    for a, b in [('rude', 'ill-mannered'), ('polite', 'civil'), ('historical', 'historic'), ('humorous', 'humourous')]:
        assert shared_synset(wn, a, b) and not antonym_link(wn, a, b) and wordnet_label(a, b, wn) == EXPECTED, (a, b)
    for a, b in [('witty', 'humorous'), ('concise', 'brief'), ('friendly', 'amicable'), ('formal', 'ceremonial'), ('playful', 'frolicsome')]:
        assert similar_link(wn, a, b) and not shared_synset(wn, a, b) and not antonym_link(wn, a, b) and wordnet_label(a, b, wn) == EXPECTED, (a, b)
    for a, b in [('concise', 'playful'), ('polite', 'formal'), ('dishonest', 'concise')]:
        assert not (shared_synset(wn, a, b) or antonym_link(wn, a, b) or similar_link(wn, a, b)) and wordnet_label(a, b, wn) is None, (a, b)
    assert wordnet_label('nosuchwordzz', 'polite', wn) is None
    assert wordnet_label('Impolite', 'POLITE', wn) == UNEXPECTED                       # phrases are lower-cased
    assert shared_synset(wn, 'ill_at_ease', 'awkward') and wordnet_label('ill at ease', 'awkward', wn) == EXPECTED   # spaces become '_'
    assert wordnet_label('impolite', 'polite') == UNEXPECTED                           # wn=None: the installed WordNet

def test_wordnet_label_is_symmetric_on_the_phrases(wn):
    labels = {(a, b): wordnet_label(a, b, wn) for a in PHRASES for b in PHRASES if a != b}
    assert all(labels[a, b] == labels[b, a] for a, b in labels)
    assert labels['polite', 'rude'] == UNEXPECTED and labels['witty', 'humorous'] == EXPECTED and labels['concise', 'playful'] is None

def test_wordnet_missing(monkeypatch):
    import nltk.corpus
    def missing(): raise LookupError('no wordnet')
    monkeypatch.setattr(nltk.corpus.wordnet, 'ensure_loaded', missing)
    with pytest.raises(AssetNotFound, match='nltk finds no WordNet'): wordnet()

def nones(col): return [None if pd.isna(x) else x for x in col]   # pandas 3 stores a missing string as NaN

def test_reference_labels_table_first_then_wordnet(wn, monkeypatch):
    pairs = pd.DataFrame(dict(w_eval=['polite', 'rude', 'witty', 'concise', 'humorous'], w_edit=['rude', 'polite', 'humorous', 'playful', 'witty'], cosine=[.1, .2, .3, .4, .5]))
    table = pd.DataFrame(dict(w_eval=['rude', 'concise'], w_edit=['polite', 'playful'], label=[EXPECTED, UNEXPECTED], reason=['x', 'y']))
    got = reference_labels(pairs, table, wn)
    assert list(got.columns) == ['w_eval', 'w_edit', 'cosine', 'label', 'source'] and list(got.cosine) == [.1, .2, .3, .4, .5]
    assert list(got.label) == [UNEXPECTED, EXPECTED, EXPECTED, UNEXPECTED, EXPECTED]       # the table overrides WordNet's 'unexpected' for (rude, polite)
    assert list(got.source) == ['wordnet', 'table', 'wordnet', 'table', 'wordnet']
    empty = pd.DataFrame(columns=['w_eval', 'w_edit', 'label'])
    w = reference_labels(pairs, empty, wn)
    assert nones(w.label) == [UNEXPECTED, UNEXPECTED, EXPECTED, None, EXPECTED] and nones(w.source) == ['wordnet', 'wordnet', 'wordnet', None, 'wordnet']
    def no_wordnet(*a, **k): raise AssertionError('WordNet was read')
    monkeypatch.setattr(ted, 'wordnet', no_wordnet); monkeypatch.setattr(ted, 'wordnet_label', no_wordnet)
    alone = reference_labels(pairs, table, wn=False)
    assert nones(alone.label) == [None, EXPECTED, None, UNEXPECTED, None] and nones(alone.source) == [None, 'table', None, 'table', None]
    for bad in (['expected', 'Unexpected'], ['yes', 'expected']):
        with pytest.raises(ConfigError, match='labels'): reference_labels(pairs, table.assign(label=bad), wn=False)

def test_reference_labels_missing_is_none_and_table_shapes(wn):
    pairs = pd.DataFrame(dict(w_eval=['concise', 'polite'], w_edit=['playful', 'rude']), index=[7, 3])
    got = reference_labels(pairs, pd.DataFrame(), wn)                                   # an empty table without columns: WordNet alone
    assert got.label.tolist() == [None, UNEXPECTED] and got.source.tolist() == [None, 'wordnet']   # None, not NaN, as documented
    assert got.label[7] is None and got.index.tolist() == [7, 3]
    with pytest.raises(ConfigError, match='columns'): reference_labels(pairs, pd.DataFrame(dict(a=[1], b=[2])), wn)

def test_reference_labels_default_table_and_wordnet(wn, monkeypatch):
    pairs = pd.DataFrame(dict(w_eval=['aggressive', 'witty'], w_edit=['formal', 'humorous']))
    t = reference_table()
    hand = dict(zip(zip(t.w_eval, t.w_edit), t.label))
    got = reference_labels(pairs)
    assert got.label[0] == hand['aggressive', 'formal'] == UNEXPECTED and got.source[0] == 'table'
    assert got.label[1] == hand.get(('witty', 'humorous'), wordnet_label('witty', 'humorous', wn))
    monkeypatch.setattr(ted, 'assets_dir', lambda: assets_dir() / 'no-such-folder')
    with pytest.raises(AssetNotFound, match='ted_reference.csv'): reference_table()

def test_shipped_reference_table():
    t = reference_table()
    assert list(t.columns) == ['w_eval', 'w_edit', 'label', 'reason'] and len(t) > 50
    assert set(t.label) == {EXPECTED, UNEXPECTED}
    assert set(t.w_eval) | set(t.w_edit) <= set(PHRASES) and (t.w_eval != t.w_edit).all()
    assert not t.duplicated(['w_eval', 'w_edit']).any() and t.reason.notna().all()
    assert t.set_index(['w_eval', 'w_edit']).label[('aggressive', 'provocative')] == UNEXPECTED   # the paper's own failure example

# ---------------------------------------------------------------- failures

def test_llm_relation_and_failure_type():
    assert llm_relation(0.9500001) == 'similar' and llm_relation(0.95) is None and llm_relation(-0.5) is None and llm_relation(-0.5000001) == 'dissimilar'
    assert llm_relation(0.0) is None and llm_relation(1.0) == 'similar' and llm_relation(-1.0) == 'dissimilar'
    assert llm_relation(0.5, 0.4, 0.1) == 'similar' and llm_relation(0.4, 0.4, 0.1) is None and llm_relation(0.0, 0.4, 0.1) == 'dissimilar' and llm_relation(0.1, 0.4, 0.1) is None
    for ts, td in [(0.3, 0.3), (0.2, 0.3)]:
        with pytest.raises(ConfigError, match='not below'): llm_relation(0.0, ts, td)
    assert failure_type('similar', UNEXPECTED) == SIDE_EFFECT and failure_type('dissimilar', EXPECTED) == INADEQUATE
    for r, l in [('similar', EXPECTED), ('dissimilar', UNEXPECTED), (None, EXPECTED), (None, UNEXPECTED), ('similar', None), ('dissimilar', None), (None, None)]:
        assert failure_type(r, l) is None

def test_failures_and_candidates_on_a_hand_made_table():
    lab = pd.DataFrame(dict(w_eval=list('abcdefghij'), w_edit=list('ABCDEFGHIJ'),
                            cosine=[0.96, 0.99, 0.95, 0.97, -0.6, -0.9, -0.5, -0.7, 0.98, 0.0],
                            label=[UNEXPECTED, UNEXPECTED, UNEXPECTED, EXPECTED, EXPECTED, EXPECTED, EXPECTED, UNEXPECTED, None, UNEXPECTED]))
    f = failures(lab)
    assert list(f.w_eval) == ['b', 'a', 'f', 'e']        # side effects by cosine from the top (c: 0.95 is not > τ), then inadequate updates from the bottom (g: -0.5 is not < τ)
    assert list(f.failure) == [SIDE_EFFECT, SIDE_EFFECT, INADEQUATE, INADEQUATE] and list(f.relation) == ['similar', 'similar', 'dissimilar', 'dissimilar']
    assert list(f.index) == [0, 1, 2, 3] and list(f.cosine) == [0.99, 0.96, -0.9, -0.6]
    f2 = failures(lab, 0.9, -0.55)
    assert list(f2.w_eval) == ['b', 'a', 'c', 'f', 'e']
    assert list(failures(lab, 0.99, -0.95).w_eval) == []
    for col in ('cosine', 'label', 'w_eval'):
        with pytest.raises(ConfigError, match=f"without \\['{col}'\\]"): failures(lab.drop(columns=[col]))
    c = candidates(lab)
    assert list(c.w_eval) == ['b', 'a', 'c', 'j', 'h'] and list(c.index) == list(range(5))          # 'unexpected' pairs, most similar first, whatever τ
    assert list(candidates(lab, UNEXPECTED, 2).w_eval) == ['b', 'a'] and list(candidates(lab, top_k=1).w_eval) == ['b']
    assert list(candidates(lab, EXPECTED).w_eval) == ['f', 'e', 'g', 'd'] and list(candidates(lab, EXPECTED, 3).w_eval) == ['f', 'e', 'g']
    tie = pd.DataFrame(dict(w_eval=['x', 'y', 'z'], w_edit=['X', 'Y', 'Z'], cosine=[0.5, 0.5, 0.5], label=[UNEXPECTED] * 3))
    assert list(candidates(tie, top_k=2).w_eval) == ['x', 'y'] and list(candidates(tie, EXPECTED).w_eval) == []
    assert sig(candidates) == dict(label=UNEXPECTED, top_k=10) and len(candidates(pd.concat([lab] * 3))) == 10
    with pytest.raises(ConfigError): candidates(lab, 'similar')
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match='top_k='): candidates(lab, top_k=bad)
    with pytest.warns(FutureWarning, match='k= is now called top_k='):
        assert candidates(lab, k=2).equals(candidates(lab, top_k=2))   # the old argument name still works

# ---------------------------------------------------------------- judges

def test_embedding_judge_against_own_embeddings(monkeypatch):
    qs = ['q1', 'q2', 'q3', 'q4']
    a = ['You are a stupid idiot and I hate you.', 'Thank you so much, kind friend.', 'The treaty was signed in 1648.', 'Same text.']
    b = ['Thank you kindly, dear friend.', 'Shut up, moron.', 'Knock knock! Who is there? A banana!', 'Same text.']
    for phrase, template in [('rude', ATTRIBUTE_TEMPLATE), ('polite', ATTRIBUTE_TEMPLATE), ('historical', 'A {phrase} passage')]:
        attr = embed(None, template.format(phrase=phrase))
        ea, eb = embed(None, a), embed(None, b)
        want = ['A' if float(x @ attr) > float(y @ attr) else 'B' if float(y @ attr) > float(x @ attr) else None for x, y in zip(ea, eb)]
        assert embedding_judge(template=template)(qs, a, b, phrase) == want
    assert ATTRIBUTE_TEMPLATE == 'This text is {phrase}.'
    assert embedding_judge()(qs, a, b, 'rude')[:2] == ['A', 'B'] and embedding_judge()(qs, a, b, 'rude')[3] is None
    calls = []
    real = ted.embed
    monkeypatch.setattr(ted, 'embed', lambda model, texts, *a_, **k: calls.append(list(texts)) or real(model, texts, *a_, **k))
    j = embedding_judge(batch_size=2)
    first = j(qs, a, b, 'rude')
    assert j(qs, b, a, 'rude') == [{'A': 'B', 'B': 'A', None: None}[v] for v in first]
    assert sum(map(len, calls)) == len(set(a) | set(b)) + 1                      # every text embedded once, the attribute too
    for bad in (0, True):
        with pytest.raises(ConfigError, match='batch_size'): embedding_judge(batch_size=bad)

def ref_margin(m, t, q, a, b, phrase, template=JUDGE_TEMPLATE, prefill='THE ANSWER IS:', max_chars=1500):
    text = t.apply_chat_template([{'role': 'user', 'content': template.format(query=q, a=a[:max_chars], b=b[:max_chars], phrase=phrase)}],
                                 tokenize=False, add_generation_prompt=True) + prefill
    ids = t(text, add_special_tokens=False)['input_ids']
    with torch.no_grad(): lg = m(torch.tensor([ids])).logits[0, -1]
    return float(lg[126] - lg[127])

def verdicts_of(ms): return ['A' if x > 0 else 'B' if x < 0 else None for x in ms]

def test_lm_judge_refuses_a_tokenizer_that_confuses_the_letters():
    with pytest.raises(ConfigError, match="same last token"): lm_judge(tiny_lm(), tiny_tokenizer())   # both letters are <unk> there

def test_lm_judge_is_the_sign_of_the_letter_margin(untouched):
    t = ab_tokenizer()
    assert t(' A', add_special_tokens=False)['input_ids'] == [126] and t(' B', add_special_tokens=False)['input_ids'] == [127]
    m = model('llama', seed=11, gain=1.5)
    g = torch.Generator().manual_seed(5)
    n = 16
    qs = [words(g, 1 + i % 4) for i in range(n)]
    A = [words(g, 2 + i % 5) for i in range(n)]
    B = [words(g, 1 + (3 * i) % 6) for i in range(n)]
    one = [ref_margin(m, t, q, x, y, 'w7') for q, x, y in zip(qs, A, B)]
    two = [ref_margin(m, t, q, y, x, 'w7') for q, x, y in zip(qs, A, B)]
    single, both = verdicts_of(one), verdicts_of([x - y for x, y in zip(one, two)])
    assert single != both and len(set(single)) == len(set(both)) == 2          # the set-up: both verdicts occur, the orders matter
    with untouched(m, t):
        for bs in (1, 5, 16):
            assert lm_judge(m, t, both_orders=False, batch_size=bs)(qs, A, B, 'w7') == single
            assert lm_judge(m, t, batch_size=bs)(qs, A, B, 'w7') == both
    assert lm_judge(m, t)(qs, A, A, 'w7') == [None] * n                          # the same text both ways: margins cancel exactly
    tmpl, pre = 'w1 {query} w2 {a} w3 {b} w4 {phrase}', 'w5 w6'
    want = verdicts_of([ref_margin(m, t, q, x, y, 'w9', tmpl, pre) - ref_margin(m, t, q, y, x, 'w9', tmpl, pre) for q, x, y in zip(qs, A, B)])
    assert lm_judge(m, t, template=tmpl, prefill=pre)(qs, A, B, 'w9') == want
    long_a = [x + ' ' + words(g, 30) for x in A]
    cut = verdicts_of([ref_margin(m, t, q, x, y, 'w7', max_chars=12) for q, x, y in zip(qs, long_a, B)])
    uncut = verdicts_of([ref_margin(m, t, q, x, y, 'w7') for q, x, y in zip(qs, long_a, B)])
    assert cut != uncut and lm_judge(m, t, both_orders=False, max_chars=12)(qs, long_a, B, 'w7') == cut
    assert lm_judge(m, t, both_orders=False)(qs, long_a, B, 'w7') == uncut
    assert sig(lm_judge) == dict(tokenizer=None, template=JUDGE_TEMPLATE, prefill='THE ANSWER IS:', both_orders=True, max_chars=1500, batch_size=8)
    assert JUDGE_TEMPLATE.format(query='Q', a='X', b='Y', phrase='rude') == \
        "QUESTION: Q\n\nRESPONSE A: X\n\nRESPONSE B: Y\n\nWhich response, A or B, is more rude? Reply with the letter only."
    m.train()
    with untouched(m, t): assert lm_judge(m, t, both_orders=False)(qs, A, B, 'w7') == single
    assert m.training
    with pytest.raises(ConfigError, match='no tokenizer'): lm_judge(m)
    with pytest.raises(ConfigError, match='batch_size'): lm_judge(m, t, batch_size=0)
    with pytest.raises(ConfigError, match='causal language model'): lm_judge(tiny_lm('bert', d_model=32), t)

# ---------------------------------------------------------------- verification

def verify_data(n=40):
    qs = [f'q{j}' for j in range(n)]
    return EditOutputs(qs, [f'r{j}' for j in range(n)], [f'control {j}' for j in range(n)],
                       {'x': [f'edit x {j}' + '!' * (j % 3) for j in range(n)], 'y': [f'y{j}' for j in range(n)]})

def test_verify_with_fake_judges():
    d = verify_data()
    seen = {}
    def oracle(queries, a, b, phrase):
        seen.update(queries=queries, phrase=phrase, a=a, b=b)
        return ['A' if x.startswith('edit x') else 'B' for x in a]
    v = verify(d, 'rude', 'x', oracle)
    assert isinstance(v, Verification) and (v.w_eval, v.w_edit, v.rate, v.n_valid, v.n) == ('rude', 'x', 1.0, 40, 40) and v.chose_edit == [True] * 40
    assert seen['queries'] == d.queries and seen['phrase'] == 'rude'                   # the judge looks for w_eval
    assert all({x, y} == {e, c} for x, y, e, c in zip(seen['a'], seen['b'], d.of('x'), d.control))
    shown_first = [x == e for x, e in zip(seen['a'], d.of('x'))]
    assert 10 < sum(shown_first) < 30                                                # the A/B order is random
    anti = verify(d, 'rude', 'x', lambda q, a, b, p: ['B' if x.startswith('edit x') else 'A' for x in a])
    assert anti.rate == 0.0 and anti.chose_edit == [False] * 40
    always_a = verify(d, 'rude', 'x', lambda q, a, b, p: ['A'] * len(a))
    assert always_a.rate == sum(shown_first) / 40 and always_a.chose_edit == shown_first
    longer = lambda q, a, b, p: ['A' if len(x) > len(y) else 'B' if len(y) > len(x) else None for x, y in zip(a, b)]
    v = verify(d, 'w', 'x', longer)                                                 # 'edit x j!!' against 'control j': longer unless j % 3 == 0 ... by length
    want = [None if len(e) == len(c) else len(e) > len(c) for e, c in zip(d.of('x'), d.control)]
    valid = [w for w in want if w is not None]
    assert v.chose_edit == want and v.n_valid == len(valid) < 40 and v.rate == pytest.approx(sum(valid) / len(valid), abs=1e-15)
    v = verify(d, 'w', 'y', longer)
    assert v.rate == 0.0 and v.n_valid == 40
    same = [verify(d, 'rude', 'x', lambda q, a, b, p: ['A'] * len(a), seed=s).chose_edit for s in (0, 0, 1)]
    assert same[0] == same[1] == shown_first and same[2] != same[0]
    other = verify(d, 'polite', 'x', lambda q, a, b, p: ['A'] * len(a)).chose_edit
    assert other != shown_first                                                      # the order is drawn per pair
    assert verify(d, 'rude', 'y', lambda q, a, b, p: ['A'] * len(a)).chose_edit != shown_first

def test_verify_errors():
    d = verify_data(6)
    with pytest.raises(ConfigError, match='5 verdicts for 6 pairs'): verify(d, 'a', 'x', lambda q, a, b, p: ['A'] * 5)
    with pytest.raises(ConfigError, match="'C'"): verify(d, 'a', 'x', lambda q, a, b, p: ['A'] * 5 + ['C'])
    with pytest.raises(ConfigError, match="'a'"): verify(d, 'a', 'x', lambda q, a, b, p: ['a'] * 6)
    with pytest.raises(NotFiniteError, match='no verdict on any of the 6'): verify(d, 'a', 'x', lambda q, a, b, p: [None] * 6)
    with pytest.raises(SiteError): verify(d, 'a', 'zz', lambda q, a, b, p: ['A'] * 6)
    v = verify(d, 'a', 'x', lambda q, a, b, p: [None] * 5 + ['A' if a[5].startswith('edit') else 'B'])
    assert (v.rate, v.n_valid, v.n) == (1.0, 1, 6) and v.chose_edit == [None] * 5 + [True]

def test_verify_pairs_and_random_pairs():
    d = verify_data(30)
    longer = lambda q, a, b, p: ['A' if len(x) > len(y) else 'B' if len(y) > len(x) else None for x, y in zip(a, b)]
    pairs = pd.DataFrame(dict(w_eval=['p', 'q'], w_edit=['x', 'y'], extra=[1, 2]))
    got = verify_pairs(d, pairs, longer)
    want_x = [len(e) > len(c) for e, c in zip(d.of('x'), d.control) if len(e) != len(c)]
    assert list(got.columns) == ['w_eval', 'w_edit', 'extra', 'rate', 'n_valid']
    assert got.rate.tolist() == pytest.approx([sum(want_x) / len(want_x), 0.0]) and got.n_valid.tolist() == [len(want_x), 30]
    P = ['a', 'b', 'c', 'd']
    r = random_pairs(P, 5, seed=3)
    assert list(r.columns) == ['w_eval', 'w_edit'] and len(r) == 5
    rows = list(zip(r.w_eval, r.w_edit))
    assert len(set(rows)) == 5 and all(a != b and a in P and b in P for a, b in rows)
    assert random_pairs(P, 5, seed=3).equals(r) and not random_pairs(P, 5, seed=4).equals(r)
    assert set(zip(*random_pairs(P, 12).to_numpy().T)) == {(a, b) for a in P for b in P if a != b}
    assert len(random_pairs(['a', 'b'], 1)) == 1
    for bad in (0, 13, -1, True, 2.0):
        with pytest.raises(ConfigError, match='n='): random_pairs(P, bad)
    with pytest.warns(FutureWarning, match='k= is now called n='):
        assert random_pairs(P, k=5, seed=3).equals(r)   # the old argument name still works
    with pytest.raises(ConfigError, match='from 1 to 12'): random_pairs(P, 13)
    with pytest.raises(ConfigError): random_pairs('abcd', 2)
    with pytest.raises(ConfigError): random_pairs(['a', 'a', 'b'], 2)

# ---------------------------------------------------------------- demo, report, plot

def hand_demo(token=1):
    g = torch.Generator().manual_seed(3)
    v = torch.randn(3, 4, 6, generator=g)
    test = EditOutputs(['q0', 'q1'], ['r0', 'r1'], ['c0', 'c1'], {'a': ['a0', 'a1'], 'b': ['b0', 'bee1'], 'c': ['c0x', 'c1x']})
    return TedDemo(test, test, emb_of(v, ['a', 'b', 'c'], [2, 2, 2]), pd.DataFrame(), dict(recipe=dict(token=token))), v

def test_pair_report_by_hand(monkeypatch):
    demo, v = hand_demo(token=1)
    x, y = v[0, 1].double().numpy(), v[1, 1].double().numpy()
    oracle = lambda q, a, b, p: ['A' if x_.startswith('b') else 'B' for x_ in a]
    r = pair_report(demo, 'a', 'b', query=1, judge=oracle)
    assert isinstance(r, PairReport) and set(vars(r)) == {'cosine', 'query', 'control', 'edited', 'verdict'}
    assert r['cosine'] == pytest.approx(x @ y / np.linalg.norm(x) / np.linalg.norm(y), abs=1e-12)          # at the recipe's token
    assert (r['query'], r['control'], r['edited']) == ('q1', 'c1', 'bee1') and r['verdict'] == "the edit for 'b' is more 'a'"
    anti = lambda q, a, b, p: ['B' if x_.startswith('b') else 'A' for x_ in a]
    assert pair_report(demo, 'a', 'b', judge=anti)['verdict'] == "the control edit is more 'a'"
    assert pair_report(demo, 'a', 'b', judge=anti)['query'] == 'q0'
    monkeypatch.setattr(ted_demo, 'embedding_judge', lambda: oracle)                         # judge=None: the embedding judge
    assert pair_report(demo, 'a', 'b')['verdict'] == "the edit for 'b' is more 'a'"
    for bad in (2, -1, True, 0.0):
        with pytest.raises(ConfigError, match='query='): pair_report(demo, 'a', 'b', query=bad, judge=oracle)
    with pytest.raises(SiteError): pair_report(demo, 'a', 'zz', judge=oracle)
    with pytest.raises(SiteError): pair_report(demo, 'zz', 'b', judge=oracle)

def test_pair_report_tie_gives_no_verdict():
    demo, _ = hand_demo()
    assert pair_report(demo, 'a', 'b', judge=lambda q, a, b, p: [None])['verdict'] is None

def test_plot_thesaurus():
    th = th_of({('a', 'b'): 0.97, ('a', 'c'): 0.96, ('b', 'c'): 0.2}, ['a', 'b', 'c'])
    fig = plot_thesaurus(th)
    try:
        assert isinstance(fig, matplotlib.figure.Figure) and tuple(fig.get_size_inches()) == (7.5, 6.5)
        assert any(ax.get_title() == 'cosine of operational embeddings (2 pairs above τ = 0.95)' for ax in fig.axes)
    finally: plt.close(fig)
    fig = plot_thesaurus(th, tau=0.965, figsize=(4, 3))
    try:
        assert tuple(fig.get_size_inches()) == (4, 3) and any(ax.get_title() == 'cosine of operational embeddings (1 pairs above τ = 0.965)' for ax in fig.axes)
    finally: plt.close(fig)

def test_load_ted_demo_reads_the_asset_layout(monkeypatch):
    out = lambda tag: dict(queries=[f'{tag}q'], responses=[f'{tag}r'], control=[f'{tag}c'], outputs={'a': [f'{tag}a'], 'b': [f'{tag}b']})
    meta = dict(phrases=['a', 'b'], counts=[1, 1], train=out('tr'), test=out('te'), lm_rates=[dict(w_eval='a', w_edit='b', rate=0.5, n_valid=2)], recipe=TED_RECIPE)
    vec = torch.randn(2, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    asked = []
    monkeypatch.setattr(ted_demo, 'load_asset', lambda name: asked.append(name) or ({'embeddings': vec}, meta))
    d = load_ted_demo()
    assert asked == [TED_ASSET] and isinstance(d, TedDemo) and d.meta is meta
    assert d.train == EditOutputs(['trq'], ['trr'], ['trc'], {'a': ['tra'], 'b': ['trb']}) and d.test.control == ['tec']
    assert d.embeddings.phrases == ['a', 'b'] and d.embeddings.counts == [1, 1] and d.embeddings.vectors.dtype == torch.float32
    assert torch.allclose(d.embeddings.vectors.double(), vec, atol=1e-6)
    assert d.lm_rates.to_dict('records') == meta['lm_rates']

# ---------------------------------------------------------------- the shipped demo asset

def _shipped():
    if not (assets_dir()/f'{TED_ASSET}.safetensors').exists(): pytest.skip(f'{TED_ASSET} not built yet (tools/make_ted_assets.py)')
    return load_ted_demo()

def test_shipped_demo_layout():
    d = _shipped()
    n = TED_RECIPE['n_embed']
    assert d.embeddings.phrases == list(PHRASES) and d.embeddings.vectors.shape == (20, 4, 576) and torch.isfinite(d.embeddings.vectors).all()
    assert d.train.queries == list(QUERIES[:n]) and d.test.queries == list(QUERIES[n:])
    for part, k in ((d.train, n), (d.test, len(QUERIES) - n)):
        assert part.phrases == list(PHRASES) and len(part.responses) == len(part.control) == k and all(len(part.of(w)) == k for w in PHRASES)
    assert all(isinstance(r, str) and r for r in d.train.responses + d.test.responses)
    assert all(1 <= c <= n for c in d.embeddings.counts)
    assert d.meta['recipe'] == TED_RECIPE
    assert {'w_eval', 'w_edit', 'rate', 'n_valid'} <= set(d.lm_rates.columns) and d.lm_rates.rate.between(0, 1).all()
    th = thesaurus(d.embeddings)
    assert np.allclose(np.diag(th.cosine), 1)

def test_smollm2_operational_embedding_matches_autograd_reference():
    "SmolLM2 (a BPE tokenizer: '\\n\\n' tokens end where the instruction starts) against the reference on 2 queries; the shipped embedding where it exists."
    from interpkit.models import load_lm
    m, t = load_lm()
    if (assets_dir()/f'{TED_ASSET}.safetensors').exists():
        d = load_ted_demo()
        w = 'witty'
        data = d.train.subset([w], [0, 1])
    else:
        d, w = None, 'witty'
        data = EditOutputs(list(QUERIES[:2]), ['Resting helps you recover and work better afterwards.', 'Your own needs matter too.'], ['x', 'y'],
                           {w: ['Rest is a gift: take it!', 'Saying no is saying yes to yourself.']})
    ids, s = control_ids(t, data.queries[0], data.responses[0])
    assert t.convert_ids_to_tokens(ids[s - 1:s + 1])[1] == 'Edit'
    got = operational_embeddings(m, data, t, batch_size=2)
    want = torch.stack([ref_grad(m, t, q, r, o) for q, r, o in zip(data.queries, data.responses, data.of(w)) if t(o, add_special_tokens=False)['input_ids']]).mean(0)
    assert got.vectors.shape == (1, 4, 576)
    assert torch.allclose(got.vectors[0].double(), want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))

def test_get_wordnet_lexnames_table(wn):
    import importlib.util
    spec = importlib.util.spec_from_file_location('get_wordnet', assets_dir().parent.parent / 'tools' / 'get_wordnet.py')
    gw = importlib.util.module_from_spec(spec); spec.loader.exec_module(gw)
    rows = [r.split('\t') for r in gw.lexnames().splitlines()]
    assert len(rows) == 45 and [r[0] for r in rows] == [f'{i:02d}' for i in range(45)]          # lexnames(5WN): files 00..44
    assert rows[0][1:] == ['adj.all', '3'] and rows[3][1:] == ['noun.Tops', '1'] and rows[29][1:] == ['verb.body', '2'] and rows[44][1:] == ['adj.ppl', '3']
    assert all(r[2] == str({'noun': 1, 'verb': 2, 'adj': 3, 'adv': 4}[r[1].split('.')[0]]) for r in rows)
    assert wn.synset('witty.s.01').lexname() == 'adj.all' and wn.synset('dog.n.01').lexname() == 'noun.animal'   # what nltk reads from it

def test_output_similarity_is_the_mean_cosine_of_paired_edits():
    d = EditOutputs(['q1', 'q2'], ['r1', 'r2'], ['c1', 'c2'],
                    {'a': ['The cat sat on the mat.', 'Stocks fell sharply today.'], 'b': ['A cat was sitting on a mat.', 'I love pizza.'], 'c': ['', 'Markets dropped.']})
    got = output_similarity(None, d)
    assert got[['w1', 'w2']].values.tolist() == [['a', 'b'], ['a', 'c'], ['b', 'c']]
    E = {w: embed(None, d.outputs[w]) for w in 'abc'}                                           # unit vectors from the core's encoder
    for (a, b), s in zip(got[['w1', 'w2']].values, got.similarity):
        want = np.mean([float(torch.dot(E[a][j], E[b][j]) / (E[a][j].norm() * E[b][j].norm())) for j in range(2)])   # query by query, then the mean
        assert math.isclose(s, want, abs_tol=1e-5), (a, b, s, want)
    assert got.similarity[0] > got.similarity[2]                                           # cat/cat + stocks/pizza vs empty/cat + pizza/markets
    sub = output_similarity(None, d, ['c', 'a'], batch_size=1)
    assert sub[['w1', 'w2']].values.tolist() == [['c', 'a']] and math.isclose(sub.similarity[0], got.similarity[1], abs_tol=1e-5)
    with pytest.raises(ConfigError, match='1 phrase'): output_similarity(None, d, ['a'])
    with pytest.raises(SiteError): output_similarity(None, d, ['a', 'zz'])
    with pytest.raises(ConfigError, match='data=NoneType'): output_similarity(None)
    for old in ((d,), (d, None, None), (d, ['c', 'a']), (d, None), ):   # the old order output_similarity(data, phrases, model) still works, and warns
        with pytest.warns(FutureWarning, match='encoder comes first'): o = output_similarity(*old)
        want = sub if len(old) > 1 and old[1] else got
        assert o[['w1', 'w2']].equals(want[['w1', 'w2']]) and np.allclose(o.similarity, want.similarity, atol=1e-5)
    with pytest.warns(FutureWarning): assert np.allclose(output_similarity(d, phrases=['c', 'a']).similarity, sub.similarity, atol=1e-5)

def boundary_tokenizer():
    "A fast word-level tokenizer whose token '\\n\\nEdit' starts two characters before the instruction, and which adds '<bos>' when asked to add special tokens."
    from tokenizers import processors
    words = ['<unk>', '<bos>', '<eos>', '\n\nEdit', ' ', '\n', '\n\n', 'user', 'assistant'] + [f'w{i}' for i in range(20)]
    tk = Tokenizer(tk_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='<unk>'))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r'\n\nEdit|\s+'), behavior='isolated')
    tk.post_processor = processors.TemplateProcessing(single='<bos> $A', special_tokens=[('<bos>', 1)])
    t = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token='<unk>', eos_token='<eos>', bos_token='<bos>')
    t.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
    return t

class NoFlag:
    "A tokenizer without an `is_fast` attribute (and without offsets), like many hand-written ones."
    def __init__(self, t): self.t = t
    def __call__(self, text, add_special_tokens=True): return self.t(text, add_special_tokens=add_special_tokens)

def test_instruction_token_across_the_boundary_and_a_bos_token():
    t = boundary_tokenizer()
    d = EditOutputs(['w1 w2'], ['w3'], ['w4'], {'w5': ['w6']})
    (ids, start), = ted._control_prompts(t, d)
    text = t.apply_chat_template([{'role': 'user', 'content': edit_request('w1 w2', 'w3')}], tokenize=False, add_generation_prompt=True)
    assert t(text)['input_ids'][0] == 1 and ids == t(text, add_special_tokens=False)['input_ids']   # the prompt is tokenized without the <bos>
    assert t.convert_ids_to_tokens(ids[start]) == '\n\nEdit'                                         # the token that holds the instruction's 'E'
    char = text.rindex('Edit RESPONSE.')
    assert _instruction_start(t, text, char) == start
    # without offsets the text before the instruction, which ends in '\n\n', is tokenized differently on its own, and these wrappers
    # cannot decode (nor could the word-level tokenizer faithfully): refused, where the count of its tokens was one token off (issue 51)
    for slow in (SlowTok(t), NoFlag(t)):
        with pytest.raises(ConfigError, match="cannot be located.*fast tokenizer"): _instruction_start(slow, text, char)

def test_operational_embeddings_with_a_tokenizer_that_adds_bos(untouched):
    t, m = boundary_tokenizer(), model('gpt2', seed=3)
    d = EditOutputs(['w1 w2', 'w3'], ['w4', 'w5 w6'], ['w7', 'w8'], {'w9': ['w10 w11', 'w12']})
    with untouched(m, t): e = operational_embeddings(m, d, t, batch_size=2)
    gs = []
    for q, r, o in zip(d.queries, d.responses, d.outputs['w9']):   # no <bos> anywhere: the chat template writes the prompt, the output follows it
        text = t.apply_chat_template([{'role': 'user', 'content': edit_request(q, r)}], tokenize=False, add_generation_prompt=True)
        ids, out = t(text, add_special_tokens=False)['input_ids'], t(o, add_special_tokens=False)['input_ids']
        s = ids.index(t.convert_tokens_to_ids('\n\nEdit'))
        x = m.get_input_embeddings()(torch.tensor([ids + out])).detach().requires_grad_(True)
        loss = F.cross_entropy(m(inputs_embeds=x).logits[0, len(ids) - 1:-1], torch.tensor(out))
        gs.append(torch.autograd.grad(loss, x)[0][0, s:s + 4])
    assert_close_emb(e, torch.stack(gs).mean(0)[None].double(), e.counts, [2])

def test_thesaurus_clamps_round_off_to_the_unit_interval():
    g = torch.Generator().manual_seed(0)
    def raw(x):                                                   # the cosines of x's rows and their negatives, unclamped, in float64
        u = F.normalize(torch.cat([x, -x]).double(), dim=-1)
        return u @ u.T
    v = next(x for x in (torch.randn(1, 8, generator=g) for _ in range(1000)) if raw(x).max() > 1 and raw(x).min() < -1)
    th = thesaurus(emb_of(torch.cat([v, -v]).unsqueeze(1).repeat(1, 4, 1)))
    c = th.cosine.to_numpy()
    assert c.max() == 1.0 and c.min() == -1.0                     # exactly: clamped


def test_old_import_paths_of_the_demo_names_warn():
    for name in ('PHRASES', 'QUERIES', 'TED_RECIPE', 'TED_ASSET', 'TedDemo', 'load_ted_demo', 'pair_report'):
        with pytest.warns(FutureWarning, match=f'ted.{name} is now interpkit.demos.ted.{name}'):
            assert getattr(ted, name) is getattr(ted_demo, name)
    with pytest.raises(AttributeError): ted.no_such_name


# ---------------------------------------------------------------- issue 51: slow tokenizers, tokenizers without a chat template

from transformers.models.clvp.tokenization_clvp import ClvpTokenizer

class SlowBPE(ClvpTokenizer):
    "GPT-2's byte-level BPE in Python (a slow tokenizer: `PythonBackend`, no offsets): CLVP's, without its English normaliser."
    @property
    def normalizer(self): return lambda t: t

BPE_SPECIAL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
BPE_CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

def bpe_pair(folder):
    "A byte-level BPE (GPT-2's and SmolLM2's kind) trained here, as a fast tokenizer and as a slow one built from the same vocabulary and merges."
    from tokenizers import decoders, trainers
    tk = Tokenizer(tk_models.BPE())
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    corpus = [edit_request(f'Why is it okay to rest {i}?', f'Because rest helps.\n\nReally {i}.', w) for i in range(20) for w in (None, 'witty', 'polite')] * 5
    corpus += ['Really.\n\n', 'Edit RESPONSE.\n\n '] * 20                    # '\n\n' before a space or the end: the merge 'ĊĊ'
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=BPE_SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=BPE_SPECIAL[0], bos_token=BPE_SPECIAL[1], eos_token=BPE_SPECIAL[2])
    mdl = json.loads(tk.to_str())['model']
    (folder/'vocab.json').write_text(json.dumps(mdl['vocab']))
    (folder/'merges.txt').write_text('#version: 0.2\n' + ''.join(' '.join(m) + '\n' for m in mdl['merges']))
    slow = SlowBPE(str(folder/'vocab.json'), str(folder/'merges.txt'), unk_token=BPE_SPECIAL[0], bos_token=BPE_SPECIAL[1], eos_token=BPE_SPECIAL[2], pad_token=BPE_SPECIAL[2])
    fast.chat_template = slow.chat_template = BPE_CHAT
    return fast, slow

BPE_DATA = EditOutputs(['Why is it okay to rest?', 'Why nap at noon?', 'Why?'], ['Rest helps.\nReally.', 'Because naps are good ü', 'So.\n\n'], ['x', 'y', 'z'],
                       {'witty': ['Rest is a gift: take it!', 'Naps, the best!', 'Why not.'], 'polite': ['Please rest.', 'Kindly nap.', '']})

def test_slow_and_fast_tokenizers_find_the_same_instruction_token(tmp_path, untouched):
    "Issue 51: a slow byte-level BPE counted the tokens of the text before the instruction, which ends in '\\n\\n' (one token 'ĊĊ' alone, 'Ċ' 'Ċ' before 'Edit'): one token early, 0.37 relative error in e_op here."
    fast, slow = bpe_pair(tmp_path)
    assert slow.is_fast is False and fast.is_fast is True
    for q, r in zip(BPE_DATA.queries, BPE_DATA.responses):
        text = fast.apply_chat_template([{'role': 'user', 'content': edit_request(q, r)}], tokenize=False, add_generation_prompt=True)
        char = text.rindex('Edit RESPONSE.')
        ids = fast(text, add_special_tokens=False)['input_ids']
        assert slow(text, add_special_tokens=False)['input_ids'] == ids                                           # the set-up: one tokenizer, two implementations
        before = slow(text[:char], add_special_tokens=False)['input_ids']
        assert slow.convert_ids_to_tokens(before[-1]) == 'ĊĊ' and ids[:len(before)] != before                   # the set-up: the old count is one token early
        ref = control_ids(fast, q, r)[1]                                                                          # the reference: where the instruction's own tokens occur
        assert fast.convert_ids_to_tokens(ids[ref - 2:ref + 1]) == ['Ċ', 'Ċ', 'Edit'] and len(before) == ref - 1
        assert _instruction_start(fast, text, char) == _instruction_start(slow, text, char) == ref
    m = tiny_lm('llama', d_model=32, vocab_size=len(fast), seed=0)
    with untouched(m, slow): es = operational_embeddings(m, BPE_DATA, slow, batch_size=2)
    ef = operational_embeddings(m, BPE_DATA, fast, batch_size=2)
    assert torch.equal(es.vectors, ef.vectors) and es.counts == ef.counts == [3, 2]
    want, counts = ref_embeddings(m, fast, BPE_DATA)
    assert_close_emb(es, want, counts, [3, 2], rtol=1e-4)

def test_ted_refuses_a_tokenizer_without_a_chat_template_before_any_work(untouched):
    "Issue 51: without a chat template the LM judge failed only when it first judged; TED's prompts are chat turns, so every entry point refuses at once."
    m, t = tiny_lm('llama', d_model=32), ab_tokenizer()
    t.chat_template = None
    calls = []
    m.register_forward_pre_hook(lambda mod, args: calls.append(1))
    d = EditOutputs(['w1'], ['w2'], ['w3'], {'a': ['w4']})
    with untouched(m, t):
        for f in (lambda: edit_outputs(m, ['w1'], ['a'], t), lambda: edit_outputs(m, ['w1'], ['a'], t, responses=['w2']),
                  lambda: operational_embeddings(m, d, t), lambda: lm_judge(m, t)):
            with pytest.raises(ConfigError, match=r"got a \w+ without a chat template.*chat_template"): f()
    assert calls == []

@pytest.mark.parametrize('arch', ['llama', 'qwen2'])
def test_left_padding_under_eager_float64_attention_is_done_row_by_row(arch, tok, untouched):
    "Issue 51: left-padded batches of a float64 model with eager attention give NaN on the padding rows, which reaches the real tokens; e_op and the LM judge raised NotFiniteError. Now such a batch is run again row by row, unpadded."
    m = tiny_lm(arch, d_model=32, seed=2).double()
    assert m.config._attn_implementation == 'eager'
    t = ab_tokenizer()
    d = EditOutputs(['w1 w2 w3 w4 w5 w6 w7 w8', 'w3', 'w9 w10'], ['w4 w5 w6 w7 w8 w9', 'w6', 'w11'], ['w1', 'w2', 'w3'],
                    {'a': ['w7 w8', 'w9 w10 w11', 'w12'], 'b': ['w13', '', 'w14 w15']})
    texts = [chat_text_of(t, edit_request(q, r)) for q, r in zip(d.queries, d.responses)]
    with pytest.raises(NotFiniteError, match='left-padded'): logits_at(m, encode_left(t, texts), 1)   # the set-up: the padded batch is not finite
    with untouched(m, t): e = operational_embeddings(m, d, t, batch_size=3)
    want, counts = ref_embeddings(m, t, d)
    assert_close_emb(e, want, counts, [3, 2], rtol=1e-6)
    with torch.no_grad(): alone = torch.stack([m(torch.tensor([t(x, add_special_tokens=False)['input_ids']])).logits[0, -1] for x in texts])
    got = ted._last_logits(m, t, texts)
    assert got.dtype == torch.float64 and torch.allclose(got, alone, rtol=0, atol=1e-12)   # a float64 model's logits stay float64 (the judge's margins too)
    assert ted._last_logits(m.float(), t, texts).dtype == torch.float32
    m.double()
    with untouched(m, t): got = lm_judge(m, t, batch_size=3)(d.queries, d.control, d.of('a'), 'w7')
    assert got == verdicts_of([ref_margin(m, t, q, x, y, 'w7') - ref_margin(m, t, q, y, x, 'w7') for q, x, y in zip(d.queries, d.control, d.of('a'))])

def chat_text_of(t, user): return t.apply_chat_template([{'role': 'user', 'content': user}], tokenize=False, add_generation_prompt=True)

def test_templates_lengths_and_tables_that_would_be_misread_are_refused(untouched):
    "Issue 51's classes in TED: a judge template with another field raised a bare KeyError at judging time; max_chars=-1 cut each output's last character; responses that are not texts were formatted into the prompts; verify_pairs without w_eval raised a KeyError; NaN embeddings gave NaN cosines."
    m, t = tiny_lm('llama', d_model=32), ab_tokenizer()
    for bad, match in (('{x}', 'does not format'), ('This text is nice.', r'has no \{phrase\} field'), (3, 'is not a text')):
        with pytest.raises(ConfigError, match=match): embedding_judge(template=bad)
    for bad, match in (('{query} {a} {b}', r'has no \{phrase\} field'), ('{query} {a} {b} {phrase} {c}', 'does not format'), ('{query} {a} {b} {phrase} {', 'does not format')):
        with pytest.raises(ConfigError, match=match): lm_judge(m, t, template=bad)
    for kw, match in ((dict(max_chars=0), 'max_chars=0'), (dict(max_chars=-1), 'max_chars=-1'), (dict(prefill=None), 'prefill=None')):
        with pytest.raises(ConfigError, match=match): lm_judge(m, t, **kw)
    with untouched(m, t):
        for kw, match in ((dict(max_chars=-1), 'max_chars=-1'), (dict(max_chars=1.5), 'max_chars=1.5'), (dict(responses=[3]), r"responses holds \['int'\]"), (dict(responses=None, queries=[3]), r"queries holds \['int'\]")):
            args = dict(queries=['w1'], responses=['w2']) | kw
            with pytest.raises(ConfigError, match=match): edit_outputs(m, args.pop('queries'), ['w5'], t, **args)
    d = EditOutputs(['q'], ['r'], ['c'], {'a': ['x']})
    with pytest.raises(ConfigError, match=r"without \['w_edit', 'w_eval'\]"): verify_pairs(d, pd.DataFrame({'x': [1]}), lambda *a: ['A'])
    with pytest.raises(ConfigError, match=r"without \['w_edit'\]"): verify_pairs(d, pd.DataFrame({'w_eval': ['a']}), lambda *a: ['A'])
    v = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0)); v[1, 2, 0] = float('nan')
    with pytest.raises(NotFiniteError, match='at token 2 has 1 non-finite'): thesaurus(emb_of(v), token=2)
    assert np.isfinite(thesaurus(emb_of(v), token=0).cosine.to_numpy()).all()    # the other tokens are finite: usable

def test_operational_embeddings_take_parameters_out_of_autograd_and_give_them_back(monkeypatch):
    "Inside the call no parameter requires a gradient (so autograd keeps no linear layer's input); after it, also after an error, each has its own flag again."
    m, tk = tiny_lm('llama', n_layers=1, seed=0), tiny_tokenizer()
    m.lm_head.weight.requires_grad_(False)   # a partly frozen model stays partly frozen
    before = {n: p.requires_grad for n, p in m.named_parameters()}
    d = EditOutputs(['w1'], ['w2'], ['w3'], {'w4': ['w5 w6']})
    seen, grads = [], ted._gradients
    def spy(model, *a):
        seen.append(any(p.requires_grad for p in model.parameters())); return grads(model, *a)
    monkeypatch.setattr(ted, '_gradients', spy)
    e = operational_embeddings(m, d, tk)
    assert seen == [False] and e.vectors.abs().max() > 0
    assert {n: p.requires_grad for n, p in m.named_parameters()} == before
    monkeypatch.setattr(ted, '_gradients', lambda *a: (_ for _ in ()).throw(RuntimeError('boom')))
    with pytest.raises(RuntimeError, match='boom'): operational_embeddings(m, d, tk)
    assert {n: p.requires_grad for n, p in m.named_parameters()} == before
