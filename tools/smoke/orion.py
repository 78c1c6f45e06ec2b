"Smoke checks of interpkit.papers.orion and its demo module interpkit.demos.orion: request-patching, sweeps, oversight and reports on tiny models on the device."
import contextlib, io, random
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import torch
from _util import lm, on, finite, untouched
from interpkit.models import encode_left
from interpkit.papers.orion import (DOMAINS, make_items, render, chat_prompt, prompt, answer_id, request_patch, last_logits, sweep, band_summary,
                                    injected, oversight, top_tokens, patch_report, show_patch, plot_sweep, probability_kept, same_request_patch)
from interpkit.demos.orion import (task_tokenizer, task_document, recall_document, load_task_lm, injection_tokenizer, injection_document,
                                   load_injection_lm)

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'Item': 'a value, made by make_items', 'Patched': 'made by request_patch', 'SweepResult': 'made by sweep', 'Band': 'made by band_summary',
    'PatchReport': 'made by patch_report', 'train_task_lm': 'trains its own model on the CPU (a short run is in tests/test_orion.py)', 'train_injection_lm': 'the same',
    'Kept': 'made by probability_kept',
}

def checks(device, dtype):
    tokenizer = task_tokenizer()
    items = [it for d in DOMAINS for it in make_items(d, 2, seed=1)]
    texts = [prompt(tokenizer, it.domain, it.c1, it.r1) for it in items]
    assert render('code', items[2].c1, items[2].r1)[0] in texts[2] and chat_prompt(tokenizer, 'q', 'a').endswith('Answer: a')
    assert answer_id(tokenizer, texts[0], items[0].answer(items[0].r1, items[0].c1)) != tokenizer.unk_token_id

    def patching():
        out = []
        for arch in ('llama', 'gpt2'):
            m = lm(arch, device, dtype, n_layers=2, vocab_size=len(tokenizer), max_len=256)
            src = encode_left(tokenizer, texts)
            dst = encode_left(tokenizer, [prompt(tokenizer, it.domain, it.c2, it.r2) for it in items])
            with untouched(m, tokenizer):
                r = request_patch(m, src, dst, ['resid_post(-1)', 'attn_out(0)', 'mlp_out(1)'], batch_size=3)
                for t in (r.src, r.dst, *r.patched.values()): on(t, device, f'{arch} logits'); assert t.dtype == dtype
                lg = on(last_logits(m, dst, batch_size=5), device, 'last_logits')
                torch.testing.assert_close(lg.float(), r.dst.float(), atol=0.05, rtol=0.05)   # no cache against the cached prefix
                torch.testing.assert_close(r.patched['resid_post(-1)'].float(), r.src.float(), atol=0.05, rtol=0.05)
            out.append(arch)
        return ', '.join(out)

    def sweeps():
        m, _, meta = load_task_lm()
        m = m.to(device=device, dtype=dtype)
        with untouched(m, tokenizer):
            res = sweep(m, tokenizer, items, ['resid_pre(0)', 'resid_post(0)', 'resid_post(-1)'], batch_size=3)
            finite(res.scores[['acc_r1c2', 'p_r1c2', 'p_ref']].to_numpy(copy=True), 'scores')
            b = band_summary(res, layers=[0])
            kept = probability_kept(res, 'resid_post')
            finite(kept.by_layer.select_dtypes('number').to_numpy(dtype=float, copy=True), 'probability kept')
            ctl = same_request_patch(m, tokenizer, items, ['resid_post(0)'], batch_size=3)
            finite(ctl.select_dtypes('number').to_numpy(dtype=float, copy=True), 'same-request control')
            plt.close(plot_sweep(res, 'code', 'resid_post').figure)
        assert len(res.survivors) >= len(items) // 2, res.base
        return f"{len(res.survivors)}/{len(items)} survive; R1(C2) after block 0: {b.by_layer.acc_r1c2[0]:.2f}"

    def injections():
        m, _, _ = load_task_lm()
        m = m.to(device=device, dtype=dtype)
        assert 'Note:' in injected('story', items[0].c2, items[0].r1, 'note', 'Paris', items[0].r2)[0]
        with untouched(m, tokenizer): ov = oversight(m, tokenizer, items, 'resid_post(0)', batch_size=5)
        finite(ov[['accuracy', 'followed', 'source']].to_numpy(copy=True), 'oversight')
        after = ov[ov.when == 'after'].accuracy.mean()
        im, itok, _ = load_injection_lm()
        im = im.to(device=device, dtype=dtype)
        assert itok.unk_token_id not in itok(injection_document(random.Random(0), inject_frac=1.))['input_ids'] and len(injection_tokenizer()) == len(itok)
        with untouched(im, itok): iov = oversight(im, itok, items, 'resid_post(0)', batch_size=5)
        finite(iov[['accuracy', 'followed', 'source']].to_numpy(copy=True), 'oversight of the injection model')
        fooled = iov[iov.when == 'before'].followed.mean()
        return f"accuracy after the patch {after:.2f}; injection model follows {fooled:.2f} before, accuracy after {iov[iov.when == 'after'].accuracy.mean():.2f}"

    def reports():
        m = lm('llama', device, dtype, n_layers=2, vocab_size=len(tokenizer), max_len=256)
        with untouched(m, tokenizer):
            rep = patch_report(m, tokenizer, items[0], 'resid_post(1)', top_k=3)
            with contextlib.redirect_stdout(io.StringIO()): tab = show_patch(m, tokenizer, items[0], 'resid_post(0)', top_k=3)
            top = top_tokens(tokenizer, last_logits(m, encode_left(tokenizer, texts[:1]))[0], 2)
        finite([p for _, p in rep.patched + rep.unpatched + top], 'probabilities')
        assert task_document(random.Random(0)) and recall_document(random.Random(0))
        return f"{tab.shape[0]} rows, top {top[0][0]!r}"

    return [('request_patch', patching), ('sweep', sweeps), ('oversight', injections), ('patch_report', reports)]
