"""The core's helpers for text LMs (issue 50): word and character tokenizers on `tokenizers`, the chat text, greedy
generation, resolving a (model, tokenizer) pair, batch checks, last-position logits, and training, saving and loading
tiny LMs. Checked against references written here by hand (the regex and the ASCII codes, a greedy loop, the chat
template's formulas of the copies it replaces, a training loop) and against the shipped assets and their loaders."""
import copy, importlib, json, logging, random, re, warnings
from pathlib import Path
import pytest, torch, transformers
import torch.nn.functional as F
from interpkit.errors import ConfigError, NotFiniteError, ShapeError
from interpkit.models import (word_vocab, word_tokenizer, tiny_tokenizer, tiny_lm, encode_texts, encode_queries, encode_left, pad_left, pad_id, chat_text,
                              generate_greedy, chat_replies, resolve_lm, check_batch, check_batch_size, iter_batches, logits_at, logits_of, load_lm)
from interpkit.data import char_tokenizer, corpus, shakespeare_docs
from interpkit.train import (Shipped, Trained, train_tiny_lm, save_tiny_lm, load_tiny_lm, load_asset, lm_loss, FitResult)


def _find(name, *modules):
    "`name` from the first of `modules` (a demo module first: names move there during issue 50) that has it."
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for m in modules:
            try: mod = importlib.import_module(m)
            except ImportError: continue
            if hasattr(mod, name): return getattr(mod, name)
    pytest.skip(f"{name} is in none of {modules}")

def _paper(p): return (f'interpkit.demos.{p}', f'interpkit.papers.{p}')

# ---------------------------------------------------------------- word tokenizers: the regex and the list, by hand

def by_hand(vocab, text):
    "The ids the hand-written WordTokenizer gave: words and single punctuation marks (re.findall), 2 for a word not in the list."
    ids = {w: i for i, w in enumerate(vocab)}
    return [ids.get(w, 2) for w in re.findall(r"\w+|[^\w\s]", text)]

def texts_by_hand(vocab, texts):
    "encode_texts by hand: <s> (1) first, right padding with 0, every real token scored."
    rows = [[1] + by_hand(vocab, t) for t in texts]
    T = max(map(len, rows))
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (T - len(r)) for r in rows])
    return dict(input_ids=ids, attention_mask=(lab != -100).long(), labels=lab)

def queries_by_hand(vocab, prompts, targets):
    "encode_queries by hand: the target's tokens alone scored."
    rows = [[1] + by_hand(vocab, p + ' ' + t) for p, t in zip(prompts, targets)]
    n = [1 + len(by_hand(vocab, p)) for p in prompts]
    T = max(map(len, rows))
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    lab = torch.tensor([[-100] * k + r[k:] + [-100] * (T - len(r)) for r, k in zip(rows, n)])
    return dict(input_ids=ids, attention_mask=torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows]), labels=lab)

EXTRA = ['Who wrote Macbeth?! ', '  tab\there\n\nnew line ', '', 'café naïve Ünïcödé x_y 3.14 ½ Ⅻ “quoted” — dash', "it's (a) [test]: {ok}."]

@pytest.fixture(scope='module')
def word_assets():
    "The shipped word-level assets and the texts their notebooks encode."
    fact_corpus = _find('fact_corpus', *_paper('trackstar'))
    author_qa, idk = _find('author_qa', *_paper('g_effect')), _find('IDK_ANSWERS', *_paper('g_effect'))
    fc, qa = fact_corpus(seed=0), author_qa(**load_asset('g_effect_qa_lm')[1]['author_qa'])
    return {'trackstar_fact_lm': (fc.passages, [q for q, _ in fc.queries], [o for _, o in fc.queries]),
            'g_effect_qa_lm': (qa.questions + qa.answers + list(idk), qa.questions, qa.answers)}

@pytest.mark.parametrize('name', ['trackstar_fact_lm', 'g_effect_qa_lm'])
def test_word_tokenizer_gives_the_shipped_assets_ids(word_assets, name):
    "For the vocabularies of the shipped assets and the texts the notebooks use: the same ids, batches, sizes as the hand-written tokenizer."
    vocab = load_asset(name)[1]['vocab']
    texts, prompts, targets = word_assets[name]
    tok = word_tokenizer(vocab)
    assert len(tok) == tok.vocab_size == len(vocab) and (tok.pad_token_id, tok.bos_token_id, tok.unk_token_id, pad_id(tok)) == (0, 1, 2, 0)
    for t in texts + prompts + EXTRA: assert tok.encode(t) == by_hand(vocab, t), t
    got, want = encode_texts(tok, texts), texts_by_hand(vocab, texts)
    assert all(torch.equal(got[k], want[k]) for k in want)
    got, want = encode_queries(tok, prompts, targets), queries_by_hand(vocab, prompts, targets)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert word_vocab(texts) == vocab   # the vocabulary was fitted on these texts
    for t in texts[:20]: assert tok.decode(tok.encode(t)) == ' '.join(re.findall(r"\w+|[^\w\s]", t))   # tokens joined by spaces
    assert tok.decode(encode_texts(tok, texts[:1])['input_ids'][0], skip_special_tokens=True) == ' '.join(re.findall(r"\w+|[^\w\s]", texts[0]))

