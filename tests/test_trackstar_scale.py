"""Tests of TrackStar at scale: the factored correction against the full per-example gradient and against the exact Adam
correction where v is rank one; chunked full gradients; the labelled-positions loss; the bergson-matched settings (Rademacher
projection, summed loss) against a brute-force computation; float16 storage; a `Projection` passed as is; `example_memory`
against sizes measured on disk; the cheaper tail-patch against a manual step on a subset of the parameters; an index built by
two processes under `torchrun` against one built in one process (and that importing the module lets `destroy_process_group` free the
group, which torch.distributed.fsdp imported after it prevents); and the typed errors (a changed model, a missing or damaged
shard, a world size that does not match the shards)."""
import json, os, socket, subprocess, sys, textwrap
import numpy as np, pytest, torch
from interpkit.errors import ConfigError, ShapeError
from interpkit.hooks import linear_modules
from interpkit.models import tiny_lm
import interpkit.grads as ig
import interpkit.papers.trackstar as ts
from interpkit.grads import Projection, factor_moments, make_projection
from interpkit.papers.trackstar import GradIndex, IndexMismatch, ShardError, example_grads, example_losses, example_memory, scores, tail_patch, target_logprob
from test_trackstar import brute_full, fake_moments, oriented, rand_batch, shapes

torch.set_num_threads(1)

def brute_grads(m, batch, i, loss):
    "Example i's weight gradients (d_out, d_in) of its own mean or summed token loss, by autograd on the unpadded example."
    full = brute_full(m, batch, i)  # of the mean loss
    if loss == 'mean': return full
    lab = batch['labels'][i, 1:]
    n = int(((lab != -100) & (batch['attention_mask'][i, 1:] == 1)).sum())
    return {k: g * n for k, g in full.items()}  # d(sum)/dW = n * d(mean)/dW

@pytest.mark.parametrize('arch', ['llama', 'gpt2'])
def test_factored_correction_equals_rank_one_full_and_exact(arch, untouched):
    m = tiny_lm(arch, n_layers=2, d_model=32, seed=3)
    b = rand_batch(5, 10, 4)
    lin = linear_modules(m)
    mom = fake_moments(m, 5)
    fm = factor_moments(mom, lin)
    for n, x in lin.items():  # the formula, written out with numpy loops over rows and columns
        v = oriented(m, n, mom[f'{n}.weight']).double().numpy()
        r, c = v.mean(1), v.mean(0)
        np.testing.assert_allclose(fm[f'{n}.weight'][0].numpy(), [np.sqrt(r.mean() / ri) for ri in r], rtol=1e-5)
        np.testing.assert_allclose(fm[f'{n}.weight'][1].numpy(), [1 / np.sqrt(cj) for cj in c], rtol=1e-5)
    proj = make_projection(lin, k_out=3, k_in=5, seed=2)
    rank1 = {f'{n}.weight': oriented(m, n, 1 / (fm[f'{n}.weight'][0][:, None] * fm[f'{n}.weight'][1][None]) ** 2) for n in lin}  # laid out like each weight
    with untouched(m):
        fast = example_grads(m, b, proj, fm)
        full = example_grads(m, b, proj, rank1, eps=0.)
    torch.testing.assert_close(fast, full, atol=1e-5 * float(full.abs().max()), rtol=1e-4)
    # where v is exactly rank one, Adafactor's factors give it back, and the factored correction is the exact one
    g = torch.Generator().manual_seed(1)
    uv = {f'{n}.weight': oriented(m, n, torch.rand(o, generator=g)[:, None] * torch.rand(i, generator=g)[None] + 0) for n, (o, i) in shapes(m).items()}
    exact = example_grads(m, b, proj, uv, eps=0.)
    torch.testing.assert_close(example_grads(m, b, proj, factor_moments(uv, lin)), exact, atol=1e-5 * float(exact.abs().max()), rtol=1e-4)
    assert not torch.allclose(fast, example_grads(m, b, proj, mom), rtol=1e-2)  # a generic v is not rank one

