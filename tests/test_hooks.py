"""Tests of interpkit.hooks against independent references: `output_hidden_states`, `output_attentions`, autograd,
by-hand computations with the model's own weights (module paths written out here per architecture, not read from
interpkit's tables), and raw torch hooks."""
import copy, os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import pytest, torch, transformers
from torch import nn
from transformers.pytorch_utils import Conv1D
from interpkit.errors import SiteError, ShapeError, ConfigError, InterpkitError, ModelNotAvailable
from interpkit.models import tiny_lm, TINY_ARCHS
from interpkit.train import seeded
from interpkit.hooks import (Site, resid_pre, resid_post, attn_out, mlp_out, head_out, head_q, as_site, resolve, layout,
                             all_sites, module_paths, capture, capture_grads, patch, add, scale, ablate_heads, head_means, hooked, ActCache,
                             linear_modules, weight_matrix, is_linear, final_norm, norm_gain, norm_eps, mlp_norm, mlp_linears)

B, T, L, H, D = 2, 9, 3, 4, 64
d = D // H
IDS = torch.randint(0, 128, (B, T), generator=torch.Generator().manual_seed(0))

def mtype(m): return m.config.model_type

def blocks(m):
    "The block list, by each architecture's own attribute names."
    base = m.base_model
    return {'gpt2': lambda: base.h, 'gpt_neox': lambda: base.layers, 'bert': lambda: base.encoder.layer}.get(mtype(m), lambda: base.layers)()

def o_proj(m, l):
    "The output projection of layer `l`, found without interpkit.hooks."
    blk = blocks(m)[l]
    return {'gpt2': lambda: blk.attn.c_proj, 'gpt_neox': lambda: blk.attention.dense,
            'bert': lambda: blk.attention.output.dense}.get(mtype(m), lambda: blk.self_attn.o_proj)()

POST_NORMED = ('gemma2', 'gemma3_text')  # normalise what attention and the MLP add before adding it

def my_final_norm(m):
    base = m.base_model
    return {'gpt2': lambda: base.ln_f, 'gpt_neox': lambda: base.final_layer_norm, 'bert': lambda: nn.Identity()}.get(mtype(m), lambda: base.norm)()

def w_head(proj, h, dh):
    "The (d_model, d_head) block of the output projection's weight that head `h` multiplies: out += z_h @ W_h.T."
    if isinstance(proj, Conv1D): return proj.weight[h*dh:(h+1)*dh, :].T  # Conv1D: y = x @ W + b, W is (in, out)
    return proj.weight[:, h*dh:(h+1)*dh]

def zero_head_cols(proj, h, dh):
    with torch.no_grad():
        if isinstance(proj, Conv1D): proj.weight[h*dh:(h+1)*dh, :] = 0
        else: proj.weight[:, h*dh:(h+1)*dh] = 0

def logits(m, ids=IDS, **kw):
    with torch.no_grad(): return m(ids, **kw).logits

def hook_state(m):
    return [(n, k, list(getattr(mod, k).items())) for n, mod in m.named_modules()
            for k in ('_forward_hooks', '_forward_pre_hooks', '_forward_hooks_with_kwargs', '_forward_pre_hooks_with_kwargs',
                      '_forward_hooks_always_called', '_backward_hooks')]

@pytest.fixture(scope='module', params=TINY_ARCHS)
def tiny(request):
    m = tiny_lm(request.param, n_layers=L, d_model=D, n_heads=H)
    with torch.no_grad(): m(IDS, output_hidden_states=True, output_attentions=True)  # transformers installs its recording hooks on first use
    return m

@pytest.fixture(scope='module')
def smol():
    try:
        from interpkit.models import load_lm
        m, tok = load_lm()
    except (ImportError, ModelNotAvailable) as e: pytest.skip(f'SmolLM2 not available: {e}')
    with torch.no_grad(): m(IDS[:, :4], output_hidden_states=True)
    return m

SMOL_IDS = torch.tensor([[1, 504, 3575, 282, 4649, 314, 216, 30, 2],
                         [1, 11, 1523, 43, 200, 1200, 5, 9, 77]])

# ---------------------------------------------------------------- hooks change nothing

def check_noop(m, ids):
    plain = logits(m, ids)
    with capture(m, []) as c: assert torch.equal(logits(m, ids), plain) and len(c) == 0
    with capture(m, all_sites(m)) as c: assert torch.equal(logits(m, ids), plain)
    assert len(c) == 6 * layout(m).n_layers
    with patch(m, {s: c[s] for s in c}): assert torch.equal(logits(m, ids), plain)  # every site patched with its own value
    with patch(m, {s: c[s][:, 2:5] for s in c}, positions=slice(2, 5)): assert torch.equal(logits(m, ids), plain)
    assert torch.equal(logits(m, ids), plain)

def test_noop_tiny(tiny): check_noop(tiny, IDS)
def test_noop_smollm2(smol): check_noop(smol, SMOL_IDS)

# ---------------------------------------------------------------- residual stream = HF hidden states

def check_hidden_states(m, ids):
    n = layout(m).n_layers
    with torch.no_grad(), capture(m, [resid_pre(l) for l in range(n)] + [resid_post(l) for l in range(n)]) as c:
        hs = m(ids, output_hidden_states=True).hidden_states
    assert len(hs) == n + 1
    for l in range(n):
        assert torch.equal(c[resid_pre(l)], hs[l])
        if l < n - 1: assert torch.equal(c[resid_post(l)], hs[l + 1])
    # HF's last hidden state has the final norm applied (BERT has none)
    with torch.no_grad(): torch.testing.assert_close(my_final_norm(m)(c[resid_post(n - 1)]), hs[n])

def test_hidden_states_tiny(tiny): check_hidden_states(tiny, IDS)
def test_hidden_states_smollm2(smol): check_hidden_states(smol, SMOL_IDS)

