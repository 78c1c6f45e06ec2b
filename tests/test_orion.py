"""Tests of interpkit.papers.orion: request-patching identities on a tiny Llama, items checked by an independent parser, typed errors, model untouched."""
import copy, os, re
import pytest, torch
from interpkit.models import tiny_lm
from interpkit.errors import ConfigError, ShapeError, SiteError
from interpkit.models import encode_left as encode
from interpkit.papers.orion import (DOMAINS, INJECTIONS, Item, make_items, render, injected, request_patch, _check_enc, answer_id, prompt,
                                   task_tokenizer, last_logits, oversight, patch_report, top_tokens, sweep)

os.environ.setdefault('HF_HUB_OFFLINE', '1')

def batch(b, t, seed, pad=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long); mask[: b // 2, :pad] = 0
    return dict(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))

SITES = [f'{s}({l})' for l in range(3) for s in ('resid_post', 'attn_out', 'mlp_out')]

@pytest.mark.parametrize('pad', [0, 3])
def test_self_patch_changes_nothing(pad):
    m = tiny_lm('llama', n_layers=3, seed=1)
    a = batch(4, 10, 0, pad)
    r = request_patch(m, a, a, SITES)
    with torch.no_grad(): full = m(**a).logits[:, -1]  # plain forward, no cache: independent reference
    torch.testing.assert_close(r.dst, full, atol=1e-5, rtol=1e-5)
    for s in SITES: torch.testing.assert_close(r.patched[s], full, atol=1e-5, rtol=1e-5)

def test_final_layer_patch_reproduces_source_distribution():
    m = tiny_lm('llama', n_layers=3, seed=2)
    a, b = batch(5, 8, 1, pad=2), batch(5, 11, 2)
    r = request_patch(m, a, b, ['resid_post(2)'])
    with torch.no_grad(): ref = m(**a).logits[:, -1].softmax(-1)
    torch.testing.assert_close(r.patched['resid_post(2)'].softmax(-1), ref, atol=1e-6, rtol=1e-5)
    assert (r.dst.softmax(-1) - ref).abs().max() > 1e-4  # the destination alone differs

def test_patch_equals_uncached_manual_patch():
    "The cached single-token step under a patch equals a full forward with a hand-written hook."
    m = tiny_lm('llama', n_layers=3, seed=3)
    a, b = batch(3, 7, 3), batch(3, 9, 4)
    r = request_patch(m, a, b, ['resid_post(1)'])
    store = {}
    h = m.model.layers[1].register_forward_hook(lambda mod, i, o: store.__setitem__('x', (o[0] if isinstance(o, tuple) else o)[:, -1].clone()))
    with torch.no_grad(): m(**a)
    h.remove()
    def put(mod, i, o):
        t = o[0] if isinstance(o, tuple) else o
        t = t.clone(); t[:, -1] = store['x']
        return (t, *o[1:]) if isinstance(o, tuple) else t
    h = m.model.layers[1].register_forward_hook(put)
    with torch.no_grad(): ref = m(**b).logits[:, -1]
    h.remove()
    torch.testing.assert_close(r.patched['resid_post(1)'], ref, atol=1e-5, rtol=1e-5)

PAT = {'story': r'(\w+) lives in (\w+)\.', 'code': r'^(\w) = (\d)$', 'table': r'^\| (\w+) \| (\w+) \|$', 'list': r'^- (\w+): (\w+)$'}
Q = {'story': r'Where does (\w+) live\?', 'code': r'What is the value of (\w)\?', 'table': r'What is the favorite color of (\w+)\?', 'list': r'What is the job of (\w+)\?'}

@pytest.mark.parametrize('domain', list(DOMAINS))
def test_items_consistent_with_their_text(domain):
    for it in make_items(domain, 30, seed=7):
        for r, c in [(it.r1, it.c1), (it.r2, it.c2), (it.r1, it.c2)]:
            user, pre = render(domain, c, r)
            pairs = dict(re.findall(PAT[domain], user, flags=re.M))
            asked = re.search(Q[domain], user).group(1)
            assert len(pairs) == len(c) and asked == r and pairs[asked] == it.answer(r, c)
            assert r in pre
        assert len({it.answer(it.r1, it.c1), it.answer(it.r2, it.c2), it.answer(it.r1, it.c2)}) == 3

