"""Forward-only entry points on a model spread over devices with a `device_map` (issue 52): a tiny Llama whose later blocks and head
accelerate offloaded to disk (their weights on the `meta` device between forwards) gives what the same model gives in one piece. On
a machine without GPUs, disk offload is the device map that exercises the same code: inputs go to the input embeddings' device, and
weights are read where accelerate keeps them."""
import copy, tempfile
import pytest, torch
import accelerate
from interpkit.hooks import add, capture, patch, resid_post, mlp_out, weight_matrix
from interpkit.models import generate_greedy, logits_at, tiny_lm, tiny_tokenizer

MAP = {'model.embed_tokens': 'cpu', 'model.layers.0': 'cpu', 'model.layers.1': 'disk', 'model.layers.2': 'disk', 'model.norm': 'disk',
       'model.rotary_emb': 'cpu', 'lm_head': 'disk'}

@pytest.fixture(scope='module')
def models():
    ref = tiny_lm('llama', n_layers=3, seed=1).eval()
    off = accelerate.dispatch_model(copy.deepcopy(ref), device_map=MAP, offload_dir=tempfile.mkdtemp())
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    return ref, off, dict(input_ids=ids, attention_mask=torch.ones_like(ids))

def both(models, f):
    ref, off, batch = models
    assert off.get_submodule('model.layers.2.mlp.up_proj').weight.device.type == 'meta'
    out = f(off, batch), f(ref, batch)
    assert off.get_submodule('model.layers.2.mlp.up_proj').weight.device.type == 'meta'   # still offloaded: not loaded for good
    return out

def test_logits_capture_patch_generation(models):
    a, b = both(models, lambda m, x: logits_at(m, x, -1)); torch.testing.assert_close(a, b, rtol=0, atol=0)
    def cap(m, x):
        with torch.no_grad(), capture(m, [resid_post(l) for l in range(3)] + [mlp_out(2)]) as c: m(**x)
        return torch.cat([c[resid_post(l)] for l in range(3)] + [c[mlp_out(2)]])
    a, b = both(models, cap); torch.testing.assert_close(a, b, rtol=0, atol=0)
    def pat(m, x):
        with torch.no_grad(), patch(m, {resid_post(1): add(torch.ones(m.config.hidden_size))}): return m(**x).logits
    a, b = both(models, pat); torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.no_grad(): assert (b - models[0](**models[2]).logits).abs().max() > 1e-3   # the patch changed something downstream
    tok = tiny_tokenizer(models[0].config.vocab_size)
    a, b = both(models, lambda m, x: generate_greedy(m, tok, ['w5 w6 w7', 'w9'], max_new_tokens=4)); assert a == b

def test_weight_reading_methods(models):
    from interpkit.papers.wasserstein import neuron_scores
    from interpkit.papers.safety_heads import ships
    a, b = both(models, lambda m, x: weight_matrix(m.get_submodule('model.layers.2.mlp.down_proj')).detach())
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    a, b = both(models, lambda m, x: neuron_scores(m, x))
    assert a.equals(b)
    a, b = both(models, lambda m, x: ships(m, x, heads=[(0, 1), (2, 3)]))
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert torch.isfinite(a[2, 3]) and a[2, 3] > 0   # a head on an offloaded block was measured

def test_methods_that_need_weights_in_memory_refuse_an_offloaded_model(models):
    "Gradients of offloaded weights would land on temporary copies and be lost: such methods refuse, naming the offloaded parameters, and change nothing."
    from interpkit.testing import untouched
    from interpkit.train import fit, lm_loss
    from interpkit.errors import ConfigError
    ref, off, batch = models
    with untouched(off):
        with pytest.raises(ConfigError, match='parameters are offloaded'): fit(off, [batch], lambda m, b: lm_loss(m, b), steps=1)

def _offloaded_lm(arch, device, dtype, **kw):
    "The smoke checks' tiny LM with its first block on the CPU and every later block offloaded to disk by accelerate."
    m = tiny_lm(arch, **kw).to(device=device, dtype=dtype)
    base, pre = m.base_model, m.base_model_prefix
    blocks = next((n for n, c in base.named_children() if isinstance(c, torch.nn.ModuleList)), None)
    if blocks is None: return m
    dm = {f'{pre}.{n}': 'cpu' for n, c in base.named_children() if n != blocks}
    dm.update({f'{pre}.{blocks}.{i}': 'cpu' if i == 0 else 'disk' for i in range(len(getattr(base, blocks)))})
    dm.update({n: 'cpu' for n, _ in m.named_children() if n != pre})
    return accelerate.dispatch_model(m, device_map=dm, offload_dir=tempfile.mkdtemp())

def test_every_smoke_check_on_offloaded_models_works_or_says_why(monkeypatch):
    "tools/gpu_smoke.py's checks with every tiny LM spread over the CPU and disk: each passes (forward-only methods), or is refused with a ConfigError that names the offloaded weights (methods that need gradients of the weights or change them); none crashes or returns something else."
    import sys
    from pathlib import Path
    tools = Path(__file__).resolve().parents[1]/'tools'
    monkeypatch.syspath_prepend(str(tools/'smoke')); monkeypatch.syspath_prepend(str(tools))
    import _util, gpu_smoke
    monkeypatch.setattr(_util, 'lm', _offloaded_lm)
    smoke = {p.stem for p in (tools/'smoke').glob('*.py')} - {'_util'}
    before = {n: sys.modules.pop(n) for n in smoke if n in sys.modules}   # imported again below, binding the offloading `lm`
    try: rows = gpu_smoke.run('cpu', [torch.float32])
    finally:
        for n in smoke: sys.modules.pop(n, None)
        sys.modules.update(before)
    bad = [r for r in rows if not r[3] and not (r[5].startswith('ConfigError') and 'offloaded' in r[5])]
    assert len(rows) > 80 and not bad, '\n'.join(f"{r[0]}.{r[1]}: {r[5]}" for r in bad)
    assert sum(r[3] for r in rows) > 60   # most checks run through the offloaded model