def test_word_vocab_sorted_specials_first():
    v = word_vocab(['b a, c', 'a <s> d.'])
    assert v == ['<pad>', '<s>', '<unk>', ',', '.', '<', '>', 'a', 'b', 'c', 'd', 's']
    from tokenizers import pre_tokenizers as pt
    assert word_vocab(['x [PAD] y'], specials=['[PAD]', '[UNK]'], split=pt.WhitespaceSplit()) == ['[PAD]', '[UNK]', 'x', 'y']   # a special is never a word twice
    assert word_vocab(['x [PAD]'], specials=['[PAD]'], split='whitespace') == ['[PAD]', 'PAD', '[', ']', 'x']
    with pytest.raises(ConfigError, match='one string'): word_vocab('a b')

@pytest.mark.parametrize('fn, module', [('task_tokenizer', 'orion'), ('injection_tokenizer', 'orion'), ('calendar_tokenizer', 'multidim'), ('arith_tokenizer', 'adce')])
def test_word_tokenizer_serves_the_copies(fn, module):
    "The hand-built WordLevel tokenizers of orion, multidim and adce: word_tokenizer with their vocabulary and settings gives the same ids, decoding and specials."
    from tokenizers import pre_tokenizers as pt
    old = _find(fn, *_paper(module))()
    vocab = old.convert_ids_to_tokens(list(range(len(old))))
    if module == 'adce':
        new = word_tokenizer(vocab, pt.Sequence([pt.Whitespace(), pt.Digits(individual_digits=True)]), pad='<pad>', bos=None, unk='<unk>', eos='<eos>',
                             specials=['<mask>'], fuse=True)
        texts = ['Tom has 12 apples and gets 30 more . How many apples does Tom have ? <mask> 42', 'zzz 7']
    else:
        new = word_tokenizer(vocab, 'whitespace', pad='[PAD]', bos=None, unk='[UNK]')
        texts = [' '.join(vocab[2:]), 'Answer: x = 3, y; f(a): b.', 'The day near Monday is Sunday . Unknownword']
    for t in texts + EXTRA:
        assert new.encode(t) == old.encode(t), t
        assert new.decode(new.encode(t)) == old.decode(old.encode(t))
        assert new.decode(new.encode(t), skip_special_tokens=True) == old.decode(old.encode(t), skip_special_tokens=True)
    assert (len(new), pad_id(new), new.eos_token_id, sorted(new.all_special_tokens)) == (len(old), pad_id(old), old.eos_token_id, sorted(old.all_special_tokens))

def test_word_tokenizer_errors_and_settings():
    with pytest.raises(ConfigError, match=r"\{'bos': '<s>'\}"): word_tokenizer(['<pad>', '<unk>', 'a'])
    with pytest.raises(ConfigError, match=r"\{'unk': None\}"): word_tokenizer(['<pad>', '<s>', 'a'], unk=None)
    with pytest.raises(ConfigError, match=r"\['a', 'b'\] twice"): word_tokenizer(['<pad>', '<s>', '<unk>', 'a', 'b', 'a', 'b'])
    with pytest.raises(ConfigError, match='non-empty'): word_tokenizer([])
    with pytest.raises(ConfigError, match="Did you mean 'words'"): word_tokenizer(['<pad>', '<s>', '<unk>'], split='word')
    t = word_tokenizer(['<pad>', '<s>', '<unk>', '</s>', 'a'], eos='</s>')
    assert (t.eos_token_id, t('a a', add_special_tokens=True)['input_ids']) == (3, [4, 4])   # no special token is added by the tokenizer itself

def test_tiny_tokenizer_is_a_word_tokenizer():
    tt = tiny_tokenizer(16)
    assert (len(tt), tt.pad_token, tt.bos_token_id, tt.eos_token_id) == (16, None, 1, 1)
    assert tt.encode('w0 w10 w11 hello user') == [5, 15, 0, 0, 2]
    assert tt.decode([5, 6]) == 'w0 w1'
    with pytest.raises(ConfigError, match='More than 5'): tiny_tokenizer(5)

def test_deprecated_word_tokenizer_warns_and_keeps_its_attributes():
    from interpkit.models import WordTokenizer
    import interpkit.models as M
    assert 'WordTokenizer' not in M.__all__
    texts = ['To be, or not.', 'Who wrote Hamlet? Shakespeare.']
    with pytest.warns(FutureWarning, match='word_tokenizer'): wt = WordTokenizer.fit(texts)
    with pytest.warns(FutureWarning): wt2 = WordTokenizer(wt.vocab)
    assert wt.vocab == wt2.vocab == word_vocab(texts) and isinstance(wt, transformers.PreTrainedTokenizerFast)
    assert wt.ids == {w: i for i, w in enumerate(wt.vocab)} and WordTokenizer.split('a,b') == ['a', ',', 'b']
    t = 'Who wrote Macbeth?'
    assert wt.encode(t) == by_hand(wt.vocab, t) and wt.decode([1] + wt.encode(t) + [0, 0]) == 'Who wrote <unk> ?'
    assert all(torch.equal(a, b) for a, b in zip(encode_texts(wt, texts).values(), encode_texts(word_tokenizer(wt.vocab), texts).values()))
    assert repr(wt) == f'WordTokenizer(vocab_size={len(wt.vocab)})'

# ---------------------------------------------------------------- the character tokenizer: ASCII codes by hand