def test_bad_input_raises_typed_errors():
    m = tiny_lm('llama', n_layers=2)
    a = batch(2, 5, 0)
    with pytest.raises(ConfigError): make_items('poem')
    with pytest.raises(ConfigError): make_items('code', n=0)
    with pytest.raises(ConfigError): render('code', make_items('code', 1)[0].c1, 'nope')
    with pytest.raises(ShapeError): request_patch(m, a, batch(3, 5, 1), ['resid_post(0)'])
    with pytest.raises(ShapeError): request_patch(m, {'input_ids': torch.zeros(2, 1, dtype=torch.long)}, a, ['resid_post(0)'])
    with pytest.raises(SiteError): request_patch(m, a, a, ['resid_post(5)'])

def test_model_unchanged_after_success_and_error():
    m = tiny_lm('llama', n_layers=2).train()
    m.model.layers[0].eval()                      # a mixed state must come back as it was
    flags = [mod.training for mod in m.modules()]
    before = copy.deepcopy(m.state_dict())
    a = batch(2, 6, 0)
    request_patch(m, a, batch(2, 4, 1), ['resid_post(0)', 'mlp_out(1)'])
    with pytest.raises(SiteError): request_patch(m, a, a, ['resid_post(0)', 'bogus(1)'])
    assert [mod.training for mod in m.modules()] == flags
    for k, v in m.state_dict().items(): assert torch.equal(v, before[k])
    for mod in m.modules(): assert not mod._forward_hooks and not mod._forward_pre_hooks


def test_task_tokenizer_every_key_and_value_is_one_known_word():
    tok = task_tokenizer()
    for d, (keys, vals, *_) in DOMAINS.items():
        for it in make_items(d, 10, seed=5):
            for r, c in [(it.r1, it.c1), (it.r2, it.c2), (it.r1, it.c2)]:
                t = prompt(tok, d, c, r)
                assert tok.unk_token_id not in tok(t)['input_ids']
                assert tok.decode([answer_id(tok, t, it.answer(r, c))]) == it.answer(r, c)
        for w in keys + vals: assert len(tok(w)['input_ids']) == 1, w

def test_injected_line_sits_between_context_and_question():
    for d in DOMAINS:
        it = make_items(d, 1, seed=2)[0]
        clean, _ = render(d, it.c2, it.r1)
        for kind in INJECTIONS:
            user, pre = injected(d, it.c2, it.r1, kind, 'XVAL', it.r2)
            lines, base = user.splitlines(), clean.splitlines()
            assert lines[:-2] == base[:-1] and lines[-1] == base[-1]   # context and question untouched
            assert ('XVAL' in lines[-2]) == (kind != 'redirect') and (it.r2 in lines[-2]) == (kind == 'redirect')
    with pytest.raises(ConfigError): injected('code', it.c2, it.r1, 'nope', 'x', 'k')

def test_last_logits_and_patch_report_against_plain_forward():
    tok = task_tokenizer()
    m = tiny_lm('llama', n_layers=2, vocab_size=len(tok), seed=4, max_len=256)
    it = make_items('code', 1, seed=1)[0]
    src, dst = prompt(tok, 'code', it.c1, it.r1), prompt(tok, 'code', it.c2, it.r2)
    with torch.no_grad(): ref_src, ref_dst = (m(**tok(t, return_tensors='pt')).logits[0, -1] for t in (src, dst))
    torch.testing.assert_close(last_logits(m, encode(tok, [dst]))[0], ref_dst, atol=1e-5, rtol=1e-5)
    rep = patch_report(m, tok, it, 'resid_post(1)', k=4)           # final layer: the source's distribution
    p = ref_src.softmax(-1)
    top = p.topk(4)
    assert [t for t, _ in rep['patched']] == [tok.decode([i]) for i in top.indices.tolist()]
    assert all(abs(q - v) < 1e-3 for (_, q), v in zip(rep['patched'], top.values.tolist()))
    assert rep['answers'] == {'r1c1': it.answer(it.r1, it.c1), 'r2c2': it.answer(it.r2, it.c2), 'r1c2': it.answer(it.r1, it.c2)}

