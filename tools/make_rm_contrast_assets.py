"""Train the two demo reward models of paper 4 (MiniLM + linear head on planted preferences), explain them, judge the perturbations with
an independent detector, and collect SmolLM2's rewrites.

Stages (each writes into --work, default /tmp/rm_contrast_assets; `train` then `explain`; `rewrite` may run beside them, one thread each):
  python tools/make_rm_contrast_assets.py train      # features, Bradley-Terry heads, held-out margins (~4 min on one core)
  python tools/make_rm_contrast_assets.py explain    # explanations of both RMs, DescriptionDetector shifts (~4 min on one core)
  python tools/make_rm_contrast_assets.py rewrite    # SmolLM2's two-step rewrites of held-out responses (~10 min on one core)
  python tools/make_rm_contrast_assets.py keep-rewrites   # instead of `rewrite`: take the rewrites from the shipped asset unchanged
  python tools/make_rm_contrast_assets.py pack       # writes interpkit/assets/rm_contrast_demo.{safetensors,json}
"""
import argparse, json, time
from pathlib import Path
import numpy as np, torch
from interpkit.models import load_encoder, load_lm
from interpkit.train import load_asset, save_asset
from interpkit.papers.rm_contrast import RESPONSE_ATTRIBUTES, DescriptionDetector, LMRewriter, detector_shifts, explain, head_features, head_reward
from interpkit.demos.rm_contrast import PLANTED, RM_ASSET, demo_comparisons, demo_heldout, planted_reward, train_reward_head

CFG = dict(n_train=1500, n_fit=1200, train_seeds={'helpful': 1, 'harmless': 2}, beta=3.0, steps=500, lr=0.01, n_test=40, test_seed=100, seed=0,
           n_rewrite=8, pooling='mean')

def train(work):
    enc, tok = load_encoder()
    out, meta = {}, {}
    for name, w in PLANTED.items():
        t0 = time.time()
        tr = demo_comparisons(CFG['n_train'], w, seed=CFG['train_seeds'][name], beta=CFG['beta'])
        f = [head_features(enc, tok, [c.prompt for c in tr], [getattr(c, s) for c in tr], pooling=CFG['pooling']) for s in ('chosen', 'rejected')]
        n = CFG['n_fit']
        head = train_reward_head(f[0][:n], f[1][:n], steps=CFG['steps'], lr=CFG['lr'], seed=CFG['seed']).model
        with torch.no_grad(): d = (head(f[0][n:]) - head(f[1][n:]))[:, 0].double().numpy()
        assert tr[n:] == demo_heldout(name, CFG)
        truth = np.sign(planted_reward([c.chosen for c in tr[n:]], w) - planted_reward([c.rejected for c in tr[n:]], w))
        acc_label, acc_planted = float((d > 0).mean()), float(((np.sign(d) == truth) | (truth == 0)).mean())
        out |= {f'{name}.head.weight': head.weight.detach(), f'{name}.head.bias': head.bias.detach(), f'{name}.heldout_margin': torch.tensor(d)}
        meta[name] = dict(heldout_accuracy_labels=acc_label, heldout_accuracy_planted=acc_planted, train_s=round(time.time() - t0, 1))
        print(name, meta[name], flush=True)
    torch.save(out, work/'heads.pt'); (work/'heads.json').write_text(json.dumps(meta))

def explain_stage(work):
    enc, tok = load_encoder()
    heads, meta = torch.load(work/'heads.pt', weights_only=True), json.loads((work/'heads.json').read_text())
    det = DescriptionDetector(embedder=enc, tokenizer=tok)
    out = {}
    for name, w in PLANTED.items():
        t0 = time.time()
        head = torch.nn.utils.skip_init(torch.nn.Linear, heads[f"{name}.head.weight"].shape[1], 1)
        head.load_state_dict({'weight': heads[f'{name}.head.weight'], 'bias': heads[f'{name}.head.bias']})
        rm = head_reward(enc, tok, head.eval().requires_grad_(False), pooling=CFG['pooling'])
        seen = []
        def counted(p, y): seen.extend(zip(p, y)); return rm(p, y)
        ex = explain(counted, demo_comparisons(CFG['n_test'], w, seed=CFG['test_seed'], beta=np.inf), baseline=True, seed=CFG['seed'])
        t1 = time.time()
        d = detector_shifts(ex, det)
        out |= {f'{name}.margins': torch.tensor(ex.margins), f'{name}.swapped': torch.tensor(ex.swapped.astype(np.uint8)),
                **{f'{name}.{c}': torch.tensor(ex.table[c].to_numpy(np.float64)) for c in ('new_margin', 'syntactic', 'semantic')},
                **{f'{name}.{c}': torch.tensor(d[c].to_numpy(np.float64)) for c in ('d_chosen', 'd_rejected')}}
        meta[name] |= dict(reward_pairs_scored=len(seen), distinct_pairs=len(set(seen)), explain_s=round(t1 - t0, 1), detector_s=round(time.time() - t1, 1))
        print(name, meta[name], flush=True)
    torch.save(out, work/'explain.pt'); (work/'explain.json').write_text(json.dumps(meta))

def rewrite(work):
    model, tok = load_lm('smollm2-135m-instruct')
    lm = LMRewriter(model, tok)
    cs = demo_comparisons(CFG['n_test'], PLANTED['helpful'], seed=CFG['test_seed'], beta=np.inf)[:CFG['n_rewrite']]
    rows, t0 = [], time.time()
    for a in RESPONSE_ATTRIBUTES:
        for side, direction in (('chosen', -1), ('rejected', 1)):
            texts = [getattr(c, side) for c in cs]
            new = lm(texts, a, direction, [c.prompt for c in cs])
            rows += [dict(comparison=i, attribute=a.name, direction=direction, response=t, rewrite=n, phrases=tr['phrases'], reply=tr['reply'])
                     for i, (t, n, tr) in enumerate(zip(texts, new, lm.transcripts[-len(cs):]))]
        print(a.name, round(time.time() - t0), 's', flush=True)
    (work/'rewrites.json').write_text(json.dumps(dict(rows=rows, seconds=round(time.time() - t0, 1))))

def keep_rewrites(work):
    _, meta = load_asset(RM_ASSET)
    (work/'rewrites.json').write_text(json.dumps(dict(rows=meta['rewrites'], seconds=meta['rewrite_s'])))

def pack(work):
    heads = torch.load(work/'heads.pt', weights_only=True)
    tensors, meta = heads | torch.load(work/'explain.pt', weights_only=True), json.loads((work/'explain.json').read_text())
    rw = json.loads((work/'rewrites.json').read_text())
    save_asset(RM_ASSET, tensors, dict(CFG, train_seeds=CFG['train_seeds'], planted=PLANTED, training=meta, rewrites=rw['rows'], rewrite_s=rw['seconds'],
                                      encoder='all-MiniLM-L6-v2', rewriter='SmolLM2-135M-Instruct'))

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('stage', choices=['train', 'explain', 'rewrite', 'keep-rewrites', 'pack'])
    p.add_argument('--work', default='/tmp/rm_contrast_assets')
    a = p.parse_args()
    torch.set_num_threads(1)
    work = Path(a.work); work.mkdir(parents=True, exist_ok=True)
    dict(train=train, explain=explain_stage, rewrite=rewrite, pack=pack)[a.stage](work) if a.stage != 'keep-rewrites' else keep_rewrites(work)