def ascii_by_hand(text): return [o if (o := ord(c)) < 128 else 63 for c in text]

def test_char_tokenizer_gives_ascii_codes_on_every_passage():
    ct = char_tokenizer()
    assert (len(ct), ct.vocab_size, ct.eos_token_id, ct.eos_token) == (128, 128, 0, '\x00')
    for t in EXTRA + ['\x00\x01\x7f\x80\uffff\U0001F600\r\n', ''.join(map(chr, range(128)))]:
        assert ct.encode(t) == ascii_by_hand(t), repr(t)
        assert ct.decode(ct.encode(t)) == ''.join(map(chr, ascii_by_hand(t)))
    docs = shakespeare_docs()
    assert all(ct.encode(d) == ascii_by_hand(d) for d in docs)

def test_char_tokenizer_gives_the_bilinear_assets_rows():
    "The shipped character-level model was trained on corpus(400_000, block=65, seed=0) of the hand-written tokenizer: the same rows."
    ct = char_tokenizer()
    got = corpus(400_000, ct, block=65, seed=0)
    want = corpus(400_000, lambda s: [0] if s == '\n\n' else ascii_by_hand(s), block=65, seed=0)   # end-of-text 0 between passages
    assert torch.equal(got, want) and got.shape == (6153, 65)
    assert load_asset('bilinear_char_lm')[1]['data'] == 'Shakespeare, 400,000 characters, corpus(seed=0, block=65)'

def test_deprecated_char_tokenizer():
    from interpkit.data import CharTokenizer
    import interpkit.data as D
    assert 'CharTokenizer' not in D.__all__
    with pytest.warns(FutureWarning, match='char_tokenizer'): ct = CharTokenizer()
    assert ct.encode('Ay, mé!') == ascii_by_hand('Ay, mé!') and ct.decode([65, 0]) == 'A\x00' and repr(ct) == 'CharTokenizer(vocab_size=128)'
    class Bos(CharTokenizer):   # as tests/test_multidim.py subclasses it
        def encode(self, text, add_special_tokens=True, **kw): return [1] * bool(add_special_tokens) + super().encode(text)
    with pytest.warns(FutureWarning): assert Bos().encode('ab') == [1, 97, 98]

# ---------------------------------------------------------------- the chat text: the copies' formulas

@pytest.fixture(scope='module')
def smol_tok():
    import interpkit.models as M
    return transformers.AutoTokenizer.from_pretrained(M._offline_lm_dir('smollm2-135m-instruct'))

def test_chat_text_is_each_copy(smol_tok):
    "models.chat_replies, safety_heads.chat_prompts, lsp.HFLLM, ted (two places), rm_contrast._texts and orion.chat_prompt, written out."
    for tok in (smol_tok, tiny_tokenizer()):
        for user in ('What is the capital of France?', 'w1 w2', 'Braces {x} and {{y}}'):
            gen = tok.apply_chat_template([{'role': 'user', 'content': user}], tokenize=False, add_generation_prompt=True)
            assert chat_text(tok, user) == chat_text(tok, user, fallback=None) == gen                # chat_replies, safety_heads, lsp, ted
            assert chat_text(tok, user) + 'THE ANSWER IS:' == gen + 'THE ANSWER IS:'                   # ted's judge, with its prefill
            assert chat_text(tok, user, 'Paris.') == tok.apply_chat_template([{'role': 'user', 'content': user}, {'role': 'assistant', 'content': 'Paris.'}], tokenize=False)  # rm_contrast
            assert chat_text(tok, user, fallback='{user}\nAnswer: ') + 'pre' == gen + 'pre'            # orion, with a template
    conv = [{'role': 'user', 'content': 'w1'}, {'role': 'assistant', 'content': 'w2'}, {'role': 'user', 'content': 'w3'}]
    assert chat_text(smol_tok, conv) == smol_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    plain = word_tokenizer(['<pad>', '<s>', '<unk>'])
    assert chat_text(plain, 'Q {x}?', fallback='{user}\nAnswer: ') + 'pre' == 'Q {x}?\nAnswer: pre'   # orion without a template
    assert (chat_text(plain, 'Hi'), chat_text(plain, 'Hi', 'Yo')) == ('User: Hi\nAssistant: ', 'User: Hi\nAssistant: Yo')
    with pytest.raises(ConfigError, match='has no chat template'): chat_text(plain, 'Hi', fallback=None)
    with pytest.raises(ConfigError, match='to format a conversation'): chat_text(plain, conv)
    with pytest.raises(ConfigError, match="fields \\['user', 'reply'\\]"): chat_text(plain, 'Hi', fallback='{user}{reply}')
    with pytest.raises(ConfigError, match='user is a dict'): chat_text(smol_tok, conv[0])

def test_chat_text_matches_the_modules_that_have_it(smol_tok):
    "Where the copies still exist, they give the same text."
    chat_prompts = _find('chat_prompts', 'interpkit.papers.safety_heads')
    assert chat_prompts(smol_tok, ['Hi', 'Yo']) == [chat_text(smol_tok, 'Hi'), chat_text(smol_tok, 'Yo')]
    chat_prompt = _find('chat_prompt', *_paper('orion'))
    plain = word_tokenizer(['<pad>', '<s>', '<unk>'])
    for tok in (smol_tok, plain): assert chat_prompt(tok, 'Q?', 'The answer is') == chat_text(tok, 'Q?', fallback='{user}\nAnswer: ') + 'The answer is'