def test_bert_last_hidden_state_is_resid_post():
    m = tiny_lm('bert', n_layers=2)
    with torch.no_grad(), capture(m, resid_post(1)) as c: hs = m(IDS, output_hidden_states=True).hidden_states
    assert torch.equal(c[resid_post(1)], hs[2])

@pytest.mark.parametrize('base', ['llama', 'gpt2', 'neox', 'bert'])
def test_bare_base_models(base):
    full = tiny_lm(base, n_layers=2)
    m = full.base_model  # LlamaModel, GPT2Model, GPTNeoXModel, BertModel
    assert layout(m).blocks in ('layers', 'h', 'encoder.layer')
    with torch.no_grad(), capture(m, [resid_pre(1), head_out(1)]) as c: hs = m(IDS, output_hidden_states=True).hidden_states
    assert torch.equal(c[resid_pre(1)], hs[1]) and c[head_out(1)].shape == (B, T, 4, 16)

# ---------------------------------------------------------------- per-head outputs and queries

def check_head_out(m, ids, layers):
    lay = layout(m)
    with torch.no_grad(), capture(m, [s for l in layers for s in (head_out(l), attn_out(l))]) as c: m(ids)
    for l in layers:
        z, proj = c[head_out(l)], o_proj(m, l)
        assert z.shape == (*ids.shape, lay.n_heads, lay.d_head)
        with torch.no_grad():
            ref = sum(z[..., h, :] @ w_head(proj, h, lay.d_head).T for h in range(lay.n_heads))
            if proj.bias is not None: ref = ref + proj.bias
            if mtype(m) in POST_NORMED: ref = blocks(m)[l].post_attention_layernorm(ref)
        torch.testing.assert_close(ref, c[attn_out(l)], atol=1e-5, rtol=1e-4)

def test_head_out_sums_to_attn_out_tiny(tiny): check_head_out(tiny, IDS, range(L))
def test_head_out_sums_to_attn_out_smollm2(smol): check_head_out(smol, SMOL_IDS, [0, 17, 29])

def q_by_hand(m, l, h_in):
    "Queries of layer `l` from its input `h_in`, with the model's own submodules: (batch, pos, n_heads, d_head), before rotary."
    blk, cfg = blocks(m)[l], m.config
    Hn = cfg.num_attention_heads
    dh = getattr(cfg, 'head_dim', None) or cfg.hidden_size // Hn
    shape = (*h_in.shape[:2], Hn, dh)
    t = mtype(m)
    if t == 'gpt2': return blk.attn.c_attn(blk.ln_1(h_in))[..., :Hn*dh].view(shape)
    if t == 'gpt_neox': return blk.attention.query_key_value(blk.input_layernorm(h_in)).view(*h_in.shape[:2], Hn, 3*dh)[..., :dh]
    if t == 'bert': return blk.attention.self.query(h_in).view(shape)  # BERT is post-LN: the block input goes straight in
    x = blk.input_layernorm(h_in)
    if t == 'phi3': return blk.self_attn.qkv_proj(x)[..., :Hn*dh].view(shape)          # [q | k | v]
    if t == 'qwen3': return blk.self_attn.q_norm(blk.self_attn.q_proj(x).view(shape))  # norm per head
    if t == 'gemma3_text': return blk.self_attn.q_norm(blk.self_attn.q_proj(x).view(shape).transpose(1, 2)).transpose(1, 2)  # per head, heads first
    if t == 'olmoe': return blk.self_attn.q_norm(blk.self_attn.q_proj(x)).view(shape)    # norm over all heads
    return blk.self_attn.q_proj(x).view(shape)

def check_head_q(m, ids, layers):
    with torch.no_grad():
        with capture(m, [head_q(l) for l in layers]) as c: hs = m(ids, output_hidden_states=True).hidden_states
        for l in layers: torch.testing.assert_close(c[head_q(l)], q_by_hand(m, l, hs[l]))

def test_head_q_by_hand_tiny(tiny): check_head_q(tiny, IDS, range(L))
def test_head_q_by_hand_smollm2(smol): check_head_q(smol, SMOL_IDS, [0, 29])

# ---------------------------------------------------------------- head ablation against by-hand computations

