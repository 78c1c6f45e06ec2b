"""Tests of interpkit.train: closed-form schedule, a hand-written AdamW loop as second implementation, determinism, assets."""
import copy, hashlib, json, math, os, sys
import pytest, torch
from torch import nn
import torch.nn.functional as F
from interpkit.train import fit, lr_factor, FitResult, save_asset, load_asset, load_asset_into, AssetNotFound, quiet, seeded
from interpkit.models import tiny_lm
from interpkit.errors import ConfigError, NotFiniteError, ShapeError

os.environ.setdefault('HF_HUB_OFFLINE', '1')

def mlp(seed=0, dropout=0.0):
    g = torch.Generator().manual_seed(seed)
    with seeded(seed): m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 3))   # its initial draws replaced below
    with torch.no_grad():
        for p in m.parameters(): p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m

W_TRUE = torch.randn(8, 3, generator=torch.Generator().manual_seed(123))

def make_batch(step, g):
    x = torch.randn(32, 8, generator=g)
    return x, (x @ W_TRUE).argmax(-1)

def xent(model, b): return F.cross_entropy(model(b[0]), b[1])

def closed_form_lr(t, steps, lr, warmup):
    if t < warmup: return lr * (t + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (steps - warmup)))

# ---------------------------------------------------------------- schedule and loop

@pytest.mark.parametrize('steps,warmup', [(40, 0), (40, 10), (7, 3)])
def test_lr_closed_form(steps, warmup):
    res = fit(mlp(), make_batch, xent, steps=steps, lr=3e-3, warmup=warmup, progress=False)
    want = [closed_form_lr(t, steps, 3e-3, warmup) for t in range(steps)]
    assert res.history['lr'].tolist() == pytest.approx(want, rel=1e-12, abs=0)
    assert res.history['step'].tolist() == list(range(steps))
    assert res.history['lr'].iloc[0] == pytest.approx(3e-3 / warmup if warmup else 3e-3)

def test_constant_schedule():
    res = fit(mlp(), make_batch, xent, steps=10, lr=1e-3, warmup=2, schedule='constant', progress=False)
    assert res.history['lr'].tolist() == pytest.approx([5e-4] + [1e-3] * 9)
    with pytest.raises(ConfigError, match="Did you mean 'cosine'"): fit(mlp(), make_batch, xent, steps=3, schedule='cosin')

