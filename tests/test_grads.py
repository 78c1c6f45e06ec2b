"""Tests of interpkit.grads, the engine for per-example gradients: the layers it selects, the projections (their
statistics, and TRAK's flat projection against diffusion influence's own `project`), the tasks (LMTask against
hand-written cross-entropies), and per-example gradients against one-example-at-a-time `torch.autograd.grad` (Llama with
left and right padding, GPT-2's Conv1D, a CNN with strided, padded and dilated convolutions, biases and several rows
per example, float64 and bfloat16 models, frozen weights), the optimizer correction, memory caps, typed errors, the
model left untouched, and diffusion influence's `measurement_grads` reproduced through a `Task`."""
import copy, math, warnings
import numpy as np, pytest, torch
import torch.nn.functional as F
from torch import nn
import interpkit.grads as ig
from interpkit.grads import FLAT_BLOCK
from interpkit.errors import ConfigError, ShapeError
from interpkit.grads import (LMTask, Projection, Task, adam_moments, check_grad_setup, factor_moments, grad_modules, grad_shape, lm_labels, make_projection,
                             per_example_grads, project_flat)
from interpkit.models import tiny_lm

torch.set_num_threads(1)

def lm_batch(b=4, t=9, seed=0, left=False, target_only=False):
    "Token ids with padding in rows 1 and 2 (left or right), labels on every real token (or on the last two)."
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (b, t), generator=g)
    mask = torch.ones_like(ids)
    for r, n in ((1, t - 3), (2, t - 5)):
        if left: mask[r, :t - n] = 0
        else: mask[r, n:] = 0
    lab = lm_labels(ids, mask)
    if target_only:
        real = [mask[i].nonzero()[:, 0].tolist() for i in range(b)]
        lab = torch.full_like(ids, -100)
        for i, pos in enumerate(real): lab[i, pos[-2:]] = ids[i, pos[-2:]]
    return dict(input_ids=ids, attention_mask=mask, labels=lab)

def as_matrix(m, w):
    "A weight-shaped tensor as (d_out, d_in), written out: Conv1D stores (in, out), a convolution flattens its kernel."
    if type(m).__name__ == 'Conv1D': return w.T
    return w.flatten(1) if w.dim() == 4 else w

def lm_one(model, batch, i, reduction='mean'):
    "Example i's loss alone: unpadded, with log_softmax over its full logits, positions counted from its first real token."
    real = batch['attention_mask'][i].nonzero()[:, 0]
    ids, lab = batch['input_ids'][i, real][None], batch['labels'][i, real][None]
    lg = model(input_ids=ids).logits[:, :-1]
    lp = lg.to(torch.promote_types(lg.dtype, torch.float32)).log_softmax(-1)
    keep = lab[:, 1:] != -100
    tok = -lp.gather(2, lab[:, 1:].clamp(min=0)[..., None])[..., 0][keep]
    return tok.mean() if reduction == 'mean' else tok.sum()

def brute(model, batch, mods, loss_of, n, bias=False):
    "(n, D): each example's gradients alone by torch.autograd.grad, as (d_out, d_in) matrices flattened, weights then bias, layer by layer."
    rows = []
    for i in range(n):
        params = [p for m in mods.values() for p in ([m.weight] + ([m.bias] if bias and m.bias is not None else []))]
        gs = iter(torch.autograd.grad(loss_of(i), params))
        parts = []
        for m in mods.values():
            parts.append(as_matrix(m, next(gs)).flatten())
            if bias and m.bias is not None: parts.append(next(gs))
        rows.append(torch.cat(parts))
    return torch.stack(rows)

@pytest.mark.parametrize('arch,left', [('llama', False), ('llama', True), ('gpt2', False), ('gpt2', True)])
def test_lm_gradients_against_one_example_at_a_time(arch, left, untouched):
    m = tiny_lm(arch, n_layers=2, d_model=32, seed=1)
    b = lm_batch(4, 9, 2, left=left, target_only=arch == 'gpt2')
    mods = grad_modules(m)
    with untouched(m): got = per_example_grads(m, b, batch_size=3)  # 3 + 1 rows; LMTask and no projection by default
    torch.testing.assert_close(got, brute(m, b, mods, lambda i: lm_one(m, b, i), 4), atol=1e-5, rtol=1e-4)
    with untouched(m): s = per_example_grads(m, b, LMTask('sum'))
    n_scored = ((b['labels'][:, 1:] != -100) & (b['attention_mask'][:, :-1] == 1)).sum(1, keepdim=True)  # a padding position predicts nothing
    torch.testing.assert_close(s, got * n_scored, atol=1e-4, rtol=1e-4)  # d(sum)/dW = n d(mean)/dW

