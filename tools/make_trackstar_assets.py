"""Make the assets of paper 10 (TrackStar): `python tools/make_trackstar_assets.py`.

Trains the tiny Llama of `nbs/papers/10_trackstar.ipynb` on the synthetic fact corpus `fact_corpus(seed=0)`
(`interpkit.demos.trackstar.train_fact_lm`, fixed seed) and writes `interpkit/assets/trackstar_fact_lm.safetensors`
(weights, read by `load_fact_lm`) and `interpkit/assets/trackstar_fact_lm_moments.safetensors` (AdamW's final
`exp_avg_sq`, taken from the FitResult's optimizer with `interpkit.grads.adam_moments`, read by `load_fact_lm_moments`), each with its `.json`.
"""
import time
import torch
from interpkit.demos.trackstar import FACT_LM, fact_corpus, train_fact_lm
from interpkit.grads import adam_moments
from interpkit.models import encode_queries, word_vocab
from interpkit.papers.trackstar import target_logprob
from interpkit.train import save_asset

if __name__ == '__main__':
    torch.set_num_threads(1)
    corpus_kw, steps, seed, lr, batch_size = dict(seed=0), 1500, 0, 3e-3, 32
    t0 = time.time()
    corpus = fact_corpus(**corpus_kw)
    model, tokenizer, res = train_fact_lm(corpus, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    moments = adam_moments(model, res.optimizer)
    secs = time.time() - t0
    prompts, targets = map(list, zip(*corpus.queries))
    qb = encode_queries(tokenizer, prompts, targets)
    with torch.no_grad():
        logits = model(input_ids=qb['input_ids'], attention_mask=qb['attention_mask']).logits
    pos = (qb['labels'] != -100).float().argmax(1) - 1
    acc = (logits[torch.arange(len(pos)), pos].argmax(-1) == qb['input_ids'][torch.arange(len(pos)), pos + 1]).float().mean().item()
    meta = dict(tiny_lm=dict(FACT_LM, vocab_size=tokenizer.vocab_size), vocab=word_vocab(corpus.passages), corpus=dict(fact_corpus=corpus_kw, passages=len(corpus.passages)),
                steps=steps, seed=seed, lr=lr, batch_size=batch_size, final_loss=res.final_loss, query_top1=acc,
                mean_target_logprob=target_logprob(model, qb).mean().item(), train_seconds=round(secs, 1), recipe='interpkit.demos.trackstar.train_fact_lm')
    p1 = save_asset('trackstar_fact_lm', model, meta)
    p2 = save_asset('trackstar_fact_lm_moments', moments, dict(meta, what="AdamW exp_avg_sq after the last step, keyed by parameter name"))
    print(f"wrote {p1} ({p1.stat().st_size / 1e3:.0f} kB), {p2} ({p2.stat().st_size / 1e3:.0f} kB): loss {res.history['loss'].iloc[0]:.3f} -> {res.final_loss:.3f}, "
          f"query top-1 {acc:.2f} in {secs:.1f} s")
