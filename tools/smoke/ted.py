"Smoke checks of interpkit.papers.ted and its demo module interpkit.demos.ted: the prompts, greedy edits (chat_replies underneath), operational embeddings on Llama, GPT-2 and NeoX, the thesaurus and its failures against the reference, both judges, verification, and the widget view and figure."
import torch
from _util import lm, finite, untouched, tiny_tokenizer
from interpkit.train import assets_dir
from interpkit.papers.ted import (EXPECTED, UNEXPECTED, followup, edit_request, check_phrases, EditOutputs, edit_outputs, OperationalEmbeddings,
                                  operational_embeddings, thesaurus, wordnet, wordnet_label, reference_table, reference_labels, llm_relation,
                                  failure_type, failures, candidates, embedding_judge, lm_judge, verify, verify_pairs, random_pairs,
                                  plot_thesaurus, output_similarity)
from interpkit.demos.ted import TED_ASSET, TedDemo, load_ted_demo, pair_report

NOT_SMOKED = {'EditOutputs': 'made by edit_outputs', 'OperationalEmbeddings': 'made by operational_embeddings', 'Thesaurus': 'made by thesaurus',
              'Verification': 'made by verify', 'TedDemo': 'made by load_ted_demo', 'PairReport': 'made by pair_report'}

def _words(g, n): return ' '.join(f'w{int(i)}' for i in torch.randint(0, 120, (n,), generator=g))

def _data(n=3, phrases=('w1', 'w2', 'w3'), seed=0):
    "Word queries, answers and edits the tiny tokenizer knows (w0, w1, ...), of several lengths."
    g = torch.Generator().manual_seed(seed)
    return EditOutputs([_words(g, 1 + j) for j in range(n)], [_words(g, 2) for _ in range(n)], [_words(g, 2) for _ in range(n)],
                       {w: [_words(g, 1 + (i + j) % 3) for j in range(n)] for i, w in enumerate(phrases)})

def checks(device, dtype):
    tok = tiny_tokenizer()
    def model(arch='llama', seed=0): return lm(arch, device, dtype, n_layers=2, d_model=32, seed=seed)

    def prompts():
        ps = check_phrases(['witty', 'rude'])
        assert followup() == 'Edit RESPONSE.' and edit_request('q', 'r', ps[0]).endswith(followup('witty'))
        return f"{len(edit_request('q', 'r'))} characters in the control prompt"

    def outputs():
        m = model()
        with untouched(m, tok): d = edit_outputs(m, ['w1 w2', 'w3'], ['w5', 'w6'], tok, max_new_tokens=3, response_tokens=3, batch_size=2)
        assert d.phrases == ['w5', 'w6'] and len(d.control) == 2 and all(len(d.of(w)) == 2 for w in d.phrases)
        return f"{sum(len(o.split()) for w in d.phrases for o in d.of(w))} edit words ({dtype})"

    embedded = {}
    def embeddings():
        out = []
        d = _data()
        for arch in ('llama', 'gpt2', 'neox'):
            m = model(arch, seed=1)
            with untouched(m, tok): e = operational_embeddings(m, d, tok, batch_size=2)
            assert isinstance(e, OperationalEmbeddings) and e.vectors.shape == (3, 4, 32) and e.vectors.dtype == torch.float32 and e.vectors.device.type == 'cpu'
            finite(e.vectors, f'{arch} embeddings')
            assert e.vectors.abs().max() > 0 and e.counts == [3, 3, 3], f"{arch}: {e.counts}"
            embedded[arch] = e
            out.append(f"{arch} |e| {e.vectors.norm():.2e}")
        return ', '.join(out) + f" ({dtype})"

    def thesaurus_and_failures():
        if not embedded: embeddings()
        th = thesaurus(embedded['llama'])
        finite(torch.tensor(th.cosine.to_numpy()), 'cosines')
        pairs = th.pairs()
        table = reference_table()
        try:
            wn = wordnet()
            lab = reference_labels(pairs, table.iloc[:0], wn)
            wl = wordnet_label('polite', 'impolite', wn)
            assert wl == UNEXPECTED, wl
        except Exception as e:
            if type(e).__name__ != 'AssetNotFound': raise
            lab = reference_labels(pairs, table, wn=False)
        lab = lab.assign(label=[EXPECTED, UNEXPECTED] * (len(lab) // 2))
        f = failures(lab, 0.0, -0.1)
        c = candidates(lab, UNEXPECTED, 2)
        assert llm_relation(0.99) == 'similar' and failure_type('similar', UNEXPECTED) is not None and len(c) <= 2
        import matplotlib.pyplot as plt
        plt.close(plot_thesaurus(th))
        return f"{len(pairs)} pairs, {len(th.similar())} similar, {len(f)} failures at τ = 0"

    def judges():
        t = tiny_tokenizer(126)
        from tokenizers import AddedToken
        t.add_tokens([AddedToken('A', single_word=True), AddedToken('B', single_word=True)])
        m = model(seed=2)
        d = _data(4, ('w1', 'w2'))
        with untouched(m, t):
            j = lm_judge(m, t, batch_size=3)
            v = verify(d, 'w2', 'w1', j)
            r = verify_pairs(d, random_pairs(['w1', 'w2'], 2), lm_judge(m, t, both_orders=False, batch_size=2))
        assert 0 <= v.rate <= 1 and r.rate.between(0, 1).all()
        e = embedding_judge()(['q'], ['A rude insult, idiot.'], ['Thank you kindly.'], 'rude')
        assert e == ['A'], e
        sim = output_similarity(None, d)
        assert sim.similarity.between(-1 - 1e-5, 1 + 1e-5).all()
        return f"LM judge rate {v.rate:.2f} on {v.n_valid}, embedding judge {e} ({dtype})"

    def demo():
        if not (assets_dir()/f'{TED_ASSET}.safetensors').exists(): return f"{TED_ASSET} not built yet: skipped"
        dm = load_ted_demo()
        assert isinstance(dm, TedDemo)
        finite(dm.embeddings.vectors, 'shipped embeddings')
        r = pair_report(dm, 'harassing', 'witty', judge=lambda q, a, b, p: ['A'] * len(a))
        return f"{len(dm.embeddings.phrases)} phrases, harassing|witty cosine {r.cosine:.3f}"

    return [('prompts', prompts), ('outputs', outputs), ('embeddings', embeddings), ('thesaurus_and_failures', thesaurus_and_failures),
            ('judges', judges), ('demo', demo)]
