"Smoke checks of interpkit.papers.cnl and its demo module interpkit.demos.cnl: answer scores, MLP-neuron attributions (activation x gradient, integrated gradients) on Llama and GPT-2's Conv1D, commonality neurons and their overlaps, amplification, neuron-only fine-tuning and its rows, the tables and the widget view, and the shipped neurons."
import torch
from _util import lm, on, finite, untouched, tiny_tokenizer
from interpkit.train import assets_dir
from interpkit.papers.cnl import (encode_answers, answer_scores, neuron_sites, neuron_attributions, top_sets, commonality_neurons, overlap, split_halves,
                                  halves_overlap, pairwise_overlap, fact_fidelity, amplified, random_neurons, neuron_parameters, finetune_neurons, neuron_rows,
                                  with_rows, overlap_table, across_table, plot_neuron_map, explore_localization, Neurons)
from interpkit.demos.cnl import (FINETUNED, addition, multiplication, sentiment, code, fact_paraphrases, capability_data, train_neuron_finetune,
                                 load_neuron_finetune)

NOT_SMOKED = {'Capability': 'made by the data builders', 'NeuronScores': 'made by neuron_attributions', 'Neurons': 'made by commonality_neurons',
              'Overlap': 'made by overlap', 'FactFidelity': 'made by fact_fidelity', 'NeuronSites': 'made by neuron_sites', 'NeuronRows': 'made by neuron_rows',
              'TemplateGrid': 'made by load_template_grid',
              'template_pairs': 'set arithmetic on neuron scores (tests/test_cnl.py)', 'load_template_grid': 'reads a shipped asset on the CPU'}

def _data(n=6, seed=0):
    "Word prompts and answers the tiny tokenizer splits into known tokens (w0, w1, ...)."
    g = torch.Generator().manual_seed(seed)
    w = lambda k: ' '.join(f'w{int(i)}' for i in torch.randint(0, 120, (k,), generator=g))
    return [w(2 + i % 3) for i in range(n)], [' ' + w(1 + i % 2) for i in range(n)]

def _on_model(m, device, dtype, what):
    for n, p in m.named_parameters():
        assert p.device.type == device.type and p.dtype == dtype, f"{what}: {n} is {p.dtype} on {p.device}"
        finite(p.detach(), f"{what}: {n}")