def test_oversight_and_sweep_leave_model_untouched():
    tok = task_tokenizer()
    m = tiny_lm('llama', n_layers=2, vocab_size=len(tok), seed=5, max_len=256).train()
    before = copy.deepcopy(m.state_dict())
    its = [it for d in DOMAINS for it in make_items(d, 2, seed=3)]
    ov = oversight(m, tok, its, 'resid_post(0)')
    assert set(ov.kind) == set(INJECTIONS) and set(ov.when) == {'before', 'after'} and ov.n.sum() == 2 * len(INJECTIONS) * len(its)
    res = sweep(m, tok, its, ['resid_post(0)'], keep_correct=False)
    assert len(res.survivors) == len(its) and res.scores.n.sum() == len(its)
    with pytest.raises(ConfigError): oversight(m, tok, its, 'resid_post(0)', kinds=['shout'])
    with pytest.raises(SiteError): oversight(m, tok, its, 'resid_post(9)')
    assert m.training and all(mod.training for mod in m.modules())
    for k, v in m.state_dict().items(): assert torch.equal(v, before[k])
    for mod in m.modules(): assert not mod._forward_hooks and not mod._forward_pre_hooks

def _context_pairs(text):
    "Key -> value of a document's context, parsed from whichever template the first line matches (independent of `render`)."
    pats = [r'(\w+) lives in (\w+)\.', r'^(\w) = (\d)$', r'^\| (\w+) \| (\w+) \|$', r'^- (\w+): (\w+)$']
    ctx = text.split('\nWhat')[0].split('\nWhere')[0]
    found = [dict(re.findall(p, ctx, flags=re.M)) for p in pats]
    found = [f for f in found if f and 'name' not in f]
    assert len(found) == 1, ctx
    return found[0]

def test_task_documents_answer_every_question_from_their_context():
    from interpkit.papers.orion import task_document
    import random
    rng, n = random.Random(7), 0
    for _ in range(300):
        text = task_document(rng, 5)
        pairs = _context_pairs(text)
        assert 2 <= len(pairs) <= 4
        for line in text.split('\n'):
            if line.startswith('Answer:'):
                words = re.findall(r"\w+", line)
                key = words[1]; assert pairs[key] == words[-1], (line, pairs); n += 1
    assert n == 1500

def test_recall_documents_consistent_and_seeded():
    from interpkit.papers.orion import recall_document
    import random
    for s in range(50):
        text = recall_document(random.Random(s), 3)
        assert text == recall_document(random.Random(s), 3)
        head, *qs = text.split(' Answer : ')
        w = head.split(); pairs = dict(zip(w[::2], w[1::2]))
        assert len(pairs) == len(w) // 2 and len(qs) == 3
        assert all(pairs[q.split()[0]] == q.split()[1] for q in qs)
        assert {d for d, spec in DOMAINS.items() if set(pairs) <= set(spec[0]) and set(pairs.values()) <= set(spec[1])}  # one domain's words

def test_shipped_task_lm_answers_and_decomposes():
    "The shipped toy model answers fresh items and request-patching after block 1 gives R1(C2); its weights are untouched by the sweep."
    from interpkit.papers.orion import load_task_lm
    m, tok = load_task_lm()
    before = copy.deepcopy(m.state_dict())
    items = [it for d in DOMAINS for it in make_items(d, 6, seed=11)]
    r = sweep(m, tok, items, ['resid_post(0)', 'resid_post(3)'])
    assert r.base.survivors.sum() >= 0.9 * len(items), r.base
    by = r.scores.set_index('layer')
    assert by.loc[0].acc_r1c2.min() >= 0.8 and by.loc[3].acc_r1c1.min() >= 0.8, r.scores
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())

def test_train_task_lm_is_seeded_and_rejects_bad_fraction():
    from interpkit.papers.orion import train_task_lm
    a, tok, ra = train_task_lm(3, batch_size=4, progress=False, n_layers=1, d_model=16)
    b, _, _ = train_task_lm(3, batch_size=4, progress=False, n_layers=1, d_model=16)
    c, _, _ = train_task_lm(3, batch_size=4, progress=False, n_layers=1, d_model=16, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))
    assert not a.training and len(ra.history) == 3
    with pytest.raises(ConfigError, match='recall_frac'): train_task_lm(2, recall_frac=-0.1)
