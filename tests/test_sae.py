"""Tests of interpkit.sae: planted-dictionary recovery (top-k and ReLU+L1), NMSE against scikit-learn's R^2,
top-k against a sort, streamed activations against hidden_states, dead-feature tracking, typed errors, model untouched."""
import copy, os
import pytest, torch
from interpkit.errors import ConfigError, ShapeError, SiteError
from interpkit.models import tiny_lm
from interpkit.train import seeded
from interpkit.sae import SAE, train_sae, sae_metrics, normalized_mse, stream_activations, planted_data, match_directions

os.environ.setdefault('HF_HUB_OFFLINE', '1')
torch.set_num_threads(1)

@pytest.mark.parametrize('kind,kw', [('topk', dict(k=3, lr=1e-2)), ('relu', dict(l1=1.0, lr=1e-2))])
def test_planted_dictionary_is_recovered(kind, kw):
    x, D = planted_data(20_000, d=24, n_features=48, active=3, seed=0)
    sae = SAE(24, 96, kind, top_k=kw.get('k'), seed=1)
    train_sae(sae, x, steps=2000, batch_size=256, lr=kw['lr'], l1=kw.get('l1', 0.), progress=False)
    cos = match_directions(sae.directions.detach(), D)
    m = sae_metrics(sae, x)
    assert (cos > 0.95).float().mean() >= 0.9, cos.sort().values[:8]
    assert m.nmse < (0.1 if kind == 'topk' else 0.2), m
    if kind == 'topk': assert m.l0 == 3
    else: assert m.l0 < 12   # sparse: the planted codes have 3 active features

def test_exact_reconstruction_with_the_planted_dictionary():
    "Reachability: with the planted directions as decoder and a matched encoder, top-k reconstructs exactly when directions are orthonormal."
    d = 16
    Q = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(0))).Q.T
    sae = SAE(d, d, 'topk', top_k=3)
    with torch.no_grad(): sae.W_dec.copy_(Q); sae.W_enc.copy_(Q.T)
    g = torch.Generator().manual_seed(1)
    idx = torch.rand(500, d, generator=g).argsort(-1)[:, :3]
    coef = torch.zeros(500, d).scatter(-1, idx, 0.5 + torch.rand(500, 3, generator=g))
    x = coef @ Q
    torch.testing.assert_close(sae(x), x, atol=1e-5, rtol=1e-5)
    assert sae_metrics(sae, x).nmse < 1e-10

def test_normalized_mse_matches_sklearn_r2():
    from sklearn.metrics import r2_score
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 7, generator=g) * torch.arange(1, 8)
    xh = x + 0.3 * torch.randn(200, 7, generator=g)
    ref = 1 - r2_score(x.numpy(), xh.numpy(), multioutput='variance_weighted')
    assert abs(normalized_mse(x, xh) - ref) < 1e-5

def test_topk_matches_sort():
    sae = SAE(10, 40, 'topk', top_k=5, seed=3)
    x = torch.randn(64, 10, generator=torch.Generator().manual_seed(2))
    f = sae.encode(x)
    pre = torch.relu((x * sae.scale - sae.b_dec) @ sae.W_enc + sae.b_enc)
    thr = pre.sort(-1, descending=True).values[:, 4:5]
    ref = torch.where(pre >= thr, pre, torch.zeros_like(pre))
    torch.testing.assert_close(f, ref)
    assert ((f > 0).sum(-1) <= 5).all()