@pytest.mark.parametrize('kind', ['two_sided', 'dense', 'none'])
def test_chunked_full_gradients_match(kind):
    m = tiny_lm('llama', n_layers=1, d_model=32, seed=4)
    b = rand_batch(5, 8, 1)
    proj = make_projection(shapes(m), kind, 2, 3)
    mom = fake_moments(m, 1)
    whole = example_grads(m, b, proj, mom)
    torch.testing.assert_close(example_grads(m, b, proj, mom, max_bytes=1), whole, atol=1e-5 * float(whole.abs().max()), rtol=1e-4)  # one example at a time
    torch.testing.assert_close(example_grads(m, b, proj, mom, max_bytes=4 * (2 * 32 * 32 + 1)), whole, atol=1e-5 * float(whole.abs().max()), rtol=1e-4)  # two at a time for the 32 x 32 modules (float32)
    with pytest.raises(ConfigError, match='max_bytes'): example_grads(m, b, proj, mom, max_bytes=0)

def test_logits_only_at_scored_positions():
    m = tiny_lm('llama', n_layers=1, seed=2)
    b = rand_batch(4, 9, 3, target_only=True)
    seen = []
    h = m.get_output_embeddings().register_forward_hook(lambda mod, a, o: seen.append(tuple(o.shape)))
    try: example_losses(m, b); target_logprob(m, b)
    finally: h.remove()
    n = int((b['labels'][:, 1:] != -100).sum())
    assert seen == [(1, n, m.config.vocab_size)] * 2  # the vocabulary projection ran on the n scored positions only
    with torch.no_grad():
        lp = m(input_ids=b['input_ids'], attention_mask=b['attention_mask']).logits[:, :-1].log_softmax(-1)
    lab = b['labels'][:, 1:]
    tok = torch.where(lab != -100, -lp.gather(2, lab.clamp(min=0)[..., None])[..., 0], 0.)
    torch.testing.assert_close(example_losses(m, b, loss='sum').detach(), tok.sum(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(example_losses(m, b).detach(), tok.sum(1) / (lab != -100).sum(1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match='loss'): example_losses(m, b, loss='max')

def test_rademacher_projection():
    p = make_projection({'a': (40, 30)}, k_out=8, k_in=4, seed=1, dist='rademacher')
    P_out, P_in = p.mats['a']
    assert p.dist == 'rademacher' and P_out.shape == (8, 40) and P_in.shape == (4, 30)
    torch.testing.assert_close(P_out.abs(), torch.full((8, 40), 8 ** -0.5)); torch.testing.assert_close(P_in.abs(), torch.full((4, 30), 0.5))
    assert 0.3 < (P_out > 0).float().mean() < 0.7  # 320 fair signs: the fraction has standard error 0.028, so 0.2 is 7 of them (false failure < 1e-11 for any seed)
    assert torch.equal(make_projection({'a': (40, 30)}, k_out=8, k_in=4, seed=1, dist='rademacher').mats['a'][0], P_out)  # seeded
    assert not torch.equal(make_projection({'a': (40, 30)}, k_out=8, k_in=4, seed=2, dist='rademacher').mats['a'][0], P_out)
    with pytest.raises(ConfigError, match='dist'): make_projection({'a': (4, 3)}, dist='uniform')

@pytest.mark.parametrize('factored', [False, True])
def test_bergson_settings_against_brute_force(factored, tmp_path, untouched):
    "Rademacher projection, summed loss, (factored) correction, unit-normalised scores: against per-example autograd gradients."
    m = tiny_lm('llama', n_layers=2, d_model=32, seed=6)
    lin = linear_modules(m)
    tr, q = rand_batch(6, 10, 7), rand_batch(3, 10, 8, target_only=True)
    mom = fake_moments(m, 3)
    corr = factor_moments(mom, lin) if factored else mom
    proj = make_projection(lin, k_out=4, k_in=4, seed=5, dist='rademacher')
    def ref(batch):
        rows = []
        for i in range(batch['input_ids'].shape[0]):
            parts = []
            for k, G in brute_grads(m, batch, i, 'sum').items():
                if factored: G = corr[f'{k}.weight'][0][:, None] * G * corr[f'{k}.weight'][1][None]
                else: G = G / (oriented(m, k, mom[f'{k}.weight']).sqrt() + 1e-8)
                P = proj.mats[k]
                parts.append((P[0] @ G @ P[1].T).flatten())
            rows.append(torch.cat(parts))
        return torch.stack(rows)
    G_ref, q_ref = ref(tr), ref(q)
    with untouched(m):
        idx = GradIndex.build(m, tr, tmp_path/'i', moments=corr, projection=proj, loss='sum', batch_size=4)
        G, qg = torch.from_numpy(np.array(idx.grads)), idx.query_grads(m, q, corr)
    torch.testing.assert_close(G, G_ref, atol=1e-4 * float(G_ref.abs().max()), rtol=1e-4)
    torch.testing.assert_close(qg, q_ref, atol=1e-4 * float(q_ref.abs().max()), rtol=1e-4)
    cos = (q_ref / q_ref.norm(dim=1, keepdim=True)) @ (G_ref / G_ref.norm(dim=1, keepdim=True)).T
    hits = idx.topk(qg, top_k=6)
    torch.testing.assert_close(hits.scores, cos.sort(1, descending=True).values.float(), atol=1e-4, rtol=1e-4)
    assert idx.meta['loss'] == 'sum' and idx.meta['custom_projection'] and idx.meta['factored'] == factored
    reopened = GradIndex(tmp_path/'i').projection()  # the matrices travel with the index
    assert all(torch.equal(a, b) for k in proj.mats for a, b in zip(reopened.mats[k], proj.mats[k]))

def test_float16_storage_and_projection_object(tmp_path):
    m = tiny_lm('llama', n_layers=1, seed=7)
    bs = [rand_batch(8, 10, s) for s in range(2)]
    a = GradIndex.build(m, bs, tmp_path/'a', k_out=2, k_in=2)
    h = GradIndex.build(m, bs, tmp_path/'h', k_out=2, k_in=2, store_dtype='float16')
    f32, f16 = (tmp_path/x/'grads-00000-of-00001.bin' for x in 'ah')
    assert f16.stat().st_size * 2 == f32.stat().st_size == 16 * a.dim * 4
    G32, G16 = torch.from_numpy(np.array(a.grads)), torch.from_numpy(np.array(h.grads)).float()
    torch.testing.assert_close(G16, G32.half().float())
    q = a.query_grads(m, rand_batch(2, 10, 5, target_only=True))
    assert torch.equal(a.topk(q, 3).indices, h.topk(q, 3).indices) or torch.allclose(a.topk(q, 3).scores, h.topk(q, 3).scores, atol=1e-2)
    with pytest.raises(ConfigError, match='store_dtype'): GradIndex.build(m, bs, tmp_path/'x', store_dtype='int8')

def test_example_memory_against_measured_sizes(tmp_path):
    m = tiny_lm('llama', n_layers=2, seed=1)
    em = example_memory(m, seq_len=12, k_out=2, k_in=3)
    lin = linear_modules(m)
    assert em.entries.iloc[0] == sum(x.weight.numel() for x in lin.values())
    assert em.loc['largest module gradient (exact Adam correction, per example)', 'entries'] == max(x.weight.numel() for x in lin.values())
    assert em.loc['output gradient of one linear layer at a time (the largest)', 'entries'] == 12 * max(o for o, _ in shapes(m).values())
    assert em.loc['projected activations and gradients, per module at a time', 'entries'] == 12 * 5
    assert em.loc['logits at every position (float32)', 'entries'] == 12 * m.config.vocab_size
    assert em.loc['logits at the scored positions (float32)', 'entries'] == 11 * m.config.vocab_size
    idx = GradIndex.build(m, [rand_batch(4, 12, 0)], tmp_path/'i', k_out=2, k_in=3, store_dtype='float16')
    per_example = (tmp_path/'i'/'grads-00000-of-00001.bin').stat().st_size / 4
    assert example_memory(m, 12, 2, 3, store_dtype='float16').loc['stored projected gradient', 'MB'] * 2**20 == per_example
    assert np.isclose(em.MB.iloc[0], em.entries.iloc[0] * 4 / 2**20)

def test_tail_patch_on_some_parameters_matches_a_manual_step(untouched):
    m = tiny_lm('llama', n_layers=2, seed=8)
    tr, q = rand_batch(5, 10, 1), rand_batch(2, 10, 2, pad=False, target_only=True)
    names = ['model.layers.1.mlp.down_proj.weight', 'model.layers.0.self_attn.q_proj.weight']
    mom = fake_moments(m, 4)
    with untouched(m): got = tail_patch(m, tr, q, lr=1e-2, moments=mom, params=names, batch_size=2)
    ref = tiny_lm('llama', n_layers=2, seed=8)
    params = dict(ref.named_parameters())
    loss = example_losses(ref, tr).mean()
    gs = torch.autograd.grad(loss, [params[n] for n in names])
    with torch.no_grad():
        for n, g in zip(names, gs): params[n] -= 1e-2 * g / (mom[n].sqrt() + 1e-8)
    torch.testing.assert_close(got, target_logprob(ref, q) - target_logprob(m, q), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got, tail_patch(m, tr, q, lr=1e-2, moments=mom), atol=1e-6)  # all parameters: another step
    with pytest.raises(ConfigError, match='not parameters'): tail_patch(m, tr, q, params=['model.nope'])
    with pytest.raises(ConfigError, match='empty'): tail_patch(m, tr, q, params=[])

def test_typed_errors(tmp_path, monkeypatch):
    m = tiny_lm('llama', n_layers=1, seed=9)
    idx = GradIndex.build(m, [rand_batch(6, 10, 0)], tmp_path/'i', k_out=2, k_in=2)
    q = rand_batch(2, 10, 1, target_only=True)
    other = tiny_lm('llama', n_layers=1, seed=9)
    with torch.no_grad(): other.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3  # changed since the index was built
    with pytest.raises(IndexMismatch, match='not the model'): idx.search(other, q)
    assert issubclass(IndexMismatch, ConfigError) and issubclass(ShardError, ConfigError)
    with pytest.raises(IndexMismatch, match='moments'): idx.search(m, q, moments=fake_moments(m))
    qg = idx.query_grads(m, q)
    monkeypatch.setattr(ts, 'rank_world', lambda: (0, 2))  # two processes searching a one-shard index
    with pytest.raises(ShardError, match='2 processes search an index of 1 shards'): idx.topk(qg, 3)
    monkeypatch.undo()
    f = tmp_path/'i'/'grads-00000-of-00001.bin'
    data = f.read_bytes()
    f.write_bytes(data[:-4])
    with pytest.raises(ShardError, match='damaged'): GradIndex(tmp_path/'i')
    f.unlink()
    with pytest.raises(ShardError, match='missing'): GradIndex(tmp_path/'i')

SCRIPT = textwrap.dedent('''
    import json, sys, torch
    import torch.distributed as dist
    from interpkit.models import tiny_lm
    from interpkit.papers.trackstar import GradIndex, ShardError
    torch.set_num_threads(1)
    dist.init_process_group('gloo')
    out = sys.argv[1]
    g = torch.Generator().manual_seed(0)
    m = tiny_lm('llama', n_layers=2, seed=11)
    ids = torch.randint(0, 128, (21, 10), generator=g)
    data = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    q = dict(input_ids=ids[:4].clone()); q['labels'] = q['input_ids'].clone(); q['labels'][:, :7] = -100
    a = GradIndex.build(m, data, out + '/rows', k_out=2, k_in=3, batch_size=4, progress=False)             # contiguous slices
    stream = [{k: v[i:i + 5] for k, v in data.items()} for i in range(0, 21, 5)]
    b = GradIndex.build(m, iter(stream), out + '/stream', k_out=2, k_in=3, batch_size=4, progress=False)   # batches dealt round-robin
    seen, chunks = [], GradIndex.chunks
    def spy(self, batch_size=4096, shards=None):
        for ids, g in chunks(self, batch_size, shards): seen.append(len(ids)); yield ids, g
    GradIndex.chunks = spy
    ha = a.search(m, q, top_k=5)                                                                           # each process scores its shard
    scored = [None] * dist.get_world_size(); dist.all_gather_object(scored, sum(seen))
    hb = b.search(m, q, top_k=5)
    if dist.get_rank() == 0:
        json.dump(dict(a=[ha.indices.tolist(), ha.scores.tolist()], b=[hb.indices.tolist(), hb.scores.tolist()], world=dist.get_world_size(), scored=scored), open(out + '/hits.json', 'w'))
    dist.destroy_process_group()
''')

LEAK = textwrap.dedent('''
    import sys, torch, torch.distributed as dist
    if sys.argv[1] == 'trackstar': import interpkit.papers.trackstar
    dist.init_process_group('gloo', init_method='file://' + sys.argv[2], rank=0, world_size=1)
    import transformers.modeling_utils   # what building a model imports
    pg = dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()
    print(sys.getrefcount(pg) - 2)       # references left besides `pg` and getrefcount's argument
''')

def test_importing_trackstar_lets_destroy_process_group_free_the_group(tmp_path):
    "torch.distributed.fsdp, imported after init_process_group, keeps references to the default group: gloo's threads then outlive destroy_process_group and abort ~5% of two-process runs at exit. Importing the module first avoids it."
    (tmp_path/'leak.py').write_text(LEAK)
    left = {}
    for how in ('plain', 'trackstar'):
        run = subprocess.run([sys.executable, str(tmp_path/'leak.py'), how, str(tmp_path/f'store-{how}')], capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        left[how] = int(run.stdout.split()[-1])
    assert left['trackstar'] == 0, left     # freed: its threads stop here, not in the interpreter's finalization
    assert left['plain'] > 0, left          # the reason for the import (torch 2.13): if torch fixes this, the import can go

def test_two_processes_build_the_index_of_one(tmp_path):
    (tmp_path/'two.py').write_text(SCRIPT)
    with socket.socket() as s_: s_.bind(('127.0.0.1', 0)); port = s_.getsockname()[1]  # a free port
    run = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_addr', '127.0.0.1', '--master_port', str(port), str(tmp_path/'two.py'), str(tmp_path)],
                         capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    g = torch.Generator().manual_seed(0)
    m = tiny_lm('llama', n_layers=2, seed=11)
    ids = torch.randint(0, 128, (21, 10), generator=g)
    data = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    q = dict(input_ids=ids[:4].clone()); q['labels'] = q['input_ids'].clone(); q['labels'][:, :7] = -100
    one = GradIndex.build(m, data, tmp_path/'one', k_out=2, k_in=3, batch_size=4)
    hits = json.loads((tmp_path/'hits.json').read_text())
    assert hits['world'] == 2 and hits['scored'] == [10, 11]  # each process read its own shard only
    for name in ('rows', 'stream'):
        two = GradIndex(tmp_path/name)
        assert len(two.shards) == 2 and two.n == 21 and two.meta['world_size'] == 2
        assert sorted(p.name for p in (tmp_path/name).iterdir() if p.name.startswith('grads')) == ['grads-00000-of-00002.bin', 'grads-00001-of-00002.bin']
        torch.testing.assert_close(torch.from_numpy(np.array(two.grads)), torch.from_numpy(np.array(one.grads)), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(two.R_train, one.R_train, atol=1e-6 * float(one.R_train.abs().max()), rtol=1e-5)  # float32 per batch, and the batches differ
        h = one.search(m, q, top_k=5)
        assert hits['a' if name == 'rows' else 'b'][0] == h.indices.tolist()
        torch.testing.assert_close(torch.tensor(hits['a' if name == 'rows' else 'b'][1]), h.scores, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(two.search(m, q, top_k=5).scores, h.scores)  # one process reads both shards
    assert [len(s) for s in GradIndex(tmp_path/'rows').shards] == [10, 11]  # rows 0-9 and 10-20
    assert GradIndex(tmp_path/'stream').rows[1].tolist() == list(range(5, 10)) + list(range(15, 20))  # batches 1 and 3

def test_defaults_and_rows_without_labels():
    m = tiny_lm('llama', n_layers=1, seed=12)
    lin = linear_modules(m)
    p, p0 = make_projection(lin), make_projection(lin, 'two_sided', 16, 16, seed=0, dist='gaussian')
    assert p.dist == 'gaussian' and all(torch.equal(a, b) for k in lin for a, b in zip(p.mats[k], p0.mats[k]))  # the documented defaults
    b = rand_batch(3, 8, 2, target_only=True)
    b['labels'][1] = -100  # a query with nothing to score: log-probability 0, not an error
    lp = target_logprob(m, b)
    assert lp[1] == 0 and (lp[[0, 2]] < 0).all()
    with torch.no_grad():
        ref = m(input_ids=b['input_ids'], attention_mask=b['attention_mask']).logits[:, :-1].log_softmax(-1)
    lab = b['labels'][:, 1:]
    torch.testing.assert_close(lp, torch.where(lab != -100, ref.gather(2, lab.clamp(min=0)[..., None])[..., 0], 0.).sum(1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match=r'Examples \[1\] have no labelled token'): example_losses(m, b)

def test_bfloat16_model_scores_in_float32():
    m = tiny_lm('llama', n_layers=1, seed=13).to(torch.bfloat16)
    b = rand_batch(3, 9, 4)
    with torch.no_grad():
        lg = m(input_ids=b['input_ids'], attention_mask=b['attention_mask']).logits[:, :-1]
    lab = b['labels'][:, 1:]
    def ce(lp): return torch.where(lab != -100, -lp.gather(2, lab.clamp(min=0)[..., None])[..., 0], 0.).sum(1) / (lab != -100).sum(1)
    want, low = ce(lg.float().log_softmax(-1)), ce(lg.log_softmax(-1).float())
    got = example_losses(m, b).detach()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)  # logits upcast before the softmax
    assert (got - low).abs().max() > 1e-4  # a softmax in bfloat16 would differ

@pytest.mark.parametrize('max_bytes', [1, 4 * 2 * 32 * 32, 4 * (3 * 32 * 32 + 5), 10**9, None])
def test_full_gradients_are_formed_in_chunks_of_max_bytes(max_bytes, monkeypatch):
    "A spy on torch.einsum sees each module's per-example gradients formed `max(1, max_bytes // (4 d_out d_in))` examples at a time (float32)."
    m = tiny_lm('llama', n_layers=1, d_model=32, seed=4)
    b = rand_batch(5, 8, 1)
    seen, einsum = [], torch.einsum
    def spy(eq, *ops):
        out = einsum(eq, *ops)
        if eq == 'bto,bti->boi': seen.append(tuple(out.shape))
        return out
    monkeypatch.setattr(torch, 'einsum', spy)
    example_grads(m, b, make_projection(shapes(m), 'two_sided', 2, 2), fake_moments(m), **({} if max_bytes is None else dict(max_bytes=max_bytes)))
    max_bytes = max_bytes or 2**28  # the default: 256 MiB
    want = []
    for o, i in reversed(list(shapes(m).values())):  # the backward pass meets the modules last to first
        step = max(1, max_bytes // (4 * o * i))
        want += [(min(step, 5 - s), o, i) for s in range(0, 5, step)]
    assert sorted(seen) == sorted(want) and len(seen) == len(want)

def test_autograd_is_asked_for_the_input_embeddings_only(monkeypatch):
    "Each module's output gradient is projected in its hook and freed: autograd returns one gradient, the input embeddings'."
    assert ig._root_site(tiny_lm('llama', n_layers=1)) == 'model.embed_tokens' and ig._root_site(tiny_lm('gpt2', n_layers=1)) == 'transformer.wte'
    assert ig._root_site(torch.nn.Linear(2, 2)) is None
    for arch in ('llama', 'gpt2'):
        m = tiny_lm(arch, n_layers=2, seed=1)
        asked, grad = [], torch.autograd.grad
        def spy(outputs, inputs, *a, **kw):
            asked.append([tuple(x.shape) for x in inputs]); return grad(outputs, inputs, *a, **kw)
        monkeypatch.setattr(torch.autograd, 'grad', spy)
        got = example_grads(m, rand_batch(3, 7, 2))
        monkeypatch.undo()
        assert asked == [[(3, 7, m.config.hidden_size)]]
        monkeypatch.setattr(ig, '_root_site', lambda model: None)  # without a root every module's gradient is asked for: the same numbers
        torch.testing.assert_close(example_grads(m, rand_batch(3, 7, 2)), got)
        monkeypatch.undo()

def test_reads_an_index_of_the_first_format(tmp_path):
    "An index written before shards existed (one grads.f32, format 1) still opens and searches the same."
    m = tiny_lm('llama', n_layers=1, seed=14)
    bs = [rand_batch(6, 9, s) for s in range(2)]
    new = GradIndex.build(m, bs, tmp_path/'new', k_out=2, k_in=2)
    assert new.meta['format'] == 'interpkit-trackstar-2' and new.meta['shards'] == [dict(file='grads-00000-of-00001.bin', n=12, rows=None)]
    old = tmp_path/'old'
    (old).mkdir()
    (old/'grads.f32').write_bytes((tmp_path/'new'/'grads-00000-of-00001.bin').read_bytes())
    (old/'r_train.npy').write_bytes((tmp_path/'new'/'r_train.npy').read_bytes())
    meta = {k: v for k, v in new.meta.items() if k not in ('shards', 'store_dtype', 'loss', 'dist', 'world_size', 'custom_projection', 'factored')}
    (old/'meta.json').write_text(json.dumps({**meta, 'format': 'interpkit-trackstar-1'}))
    o = GradIndex(old)
    assert isinstance(o.grads, np.memmap) and o.meta['loss'] == 'mean' and o.meta['dist'] == 'gaussian'
    q = rand_batch(2, 9, 7, target_only=True)
    h_new, h_old = new.search(m, q, top_k=4), o.search(m, q, top_k=4)
    assert torch.equal(h_new.indices, h_old.indices) and torch.equal(h_new.scores, h_old.scores)
    (old/'meta.json').write_text(json.dumps({**meta, 'format': 'interpkit-trackstar-0'}))
    with pytest.raises(ConfigError, match="has format 'interpkit-trackstar-0'"): GradIndex(old)

def test_moments_checked_before_any_pass():
    m = tiny_lm('llama', n_layers=1, seed=15)
    b = rand_batch(2, 6, 0)
    mom = fake_moments(m)
    with pytest.raises(ConfigError, match=r"moments has no entry for model.layers.0.self_attn.q_proj.weight \(and 0 more\)"):
        example_grads(m, b, moments={k: v for k, v in mom.items() if k != 'model.layers.0.self_attn.q_proj.weight'})
    fm = factor_moments(mom, linear_modules(m))
    k = 'model.layers.0.mlp.up_proj.weight'
    with pytest.raises(ShapeError, match=r"moments\['model.layers.0.mlp.up_proj'.weight\] has shape \[\(3,\), \(64,\)\]"):
        example_grads(m, b, moments={**fm, k: (fm[k][0][:3], fm[k][1])})

def test_shards_with_row_numbers_read_back_in_corpus_order(tmp_path):
    "An index cut by hand into two shards of interleaved rows (as a stream gives them) reads back, chunks and searches as the one-shard index."
    m = tiny_lm('llama', n_layers=1, seed=16)
    one = GradIndex.build(m, [rand_batch(7, 8, s) for s in range(2)], tmp_path/'one', k_out=2, k_in=2)
    G = np.array(one.grads)
    two = tmp_path/'two'; two.mkdir()
    rows = [np.arange(0, 14, 2), np.arange(1, 14, 2)]
    for r, ids in enumerate(rows):
        G[ids].astype('<f4').tofile(two/f'grads-{r:05d}-of-00002.bin'); np.save(two/f'rows-{r:05d}.npy', ids)
    (two/'r_train.npy').write_bytes((tmp_path/'one'/'r_train.npy').read_bytes())
    meta = {**one.meta, 'world_size': 2, 'shards': [dict(file=f'grads-{r:05d}-of-00002.bin', n=7, rows=f'rows-{r:05d}.npy') for r in range(2)]}
    (two/'meta.json').write_text(json.dumps(meta))
    t = GradIndex(two)
    assert np.array_equal(t.grads, G) and not isinstance(t.grads, np.memmap)
    seen = [(ids.tolist(), g) for ids, g in t.chunks(batch_size=3)]
    assert [i for ids, _ in seen for i in ids] == [0, 2, 4, 6, 8, 10, 12, 1, 3, 5, 7, 9, 11, 13]
    for ids, g in seen: assert np.array_equal(g.numpy(), G[ids])
    q = one.query_grads(m, rand_batch(3, 8, 9, target_only=True))
    W = one.whitener(q)
    a, b = one.topk(q, 5, W, batch_size=4), t.topk(q, 5, W, batch_size=4)
    assert torch.equal(a.indices, b.indices); torch.testing.assert_close(a.scores, b.scores, atol=1e-7, rtol=1e-6)  # other chunks, other rounding
    assert all(torch.equal(x, y) for k in one.meta['modules'] for x, y in zip(one.projection().mats[k], make_projection(shapes(m), 'two_sided', 2, 2).mats[k]))

GRADS = textwrap.dedent('''
    import sys, torch, torch.distributed as dist
    import interpkit.papers.trackstar as ts
    from interpkit.models import tiny_lm
    torch.set_num_threads(1)
    dist.init_process_group('gloo')
    g = torch.Generator().manual_seed(0)
    m = tiny_lm('llama', n_layers=2, seed=11)
    ids = torch.randint(0, 128, (7, 10), generator=g)
    data = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    proj = ts.grads.make_projection(ts._modules_of(m, None), k_out=2, k_in=3, seed=1)
    rows, engine = [], ts.per_example_grads
    def spy(model, batch, *a, **k): rows.append(batch['input_ids'].shape[0]); return engine(model, batch, *a, **k)
    ts.per_example_grads = spy                                                         # counts the rows this process differentiates
    G = ts.example_grads(m, data, proj, batch_size=2)
    mine = list(rows)
    one = ts.example_grads(m, {k: v[:1] for k, v in data.items()}, proj)               # one row for two processes: rank 0 has none
    torch.save(dict(G=G, one=one, mine=mine, rows=rows), f'{sys.argv[1]}/{dist.get_rank()}.pt')
    dist.destroy_process_group()
''')

def test_two_processes_example_grads_of_one(tmp_path):
    "`example_grads` under torchrun: each process differentiates its contiguous share of the rows, and both return every row's gradient, as one process does."
    from interpkit.parallel import launch
    (tmp_path/'grads.py').write_text(GRADS)
    launch(tmp_path/'grads.py', tmp_path)
    g = torch.Generator().manual_seed(0)
    m = tiny_lm('llama', n_layers=2, seed=11)
    ids = torch.randint(0, 128, (7, 10), generator=g)
    data = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    proj = make_projection(linear_modules(m), k_out=2, k_in=3, seed=1)
    ref = torch.stack([example_grads(m, {k: v[i:i + 1] for k, v in data.items()}, proj)[0] for i in range(7)])   # one row at a time, in this process
    r0, r1 = (torch.load(tmp_path/f'{r}.pt') for r in (0, 1))
    assert (r0['mine'], r1['mine']) == ([3], [4])              # rows 0-2 and 3-6: each process did its own share only
    assert (r0['rows'], r1['rows']) == ([3], [4, 1])           # and the single row was differentiated by rank 1 alone
    for r in (r0, r1):
        torch.testing.assert_close(r['G'], ref, atol=1e-6 * float(ref.abs().max()), rtol=1e-5)
        torch.testing.assert_close(r['one'], ref[:1], atol=1e-6 * float(ref.abs().max()), rtol=1e-5)
