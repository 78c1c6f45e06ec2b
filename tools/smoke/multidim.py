"Smoke checks of paper 18 (multi-dimensional features): word and day states, the circle intervention, the indices, PCA, SAE clusters and the SAE recipe on tiny models."
import re
import numpy as np, torch
from _util import lm, on, finite, untouched
from interpkit.data import char_tokenizer
from interpkit.sae import SAE
from interpkit.papers.multidim import (normalize_points, rotate, mutual_info_2d, separability_curve, separability_index, mixture_index, irreducibility,
    pca_fit, pca_project, circularity, circularity_null, word_states, circle_scores, calendar_prompts, calendar_logits, calendar_states, duration,
    replace_coords, circle_intervention, angular_similarity, cluster_features, cluster_reconstruction, rank_clusters, token_share, pca_view, plot_pca_view,
    calendar_accuracy, DAYS)
from interpkit.demos.multidim import (synthetic_cloud, calendar_texts, sae_tokens, lm_sae_activations, heldout_split, train_lm_sae, load_multidim_sae,
    calendar_tokenizer, calendar_split, near_sentence, calendar_document, load_calendar_lm, load_large_sae_summary)

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'Line': 'made by mixture_index', 'train_calendar_lm': 'trains its own model on the CPU (a short run is in tests/test_multidim.py)', 'Irreducibility': 'made by irreducibility', 'Circularity': 'made by circularity', 'PCAView': 'made by pca_view',
    'WordStates': 'made by word_states', 'LargeSAESummary': 'made by load_large_sae_summary',
}

class _WordTok:
    "Word-level tokenizer (' word' is one token), ids given on first sight: the day names are single tokens."
    def __init__(self): self.vocab = {}
    def encode(self, text, add_special_tokens=False): return [self.vocab.setdefault(w, len(self.vocab) % 128) for w in re.findall(r' ?[^ ]+', text)]

def checks(device, dtype):
    ct = char_tokenizer()

    def states():
        m = lm('llama', device, dtype, n_layers=2)
        words = ['ab', 'cd', 'ef', 'gh', 'ij']
        with untouched(m, ct):
            st = word_states(m, ct, words, [0, -1], ['say {w}.', '{w}!'], batch_size=3)
        on(st[0], device, 'word states'); assert st[0].dtype == torch.promote_types(dtype, torch.float32)
        sc = circle_scores(st, words)
        v = pca_view({'w': st}, 'w', 0)
        plot_pca_view(v, words)
        import matplotlib.pyplot as plt; plt.close('all')
        finite(sc.R.values)
        return f"states {tuple(st[0].shape)} {st[0].dtype}, R {sc.R.iloc[0]:.2f}"

    def days():
        out = []
        for arch in ('llama', 'gpt2'):
            m, tok, P = lm(arch, device, dtype, n_layers=3), _WordTok(), calendar_prompts()
            assert duration(2, 'day') in P.text[7]
            with untouched(m):
                lp = on(calendar_logits(m, tok, P, batch_size=20), device, 'day log-probabilities')
                h = on(calendar_states(m, tok, P, 1, batch_size=20), device, 'day states')
                moved = on(calendar_logits(m, tok, P, 1, lambda x, r: h.flip(0)[r.to(h.device)], batch_size=20), device, 'patched log-probabilities')
                res = circle_intervention(m, tok, 1, batch_size=30)
                months = circle_intervention(m, tok, 'resid_pre(0)', 'months', batch_size=40)
            finite(res.drop(columns=['method', 'site']).values.astype(float)); finite(months.drop(columns=['method', 'site']).values.astype(float))
            new = on(replace_coords(h, h.mean(0), torch.eye(h.shape[1], 2, device=device).T, torch.zeros(len(h), 2)), device, 'replaced states')
            assert new.dtype == h.dtype and torch.isfinite(moved).all()
            out.append(f"{arch} tv {res.tv_moved.iloc[1]:.3f}")
        return ', '.join(out)

    def geometry():
        x = synthetic_cloud('circle', 400).to(device=device, dtype=dtype)
        r = irreducibility(x)
        finite(on(rotate(x, 0.3), device, 'rotated')); finite(normalize_points(x))
        ang, mi = separability_curve(x, n_angles=8)
        on(mutual_info_2d(x[:, 0], x[:, 1]), device, 'mutual information')
        finite(mi); finite(separability_index(x, n_angles=8)); finite(mixture_index(x, n_angles=16, n_offsets=21))
        mu, v = pca_fit(torch.randn(20, 6, device=device, dtype=dtype), 2)
        p = on(pca_project(torch.randn(9, 6, device=device, dtype=dtype), 2), device, 'projection')
        c = circularity(p[:7]); finite(circularity_null(7, p[:7], n=20))
        return f"{r}, R {c.R:.2f}"

    def sae_clusters():
        m = lm('llama', device, dtype, n_layers=2)
        assert calendar_texts(2) and sae_tokens(ct, 128).shape == (2, 64)
        with untouched(m, ct):
            sae, none, res = train_lm_sae(m, ct, site='resid_post(0)', n_tokens=64 * 8, d_sae=32, top_k=4, steps=3, batch_size=64, forward_batch=4, progress=False)
            acts = lm_sae_activations(m, ct, site='resid_post(0)', n_tokens=64 * 8)
        assert next(sae.parameters()).device.type == torch.device(device).type, 'the SAE is not where the model is'
        _, held = heldout_split(acts)
        with torch.no_grad(): codes = on(sae.encode(held.to(device)), device, 'codes')
        a = angular_similarity(sae.directions)
        labels = cluster_features(sae.directions.detach(), 3)
        rec, rows = cluster_reconstruction(sae, codes.to(dtype), np.flatnonzero(labels == labels[0]))
        on(rec, device, 'cluster reconstruction')
        on(token_share(codes, torch.arange(len(codes)) % 7, [1, 2]), device, 'token share')
        ranked = rank_clusters(sae, codes, labels, min_size=1, max_size=32, min_points=10)
        big, _, meta = load_multidim_sae()
        big = big.to(device)
        on(cluster_reconstruction(big, big.encode(torch.randn(16, 576, device=device)), [0, 1, 2])[0], device, 'shipped SAE reconstruction')
        return f"{len(ranked)} clusters ranked, similarity {a.shape}, loss {res.final_loss:.3g}"

    def toy_model():
        import random
        m, tok, meta = load_calendar_lm()
        m = m.to(device=device, dtype=dtype)
        train, held = calendar_split()
        assert near_sentence(random.Random(0)) and calendar_document(train, random.Random(0)) and len(calendar_tokenizer()) == len(tok)
        with untouched(m, tok):
            acc = calendar_accuracy(m, tok, train, batch_size=50)
            res = circle_intervention(m, tok, 'resid_pre(0)', 'months')
        assert acc.min() > 0.9, acc   # low precision keeps the answers
        big = load_large_sae_summary()
        return f"accuracy {acc.round(3).to_dict()}; months moved on the circle: {res.acc_intended.iloc[1]:.2f}; {len(big.clusters)} large-SAE clusters"

    return [('states', states), ('days', days), ('geometry', geometry), ('sae_clusters', sae_clusters), ('toy_model', toy_model)]