def test_cnn_with_biases_and_several_rows_per_example(untouched):
    "Strided, padded and dilated convolutions and a linear head, biases included, a task of 3 noisy rows per example: against each example alone."
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.Tanh(), nn.Conv2d(3, 4, (2, 3), dilation=(2, 1), padding=(1, 0)), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(5, 2, 9, 9, generator=torch.Generator().manual_seed(1))
    cnn(x[:1])  # materialise the lazy layer
    def loss(model, batch):
        xr = batch['x'].repeat_interleave(3, 0)
        noise = torch.stack([torch.randn(xr.shape[1:], generator=torch.Generator().manual_seed(int(i))) for i in batch['i'].repeat_interleave(3) * 3 + torch.arange(3).repeat(len(batch['i']))])
        return model(xr + 0.3 * noise).pow(2).sum(1).view(-1, 3).mean(1)
    task, data = Task(loss=loss), dict(x=x, i=torch.arange(5))
    mods = grad_modules(cnn)
    assert list(mods) == ['0', '2', '4'] and grad_shape(mods['2'], bias=True) == (4, 3 * 2 * 3 + 1)
    with untouched(cnn): got = per_example_grads(cnn, data, task, bias=True, batch_size=2)
    ref = brute(cnn, data, mods, lambda i: loss(cnn, {k: v[i:i+1] for k, v in data.items()}).sum(), 5, bias=True)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
    assert got.shape[1] == sum(p.numel() for p in cnn.parameters())
    # two-sided projections with the bias column, and a dense one, of the same gradients
    proj = make_projection({n: grad_shape(x_, True) for n, x_ in mods.items()}, 'two_sided', 3, 2, seed=4)
    want, o = [], 0
    for n, x_ in mods.items():
        do, di = grad_shape(x_, True)
        W, bb = ref[:, o:o + do * (di - 1)].view(5, do, di - 1), ref[:, o + do * (di - 1):o + do * di]; o += do * di
        Gaug = torch.cat([W, bb[:, :, None]], 2)  # the bias is the last input column
        want.append((proj.mats[n][0] @ Gaug @ proj.mats[n][1].T).flatten(1))
    torch.testing.assert_close(per_example_grads(cnn, data, task, proj=proj, bias=True), torch.cat(want, 1), atol=1e-5, rtol=1e-4)
    dense = make_projection({n: grad_shape(x_, True) for n, x_ in mods.items()}, 'dense', 2, 2, seed=4)
    assert per_example_grads(cnn, data, task, proj=dense, bias=True).shape == (5, 3 * 4)
    with pytest.raises(ShapeError, match='One value per example'): per_example_grads(cnn, data, Task(loss=lambda mdl, bt: loss(mdl, bt).sum()))
    with pytest.raises(ShapeError, match='rows for'): per_example_grads(cnn, data, Task(loss=lambda mdl, bt: mdl(bt['x'][:-1]).sum(1).repeat(2)[:len(bt['x'])]))

def test_measurement_and_moments_with_biases():
    "`of='measurement'` differentiates the measurement; an elementwise correction divides weights and biases by sqrt(v) + eps."
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))
    data = dict(x=torch.randn(6, 4, generator=torch.Generator().manual_seed(3)))
    task = Task(loss=lambda m, b: m(b['x']).pow(2).sum(1), measurement=lambda m, b: m(b['x'])[:, 0])
    mods = grad_modules(net)
    ref = brute(net, data, mods, lambda i: net(data['x'][i:i+1])[0, 0], 6, bias=True)
    torch.testing.assert_close(per_example_grads(net, data, task, of='measurement', bias=True), ref)
    g = torch.Generator().manual_seed(5)
    v = {n: torch.rand(p.shape, generator=g) + 0.2 for n, p in net.named_parameters()}
    got = per_example_grads(net, data, task, moments=v, bias=True, of='measurement', eps=0.1)
    denom = torch.cat([torch.cat([(v[f'{n}.weight'].sqrt() + 0.1).flatten(), v[f'{n}.bias'].sqrt() + 0.1]) for n in mods])
    torch.testing.assert_close(got, ref / denom)
    with pytest.raises(ConfigError, match='bias'): per_example_grads(net, data, task, moments={k: x for k, x in v.items() if not k.endswith('bias')}, bias=True)
    with pytest.raises(ConfigError, match='Factored'): per_example_grads(net, data, task, moments=factor_moments(v, mods), bias=True)
    with pytest.raises(ConfigError, match="of='x'"): per_example_grads(net, data, task, of='x')

