"""Make the asset of paper 12 (monosemantic features): `python tools/make_monosemantic_assets.py`.

Trains the networks of `nbs/papers/12_monosemantic.ipynb` on digit pairs (`interpkit.demos.monosemantic.digit_pairs`,
100 classes) with the recipe `DIGIT_RECIPE` and seed 0: SimCLR, NCL (ReLU on the normalised projection, then normalised
again), then a TopK SAE on SimCLR's frozen projector output, and writes `interpkit/assets/monosemantic_digit_pairs.safetensors`
and its `.json` (recipe, training times and loss curves).

Stages, so that the two networks can train at once on two cores:
  --stage train --method simclr|ncl   train one network, write its weights and curve to --work (default /tmp/monosemantic)
  --stage pack                        train the SAE on the SimCLR network and write the asset
  --stage all                         (default) train both networks in turn, then pack
"""
import argparse, json, time
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from interpkit.papers.monosemantic import ContrastiveNet, train_feature_sae
from interpkit.demos.monosemantic import DIGIT_MODELS, DIGIT_RECIPE, DigitEncoder, digit_pairs, train_digit_net
from interpkit.train import save_asset

SEED = 0

def _curve(res, cols):
    h = res.history
    return h.iloc[::max(1, len(h) // 200)][['step'] + cols].round(5).to_dict('list')

def train(method:str, work:Path):
    t0 = time.time()
    net, _, res = train_digit_net(method, digit_pairs('train').x, seed=SEED, progress=False)
    secs = time.time() - t0
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, work/f'{method}.safetensors')
    (work/f'{method}.json').write_text(json.dumps(dict(seconds=round(secs, 1), final_loss=res.final_loss, curve=_curve(res, ['loss', 'nce', 'activation']))))
    print(f"{method}: loss {res.history['loss'].iloc[0]:.3f} -> {res.final_loss:.4f} in {secs:.0f} s", flush=True)

def pack(work:Path):
    r = DIGIT_RECIPE
    simclr = ContrastiveNet(DigitEncoder(r['d_enc']), r['d_enc'], r['d_proj'], r['d_hidden'], 'none')
    simclr.load_state_dict(load_file(work/'simclr.safetensors'))
    t0 = time.time()
    sae, _, res = train_feature_sae(simclr.eval(), digit_pairs('train').x, r['k'], r['sae_steps'], seed=SEED, progress=False)
    secs = time.time() - t0
    print(f"sae: nmse {res.history['nmse'].iloc[-1]:.4f}, l0 {res.history['l0'].iloc[-1]:.1f} in {secs:.0f} s", flush=True)
    tensors = {f'simclr/{k}': v for k, v in simclr.state_dict().items()}
    tensors |= {f'ncl/{k}': v for k, v in load_file(work/'ncl.safetensors').items()}
    tensors |= {f'sae/{k}': v for k, v in sae.state_dict().items()}
    meta = dict(seed=SEED, recipe=DIGIT_RECIPE, made_by='interpkit.demos.monosemantic.train_digit_net and interpkit.papers.monosemantic.train_feature_sae',
                training={m: json.loads((work/f'{m}.json').read_text()) for m in ('simclr', 'ncl')})
    meta['training']['sae'] = dict(seconds=round(secs, 1), final_nmse=float(res.history['nmse'].iloc[-1]), curve=_curve(res, ['loss', 'nmse', 'l0']))
    path = save_asset(DIGIT_MODELS, tensors, meta)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--stage', default='all', choices=['all', 'train', 'pack'])
    ap.add_argument('--method', choices=['simclr', 'ncl'])
    ap.add_argument('--work', default='/tmp/monosemantic')
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work); work.mkdir(parents=True, exist_ok=True)
    if args.stage == 'train': train(args.method, work)
    else:
        if args.stage == 'all':
            for m in ('simclr', 'ncl'): train(m, work)
        pack(work)