def test_zero_ablation_by_hand(tiny):
    ref = copy.deepcopy(tiny)
    for h in (1, 3): zero_head_cols(o_proj(ref, 1), h, d)
    zero_head_cols(o_proj(ref, 2), 0, d)
    with ablate_heads(tiny, {1: [1, 3], 2: [0]}): out = logits(tiny)
    torch.testing.assert_close(out, logits(ref), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(out, logits(tiny))

def test_head_means_against_raw_hook(tiny):
    ids = torch.randint(0, 128, (3, T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids); mask[0, 6:] = 0; mask[2, 4:] = 0
    batches = [{'input_ids': ids, 'attention_mask': mask}, {'input_ids': IDS, 'attention_mask': torch.ones_like(IDS)}]
    got = head_means(tiny, batches, layers=[0, 2])
    zs, ws = [], []  # reference: a plain torch pre-hook on the output projection
    h = o_proj(tiny, 2).register_forward_pre_hook(lambda mod, args: zs.append(args[0].detach()))
    try:
        with torch.no_grad():
            for b in batches: tiny(**b); ws.append(b['attention_mask'])
    finally: h.remove()
    ref = sum((z * w[..., None]).sum((0, 1)) for z, w in zip(zs, ws)) / sum(w.sum() for w in ws)
    torch.testing.assert_close(got[2], ref.view(H, d))
    assert set(got) == {0, 2} and got[0].shape == (H, d)
    assert torch.equal(head_means(tiny, IDS)[1], head_means(tiny, [IDS])[1])

def test_mean_ablation_by_hand(tiny):
    means = head_means(tiny, torch.randint(0, 128, (4, T), generator=torch.Generator().manual_seed(2)))
    ref = copy.deepcopy(tiny)
    proj = o_proj(ref, 1)
    with torch.no_grad():
        extra = sum(w_head(o_proj(tiny, 1), h, d) @ means[1][h] for h in (0, 2))  # the heads' constant contribution
        zero_head_cols(proj, 0, d); zero_head_cols(proj, 2, d)
        if proj.bias is None: proj.bias = nn.Parameter(extra)
        else: proj.bias += extra
    with ablate_heads(tiny, {1: [0, 2]}, how='mean', means=means): out = logits(tiny)
    torch.testing.assert_close(out, logits(ref), atol=1e-5, rtol=1e-4)

@pytest.mark.parametrize('eps', [0., 0.3])
def test_scale_query_attention_pattern(tiny, eps):
    if eps and getattr(tiny.config, 'attn_logit_softcapping', None): pytest.skip('Gemma 2 soft-caps its scores: tanh(s/c) c is not linear in the query')
    with torch.no_grad():
        a0 = tiny(IDS, output_attentions=True).attentions[1]
        with ablate_heads(tiny, {1: [2]}, how='scale_query', eps=eps): a = tiny(IDS, output_attentions=True).attentions[1]
    # by hand: scores scale by eps, so the pattern is softmax(eps * log p) over the allowed positions
    ref = torch.softmax(eps * torch.log(a0[:, 2]), -1) if eps else (a0[:, 2] > 0).float() / (a0[:, 2] > 0).sum(-1, keepdim=True)
    torch.testing.assert_close(a[:, 2], ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a[:, [0, 1, 3]], a0[:, [0, 1, 3]])
    if not eps and mtype(tiny) != 'bert': torch.testing.assert_close(a[0, 2, 4, :5], torch.full((5,), 1/5))  # causal row 4: uniform on 0..4
    ent = lambda p: -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()
    assert ent(a[:, 2]) > ent(a0[:, 2])  # closer to uniform

def test_ablation_at_positions(tiny):
    "Ablating the last block's heads at the last position only = full ablation there, and no change elsewhere."
    with ablate_heads(tiny, {L - 1: [0, 1, 2, 3]}, positions=[T - 1]): out = logits(tiny)
    ref = copy.deepcopy(tiny)
    for h in range(H): zero_head_cols(o_proj(ref, L - 1), h, d)
    torch.testing.assert_close(out[:, -1], logits(ref)[:, -1], atol=1e-5, rtol=1e-4)
    if mtype(tiny) == 'olmoe':  # its experts run on the tokens routed to them in one batch: another last token regroups them, to round-off
        torch.testing.assert_close(out[:, :-1], logits(tiny)[:, :-1], atol=1e-6, rtol=0)
    else: assert torch.equal(out[:, :-1], logits(tiny)[:, :-1])

def test_zero_ablation_smollm2(smol):
    ref = copy.deepcopy(smol)
    for h in (0, 4, 8): zero_head_cols(ref.model.layers[3].self_attn.o_proj, h, 64)
    with ablate_heads(smol, {3: [0, 4, 8]}): out = logits(smol, SMOL_IDS)
    torch.testing.assert_close(out, logits(ref, SMOL_IDS), atol=1e-4, rtol=1e-4)
    del ref

# ---------------------------------------------------------------- capture and patch semantics

def test_positions_and_keys(tiny):
    with torch.no_grad():
        with capture(tiny, [resid_post(1), 'resid_pre(2)', head_out(0)]) as full: tiny(IDS)
        with capture(tiny, [resid_post(1), head_out(0)], positions=[1, 3]) as part: tiny(IDS)
        with capture(tiny, resid_post(1), positions=-1, to_cpu=True) as last: tiny(IDS)
    assert torch.equal(part[resid_post(1)], full[resid_post(1)][:, [1, 3]])
    assert torch.equal(part['head_out(0)'], full[head_out(0)][:, [1, 3]])
    assert last[resid_post(1)].shape == (B, 1, D) and torch.equal(last[resid_post(1)][:, 0], full[resid_post(1)][:, -1])
    assert torch.equal(full[resid_pre(2)], full['resid_pre(2)']) and torch.equal(full[resid_post(1)], full[Site('resid_post', 1)])
    assert list(full) == [resid_post(1), 'resid_pre(2)', head_out(0)] and len(full) == 3
    assert resid_post(1) in full and mlp_out(0) not in full and 'nonsense((' not in full
    assert 'resid_post(1): (2, 9, 64)' in repr(full)
    assert not full[resid_post(1)].requires_grad

def test_cache_before_forward():
    m = tiny_lm('llama')
    with capture(m, resid_post(0)) as c: pass
    with pytest.raises(SiteError, match='Nothing captured'): c[resid_post(0)]

def test_patch_functions_and_order(tiny):
    v = torch.randn(D, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with capture(tiny, [resid_post(0), mlp_out(1)]) as c0: tiny(IDS)
        with patch(tiny, {resid_post(0): add(v)}), capture(tiny, resid_post(0)) as c1: tiny(IDS)
        with patch(tiny, {resid_post(0): scale(2.)}), capture(tiny, resid_post(0)) as c2: tiny(IDS)
        with capture(tiny, resid_post(0)) as c3, patch(tiny, {resid_post(0): scale(2.)}): tiny(IDS)  # capture registered first: sees the original
    torch.testing.assert_close(c1[resid_post(0)], c0[resid_post(0)] + v)
    torch.testing.assert_close(c2[resid_post(0)], 2 * c0[resid_post(0)])
    assert torch.equal(c3[resid_post(0)], c0[resid_post(0)])

def test_patch_positions_causal():
    m = tiny_lm('gpt2', n_layers=2)
    plain = logits(m)
    with patch(m, {attn_out(0): torch.zeros(64)}, positions=[5, 7]): out = logits(m)
    assert torch.equal(out[:, :5], plain[:, :5]) and not torch.allclose(out[:, 5], plain[:, 5])

def test_patch_head_q_fused_and_interleaved():
    "Writing head_q back into fused (GPT-2) and interleaved (NeoX) qkv projections keeps keys and values."
    for arch, path in [('gpt2', 'transformer.h.0.attn.c_attn'), ('neox', 'gpt_neox.layers.0.attention.query_key_value')]:
        m = tiny_lm(arch, n_layers=1)
        with torch.no_grad(), capture(m, path) as c0: m(IDS)
        with torch.no_grad(), patch(m, {head_q(0): scale(0.)}), capture(m, path) as c1: m(IDS)
        raw0, raw1 = c0[path], c1[path]
        if arch == 'gpt2': qmask = torch.arange(3 * D) < D
        else: qmask = (torch.arange(3 * D) % (3 * d)) < d
        assert torch.equal(raw1[..., ~qmask], raw0[..., ~qmask]) and raw1[..., qmask].abs().max() == 0

def test_paths_and_inputs():
    m = tiny_lm('llama', n_layers=2)
    ref = []
    h = m.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda mod, a: ref.append(a[0]))
    try:
        with torch.no_grad(), capture(m, ['model.layers.1.mlp.down_proj:in', 'model.layers.1.mlp']) as c: m(IDS)
    finally: h.remove()
    assert torch.equal(c['model.layers.1.mlp.down_proj:in'], ref[0]) and c['model.layers.1.mlp'].shape == (B, T, 64)

def test_unknown_architecture_by_path():
    with seeded(0): net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with capture(net, ['0', '2:in']) as c: y = net(x)
    assert torch.equal(c['0'], net[0](x)) and torch.equal(c['2:in'], torch.relu(net[0](x)))
    with patch(net, {'1': torch.zeros(5)}): assert torch.equal(net(x), net[2].bias.expand(4, 2))
    with pytest.raises(SiteError, match='no known layout'): capture(net, resid_post(0)).__enter__()

@pytest.mark.parametrize('cfg_cls', ['MistralConfig', 'Qwen2Config'])
def test_llama_like(cfg_cls):
    cfg = getattr(transformers, cfg_cls)(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=128)
    cfg._attn_implementation = 'eager'
    with seeded(0): m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    assert layout(m).family == 'llama'
    check_noop(m, IDS); check_hidden_states(m, IDS); check_head_out(m, IDS, [0, 1]); check_head_q(m, IDS, [1])

# ---------------------------------------------------------------- the model is left unchanged

def test_state_unchanged(tiny, untouched):
    with untouched(tiny):
        with torch.no_grad():
            with capture(tiny, all_sites(tiny)), patch(tiny, {mlp_out(1): scale(3.)}), ablate_heads(tiny, {0: [1]}, how='scale_query', eps=.5): tiny(IDS)
            with pytest.raises(RuntimeError, match='boom'):
                with ablate_heads(tiny, {2: [0]}), capture(tiny, [resid_post(0), head_q(1)]):
                    tiny(IDS); raise RuntimeError('boom')
            with pytest.raises(ShapeError):  # an error raised by a hook during the forward pass
                with patch(tiny, {resid_post(1): torch.zeros(3)}): tiny(IDS)
        with capture_grads(tiny, [resid_post(0), head_out(1), head_q(2)]) as g: g.backward(tiny(IDS).logits.sum())
        head_means(tiny, IDS)

def test_training_flag_kept(untouched):
    m = tiny_lm('gpt2', n_layers=2).train()
    m.transformer.h[1].eval()
    with untouched(m), seeded(0):   # train mode: dropout draws
        with ablate_heads(m, {0: [0]}), capture(m, all_sites(m)): m(IDS)
        head_means(m, IDS)

def test_registration_failure_midway(monkeypatch):
    m = tiny_lm('llama', n_layers=2)
    before = hook_state(m)
    def boom(*a, **k): raise RuntimeError('registration failed')
    monkeypatch.setattr(m.model.layers[1], 'register_forward_hook', boom)
    with pytest.raises(RuntimeError, match='registration failed'):
        with capture(m, [resid_post(0), attn_out(0), resid_pre(1), head_out(0), resid_post(1)]): pass
    monkeypatch.undo()
    assert hook_state(m) == before
    assert len(m.model.layers[0]._forward_hooks) == 0 and len(m.model.layers[1]._forward_pre_hooks) == 0

# ---------------------------------------------------------------- bad input

def test_unknown_path():
    m = tiny_lm('llama', n_layers=2)
    with pytest.raises(SiteError, match=r"model\.layers\.1\.mlp") as e: capture(m, 'model.layer.1.mlp').__enter__()
    assert "No module 'model.layer.1.mlp'" in str(e.value) and isinstance(e.value, KeyError)
    with pytest.raises(SiteError, match=r'Did you mean mlp_out\(1\)'): resolve(m, 'mlp_oot(1)')
    with pytest.raises(SiteError, match='must be a Site or a string'): resolve(m, 3)

def test_layer_out_of_range():
    m = tiny_lm('gpt2', n_layers=2)
    for bad in (2, -3, 17):
        with pytest.raises(SiteError, match=r'Valid layers: 0\.\.1') as e: capture(m, resid_post(bad)).__enter__()
        assert f'Layer {bad}' in str(e.value)
    with pytest.raises(SiteError, match=r'Valid layers: 0\.\.1'): ablate_heads(m, {5: [0]}).__enter__()
    assert resolve(m, attn_out(-1)).path == 'transformer.h.1.attn.c_proj'

def test_wrong_patch_shape():
    m = tiny_lm('llama', n_layers=2)
    with patch(m, {resid_post(0): torch.zeros(2, 5, 64)}):
        with pytest.raises(ShapeError) as e: m(IDS)
    msg = str(e.value)
    assert '(2, 5, 64)' in msg and 'Expected (2, 9, 64)' in msg and isinstance(e.value, ValueError)
    with patch(m, {head_out(1): torch.zeros(2, 9, 64)}), pytest.raises(ShapeError, match=r'Expected \(2, 9, 4, 16\)'): m(IDS)
    with patch(m, {resid_post(0): torch.zeros(2, 9, 64)}, positions=[0, 1]), pytest.raises(ShapeError, match=r'Expected \(2, 2, 64\).*chosen positions'): m(IDS)
    with patch(m, {resid_post(0): lambda a: a[:, :3]}), pytest.raises(ShapeError, match='patch function .* returned shape'): m(IDS)
    assert hook_state(m) == hook_state(tiny_lm('llama', n_layers=2))  # nothing left behind

def test_bad_arguments():
    m = tiny_lm('llama', n_layers=2)
    with pytest.raises(ConfigError, match="Did you mean 'zero'"): ablate_heads(m, {0: [0]}, how='zeros').__enter__()
    with pytest.raises(ConfigError, match=r'Valid heads: 0\.\.3'): ablate_heads(m, {0: [4]}).__enter__()
    with pytest.raises(ConfigError, match='head_means'): ablate_heads(m, {0: [0]}, how='mean').__enter__()
    with pytest.raises(ConfigError, match='nothing for layer 1'): ablate_heads(m, {1: [0]}, how='mean', means={0: torch.zeros(4, 16)}).__enter__()
    with pytest.raises(ShapeError, match=r'Expected \(n_heads, d_head\) = \(4, 16\)'): ablate_heads(m, {0: [0]}, how='mean', means={0: torch.zeros(4, 8)}).__enter__()
    with pytest.raises(ConfigError, match='tensor or a function'): patch(m, {resid_post(0): 3.0}).__enter__()
    with pytest.raises(ShapeError, match='no position dimension'):
        with seeded(0): net = nn.Sequential(nn.Linear(3, 2))
        with capture(net, '0', positions=0): net(torch.ones(3))
    assert all(issubclass(c, InterpkitError) for c in (SiteError, ShapeError, ConfigError))

# ---------------------------------------------------------------- the residual stream adds up (pre-norm families)

def test_residual_decomposition(tiny):
    "resid_post = resid_pre + attn_out + mlp_out in every pre-norm family (GPT-NeoX's parallel blocks too); BERT is post-LN."
    if mtype(tiny) == 'bert': pytest.skip('post-LN: resid_post is normalised after the additions')
    with torch.no_grad(), capture(tiny, all_sites(tiny, ['resid_pre', 'resid_post', 'attn_out', 'mlp_out'])) as c: tiny(IDS)
    for l in range(L):
        torch.testing.assert_close(c[resid_post(l)], c[resid_pre(l)] + c[attn_out(l)] + c[mlp_out(l)], atol=1e-5, rtol=1e-5)

# ---------------------------------------------------------------- gradients against autograd

def ce_sum(out, y): return nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten(), reduction='sum')

def test_capture_grads_equals_autograd_on_hidden_states(tiny, untouched):
    y = torch.randint(0, 128, (B, T), generator=torch.Generator().manual_seed(3))
    with untouched(tiny):
        with capture_grads(tiny, [resid_pre(l) for l in range(L)] + [head_out(1), attn_out(1), head_q(0)]) as g:
            out = tiny(IDS, output_hidden_states=True)
            g.backward(ce_sum(out, y), retain_graph=True)
    refs = torch.autograd.grad(ce_sum(out, y), [out.hidden_states[l] for l in range(L)])
    for l in range(L):
        torch.testing.assert_close(g.grads[resid_pre(l)], refs[l], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(g.acts[resid_pre(l)], out.hidden_states[l])
    if mtype(tiny) not in POST_NORMED:  # chain rule through the output projection: dL/dz_h = dL/d(attn_out) W_O^(h)
        proj = o_proj(tiny, 1)
        ref = torch.stack([g.grads[attn_out(1)] @ w_head(proj, h, d).detach() for h in range(H)], -2)
        torch.testing.assert_close(g.grads[head_out(1)], ref, atol=1e-6, rtol=1e-4)
    assert g.grads[head_q(0)].shape == (B, T, H, d) and g.grads[head_q(0)].abs().sum() > 0

@pytest.mark.parametrize('arch', ['llama', 'gpt2', 'gemma2'])
def test_capture_grads_per_example_on_a_frozen_model(arch, untouched):
    "Each row of the gradient of a sum of per-example losses is that example's own gradient; frozen weights stay frozen, no .grad appears."
    m = tiny_lm(arch, n_layers=2).requires_grad_(False)
    y = torch.randint(0, 128, (B, T), generator=torch.Generator().manual_seed(4))
    with untouched(m):
        with capture_grads(m, [resid_post(0), head_out(1)]) as g:
            g.backward(nn.functional.cross_entropy(m(IDS).logits.transpose(1, 2), y, reduction='none').mean(1).sum())
        for i in range(B):
            with capture_grads(m, [resid_post(0), head_out(1)]) as gi:
                gi.backward(nn.functional.cross_entropy(m(IDS[i:i+1]).logits[0], y[i]))
            for s in (resid_post(0), head_out(1)): torch.testing.assert_close(g.grads[s][i:i+1], gi.grads[s], atol=1e-6, rtol=1e-4)

@pytest.mark.parametrize('arch', ['llama', 'gpt2', 'neox'])
def test_linear_weight_gradient_from_input_and_output_sites(arch, untouched):
    "sum_t delta_t a_t^T from a linear layer's ':in' and output sites equals autograd's weight gradient, per example, Conv1D included."
    m = tiny_lm(arch, n_layers=2)
    y = torch.randint(0, 128, (B, T), generator=torch.Generator().manual_seed(5))
    lins = linear_modules(m)
    names = list(lins)[:4]
    with untouched(m):
        with capture_grads(m, names + [f'{n}:in' for n in names]) as g:
            g.backward(nn.functional.cross_entropy(m(IDS).logits.transpose(1, 2), y, reduction='none').mean(1).sum())
        for i in range(B):
            loss = nn.functional.cross_entropy(m(IDS[i:i+1]).logits[0], y[i])
            refs = torch.autograd.grad(loss, [lins[n].weight for n in names])
            for n, ref in zip(names, refs):
                got = torch.einsum('to,ti->oi', g.grads[n][i], g.acts[f'{n}:in'][i])
                torch.testing.assert_close(got, weight_matrix(lins[n], ref), atol=1e-6, rtol=1e-4)

def test_capture_grads_positions_cpu_and_errors():
    m = tiny_lm('llama', n_layers=2)
    with capture_grads(m, [resid_post(1), resid_post(0)], positions=[-1], to_cpu=True) as g:
        out = m(IDS, output_hidden_states=True); g.backward(out.logits[:, -1, 0].sum(), retain_graph=True)
    ref, = torch.autograd.grad(out.logits[:, -1, 0].sum(), out.hidden_states[1])
    torch.testing.assert_close(g.grads[resid_post(0)], ref[:, -1:])
    assert g.grads[resid_post(1)].device.type == 'cpu' and g.acts[resid_post(1)].shape == (B, 1, D)
    with torch.no_grad(), capture_grads(m, resid_post(0)), pytest.raises(ConfigError, match=r'without autograd \(under torch.no_grad'): m(IDS)
    with capture_grads(m, resid_post(0)) as g:
        with pytest.raises(SiteError, match='No forward pass ran'): g.backward(torch.tensor(1.))
        out = m(IDS)
        with pytest.raises(ShapeError, match='A scalar loss'): g.backward(out.logits)
        with pytest.raises(SiteError, match='Gradients are stored by a backward pass'): g.grads[resid_post(0)]
    with capture_grads(m, [resid_post(0), resid_post(1)]) as g:
        out = m(IDS, output_hidden_states=True)
        with pytest.raises(SiteError, match=r'does not depend on the activation at resid_post\(1\)'): g.backward(out.hidden_states[1].sum())

def test_backward_inside_block_by_hand(untouched):
    "A user's own loss.backward() inside the block fills the cache too (and fills .grad, as the user asked)."
    m = tiny_lm('gpt2', n_layers=2)
    with capture_grads(m, head_out(0)) as g: m(IDS).logits.sum().backward()
    with capture_grads(m, head_out(0)) as g2: g2.backward(m(IDS).logits.sum())
    torch.testing.assert_close(g.grads[head_out(0)], g2.grads[head_out(0)])
    assert m.transformer.h[0].attn.c_proj.weight.grad is not None

# ---------------------------------------------------------------- linear layers and norms

def test_weight_matrix_is_out_by_in_for_every_linear_layer(tiny):
    g = torch.Generator().manual_seed(0)
    for n, mod in linear_modules(tiny, head=True).items():
        W = weight_matrix(mod)
        xi = torch.randn(3, W.shape[1], generator=g)
        ref = xi @ W.T + (mod.bias if mod.bias is not None else 0)
        with torch.no_grad(): torch.testing.assert_close(mod(xi), ref, atol=1e-6, rtol=1e-5)
    n_lin = sum(isinstance(mm, (nn.Linear, Conv1D)) for mm in tiny.modules())
    head = tiny.get_output_embeddings()
    assert len(linear_modules(tiny, head=True)) == n_lin and len(linear_modules(tiny)) == n_lin - isinstance(head, (nn.Linear, Conv1D))

def test_linear_modules_gpt2_is_conv1d_and_errors():
    m = tiny_lm('gpt2', n_layers=2)
    lins = linear_modules(m)
    assert len(lins) == 8 and all(isinstance(v, Conv1D) for v in lins.values()) and 'lm_head' not in lins
    assert list(linear_modules(m, ['transformer.h.1.mlp.c_fc', 'transformer.h.0.attn.c_proj'])) == ['transformer.h.0.attn.c_proj', 'transformer.h.1.mlp.c_fc']
    with pytest.raises(ConfigError, match="Did you mean 'transformer.h.1.mlp.c_fc'"): linear_modules(m, ['transformer.h.1.mlp.c_fcc'])
    with pytest.raises(ConfigError, match='has no linear layer'): linear_modules(nn.Sequential(nn.ReLU()))
    with pytest.raises(ConfigError, match='is not a linear layer'): weight_matrix(nn.ReLU())

@pytest.mark.parametrize('arch', ['llama', 'gemma', 'gemma2', 'gemma3', 'qwen3', 'neox', 'gpt2'])
def test_norm_gain_by_hand(arch):
    """normalised output = gain × normalised input (+ bias): Gemma's RMSNorm multiplies by 1 + w, the others by w. (Checked as a product:
    the quotient output / input is ill-conditioned where an input sits near its row's mean, and moved by 2e-4 there across CPUs.)"""
    m = tiny_lm(arch, n_layers=1)
    norm = final_norm(m)
    assert norm is my_final_norm(m)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad(): nn.init.normal_(norm.weight, generator=g)
    x = torch.randn(4, D, generator=g)
    with torch.no_grad():
        y = norm(x)
        if isinstance(norm, nn.LayerNorm):
            xn = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
            want = norm_gain(norm) * xn + norm.bias
        else:
            eps = getattr(norm, 'variance_epsilon', getattr(norm, 'eps', None))
            want = norm_gain(norm) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-4)
    if arch.startswith('gemma'): torch.testing.assert_close(norm_gain(norm), 1 + norm.weight.detach())

# ---------------------------------------------------------------- dtypes and dispatched models

@pytest.mark.parametrize('arch', ['llama', 'gpt2', 'phi3'])
def test_bfloat16_model(arch, untouched):
    "Captures and patches keep the model's dtype; results match the float32 model within bfloat16's precision."
    m32, m16 = tiny_lm(arch, n_layers=2), tiny_lm(arch, n_layers=2).to(torch.bfloat16)
    with untouched(m16):
        with torch.no_grad(), capture(m16, [resid_post(0), head_out(1)]) as c16: m16(IDS)
        mu16, mu32 = head_means(m16, IDS), head_means(m32, IDS)
        with torch.no_grad(), ablate_heads(m16, {1: [0, 2]}, how='mean', means=mu16), patch(m16, {resid_post(0): add(torch.ones(D))}): out16 = m16(IDS).logits
        with capture_grads(m16, resid_post(0)) as g16: g16.backward(m16(IDS).logits.float().sum())
    with torch.no_grad(), capture(m32, [resid_post(0), head_out(1)]) as c32: m32(IDS)
    with torch.no_grad(), ablate_heads(m32, {1: [0, 2]}, how='mean', means=mu32), patch(m32, {resid_post(0): add(torch.ones(D))}): out32 = m32(IDS).logits
    assert c16[resid_post(0)].dtype == torch.bfloat16 and mu16[1].dtype == torch.bfloat16 and g16.grads[resid_post(0)].dtype == torch.bfloat16
    for a, b in [(c16[resid_post(0)], c32[resid_post(0)]), (mu16[1], mu32[1]), (out16, out32)]:  # bfloat16 keeps 8 bits of mantissa
        torch.testing.assert_close(a.float(), b, atol=0.1, rtol=0.05)

def test_model_dispatched_over_cpu_and_disk(tmp_path, untouched):
    "A model loaded with a device_map that offloads blocks to disk (accelerate's hooks move its weights) gives the plain model's numbers."
    plain = tiny_lm('llama', n_layers=3)
    plain.save_pretrained(tmp_path)
    where = {'model.embed_tokens': 'cpu', 'model.layers.0': 'cpu', 'model.layers.1': 'disk', 'model.layers.2': 'disk', 'model.norm': 'cpu',
             'model.rotary_emb': 'cpu', 'lm_head': 'cpu'}
    m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map=where, offload_folder=str(tmp_path/'off'), attn_implementation='eager').eval()
    assert set(m.hf_device_map.values()) == {'cpu', 'disk'}
    sites = [resid_post(0), resid_post(2), head_out(1), head_q(2)]
    with untouched(m):
        with torch.no_grad(), capture(m, sites) as c: out = m(IDS).logits
        with torch.no_grad(), patch(m, {attn_out(1): scale(0.)}): zeroed = m(IDS).logits
        mu = head_means(m, IDS)
        with torch.no_grad(), ablate_heads(m, {2: [1]}, how='mean', means=mu): ablated = m(IDS).logits
    with torch.no_grad(), capture(plain, sites) as c0: out0 = plain(IDS).logits
    with torch.no_grad(), patch(plain, {attn_out(1): scale(0.)}): zeroed0 = plain(IDS).logits
    mu0 = head_means(plain, IDS)
    with torch.no_grad(), ablate_heads(plain, {2: [1]}, how='mean', means=mu0): ablated0 = plain(IDS).logits
    for s in sites: torch.testing.assert_close(c[s], c0[s], atol=1e-5, rtol=1e-5)
    for a, b in [(out, out0), (zeroed, zeroed0), (ablated, ablated0), (mu[2], mu0[2])]: torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