def test_stream_matches_hidden_states_with_padding_and_leaves_model_alone(untouched):
    m = tiny_lm('llama', n_layers=3, seed=4).train()
    m.model.layers[0].eval()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 128, (4, 10), generator=g)
    mask = torch.ones(4, 10, dtype=torch.long); mask[1, 7:] = 0; mask[3, 5:] = 0  # right padding
    with untouched(m):
        chunks = list(stream_activations(m, [dict(input_ids=ids, attention_mask=mask)], 'resid_post(1)', skip_first=1))
        late = list(stream_activations(m, [dict(input_ids=ids, attention_mask=mask)], 'resid_post(1)', skip_first=1, stop_early=False))
        with pytest.raises(SiteError): next(stream_activations(m, ids, 'resid_post(9)'))
    with torch.no_grad():
        m2 = copy.deepcopy(m).eval()
        hs = m2(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[2]
    keep = mask.bool().clone(); keep[:, 0] = False
    torch.testing.assert_close(chunks[0], hs[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(late[0], chunks[0])
    assert len(chunks[0]) == int(keep.sum())

def test_dead_feature_tracking():
    x, _ = planted_data(4000, d=12, n_features=12, active=2, seed=2)
    sae = SAE(12, 24, 'relu', seed=0)
    with torch.no_grad(): sae.W_enc[:, :3] = 0; sae.b_enc[:3] = -100.   # features 0..2 can never fire
    res = train_sae(sae, x, steps=40, batch_size=50, l1=0.1, dead_after=1000, progress=False)
    assert (sae.since_fired[:3] == 40 * 50).all()
    assert res.history.dead_frac.iloc[-1] >= 3 / 24
    assert res.history.dead_frac.iloc[0] == 0  # nobody is dead before dead_after inputs
    assert sae_metrics(sae, x).dead_frac >= 3 / 24

def test_training_from_a_stream_reduces_error():
    m = tiny_lm('llama', n_layers=2, seed=0)
    ids = torch.randint(0, 128, (256, 17), generator=torch.Generator().manual_seed(0))
    sae = SAE(64, 128, 'topk', top_k=8)
    res = train_sae(sae, stream_activations(m, ids, 'resid_post(0)', batch_size=16), steps=120, batch_size=32, buffer=1024, lr=1e-2, progress=False)  # 4096 rows, 3872 used
    acts = torch.cat(list(stream_activations(m, ids, 'resid_post(0)')))
    assert sae_metrics(sae, acts).nmse < 0.7 * res.history.nmse.iloc[:3].mean()

def test_typed_errors():
    with pytest.raises(ConfigError): SAE(8, 16, 'topk')
    with pytest.raises(ConfigError): SAE(8, 16, 'gated')
    with pytest.raises(ConfigError): SAE(0, 16)
    with seeded(0): sae = SAE(8, 16)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ShapeError): sae.encode(torch.zeros(3, 9))
    with pytest.raises(ShapeError): sae.decode(torch.zeros(3, 9))
    with pytest.raises(ShapeError): train_sae(sae, torch.zeros(10, 9), steps=2, progress=False)
    with pytest.raises(ConfigError): train_sae(sae, torch.randn(100, 8, generator=g), steps=0, progress=False)
    with pytest.raises(ConfigError): normalized_mse(torch.ones(4, 2), torch.ones(4, 2))
    with pytest.raises(ConfigError): train_sae(sae, iter([torch.randn(50, 8, generator=g)]), steps=5, batch_size=32, progress=False)


def test_bfloat16_model_and_sae():
    "A bfloat16 model streams bfloat16 activations as float32 chunks; a bfloat16 SAE trains on them and reports its metrics."
    m = tiny_lm('gpt2', n_layers=2).to(torch.bfloat16)
    ids = torch.randint(0, 128, (16, 12), generator=torch.Generator().manual_seed(7))
    chunks = list(stream_activations(m, ids, 'resid_post(0)', batch_size=8))
    assert all(c.dtype == torch.float32 for c in chunks)
    sae = SAE(64, 32, 'topk', top_k=4).to(torch.bfloat16)
    train_sae(sae, torch.cat(chunks), steps=5, batch_size=32, progress=False)
    met = sae_metrics(sae, torch.cat(chunks))
    assert met.n == sum(map(len, chunks)) and met.l0 == 4 and 0 < met.nmse < 2
    assert repr(met).startswith('SAEMetrics(nmse=')


def test_the_old_name_k_still_works_with_a_warning():
    "SAE's `k` is `top_k` (the vocabulary: no bare k); the old keyword and attribute keep working for one release."
    with pytest.warns(FutureWarning, match='k= is now called top_k='): old = SAE(8, 16, 'topk', k=3, seed=2)
    new = SAE(8, 16, 'topk', top_k=3, seed=2)
    assert old.top_k == new.top_k == old.k == 3 and all(torch.equal(a, b) for a, b in zip(old.parameters(), new.parameters()))
    with pytest.raises(ConfigError, match='top_k=True'): SAE(8, 16, 'topk', top_k=True)