# ---------------------------------------------------------------- greedy generation: a loop by hand

def greedy_by_hand(model, ids, n, stop):
    "One prompt alone, no padding: append the argmax of the last position's logits n times, or until a token in `stop`."
    ids = torch.tensor([ids])
    for _ in range(n):
        with torch.no_grad(): nxt = model(input_ids=ids).logits[0, -1].argmax().item()
        if nxt in stop: break
        ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    return ids[0].tolist()

PROMPTS = ['w1 w2 w3 w4 w5', 'w3', 'w7 w8', 'w9 w10 w11 w12 w13 w14 w15', 'w2']

def _want(model, tok, prompts, n, stop):
    return [tok.decode(greedy_by_hand(model, tok.encode(p), n, stop)[len(tok.encode(p)):], skip_special_tokens=True) for p in prompts]

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_generate_greedy_is_the_greedy_loop(arch, untouched):
    tok, m = tiny_tokenizer(), tiny_lm(arch, seed=3, eos_token_id=1, bos_token_id=1).train()
    want = _want(m.eval(), tok, PROMPTS, 7, {1})
    m.train()
    with untouched(m, tok):
        for bs in (1, 2, 5): assert generate_greedy(m, tok, PROMPTS, max_new_tokens=7, batch_size=bs) == want
    assert m.training

def test_generate_greedy_stops_at_the_tokenizers_eos():
    "A tokenizer whose end-of-sequence token is what the model writes third: the replies stop before it (the model's own eos, 1, stops too)."
    m, tt = tiny_lm('llama', seed=3, eos_token_id=1, bos_token_id=1), tiny_tokenizer()
    full = greedy_by_hand(m, tt.encode(PROMPTS[0]), 6, {1})[len(tt.encode(PROMPTS[0])):]
    vocab = tt.convert_ids_to_tokens(list(range(len(tt))))
    eos = vocab[full[2]]
    assert eos not in {vocab[i] for i in full[:2]}, 'pick another prompt: the third token repeats'
    tok = word_tokenizer(vocab, 'whitespace', pad=None, bos=None, unk='<unk>', eos=eos)
    assert generate_greedy(m, tok, PROMPTS[:1], max_new_tokens=6) == [' '.join(vocab[i] for i in full[:2])]
    assert generate_greedy(m, tok, PROMPTS, max_new_tokens=6, batch_size=5) == _want(m, tok, PROMPTS, 6, {1, full[2]})

def test_generate_greedy_float64_eager_left_padding():
    "Left padding with eager attention in float64 gives the padded rows NaN logits in some transformers versions (here: recorded below); the replies are still the greedy loop's."
    tok, m = tiny_tokenizer(), tiny_lm('llama', seed=3, eos_token_id=1, bos_token_id=1).double()
    assert m.config._attn_implementation == 'eager'
    enc = encode_left(tok, PROMPTS, position_ids=False)
    with torch.no_grad(): finite = torch.isfinite(m(**enc).logits).all((1, 2))
    padded = enc['attention_mask'].eq(0).any(1)
    print(f"transformers {transformers.__version__}: rows with NaN logits {(~finite).nonzero()[:, 0].tolist()}, padded rows {padded.nonzero()[:, 0].tolist()}")
    assert finite[~padded].all()   # rows without padding are always finite
    want = _want(m, tok, PROMPTS, 7, {1})
    assert generate_greedy(m, tok, PROMPTS, max_new_tokens=7, batch_size=5) == want
    if not finite.all():           # what model.generate alone gives: token 0 (argmax of NaN) where a row is NaN
        g = m.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=pad_id(tok))
        assert (g[~finite, enc['input_ids'].shape[1]:] == 0).all()

def test_generate_greedy_raises_on_non_finite_logits():
    tok, m = tiny_tokenizer(), tiny_lm('llama', seed=3, eos_token_id=1, bos_token_id=1)
    bad = copy.deepcopy(m)
    with torch.no_grad(): bad.model.embed_tokens.weight[tok.convert_tokens_to_ids('w7')] = float('nan')   # prompts with w7 only
    with pytest.raises(NotFiniteError, match=r"prompt 2 \('w7 w8'\) are not finite.*dtype"): generate_greedy(bad, tok, PROMPTS, max_new_tokens=3, batch_size=2)
    assert bad.generation_config.to_dict() == m.generation_config.to_dict()

def test_generate_greedy_sampling_settings_no_warning_no_generation_config(caplog):
    "A generation config that samples (temperature, top_p) neither changes the greedy replies nor makes generate warn; a model without one works too."
    tok, m = tiny_tokenizer(), tiny_lm('llama', seed=3, eos_token_id=1, bos_token_id=1)
    want = generate_greedy(m, tok, PROMPTS, max_new_tokens=5)
    m.generation_config.update(do_sample=True, temperature=0.7, top_p=0.9, top_k=20)
    before = m.generation_config.to_dict()
    with warnings.catch_warnings(record=True) as w, caplog.at_level(logging.WARNING):
        warnings.simplefilter('always')
        got = generate_greedy(m, tok, PROMPTS, max_new_tokens=5)
    assert got == want and m.generation_config.to_dict() == before
    assert not [x for x in w if 'generat' in str(x.message).lower() or 'sampl' in str(x.message).lower()], [str(x.message) for x in w]
    assert not [r for r in caplog.records if 'flag' in r.getMessage() or 'sampl' in r.getMessage()], [r.getMessage() for r in caplog.records]
    m.generation_config = None
    assert generate_greedy(m, tok, PROMPTS, max_new_tokens=5) == want and m.generation_config is None

