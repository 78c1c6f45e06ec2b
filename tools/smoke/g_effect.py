"Smoke checks of interpkit.papers.g_effect and its demo module interpkit.demos.g_effect: the objectives' terms, G-effects of every objective (Llama, GPT-2), instance-wise G-effects, the step check, a short unlearning run, the shipped QA model."
import math
import torch
from _util import lm, on, finite, untouched
from interpkit.models import encode_queries
from interpkit.papers.g_effect import (OBJECTIVES, answer_logprobs, forget_term, g_effect, instance_g_effects, objective, param_groups, qa_metrics,
                                       retain_term, risk_term, step_check, unlearn)
from interpkit.demos.g_effect import IDK_ANSWERS, author_qa, load_qa_lm, qa_tokenizer

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'AuthorQA': 'made by author_qa', 'Objective': 'made by objective', 'GEffect': 'made by g_effect', 'Unlearning': 'made by unlearn', 'ParamGroups': 'made by param_groups',
    'train_qa_lm': 'a CPU recipe (tools/make_g_effect_assets.py); a short run is tested in tests/test_g_effect.py',
    'retain_at': 'pandas on a history, no model', 'plot_g_effects': 'matplotlib on histories, no model',
}

def checks(device, dtype):
    qa = author_qa(n_authors=6, forget_frac=0.34, seed=0)
    tok = qa_tokenizer(qa)
    qs, ans = qa.pairs(qa.forget[:4])
    forget, retain = encode_queries(tok, qs, ans), encode_queries(tok, *qa.pairs(qa.retain[:6]))
    idk = encode_queries(tok, qs, IDK_ANSWERS[:4])
    def model(arch='llama'): return lm(arch, device, dtype, n_layers=2, d_model=32, vocab_size=tok.vocab_size)

    def terms():
        m = model()
        with untouched(m):
            lp, mask, h = answer_logprobs(m, forget, hidden=1)
            on(lp, device, 'answer log-probabilities'); on(h, device, 'hidden state')
            s, c = risk_term(m, forget)
            vals = {name: float(finite(on(forget_term(m, objective(name), idk if name == 'idk' else forget, m)[0], device, name).detach()))
                    for name in OBJECTIVES}
            for reg in ('gd', 'kl'): on(retain_term(m, objective('ga', regularizer=reg), retain, m)[0], device, reg)
            groups = param_groups(m).order
        return f"R {float(s.detach()) / c:.3g} over {c} tokens; NPO {vals['npo']:.3g}, RMU {vals['rmu']:.3g}; groups {groups}"

    def effects():
        out = []
        for arch in ('llama', 'gpt2'):
            m = model(arch)
            with untouched(m):
                ges = {name: g_effect(m, name, forget, retain, idk=idk if name == 'idk' else None, batch_size=3) for name in OBJECTIVES}
                for name, ge in ges.items():
                    finite([ge.unlearning, ge.retention, ge.loss], f'{arch} {name} G-effect')
                    assert math.isclose(ge.groups['unlearning'].sum(), ge.unlearning, rel_tol=1e-6, abs_tol=1e-9), f'{arch} {name} groups'
                kl = g_effect(m, objective('npo', regularizer='kl'), forget, retain, batch_size=2, smoothing=0.6, groups=2)
                finite([kl.unlearning, kl.retention], f'{arch} NPO+KL smoothed')
                inst = instance_g_effects(m, 'npo', forget, retain)
                finite(inst.to_numpy(), f'{arch} instance G-effects')
            out.append(f"{arch} GA e_u {ges['ga'].unlearning:.3g}, NPO+KL e_r {kl.retention:.3g}")
        return ', '.join(out)

    def steps():
        m = model()
        with untouched(m):
            sc = step_check(m, 'ga', forget, retain, lr=1e-3)
            finite(sc.to_numpy(), 'step check')
            run = unlearn(m, objective('npo', regularizer='gd'), forget, retain, steps=2, lr=1e-3, g_effect_every=1)
        assert next(run.model.parameters()).device.type == device.type and next(run.model.parameters()).dtype == dtype
        finite(run.history.to_numpy(dtype=float), 'unlearning history')
        met = qa_metrics(run.model, forget)
        return f"step check forget predicted {sc.loc['forget', 'predicted']:.2g} actual {sc.loc['forget', 'actual']:.2g}; unlearned forget NLL {met['nll']:.3g}"

    def shipped():
        m, qa_tok, meta = load_qa_lm()
        qa_data = author_qa(**meta['author_qa'])
        m = m.to(device=device, dtype=dtype)
        f, r = (encode_queries(qa_tok, *qa_data.pairs(idx[:8])) for idx in (qa_data.forget, qa_data.retain))
        with untouched(m):
            met = qa_metrics(m, f)
            ge = g_effect(m, 'npo', f, r)
        finite([ge.unlearning, ge.retention], 'shipped model G-effect')
        return f"shipped QA LM forget NLL {met['nll']:.3g} acc {met['acc']:.2f}; NPO e_u {ge.unlearning:.3g}"

    return [('terms', terms), ('g_effects', effects), ('steps', steps), ('shipped', shipped)]
