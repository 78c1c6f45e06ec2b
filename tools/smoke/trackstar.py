"Smoke checks of interpkit.papers.trackstar and its demo module interpkit.demos.trackstar: per-example gradients (Llama, GPT-2's Conv1D), the on-disk index and its search, tail-patch, the fact LM."
import tempfile
from pathlib import Path
import torch
from _util import lm, on, finite, ids, untouched, tiny_tokenizer
from interpkit.demos.trackstar import fact_corpus, load_fact_lm, load_fact_lm_moments, train_fact_lm
from interpkit.grads import adam_moments, factor_moments, lm_labels, make_projection
from interpkit.hooks import linear_modules
from interpkit.models import encode_queries, encode_texts
from interpkit.papers.trackstar import (GradIndex, example_memory, autocorr, blocks_of, example_grads, example_losses, inv_sqrt, mix, model_fingerprint, rank_metrics, scores, side_by_side, tail_patch, target_logprob, whiten)

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'Projection': 'made by make_projection', 'Hits': 'made by GradIndex.topk', 'FactCorpus': 'made by fact_corpus',
    'bm25_scores': 'text on the CPU, no model',
    'IndexMismatch': 'an error type', 'ShardError': 'an error type',
}

def batch(n=4, t=8, seed=0):
    b = dict(input_ids=ids(n, t, seed=seed), attention_mask=torch.ones(n, t, dtype=torch.long))
    b['attention_mask'][0, t // 2:] = 0
    b['labels'] = lm_labels(b['input_ids'], b['attention_mask'])
    return b

def moments_of(m, device):
    return {n: torch.rand(p.shape, generator=torch.Generator().manual_seed(0)).to(device, p.dtype) * 1e-2 + 1e-4 for n, p in m.named_parameters()}

def checks(device, dtype):
    tokenizer = tiny_tokenizer()

    def grads():
        out = []
        for arch in ('llama', 'gpt2'):
            m = lm(arch, device, dtype, n_layers=2, d_model=32)
            mom = moments_of(m, device)
            with untouched(m):
                b = batch()
                g = on(example_grads(m, b, moments=mom, batch_size=3), device, f'{arch} corrected gradients')
                on(example_grads(m, b, make_projection(linear_modules(m), 'dense', 2, 2)), device, f'{arch} dense gradients')
                on(example_losses(m, b), device, 'losses')
                fm = factor_moments(mom, linear_modules(m))
                on(example_grads(m, b, make_projection(linear_modules(m), dist='rademacher'), fm, loss='sum', max_bytes=1), device, f'{arch} factored, summed gradients')
                assert example_memory(m, 8).MB.iloc[0] > 0
            out.append(f"{arch} {tuple(g.shape)} {g.dtype}")
        return ', '.join(out)

    def index():
        m = lm('gpt2', device, dtype, n_layers=2, d_model=32)
        mom = moments_of(m, device)
        with tempfile.TemporaryDirectory() as d, untouched(m):
            idx = GradIndex.build(m, batch(12, 8), Path(d)/'i', moments=mom, k_out=2, k_in=2, batch_size=5, progress=False, store_dtype='float16')
            q = batch(2, 8, seed=1)
            hits = idx.search(m, q, top_k=3, moments=mom)
            on(hits.scores, device, 'hit scores'); assert hits.indices.device.type == device.type
            qg = on(idx.query_grads(m, q, mom), device, 'query gradients')
            W = on(idx.whitener(qg), device, 'R^-1/2')
            on(idx.topk(qg.cpu(), 3, W).scores, 'cpu', 'topk of CPU queries')
            S = on(scores(qg, torch.tensor(idx.grads), W), device, 'scores')
            on(whiten(qg, inv_sqrt(mix(idx.R_train, autocorr(qg)))), device, 'whitened')
            on(blocks_of(qg, [qg.shape[1] // 8] * 8), device, 'blocks')
            rm = rank_metrics(S, [{0}, {1}])
            side_by_side([f'p{i}' for i in range(12)], S, S, 0, {0}, top_k=2)
            assert isinstance(model_fingerprint(m), str)
        return f"{idx}, MRR {rm.rr.mean():.2f}".replace(d, '...')

    def tail():
        m = lm('llama', device, dtype, n_layers=2, d_model=32)
        with untouched(m):
            train, query = dict(input_ids=ids(3, 8)), dict(input_ids=ids(2, 6, seed=2))  # no attention masks
            d = on(tail_patch(m, train, query, lr=1e-2, moments=moments_of(m, device), batch_size=2), device, 'tail-patch')
            on(tail_patch(m, train, query, lr=1e-2, params=['model.layers.1.mlp.down_proj.weight']), device, 'tail-patch of one weight')
            on(target_logprob(m, query), device, 'target log-probabilities')
        return f"tail-patch {d.float().mean().item():.3g}"

    def fact_lm():
        fc = fact_corpus(n_entities=4, distractors=10)
        m, wt, res = train_fact_lm(fc, steps=2, batch_size=4, progress=False, device=device)
        assert next(m.parameters()).device.type == device.type
        mom = adam_moments(m, res.optimizer)
        model, fact_tokenizer, meta = load_fact_lm()
        model = model.to(device=device, dtype=dtype)
        assert len(fact_tokenizer) == len(meta['vocab']) and set(load_fact_lm_moments()) == set(mom)
        qb = encode_queries(fact_tokenizer, *map(list, zip(*fact_corpus(seed=0).queries[:4])))
        with untouched(model): lp = on(target_logprob(model, qb), device, 'fact LM log-probabilities')
        tb = encode_texts(tokenizer, ['w1 w2 w3', 'w4'])
        assert tb['input_ids'][1, -1].item() == tokenizer.eos_token_id
        return f"trained {len(res.history)} steps, loss {finite(res.final_loss):.3g}; shipped LM mean p(target) {lp.float().exp().mean().item():.2f}"

    return [('grads', grads), ('index', index), ('tail_patch', tail), ('fact_lm', fact_lm)]