def test_generate_greedy_errors():
    tok, m = tiny_tokenizer(), tiny_lm('llama', seed=3)
    with pytest.raises(ConfigError, match='generate_greedy got do_sample, temperature'): generate_greedy(m, tok, PROMPTS, do_sample=True, temperature=0.5)
    with pytest.raises(ConfigError, match='a single str'): generate_greedy(m, tok, 'w1')
    with pytest.raises(ConfigError, match='no prompts'): generate_greedy(m, tok, [])
    with pytest.raises(ConfigError, match='not all strings'): generate_greedy(m, tok, ['w1', 3])
    with pytest.raises(ConfigError, match='max_new_tokens=0 is not valid'): generate_greedy(m, tok, PROMPTS, max_new_tokens=0)
    with pytest.raises(ConfigError, match='causal language model'): generate_greedy(tiny_lm('bert'), tok, PROMPTS)

def test_chat_replies_is_generate_greedy_on_chat_text(untouched):
    tok, m = tiny_tokenizer(), tiny_lm('llama', seed=3, eos_token_id=1, bos_token_id=1)
    convs = ['w1 w2', [{'role': 'user', 'content': 'w3'}, {'role': 'assistant', 'content': 'w4'}, {'role': 'user', 'content': 'w5 w6'}]]
    with untouched(m, tok):
        got = chat_replies(m, tok, convs, max_new_tokens=6, batch_size=2)
        assert got == generate_greedy(m, tok, [chat_text(tok, c) for c in convs], max_new_tokens=6)
        assert got == _want(m, tok, [chat_text(tok, c) for c in convs], 6, {1})
        assert chat_replies(m, tok, convs, max_new_tokens=6, do_sample=False, temperature=0.3) == got   # greedy settings as before
        torch.manual_seed(0)
        assert len(chat_replies(m, tok, convs, max_new_tokens=3, do_sample=True)) == 2
    with pytest.raises(ConfigError, match='has no chat template'): chat_replies(m, word_tokenizer(['<pad>', '<s>', '<unk>']), ['x'])

# ---------------------------------------------------------------- resolving a model and its tokenizer

def test_resolve_lm(tmp_path):
    m, tok = tiny_lm('llama'), tiny_tokenizer()
    assert resolve_lm(m, tok) == (m, tok)
    m.save_pretrained(tmp_path); tok.save_pretrained(tmp_path)
    m2, t2 = resolve_lm(str(tmp_path))
    assert type(m2).__name__ == 'LlamaForCausalLM' and t2.encode('w0 w1') == [5, 6] and not m2.training
    m3, t3 = resolve_lm(tmp_path, tok)
    assert t3 is tok
    with torch.no_grad(): torch.testing.assert_close(m3(torch.tensor([[5, 6]])).logits, m(torch.tensor([[5, 6]])).logits)
    with pytest.raises(ConfigError, match='ted got a LlamaForCausalLM object but no tokenizer'): resolve_lm(m, what='ted')
    with pytest.raises(ConfigError, match='causal language model'): resolve_lm(tiny_lm('bert'), tok)

# ---------------------------------------------------------------- batch checks: what the four copies checked

def test_check_batch_accepts_what_the_copies_accepted():
    tok = tiny_tokenizer()
    texts = encode_texts(tok, ['w1 w2 w3', 'w4'])                                                    # trackstar: encode_texts, encode_queries
    assert check_batch(texts) == texts and check_batch(texts)['input_ids'] is texts['input_ids']
    q = encode_queries(tok, ['w1 w2', 'w3'], ['w4', 'w5 w6'])                                         # g_effect: labels with answer tokens
    assert check_batch(q, 'forget', need_labels=True) == q
    left = encode_left(tok, ['w1', 'w2 w3 w4'], position_ids=False)                                   # safety_heads, orion: left-padded prompts
    full = check_batch(left, 'dst', min_len=2, left_padded=True, complete=True)
    assert torch.equal(full['position_ids'], torch.tensor([[0, 0, 0], [0, 1, 2]])) and torch.equal(full['attention_mask'], left['attention_mask'])
    bare = check_batch({'input_ids': torch.tensor([[3, 4, 5]], dtype=torch.int32)}, complete=True)
    assert bare['attention_mask'].tolist() == [[1, 1, 1]] and bare['position_ids'].tolist() == [[0, 1, 2]]
    be = tok(['w1 w2'], return_tensors='pt')                                                          # a BatchEncoding
    assert isinstance(be, transformers.BatchEncoding) and type(check_batch(be)) is dict

