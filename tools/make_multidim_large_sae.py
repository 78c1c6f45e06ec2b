"""Make the large-SAE summary of paper 18 (multi-dimensional features): `python tools/make_multidim_large_sae.py`.

A wider sparse autoencoder than the shipped one, to see whether calendar clusters appear in SmolLM2-135M-Instruct at a larger
scale: 4096 top-k features (k = 32) on 320,000 tokens at resid_post(6), with the recipe `interpkit.demos.multidim.train_lm_sae`
(Shakespeare mixed with 20% generated calendar sentences, fixed seed). The SAE encodes a fresh draw of text (seed 1, 30% calendar
rows), its decoder directions are spectrally clustered into 160 clusters (about 25 features each, the paper's ratio for GPT-2),
and every cluster is scored with `rank_clusters`. The weights (9 MB) are not shipped: the script writes
`interpkit/assets/multidim_large_sae.json` with the settings, held-out metrics, the cluster table (with the share of each
cluster's activation on day and month tokens), where the day and month features landed, and the 2-D points of the clusters that
hold the most day and month activation, so that the notebook can show them. `load_large_sae_summary()` reads it.
"""
import json, time
from dataclasses import asdict
import numpy as np, torch
from interpkit.models import load_lm
from interpkit.papers.multidim import DAYS, MONTHS, cluster_features, rank_clusters, token_share, cluster_reconstruction, pca_project, irreducibility
from interpkit.demos.multidim import train_lm_sae, lm_sae_activations, heldout_split, sae_tokens
from interpkit.sae import sae_metrics, stream_activations
from interpkit.train import assets_dir

CONFIG = dict(site='resid_post(6)', n_tokens=320_000, d_sae=4096, top_k=32, steps=3000, batch_size=1024, lr=1e-3, block=64, calendar_frac=0.2, seed=0)
EVAL = dict(n_tokens=64 * 160, calendar_frac=0.3, seed=1, n_clusters=160, max_points=600)

def make(model, tokenizer, config=CONFIG, ev=EVAL, name='multidim_large_sae', folder=None, progress=True):
    "Train, encode a fresh draw, cluster, score; write the JSON summary and return it."
    t0 = time.time()
    sae, _, res = train_lm_sae(model, tokenizer, **config, progress=progress)
    secs = time.time() - t0
    data = {k: config[k] for k in ('site', 'n_tokens', 'block', 'calendar_frac', 'seed')}
    _, heldout = heldout_split(lm_sae_activations(model, tokenizer, **data))
    ids = sae_tokens(tokenizer, ev['n_tokens'], block=config['block'], calendar_frac=ev['calendar_frac'], seed=ev['seed'])
    acts = torch.cat(list(stream_activations(model, ids, config['site'])))
    tok_ids = ids[:, 1:].reshape(-1)  # stream_activations drops position 0 of each row
    sae = sae.cpu()
    with torch.no_grad(): codes = sae.encode(acts)
    labels = cluster_features(sae.directions.detach(), ev['n_clusters'], seed=0)
    ranked = rank_clusters(sae, codes, labels, min_points=40)
    vocab = {name: [tokenizer.encode(' ' + w, add_special_tokens=False)[0] for w in words] for name, words in (('days', DAYS), ('months', MONTHS))}
    share = {name: token_share(codes, tok_ids, v) for name, v in vocab.items()}
    mass = codes.sum(0)
    for nm in vocab:  # each cluster's share of activation on the set's tokens
        ranked[f'{nm}_share'] = [float((share[nm][labels == c] * mass[labels == c]).sum() / mass[labels == c].sum().clamp_min(1e-12)) for c in ranked.cluster]
    out = dict(config=config, eval=ev, model='smollm2-135m-instruct', train_seconds=round(secs, 1), final_train_nmse=float(res.history['nmse'].iloc[-100:].mean()),
               heldout=asdict(sae_metrics(sae, heldout)), on_draw=asdict(sae_metrics(sae, acts)), clusters=ranked.round(4).to_dict('records'),
               base_rate={nm: torch.isin(tok_ids, torch.tensor(v)).float().mean().item() for nm, v in vocab.items()}, vocab=vocab, calendar={})
    g = torch.Generator().manual_seed(0)
    for nm, v in vocab.items():
        feats = np.flatnonzero((share[nm] > 0.5).numpy())
        best = int(ranked.sort_values(f'{nm}_share', ascending=False).cluster.iloc[0])
        groups = {'cluster_points': np.flatnonzero(labels == best), 'feature_points': feats}  # the best cluster; all the set's features (an oracle grouping)
        entry = dict(features=feats.tolist(), clusters_of_features=sorted(set(labels[feats].tolist())), best_cluster=best)
        for gname, fs in groups.items():
            if len(fs) == 0: continue
            rec, rows = cluster_reconstruction(sae, codes, fs)
            p2 = pca_project(rec, 2)
            r = irreducibility(p2)
            keep = torch.randperm(len(rows), generator=g)[:ev['max_points']].sort().values
            entry[gname] = dict(features=[int(f) for f in fs], separability=r.separability, mixture=r.mixture, n_points=len(rows),
                                points=p2[keep].round(decimals=4).tolist(), tokens=tok_ids[rows][keep].tolist())
        out['calendar'][nm] = entry
    path = (folder or assets_dir()) / f'{name}.json'
    path.write_text(json.dumps(out, default=float))
    return path, out

if __name__ == '__main__':
    torch.set_num_threads(1)  # one thread: with the cores shared, a second OpenMP thread mostly spins
    model, tokenizer = load_lm()
    path, out = make(model, tokenizer)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB) in {out['train_seconds']:.0f} s of training; held-out {out['heldout']}")
    for name, e in out['calendar'].items(): print(name, len(e['features']), 'features in', len(e['clusters_of_features']), 'clusters; best', e['best_cluster'], {k: (round(e[k]['separability'], 3), round(e[k]['mixture'], 3)) for k in ('cluster_points', 'feature_points') if k in e})
