"""Make the asset of paper 5 (G-effect): `python tools/make_g_effect_assets.py`.

Trains the tiny Llama of `nbs/papers/05_g_effect.ipynb` to answer every question of the synthetic TOFU `author_qa(seed=0)`
(`interpkit.demos.g_effect.train_qa_lm`, fixed seed, ~1 minute on one thread) and writes
`interpkit/assets/g_effect_qa_lm.safetensors` (weights, read by `interpkit.demos.g_effect.load_qa_lm`) with its `.json` (config, vocabulary, data, metrics)
through `interpkit.train.save_tiny_lm`.
"""
import time
import torch
from interpkit.models import encode_queries
from interpkit.papers.g_effect import qa_metrics
from interpkit.demos.g_effect import QA_LM, author_qa, train_qa_lm
from interpkit.train import save_tiny_lm

if __name__ == '__main__':
    torch.set_num_threads(1)
    qa_kw, steps, seed, lr, batch_size = dict(n_authors=40, forget_frac=0.1, seed=0), 800, 0, 3e-3, 32
    t0 = time.time()
    qa = author_qa(**qa_kw)
    model, tokenizer, res = train_qa_lm(qa, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    secs = time.time() - t0
    metrics = {k: qa_metrics(model, encode_queries(tokenizer, *qa.pairs(ix))).to_dict() for k, ix in (('forget', qa.forget), ('retain', qa.retain))}
    meta = dict(tiny_lm=dict(QA_LM, vocab_size=len(tokenizer)), author_qa=qa_kw, steps=steps, seed=seed, lr=lr,
                batch_size=batch_size, final_loss=res.final_loss, metrics=metrics, train_seconds=round(secs, 1), recipe='interpkit.demos.g_effect.train_qa_lm')
    p = save_tiny_lm(model, tokenizer, 'g_effect_qa_lm', meta)   # meta['vocab']: the tokenizer's tokens in id order
    print(f"wrote {p} ({p.stat().st_size / 1e3:.0f} kB): loss {res.history['loss'].iloc[0]:.3f} -> {res.final_loss:.4f}, {metrics} in {secs:.1f} s")