def test_check_batch_errors_say_what_was_given():
    tok = tiny_tokenizer()
    q = encode_queries(tok, ['w1 w2', 'w3'], ['w4', 'w5 w6 w7'])   # row 0 ends in padding
    bad = [((torch.ones(2, 3, dtype=torch.long),), {}, ShapeError, 'batch is a Tensor.'),
           (({'input_ids': torch.ones(3, dtype=torch.long)},), {}, ShapeError, r'input_ids is a torch.int64 tensor of shape \(3,\)'),
           (({'input_ids': torch.ones(2, 3)},), {}, ShapeError, 'torch.float32 tensor'),
           (({'input_ids': torch.ones(2, 3, dtype=torch.bool)},), {}, ShapeError, 'torch.bool tensor'),
           (({'input_ids': [[1, 2]]},), {}, ShapeError, 'input_ids is a list'),
           (({'input_ids': torch.ones(0, 3, dtype=torch.long)},), {}, ShapeError, 'batch >= 1'),
           ((q,), {'min_len': 9}, ShapeError, 'pos >= 9'),
           (({**q, 'attention_mask': q['attention_mask'][:, 1:]},), {}, ShapeError, r"\['attention_mask'\] is a torch.int64 tensor of shape \(2, 4\)"),
           (({**q, 'labels': q['labels'].float()},), {}, ShapeError, 'One integer value per token'),
           (({**q, 'position_ids': [0]},), {}, ShapeError, r"\['position_ids'\] is a list"),
           (({**q, 'attention_mask': q['attention_mask'] * torch.tensor([[1], [0]])},), {}, ShapeError, r'Rows \[1\] of batch are all padding'),
           ((q,), {'left_padded': True, 'what': 'dst'}, ShapeError, r'last position of dst is padding in rows \[0\]'),
           (({'input_ids': q['input_ids']},), {'need_labels': True, 'what': 'forget'}, ShapeError, 'forget has no labels'),
           (({**q, 'labels': torch.full_like(q['labels'], -100)},), {'need_labels': True}, ConfigError, 'no labelled token')]
    for args, kw, err, msg in bad:
        with pytest.raises(err, match=msg): check_batch(*args, **kw)
    with pytest.raises(ShapeError, match='Do this.'): check_batch([], todo='Do this.')

def test_check_batch_size_on_check_int():
    import numpy as np
    assert check_batch_size(3) == 3 and check_batch_size(np.int64(4)) == 4 and type(check_batch_size(np.int64(4))) is int
    for bad in (0, -2, 2.0, True, '8', None):
        with pytest.raises(ConfigError, match=f"batch_size={bad!r} is not valid.*not a positive integer"): check_batch_size(bad)
        with pytest.raises(ConfigError): list(iter_batches([1, 2], bad))

def test_pad_left_by_hand():
    g = random.Random(0)
    rows = [[g.randrange(3, 50) for _ in range(g.randint(1, 6))] for _ in range(7)]
    T = max(map(len, rows))
    b = pad_left(rows, 1)
    assert b['input_ids'].tolist() == [[1] * (T - len(r)) + r for r in rows]
    assert b['attention_mask'].tolist() == [[0] * (T - len(r)) + [1] * len(r) for r in rows]
    assert b['position_ids'].tolist() == [[0] * (T - len(r)) + list(range(len(r))) for r in rows]
    tok = tiny_tokenizer()
    texts = ['w1 w2 w3', 'w4', 'w5 w6']
    enc = encode_left(tok, texts)
    assert all(torch.equal(v, enc[k]) for k, v in pad_left([tok.encode(t) for t in texts], pad_id(tok)).items())
    assert set(pad_left(rows, 0, position_ids=False)) == {'input_ids', 'attention_mask'}
    with pytest.raises(ConfigError, match='no rows'): pad_left([], 0)

# ---------------------------------------------------------------- last-position logits

class _Plain(torch.nn.Module):
    "A model whose forward takes no logits_to_keep and has no output embeddings: full logits, sliced; records its keyword arguments."
    def __init__(self, m): super().__init__(); self.m, self.kw = m, []
    def forward(self, input_ids, attention_mask=None, use_cache=None): self.kw.append(use_cache); return self.m(input_ids=input_ids, attention_mask=attention_mask).logits

@pytest.mark.parametrize('arch', ['llama', 'gpt2', 'bert', 'plain'])
def test_logits_at_negative_is_one_position(arch):
    "What orion, multidim, safety_heads and cnl compute by hand: logits[:, -1] of a (left-padded) batch."
    m = _Plain(tiny_lm('llama', seed=1)) if arch == 'plain' else tiny_lm(arch, seed=1)
    enc = encode_left(tiny_tokenizer(), ['w1 w2 w3', 'w4'], position_ids=False)
    with torch.no_grad():
        full = logits_of(m(**enc))
        if arch == 'plain': m.kw.clear()
        for j in (1, 2, 3):
            got = logits_at(m, enc, -j)
            assert got.shape == (2, 128) and got.is_contiguous()
            torch.testing.assert_close(got, full[:, -j], atol=1e-5, rtol=0)
        torch.testing.assert_close(logits_at(m, enc, 2), full[:, -2:], atol=1e-5, rtol=0)
    if arch == 'plain': assert m.kw and all(k is False for k in m.kw)   # no key-value cache asked for
    with pytest.raises(ConfigError, match='negative int -j'): logits_at(m, enc, 0)