def checks(device, dtype):
    tok = tiny_tokenizer()
    def model(arch='llama', seed=0): return lm(arch, device, dtype, n_layers=2, d_model=32, seed=seed)
    d = _data()

    def data_sets():
        sets = [addition(8), multiplication(8, seed=1), sentiment(8), code(8), capability_data('code', 'test')] + fact_paraphrases()[:2]
        assert all(len(s.prompts) == len(s.answers) > 0 for s in sets)
        b = encode_answers(tok, d)
        assert b['input_ids'].shape == b['labels'].shape and len(b['last']) == len(d[0])
        return f"{len(sets)} data sets, batch {tuple(b['input_ids'].shape)}"

    def scores():
        out = []
        for arch in ('llama', 'gpt2'):
            m = model(arch)
            with untouched(m, tok): s = answer_scores(m, tok, d, batch_size=4)
            finite(torch.tensor(s['logprob'].to_numpy()), f'{arch} logprob')
            assert s['logprob'].dtype == 'float64' and (s['logprob'] < 0).all()
            out.append(f"{arch} logprob {s['logprob'].mean():.2f}")
        return ', '.join(out) + f" ({dtype})"

    located = {}
    def attributions():
        out = []
        for arch in ('llama', 'gpt2'):
            m = model(arch, seed=1)
            ns = neuron_sites(m); sites, counts = ns.sites, ns.counts
            assert list(sites) == [0, 1] and len(set(counts.values())) == 1
            with untouched(m, tok):
                for method, positions in (('grad_x_act', 'all'), ('grad_x_act', 'last'), ('ig', 'all')):
                    s = neuron_attributions(m, tok, d, method=method, positions=positions, batch_size=4, n_steps=4)
                    t = s.scores
                    assert t.device.type == 'cpu' and t.dtype == torch.float32 and t.shape == (len(d[0]), 2, counts[0]), f"{arch} {method} scores {t.dtype} {t.shape}"
                    finite(t, f'{arch} {method} {positions} scores'); finite(s.logprob, f'{arch} {method} logprob')
                    assert t.abs().max() > 0, f"{arch} {method}: all attributions are 0"
                    located[arch, method, positions] = s
            out.append(f"{arch} |attr| {located[arch, 'grad_x_act', 'all'].scores.abs().mean():.2e}")
        return ', '.join(out) + f" ({dtype})"

    def localisation():
        if not located: attributions()
        s = located['llama', 'grad_x_act', 'all']
        k = 8
        assert (top_sets(s, k).flatten(1).sum(1) == k).all()
        c = commonality_neurons(s, k, 0.3)
        a, b = split_halves(len(s))
        h = halves_overlap(s, k, 1 / 3)
        o = overlap(c, commonality_neurons(located['llama', 'grad_x_act', 'last'], k, 0.3))
        p = pairwise_overlap(s, k)
        ff = fact_fidelity([s.subset([0, 1, 2]), s.subset([3, 4, 5])], k)
        sc = {'all': s, 'last': located['llama', 'grad_x_act', 'last'], 'ig': located['llama', 'ig', 'all']}
        t1, t2 = overlap_table(sc, k, 1 / 3), across_table(sc, k, 0.3)
        fig, view = explore_localization(sc, 'all', f=0.3, top_k=k)
        fig2 = plot_neuron_map({'all': c})
        import matplotlib.pyplot as plt
        plt.close(fig2)
        finite(torch.tensor(t1.to_numpy(float)), 'overlap_table'); finite(torch.tensor(t2.to_numpy(float)), 'across_table'); finite(torch.tensor(view.to_numpy(float)), 'widget view')
        assert 0 <= h.rate <= 1 and 0 <= o.iou <= 1 and 0 <= p <= 1 and len(a) + len(b) == len(s)
        return f"{len(c)} commonality neurons, halves rate {h.rate:.2f}, pairwise {p:.2f}, fidelity {ff.same_fact:.2f}"

    def amplify():
        out = []
        for arch in ('llama', 'gpt2'):
            m = model(arch, seed=2)
            mask = torch.zeros(2, neuron_sites(m).counts[0], dtype=torch.bool); mask[0, :5] = True; mask[1, 3] = True
            N = Neurons(mask, [0, 1])
            x = torch.tensor([[8, 9, 10, 11], [12, 13, 14, 15]], device=device)
            with torch.no_grad(): base = m(x).logits
            with untouched(m, tok):
                with amplified(m, N, 0.0), torch.no_grad(): zero = on(m(x).logits, device, f'{arch} ablated logits')
                with amplified(m, N, 3.0), torch.no_grad(): amp = on(m(x).logits, device, f'{arch} amplified logits')
            with torch.no_grad(): assert torch.equal(m(x).logits, base), f"{arch}: amplified left something behind"
            assert not torch.equal(zero, base) and not torch.equal(amp, base)
            out.append(f"{arch} |change| {(amp - base).abs().float().mean().item():.3g}")
        return ', '.join(out) + f" ({dtype})"

    def finetune():
        out = []
        for arch in ('llama', 'gpt2'):
            m = model(arch, seed=3)
            mask = torch.zeros(2, neuron_sites(m).counts[0], dtype=torch.bool); mask[1, [1, 5, 9]] = True
            N = Neurons(mask, [0, 1])
            R = random_neurons(N, seed=1)
            assert len(R) == len(N) and not (R.mask & N.mask).any()
            assert all(p.shape[dim] == blocks * mask.shape[1] for p, dim, blocks in neuron_parameters(m, 1))
            with untouched(m, tok):
                tuned, res = finetune_neurons(m, tok, d, N, steps=2, lr=1e-2, batch_size=3)
                _on_model(tuned, device, dtype, f'{arch} tuned')
                finite(torch.tensor(res.history['loss'].to_numpy()), f'{arch} loss')
                rows = neuron_rows(tuned, N)
                assert all(v.device.type == 'cpu' for v in rows.tensors.values())
                back = with_rows(m, rows)
                _on_model(back, device, dtype, f'{arch} with_rows')
                assert all(torch.equal(p, q) for p, q in zip(back.parameters(), tuned.parameters())), f"{arch}: with_rows does not rebuild the tuned model"
                t2, _, r2 = train_neuron_finetune(m, tok, 'code', R, steps=1)
                _on_model(t2, device, dtype, f'{arch} train_neuron_finetune')
            out.append(f"{arch} loss {res.history['loss'].iloc[0]:.2f} -> {res.final_loss:.2f}")
        return ', '.join(out) + f" ({dtype})"

    def shipped():
        if not (assets_dir()/f'{FINETUNED}.safetensors').exists(): return f"{FINETUNED} not built yet: skipped"
        from interpkit.models import load_lm
        base, t = load_lm()
        base = base.to(device=device, dtype=dtype)
        with untouched(base):
            tuned, _, meta = load_neuron_finetune(base, t, 'addition')
        _on_model(tuned, device, dtype, 'shipped addition')
        s = answer_scores(tuned, t, capability_data('addition', 'test').subset(range(8)), batch_size=8)
        return f"{len(meta['neurons'])} neurons, held-out accuracy {s['correct'].mean():.2f} on 8 ({dtype})"

    return [('data_sets', data_sets), ('scores', scores), ('attributions', attributions), ('localisation', localisation), ('amplify', amplify),
            ('finetune', finetune), ('shipped', shipped)]