# ---------------------------------------------------------------- clear errors at the edges

def test_positions_out_of_range():
    m = tiny_lm('gpt2', n_layers=2)
    for bad, shown in [([9], '[9]'), (-10, '[-10]'), (torch.tensor([0, 11]), '[11]')]:
        with capture(m, resid_post(0), positions=bad), pytest.raises(ShapeError, match=rf'positions {re_esc(shown)} are out of range at resid_post\(0\): the activation has 9 positions'):
            m(IDS)
        with patch(m, {resid_post(0): torch.zeros(64)}, positions=bad), pytest.raises(ShapeError, match='Valid positions: 0..8'): m(IDS)
    with capture(m, resid_post(0), positions=torch.ones(9, dtype=torch.bool)) as c: m(IDS)
    assert c[resid_post(0)].shape == (B, T, D)
    with pytest.raises(ConfigError, match='is not an index'): capture(m, resid_post(0), positions=1.5).__enter__()

def re_esc(s):
    import re
    return re.escape(s)

def test_sites_must_be_a_site_or_a_list():
    m = tiny_lm('llama', n_layers=2)
    for bad, msg in [(3, 'got sites=3, a int'), (None, 'got sites=None'), ({resid_post(0): 1}, 'patches')]:
        with pytest.raises(SiteError, match=msg): capture(m, bad).__enter__()
        with pytest.raises(SiteError, match=msg): capture_grads(m, bad).__enter__()
    with pytest.raises(ConfigError, match='A mapping {site: tensor or function}'): patch(m, [resid_post(0)]).__enter__()
    with capture(m, (s for s in [resid_post(0), resid_post(0), 'resid_post(0)'])) as c: m(IDS)  # a generator; the same site thrice is one site
    assert len(c) == 1