def test_logits_at_keeps_no_cache():
    m, seen = tiny_lm('llama', seed=1), []
    h = m.register_forward_pre_hook(lambda mod, args, kw: seen.append(kw.get('use_cache')), with_kwargs=True)
    with torch.no_grad(): logits_at(m, {'input_ids': torch.tensor([[5, 6, 7]])}, -1); logits_at(m, {'input_ids': torch.tensor([[5, 6, 7]]), 'use_cache': True}, 1)
    h.remove()
    assert seen == [False, True]   # the caller's choice is kept

# ---------------------------------------------------------------- training, saving and loading tiny LMs

def _reference_training(tokenizer, data, steps, batch_size, lr, seed, shape):
    "A plain loop: the seeded tiny Llama, AdamW at a constant rate, rows drawn with a generator seeded `seed`, `lm_loss`."
    model = tiny_lm('llama', vocab_size=len(tokenizer), seed=seed, **shape).train()
    opt, gen = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0), torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(0, data['input_ids'].shape[0], (batch_size,), generator=gen)
        loss = lm_loss(model, {k: v[i] for k, v in data.items()})
        opt.zero_grad(); loss.backward(); opt.step()
    return model.eval()

SHAPE = dict(n_layers=1, d_model=32, n_heads=2, max_len=32)

def test_train_tiny_lm_is_the_plain_loop():
    texts = ['one two three .', 'two three four .', 'three four five six .', 'five six .']
    tok = word_tokenizer(word_vocab(texts))
    res = train_tiny_lm(tok, texts, steps=4, batch_size=3, lr=1e-2, seed=2, progress=False, warmup=0, schedule='constant', **SHAPE)
    ref = _reference_training(tok, encode_texts(tok, texts), 4, 3, 1e-2, 2, SHAPE)
    assert isinstance(res, Trained) and isinstance(res.fit, FitResult) and res.tokenizer is tok and not res.model.training
    assert all(torch.equal(a, b) for a, b in zip(res.model.state_dict().values(), ref.state_dict().values()))
    same = train_tiny_lm(tok, encode_texts(tok, texts), steps=4, batch_size=3, lr=1e-2, seed=2, progress=False, warmup=0, schedule='constant', **SHAPE)
    assert all(torch.equal(a, b) for a, b in zip(res.model.parameters(), same.model.parameters()))   # a list of texts is its encode_texts batch

def test_train_tiny_lm_on_generated_documents():
    "Documents drawn afresh for each batch with a random.Random seeded from fit's generator; the loss falls; same seed, same weights; shape settings reach the model."
    tok = word_tokenizer(word_vocab(['a b c d e f .']))
    seen = []
    def doc(rng):
        s = rng.randrange(4); seen.append(s)
        return ' '.join('abcdef'[s:s + 3]) + ' .'
    r1 = train_tiny_lm(tok, doc, steps=60, batch_size=8, lr=1e-2, seed=0, progress=False, **SHAPE)
    assert len(seen) == 60 * 8 and r1.fit.final_loss < 0.6 * r1.fit.history.loss.iloc[0]
    r2 = train_tiny_lm(tok, doc, steps=60, batch_size=8, lr=1e-2, seed=0, progress=False, **SHAPE)
    assert all(torch.equal(a, b) for a, b in zip(r1.model.parameters(), r2.model.parameters())) and seen[:480] == seen[480:]
    assert r1.model.config.num_hidden_layers == 1 and r1.model.config.vocab_size == len(tok)
    r3 = train_tiny_lm(tok, doc, steps=2, batch_size=2, progress=False, grad_clip=0.5, **SHAPE)
    assert 'grad_norm' in r3.fit.history
    with pytest.raises(ShapeError, match='documents is a int'): train_tiny_lm(tok, 3, steps=2, progress=False)

def test_train_tiny_lm_convert_and_loss_fn():
    tok = word_tokenizer(word_vocab(['a b c .']))
    calls = []
    def convert(m): calls.append(type(m).__name__); m.model.norm.weight.requires_grad_(False); return m
    def loss_fn(m, b): calls.append('loss'); return lm_loss(m, b) * 2
    r = train_tiny_lm(tok, ['a b c .'], steps=2, batch_size=1, progress=False, convert=convert, loss_fn=loss_fn, **SHAPE)
    assert calls == ['LlamaForCausalLM', 'loss', 'loss'] and torch.equal(r.model.model.norm.weight, torch.ones(32))

def test_save_and_load_tiny_lm(tmp_path):
    texts = ['one two three .', 'two three four .']
    tok = word_tokenizer(word_vocab(texts))
    trained = train_tiny_lm(tok, texts, steps=3, batch_size=2, progress=False, **SHAPE)
    assets = tmp_path/'pkg'/'assets'; (tmp_path/'tools').mkdir(); (tmp_path/'tools'/'make_counting.py').write_text("save_tiny_lm(model, tokenizer, 'counting')")
    save_tiny_lm(trained.model, tok, 'counting', {'recipe': 'test'}, folder=assets)
    meta = json.loads((assets/'counting.json').read_text())
    assert meta['tiny_lm'] == {**SHAPE, 'vocab_size': len(tok)} and meta['vocab'] == word_vocab(texts) and meta['recipe'] == 'test'
    shipped = load_tiny_lm('counting', folder=assets)
    assert isinstance(shipped, Shipped) and not shipped.model.training and shipped.meta['recipe'] == 'test'
    assert all(torch.equal(a, b) for a, b in zip(shipped.model.state_dict().values(), trained.model.state_dict().values()))
    for t in texts + ['four one zero']: assert shipped.tokenizer.encode(t) == tok.encode(t)
    model, tokenizer, meta2 = shipped                                                                       # unpacks
    assert meta2 is shipped.meta and 'Shipped(model=LlamaForCausalLM (' in repr(shipped)
    other = word_tokenizer(word_vocab(texts + ['five']))
    with pytest.raises(ConfigError, match=r"8 tokens against 9, first different at id 4.*python tools/make_counting.py"): load_tiny_lm('counting', other, folder=assets)
    with pytest.raises(ConfigError, match="no 'tiny_lm' settings"):
        from interpkit.train import save_asset
        save_asset('raw', trained.model, folder=assets); load_tiny_lm('raw', tok, folder=assets)