def test_frozen_float64_bfloat16_and_memory_cap(untouched):
    m = tiny_lm('llama', n_layers=1, d_model=32, seed=3)
    b = lm_batch(3, 8, 4)
    want = per_example_grads(m, b)
    frozen = copy.deepcopy(m).requires_grad_(False)
    with untouched(frozen): torch.testing.assert_close(per_example_grads(frozen, b), want, atol=1e-6, rtol=1e-5)
    m64 = copy.deepcopy(m).double()
    g64 = per_example_grads(m64, b)
    assert g64.dtype == torch.float64
    torch.testing.assert_close(g64, brute(m64, b, grad_modules(m64), lambda i: lm_one(m64, b, i), 3), atol=1e-10, rtol=1e-9)
    assert per_example_grads(copy.deepcopy(m).to(torch.bfloat16), b).dtype == torch.float32  # outer products in float32
    v = {n: torch.rand(p.shape, generator=torch.Generator().manual_seed(1)) + 0.1 for n, p in m.named_parameters()}
    proj = make_projection(grad_modules(m), 'two_sided', 3, 2)
    whole = per_example_grads(m, b, proj=proj, moments=v)
    for cap in (1, 4 * 2 * 32 * 32):  # one example at a time; two at a time for the 32 x 32 layers
        torch.testing.assert_close(per_example_grads(m, b, proj=proj, moments=v, max_bytes=cap), whole, atol=1e-5, rtol=1e-4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        torch.testing.assert_close(per_example_grads(m, b, proj=proj, moments=v, max_elems=1), whole, atol=1e-5, rtol=1e-4)  # the old name
    assert any(issubclass(x.category, FutureWarning) and 'max_bytes' in str(x.message) for x in w)
    with pytest.raises(ConfigError, match='max_bytes'): per_example_grads(m, b, max_bytes=0)

def test_two_sided_projection_first_equals_projecting_full_gradients():
    m = tiny_lm('gpt2', n_layers=1, d_model=32, seed=6)
    b = lm_batch(3, 8, 7)
    mods = grad_modules(m)
    full = per_example_grads(m, b)
    proj = make_projection(mods, 'two_sided', 4, 3, seed=2)
    want, o = [], 0
    for n, x in mods.items():
        do, di = grad_shape(x); G = full[:, o:o + do * di].view(-1, do, di); o += do * di
        want.append((proj.mats[n][0] @ G @ proj.mats[n][1].T).flatten(1))
    torch.testing.assert_close(per_example_grads(m, b, proj=proj), torch.cat(want, 1), atol=1e-5, rtol=1e-4)
    fm = factor_moments({n: torch.rand(p.shape, generator=torch.Generator().manual_seed(0)) + 0.1 for n, p in m.named_parameters()}, mods)
    want, o = [], 0
    for n, x in mods.items():  # the factored correction: diag(s_out) G diag(s_in), projected
        do, di = grad_shape(x); G = full[:, o:o + do * di].view(-1, do, di); o += do * di
        so, si = fm[f'{n}.weight']
        want.append((proj.mats[n][0] @ (so[:, None] * G * si[None]) @ proj.mats[n][1].T).flatten(1))
    torch.testing.assert_close(per_example_grads(m, b, proj=proj, moments=fm), torch.cat(want, 1), atol=1e-4, rtol=1e-4)

def test_grad_modules_selection_and_errors():
    m = tiny_lm('llama', n_layers=2, d_model=32)
    assert len(grad_modules(m)) == 14 and 'lm_head' not in grad_modules(m) and 'lm_head' in grad_modules(m, head=True)
    assert list(grad_modules(m, pattern='layers\\.1\\..*proj$', kinds='linear'))[:2] == ['model.layers.1.self_attn.q_proj', 'model.layers.1.self_attn.k_proj']
    assert list(grad_modules(m, 'model.layers.0.mlp.up_proj')) == ['model.layers.0.mlp.up_proj']
    with pytest.raises(ConfigError, match="Did you mean 'model.layers.0.mlp.up_proj'"): grad_modules(m, ['model.layers.0.mlp.up'])
    with pytest.raises(ConfigError, match='matches'): grad_modules(m, pattern='nothing-like-this')
    with pytest.raises(ConfigError, match='kinds'): grad_modules(m, kinds=('conv3d',))
    with pytest.raises(ConfigError, match='are not linear layers'): grad_modules(m, {'x': nn.ReLU()}, kinds='linear')
    with pytest.raises(ConfigError, match='empty'): grad_modules(m, {})
    cnn = nn.Sequential(nn.Conv2d(1, 2, 3, padding='same'), nn.Conv2d(2, 2, 1), nn.Conv2d(2, 4, 1, groups=2))
    assert list(grad_modules(cnn)) == ['1']  # string padding and groups are left out
    with pytest.raises(ConfigError, match='grouped or string-padded'): grad_modules(cnn, ['0', '1'])
    with pytest.raises(ConfigError, match='no linear layer'): grad_modules(cnn, kinds='linear')

def test_projection_statistics_and_seeds():
    "Each layer's matrices depend on (seed, path) only; entries of variance 1/k; inner products preserved on average (Monte Carlo, 4 standard errors)."
    p = make_projection({'a': (60, 50), 'b': (60, 50)}, 'two_sided', 8, 6, seed=1)
    assert torch.equal(p.mats['a'][0], make_projection({'z': (3, 3), 'a': (60, 50)}, 'two_sided', 8, 6, seed=1).mats['a'][0])
    assert not torch.equal(p.mats['a'][0], make_projection({'a': (60, 50)}, 'two_sided', 8, 6, seed=2).mats['a'][0])
    big = make_projection({'a': (2000, 1000)}, 'two_sided', 50, 40, seed=0)
    for P, k in zip(big.mats['a'], (50, 40)):  # 40,000+ entries: the sample variance's relative standard error is below 0.7%, so 5% is 7 of them
        assert abs(P.var().item() * k - 1) < 0.05 and abs(P.mean().item()) < 5 / math.sqrt(P.numel() * k)
    g = torch.Generator().manual_seed(0)
    G, H = torch.randn(7, 6, generator=g), torch.randn(7, 6, generator=g)
    H = G + 0.5 * H
    for kind, dist in (('two_sided', 'gaussian'), ('dense', 'rademacher')):
        vals = torch.tensor([((lambda P: ((P[0] @ G @ P[1].T).flatten() @ (P[0] @ H @ P[1].T).flatten()) if kind == 'two_sided' else (P[0] @ G.flatten()) @ (P[0] @ H.flatten()))(
            make_projection({'w': (7, 6)}, kind, 3, 2, seed=s, dist=dist).mats['w'])).item() for s in range(500)])
        assert abs(vals.mean() - (G * H).sum()) < 4 * vals.std() / math.sqrt(500), (kind, vals.mean(), (G * H).sum())
    with pytest.raises(ConfigError, match='dense projection'): make_projection({'a': (100, 100)}, 'dense', 16, 16, max_bytes=10**6)
    with pytest.warns(FutureWarning, match='max_dense'):  # the old name of the cap
        make_projection({'a': (100, 100)}, 'dense', 2, 2, max_dense=10**9)
    with pytest.raises(ConfigError, match='k_out'): make_projection({'a': (3, 3)}, k_out=0)
    assert isinstance(p, Projection) and p.dims() == {'a': 48, 'b': 48} and 'tensor(8, 60) float32' in repr(p)

def test_project_flat_against_the_whole_matrix():
    "`project_flat` equals one product with the whole (P, dim) matrix made of its seeded blocks of `FLAT_BLOCK` rows (block i: seed * 1_000_003 + i), on any rows."
    X = torch.randn(5, 9000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    R = torch.cat([torch.randn(min(FLAT_BLOCK, 9000 - i), 32, generator=torch.Generator().manual_seed(3 * 1_000_003 + i), dtype=torch.float64)
                   for i in range(0, 9000, FLAT_BLOCK)])
    torch.testing.assert_close(project_flat(X, 32, seed=3), X @ R / math.sqrt(32), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(project_flat(X[3:], 32, seed=3), project_flat(X, 32, seed=3)[3:], atol=1e-12, rtol=1e-12)
    assert not torch.allclose(project_flat(X, 32, seed=4), project_flat(X, 32, seed=3))
    assert project_flat(X.to('meta'), 8).device.type == 'meta'  # computed where the gradients are
    with pytest.raises(ConfigError, match='dim'): project_flat(X, 0)
    with pytest.raises(ShapeError): project_flat(X[0])

def test_engine_reproduces_diffusion_influence_measurement_grads(untouched):
    "Diffusion influence's per-example gradients (k (t, eps) draws per image, Linear and Conv2d layers with their biases) through a `Task`, against per-image autograd."
    pytest.importorskip('curvlinops')
    from diffusers import DDPMScheduler
    import interpkit.papers.diffusion_influence as di
    unet, sched = di.tiny_ddpm(seed=1), DDPMScheduler(**di.DDPM_SCHEDULER)
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(2)).clamp(-1, 1)
    s, k, seed = di._schedule(sched), 4, 7
    def measurement_of(kind):
        def fn(model, batch):  # each image's mean over its k draws, the draws of image i depending on (seed, i) only
            i0 = int(batch['i'][0])
            t, eps = di.draws(len(batch['x']), k, tuple(x.shape[1:]), s['T'], seed, start=i0)
            terms = di._terms(model, sched, s, batch['x'].repeat_interleave(k, 0), t.flatten(), eps.flatten(0, 1), kind, di.denoiser_forward)
            return terms.view(-1, k).mean(1)
        return fn
    for kind in ('loss', 'square_norm'):
        task = Task(loss=measurement_of('loss'), measurement=measurement_of(kind))
        with untouched(unet): got = per_example_grads(unet, dict(x=x, i=torch.arange(5)), task, of='measurement', bias=True, batch_size=2)
        params = di.influence_params(grad_modules(unet))   # each tracked layer's weight, then its bias: the engine's column order
        want = torch.stack([torch.cat([g.flatten() for g in torch.autograd.grad(measurement_of(kind)(unet, dict(x=x[i:i + 1], i=torch.tensor([i])))[0], params)])
                            for i in range(5)])   # one image at a time, plain autograd
        torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-4)
        assert torch.equal(got, di.measurement_grads(unet, sched, x, kind, k, seed, batch_size=2 * k))   # the paper module's entry point is this engine call

def test_tasks_and_lm_task_by_hand():
    m = tiny_lm('llama', n_layers=1, d_model=32, seed=8)
    b = lm_batch(4, 9, 9, left=True, target_only=True)
    with torch.no_grad():
        want = torch.stack([lm_one(m, b, i) for i in range(4)])
        torch.testing.assert_close(LMTask().loss(m, b), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(LMTask().logprob(m, b), -want * 2, atol=1e-5, rtol=1e-5)  # two scored tokens each
        zero = {'model.layers.0.mlp.down_proj.weight': torch.zeros_like(m.model.layers[0].mlp.down_proj.weight)}
        mc = copy.deepcopy(m); mc.model.layers[0].mlp.down_proj.weight.zero_()
        torch.testing.assert_close(LMTask().loss(m, b, params=zero), LMTask().loss(mc, b))  # other parameter values, the model unchanged
    assert LMTask().measurement(m, b).shape == (4,) and repr(LMTask('sum')) == "LMTask(reduction='sum')"
    with pytest.raises(ConfigError, match='reduction'): LMTask('max')
    with pytest.raises(ShapeError, match='input_ids'): per_example_grads(m, b['input_ids'])
    with pytest.raises(ConfigError, match='no labelled token'): per_example_grads(m, dict(b, labels=torch.full_like(b['labels'], -100)))
    with pytest.raises(ConfigError, match='has no loss'): Task().loss(m, b)
    with pytest.raises(ShapeError, match='first dimensions'): Task(loss=lambda mdl, bt: bt['x']).check(dict(x=torch.zeros(3), y=torch.zeros(2)))

def test_optimizer_moments():
    m = tiny_lm('llama', n_layers=1, d_model=32, seed=0)
    opt = torch.optim.AdamW(m.parameters())
    with pytest.raises(ConfigError, match='exp_avg_sq'): adam_moments(m, opt)
    m(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward(); opt.step()
    v = adam_moments(m, opt)
    assert all(torch.equal(v[n], opt.state[p]['exp_avg_sq']) and v[n] is not opt.state[p]['exp_avg_sq'] for n, p in m.named_parameters())
    with pytest.warns(FutureWarning, match='model comes first'): old = adam_moments(opt, m)  # the old order
    assert all(torch.equal(old[n], v[n]) for n in v)
    mods = grad_modules(m)
    fm = factor_moments(v, mods)
    for n in mods:  # the formula, with numpy loops over rows and columns
        vv = v[f'{n}.weight'].double().numpy(); r, c = np.maximum(vv.mean(1), 1e-30), np.maximum(vv.mean(0), 1e-30)
        np.testing.assert_allclose(fm[f'{n}.weight'][0].numpy(), [math.sqrt(r.mean() / ri) for ri in r], rtol=1e-5)
        np.testing.assert_allclose(fm[f'{n}.weight'][1].numpy(), [1 / math.sqrt(cj) for cj in c], rtol=1e-5)
    with pytest.raises(ConfigError, match='no matrices'): check_grad_setup(mods, make_projection({'x': (3, 3)}))
    with pytest.raises(ShapeError, match='laid out like'): check_grad_setup(mods, make_projection(mods), {k: x.T.contiguous() if 'up_proj' in k else x for k, x in v.items()})

def test_autograd_is_asked_for_the_input_embeddings_only(monkeypatch):
    "Where the model has input embeddings, autograd returns their gradient alone: each layer's output gradient is freed once projected."
    m = tiny_lm('llama', n_layers=2, d_model=32, seed=1)
    asked, grad = [], torch.autograd.grad
    def spy(outputs, inputs, *a, **kw): asked.append(len(inputs)); return grad(outputs, inputs, *a, **kw)
    monkeypatch.setattr(torch.autograd, 'grad', spy)
    got = per_example_grads(m, lm_batch(3, 7, 2), proj=make_projection(grad_modules(m), k_out=2, k_in=2))
    monkeypatch.undo()
    assert asked == [1]
    monkeypatch.setattr(ig, '_root_site', lambda model: None)
    torch.testing.assert_close(per_example_grads(m, lm_batch(3, 7, 2), proj=make_projection(grad_modules(m), k_out=2, k_in=2)), got)


def test_grad_modules_says_which_convolutions_it_leaves_out():
    "Issue 51: Conv2d(padding='same') and grouped convolutions were left out silently; now a warning names them, and naming one is refused."
    import warnings
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding='same'), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 8, 2))
    with pytest.warns(UserWarning, match=r"1 grouped or string-padded convolution\(s\) left out: \['0'\]"): got = grad_modules(net)
    assert list(got) == ['2', '4']
    with pytest.raises(ConfigError, match='string-padded'): grad_modules(net, ['0'])
    with warnings.catch_warnings(): warnings.simplefilter('error'); assert list(grad_modules(net, kinds='linear')) == ['4']


def test_token_ids_the_model_does_not_embed_are_named():
    "Issue 51: inputs from another vocabulary gave a raw IndexError from the embedding."
    from interpkit.grads import LMTask
    m = tiny_lm('llama')
    for bad in (300, 128):   # 128: one past the last id
        with pytest.raises(ConfigError, match=rf'holds token id\(s\) \[{bad}\], but LlamaForCausalLM embeds ids 0 to 127'):
            LMTask().loss(m, dict(input_ids=torch.tensor([[5, bad, 7]])))
    assert torch.isfinite(LMTask().loss(m, dict(input_ids=torch.tensor([[5, 127, 0]])))).all()