def test_module_running_twice_in_one_pass():
    class Twice(nn.Module):
        def __init__(self): super().__init__(); self.block = nn.Linear(4, 4)
        def forward(self, x): return self.block(torch.relu(self.block(x)))
    with seeded(0): net, x = Twice(), torch.randn(2, 4)
    for cm in (capture, capture_grads):
        with cm(net, ['block']), pytest.raises(SiteError, match="'block' ran twice in one forward pass of Twice"): net(x)
    with capture(net, 'block:in') as c:  # two separate passes of the root: each keeps its own
        net.block(x); net.block(2 * x)
    torch.testing.assert_close(c['block:in'], 2 * x)
    with patch(net, {'block': scale(0.5)}): y = net(x)   # patching applies to every call
    torch.testing.assert_close(y, 0.5 * net.block(torch.relu(0.5 * net.block(x))))

def test_heads_and_batches_must_not_be_empty():
    m = tiny_lm('llama', n_layers=2)
    for heads in ({}, {0: []}, [0, 1]):
        with pytest.raises(ConfigError, match='A non-empty mapping'): ablate_heads(m, heads).__enter__()
    with pytest.raises(ConfigError, match='got no tokens'): head_means(m, [])
    with pytest.raises(ConfigError, match='got no tokens'): head_means(m, {'input_ids': IDS, 'attention_mask': torch.zeros_like(IDS)})
    with pytest.raises(ConfigError, match='not a positive integer'): head_means(m, IDS, batch_size=0)
    with pytest.raises(SiteError, match='Valid layers'): head_means(m, IDS, layers=[5])