def test_save_tiny_lm_other_tokenizers_and_models(tmp_path):
    ct = char_tokenizer()
    m = tiny_lm('llama', **SHAPE)
    save_tiny_lm(m, ct, 'chars', folder=tmp_path)
    with pytest.raises(ConfigError, match="not a default word_tokenizer's"): load_tiny_lm('chars', folder=tmp_path)   # no <pad>: say which tokenizer
    assert load_tiny_lm('chars', ct, folder=tmp_path).tokenizer is ct
    save_tiny_lm(m, None, 'novocab', folder=tmp_path)
    with pytest.raises(ConfigError, match='saved no vocabulary'): load_tiny_lm('novocab', folder=tmp_path)
    with pytest.raises(ConfigError, match='has 128 tokens, the tokenizer given 14'): load_tiny_lm('novocab', word_tokenizer(word_vocab(['a b c d e f g h i j k'])), folder=tmp_path)
    with pytest.raises(ConfigError, match="without meta\\['tiny_lm'\\]"): save_tiny_lm(tiny_lm('gpt2'), None, 'gpt', folder=tmp_path)
    save_tiny_lm(tiny_lm('gpt2', n_layers=1, seed=4), None, 'gpt', meta={'tiny_lm': {'arch': 'gpt2', 'n_layers': 1}}, folder=tmp_path)   # any tiny_lm, with its settings
    assert type(load_tiny_lm('gpt', ct, folder=tmp_path).model).__name__ == 'GPT2LMHeadModel'
    with pytest.warns(FutureWarning):
        from interpkit.models import WordTokenizer
        wt = WordTokenizer.fit(['a b c'])
    save_tiny_lm(tiny_lm('llama', vocab_size=len(wt.vocab), **SHAPE), wt, 'old', folder=tmp_path)   # the deprecated tokenizer's list
    assert load_tiny_lm('old', folder=tmp_path).meta['vocab'] == wt.vocab

# ---------------------------------------------------------------- the shipped assets, through load_tiny_lm and through each module's loader

def _tokenizer_of(name):
    "The tokenizer each module's loader uses for the asset (None: load_tiny_lm's default, from the asset's vocabulary)."
    return {'orion_task_lm': lambda: _find('task_tokenizer', *_paper('orion'))(), 'orion_injection_lm': lambda: _find('injection_tokenizer', *_paper('orion'))(),
            'multidim_calendar_lm': lambda: _find('calendar_tokenizer', *_paper('multidim'))(), 'bilinear_char_lm': char_tokenizer}.get(name, lambda: None)()

LOADERS = {'trackstar_fact_lm': ('load_fact_lm', 'trackstar'), 'g_effect_qa_lm': ('load_qa_lm', 'g_effect'), 'orion_task_lm': ('load_task_lm', 'orion'),
           'orion_injection_lm': ('load_injection_lm', 'orion'), 'multidim_calendar_lm': ('load_calendar_lm', 'multidim'), 'bilinear_char_lm': ('load_char_lm', 'bilinear')}

@pytest.mark.parametrize('name', list(LOADERS))
def test_load_tiny_lm_loads_every_shipped_asset_as_its_loader(name):
    "The current assets, unchanged: the same weights (and logits) and the same token ids as the module's own loader."
    fn, paper = LOADERS[name]
    convert = _find('to_bilinear', 'interpkit.papers.bilinear') if paper == 'bilinear' else None
    shipped = load_tiny_lm(name, _tokenizer_of(name), convert=convert)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        model, tokenizer, meta = _find(fn, *_paper(paper))()
    tensors = load_asset(name)[0]
    assert set(shipped.model.state_dict()) == set(tensors) and all(torch.equal(shipped.model.state_dict()[k], v) for k, v in tensors.items())
    assert all(torch.equal(a, b) for a, b in zip(shipped.model.state_dict().values(), model.state_dict().values()))
    assert shipped.meta == meta and not shipped.model.training
    vocab = meta.get('vocab') or [chr(i) for i in range(128)]
    texts = [' '.join(vocab[3:40]), ' '.join(vocab[-30:]) + ' ?', 'Where was Jora Rowan born ? Unknownword .', 'Ay, me! To be, or not.\n']
    for t in texts: assert shipped.tokenizer.encode(t, add_special_tokens=False) == tokenizer.encode(t, add_special_tokens=False), (name, t)
    ids = encode_texts(shipped.tokenizer, texts[:2])
    with torch.no_grad(): assert torch.equal(shipped.model(ids['input_ids']).logits, model(ids['input_ids']).logits)