@pytest.mark.parametrize('grad_clip,wd', [(None, 0.0), (0.5, 0.1)])
def test_matches_manual_adamw(grad_clip, wd):
    "Second implementation: torch's AdamW + LambdaLR driven by hand, same batches."
    steps, lr, warmup, seed = 25, 5e-3, 5, 7
    m1, m2 = mlp(), mlp()
    res = fit(m1, make_batch, xent, steps=steps, lr=lr, warmup=warmup, weight_decay=wd, grad_clip=grad_clip, seed=seed, progress=False)
    opt = torch.optim.AdamW(m2.parameters(), lr=lr, weight_decay=wd)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: closed_form_lr(t, steps, 1.0, warmup))
    g = torch.Generator().manual_seed(seed)
    m2.train()
    for t in range(steps):
        loss = xent(m2, make_batch(t, g))
        opt.zero_grad(); loss.backward()
        if grad_clip: nn.utils.clip_grad_norm_(m2.parameters(), grad_clip)
        opt.step(); sched.step()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        s1, s2 = res.optimizer.state[p1], opt.state[p2]
        torch.testing.assert_close(s1['exp_avg_sq'], s2['exp_avg_sq'], rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(s1['exp_avg'], s2['exp_avg'], rtol=1e-6, atol=1e-10)
        torch.testing.assert_close(p1, p2, rtol=1e-6, atol=1e-7)
    if grad_clip: assert 'grad_norm' in res.history and (res.history['grad_norm'] > 0).all()

def test_loss_decreases_tiny_lm():
    "A 1-layer tiny Llama learns counting: sequences x, x+1, x+2, ... (mod V) from random starts."
    V, L = 16, 12
    model = tiny_lm('llama', n_layers=1, d_model=32, n_heads=2, vocab_size=V, seed=0)
    def batch(step, g): return (torch.randint(0, V, (16, 1), generator=g) + torch.arange(L)) % V
    def loss_fn(m, ids): return F.cross_entropy(m(ids).logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    res = fit(model, batch, loss_fn, steps=40, lr=1e-2, warmup=5, progress=False)
    first, last = res.history['loss'].iloc[0], res.history['loss'].iloc[-5:].mean()
    assert first > 0.9 * math.log(V) and last < 0.2 * first, (first, last)
    assert not model.training                                           # tiny_lm comes in eval mode and goes back to it

def test_same_seed_same_weights():
    runs = []
    for seed in (0, 0, 1):
        m = mlp(dropout=0.3)                                            # dropout draws from torch's RNG
        fit(m, make_batch, xent, steps=20, seed=seed, progress=False)
        runs.append(m.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert not all(torch.equal(runs[0][k], runs[2][k]) for k in runs[0])

def test_rng_state_and_flags_restored():
    m = mlp(dropout=0.3).train()
    m[2].eval()                                                         # a mixed state must come back as it was
    flags = [x.training for x in m.modules()]
    state = torch.get_rng_state()
    fit(m, make_batch, xent, steps=3, progress=False)
    assert [x.training for x in m.modules()] == flags
    assert torch.equal(torch.get_rng_state(), state)

def test_iterables_cycle():
    data = [make_batch(i, torch.Generator().manual_seed(i)) for i in range(3)]
    seen = []
    def loss_fn(m, b):
        seen.append(next(i for i, d in enumerate(data) if d[0] is b[0]))
        return xent(m, b)
    fit(mlp(), data, loss_fn, steps=7, progress=False)                  # a list: restarted
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    seen.clear()
    fit(mlp(), (d for d in data), loss_fn, steps=5, progress=False)     # a one-shot generator: cycled
    assert seen == [0, 1, 2, 0, 1]
    g = torch.Generator().manual_seed(0)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(20, 8, generator=g), torch.randint(0, 3, (20,), generator=g)), batch_size=8, shuffle=True,
                                     generator=torch.Generator().manual_seed(1))
    assert len(fit(mlp(), dl, xent, steps=10, progress=False).history) == 10
    with pytest.raises(ConfigError, match='no batch'): fit(mlp(), [], xent, steps=2, progress=False)

def test_eval_and_logged_metrics():
    modes = []
    def eval_fn(m):
        modes.append((m.training, torch.is_grad_enabled()))
        return {'acc': 0.5, 'loss': torch.tensor(1.0)}
    def loss_fn(m, b):
        loss = xent(m, b)
        return loss, {'double': 2 * loss.detach()}
    res = fit(mlp(), make_batch, loss_fn, steps=10, eval_fn=eval_fn, eval_every=4, progress=False)
    assert isinstance(res, FitResult) and 'FitResult(steps=10' in repr(res)
    assert res.evals['step'].tolist() == [3, 7, 9]
    assert set(modes) == {(False, False)}
    assert res.history['double'].tolist() == pytest.approx((2 * res.history['loss']).tolist())
    assert res.history['eval_acc'].notna().sum() == 3 and res.final_loss == res.history['loss'].iloc[-1]
    res = fit(mlp(), make_batch, xent, steps=20, eval_fn=lambda m: 0.25, progress=False)   # default: about ten evaluations
    assert res.evals['step'].tolist() == list(range(1, 20, 2)) and (res.evals['eval'] == 0.25).all()

def test_nan_loss_raises_at_step():
    def loss_fn(m, b, calls=[0]):
        calls[0] += 1
        loss = xent(m, b)
        return loss * float('nan') if calls[0] > 3 else loss
    with pytest.raises(NotFiniteError, match='at step 3 of 10'): fit(mlp(), make_batch, loss_fn, steps=10, progress=False)
    with pytest.raises(NotFiniteError): fit(mlp(), make_batch, lambda m, b: xent(m, b) + float('inf'), steps=2, progress=False)

def test_bad_input():
    with pytest.raises(ShapeError, match='scalar'): fit(mlp(), make_batch, lambda m, b: m(b[0]).sum(0), steps=2, progress=False)
    with pytest.raises(ConfigError, match='steps'): fit(mlp(), make_batch, xent, steps=0)
    with pytest.raises(ConfigError, match='warmup'): fit(mlp(), make_batch, xent, steps=5, warmup=5)
    with pytest.raises(ConfigError, match='neither iterable nor callable'): fit(mlp(), 3, xent, steps=2)
    frozen = mlp().requires_grad_(False)
    with pytest.raises(ConfigError, match='requires a gradient'): fit(frozen, make_batch, xent, steps=2)

def test_given_optimizer_and_quiet():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    res = fit(m, make_batch, xent, steps=4, optimizer=opt, progress=True)
    assert res.optimizer is opt and res.history['lr'].iloc[1] == pytest.approx(0.1 * lr_factor(1, 4))
    assert quiet()                                                     # PYTEST_CURRENT_TEST is set here

# ---------------------------------------------------------------- assets

def test_asset_round_trip_tensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    t = {'a': torch.randn(3, 4, generator=g), 'b': torch.arange(5), 'c': torch.randn(2, 2, generator=g).to(torch.bfloat16), 'view': torch.randn(4, 4, generator=g)[:, 1]}
    meta = {'config': {'d': 4, 'name': 'x'}, 'seed': 3, 'metrics': {'acc': 0.9}, 'path': tmp_path}
    p = save_asset('toy', t, meta, folder=tmp_path)
    assert p == tmp_path/'toy.safetensors' and (tmp_path/'toy.json').exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ['toy.json', 'toy.safetensors']     # no temporary files left
    got, m = load_asset('toy', folder=tmp_path)
    assert set(got) == set(t) and all(torch.equal(got[k], t[k]) and got[k].dtype == t[k].dtype for k in t)
    assert m['config'] == meta['config'] and m['seed'] == 3 and m['metrics'] == {'acc': 0.9} and m['path'] == str(tmp_path)
    assert m['command'][1:] == sys.argv[1:] and m['date'][:2] == '20' and m['n_params'] == 12 + 5 + 4 + 4
    assert m['sha256'] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert json.loads((tmp_path/'toy.json').read_text()) == m
    save_asset('toy', {'a': torch.zeros(1)}, {'v': 2}, folder=tmp_path)                        # overwrite
    got, m = load_asset('toy', folder=tmp_path)
    assert list(got) == ['a'] and m['v'] == 2 and 'seed' not in m

def test_asset_tied_module(tmp_path):
    lm = tiny_lm('gpt2', n_layers=1, d_model=32, n_heads=2)
    assert lm.lm_head.weight.data_ptr() == lm.transformer.wte.weight.data_ptr()
    save_asset('lm', lm, {'seed': 0}, folder=tmp_path)
    got, _ = load_asset('lm', folder=tmp_path)
    sd = lm.state_dict()
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
    other = tiny_lm('gpt2', n_layers=1, d_model=32, n_heads=2, seed=5)
    assert load_asset_into(other, 'lm', folder=tmp_path) == _
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(): assert torch.equal(other(ids).logits, lm(ids).logits)

def test_asset_missing(tmp_path):
    assets = tmp_path/'interpkit'/'assets'
    assets.mkdir(parents=True)
    (tmp_path/'tools').mkdir()
    (tmp_path/'tools'/'make_probe.py').write_text("save_asset('probe_weights', model, meta)\n")
    save_asset('other', {'x': torch.ones(1)}, folder=assets)
    with pytest.raises(AssetNotFound, match="python tools/make_probe.py") as e: load_asset('probe_weights', folder=assets)
    assert isinstance(e.value, FileNotFoundError) and "['other']" in str(e.value)
    with pytest.raises(FileNotFoundError, match="tools/ folder"): load_asset('nothing_makes_this', folder=assets)
    with pytest.raises(ConfigError, match='not valid'): save_asset('a/b', {'x': torch.ones(1)}, folder=tmp_path)
    with pytest.raises(ConfigError, match='not tensors'): save_asset('bad', {'x': 1}, folder=tmp_path)


def test_lm_loss_scores_a_left_padded_row_as_the_row_alone():
    "Issue 51: left padding shifted the positions and labelled the first real token (predicted from padding)."
    from interpkit.models import tiny_lm
    from interpkit.train import lm_loss
    m = tiny_lm('gpt2', n_layers=1, seed=0)   # absolute positions: a shifted row reads other position embeddings (RoPE models barely notice)
    row = torch.tensor([[7, 8, 9, 10]])
    left = dict(input_ids=torch.tensor([[0, 0, 7, 8, 9, 10]]), attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1]]))
    with torch.no_grad(): torch.testing.assert_close(lm_loss(m, left), lm_loss(m, dict(input_ids=row)), rtol=1e-6, atol=1e-6)