def test_head_means_batch_size_negative_layers_and_eval_mode(untouched):
    m = tiny_lm('gpt2', n_layers=2, resid_pdrop=0.5, attn_pdrop=0.5).train()   # dropout on: train mode would give random means
    ids = torch.randint(0, 128, (7, T), generator=torch.Generator().manual_seed(6))
    with untouched(m):
        whole, pieces, neg = head_means(m, ids, batch_size=7), head_means(m, ids, batch_size=2), head_means(m, ids, layers=[-1])
    m.eval(); ref = head_means(m, ids)
    torch.testing.assert_close(whole[1], pieces[1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(whole[1], ref[1])
    assert list(neg) == [1] and torch.equal(neg[1], ref[1])
    with ablate_heads(m, {-1: [0]}, how='mean', means=neg): m(ids)   # -1 and 1 are the same layer

@pytest.mark.parametrize('arch', ['llama', 'gemma', 'gemma2', 'gemma3', 'phi3', 'gpt2', 'neox', 'qwen3'])
def test_mlp_norm_is_what_the_mlp_reads(arch):
    "The MLP's input equals mlp_norm(resid after attention): checked by capture in every pre-norm family (NeoX's parallel MLP reads the block input)."
    m = tiny_lm(arch, n_layers=2)
    path = resolve(m, mlp_out(1)).path if arch not in POST_NORMED_ARCHS else f"{layout(m).blocks}.1.mlp"
    with torch.no_grad(), capture(m, [f'{path}:in', resid_pre(1), attn_out(1)]) as c: m(IDS)
    x = c[resid_pre(1)] if mtype(m) == 'gpt_neox' else c[resid_pre(1)] + c[attn_out(1)]
    with torch.no_grad(): torch.testing.assert_close(c[f'{path}:in'], mlp_norm(m, 1)(x), atol=1e-5, rtol=1e-5)
    assert norm_eps(mlp_norm(m, 1)) == getattr(mlp_norm(m, 1), 'variance_epsilon', getattr(mlp_norm(m, 1), 'eps', None))

POST_NORMED_ARCHS = ('gemma2', 'gemma3')

@pytest.mark.parametrize('arch', TINY_ARCHS)
def test_mlp_linears_are_the_blocks_linears_outside_attention(arch):
    "mlp_linears(m, 1): linear layers of block 1, in model order, and every other linear of that block is attention's; MoE blocks (fused experts, no linear layer) raise."
    m = tiny_lm(arch, n_layers=2)
    block = f"{layout(m).blocks}.1"
    if arch in ('mixtral', 'olmoe'):
        with pytest.raises(SiteError, match='no linear layer'): mlp_linears(m, 1)
        return
    lin = mlp_linears(m, 1)
    assert lin and all(p.startswith(block + '.') and is_linear(mod) for p, mod in lin.items())
    assert list(lin) == [p for p in linear_modules(m) if p in lin]                   # model order
    others = [p for p in linear_modules(m) if p.startswith(block + '.') and p not in lin]
    assert others and all(any(w in p for w in ('attn', 'attention')) for p in others), others
    assert list(mlp_linears(m, -1)) == list(lin)
    with pytest.raises(SiteError): mlp_linears(m, 2)


@pytest.mark.parametrize('arch', ['llama', 'gemma', 'qwen2'])
def test_norm_gain_is_exact_in_float64(arch):
    "Issue 51: RMSNorms compute in float32 even in a float64 model; the gain is the weight (or 1 + weight) exactly, not a float32 measurement (7e-9 off)."
    m = tiny_lm(arch).double()
    norm = final_norm(m)
    with torch.no_grad(): norm.weight.normal_(generator=torch.Generator().manual_seed(3))
    w = norm.weight.detach()
    assert torch.equal(norm_gain(norm), 1 + w if arch == 'gemma' else w)
    odd = nn.Module(); odd.weight = nn.Parameter(w.clone()); odd.eps = 1e-6; odd.forward = lambda x: 2 * x * w / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()   # another form: measured
    torch.testing.assert_close(norm_gain(odd), 2 * w, rtol=1e-12, atol=1e-12)   # measured in float64, not through float32


def test_patch_refuses_a_non_finite_patch_and_leaves_the_model_alone():
    "Issue 51: a NaN patch is named before anything runs, not found later in the logits."
    from interpkit.errors import NotFiniteError
    from interpkit.testing import untouched
    m = tiny_lm('llama', n_layers=2)
    bad = torch.zeros(64); bad[3] = float('nan')
    with untouched(m):
        with pytest.raises(NotFiniteError, match=r'The patch for resid_post\(0\) has 1 non-finite'):
            with patch(m, {resid_post(0): bad}): m(torch.zeros(1, 3, dtype=torch.long))
        with patch(m, {resid_post(0): torch.zeros(64)}): out = m(torch.zeros(1, 3, dtype=torch.long)).logits
    assert torch.isfinite(out).all()
