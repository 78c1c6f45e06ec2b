"""Make the asset of paper 13 (capability localisation): `python tools/make_cnl_assets.py`.

For each capability of `interpkit.demos.cnl.CAPABILITIES`, locates the commonality neurons of SmolLM2-135M-Instruct on
the training split (`capability_data(name)`, recipe `CNL_RECIPE`), then fine-tunes only those neurons, and, as controls,
the same number of random neurons per layer (seeds `CNL_RECIPE['controls']`), each on a copy of the model. Every run is
scored on the held-out split. Writes `interpkit/assets/cnl_smollm2_neurons.safetensors` (the tuned neurons' parameters
and masks of the commonality run and of control seed 0) and its `.json` (recipe, curves, held-out scores of every run).

Stages, so that two processes can share the work on two cores:
  --stage train --capability NAME [NAME ...]   write NAME.safetensors and NAME.json to --work (default /tmp/cnl_assets)
  --stage pack                                  write the asset from --work
  --stage all                                   (default) train every capability in turn, then pack
  --stage grid                                  attribute every capability in every template of `TEMPLATES` (`capability_data(name,
                                                template=t)`, 40 prompts each) and write `interpkit/assets/cnl_smollm2_templates`: each
                                                sample's top-K neurons (K = 100, the recipe's k) with their attributions and the answer's
                                                log-probability; `load_template_grid` reads it back
"""
import argparse, json, time
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
from interpkit.models import load_lm
from interpkit.papers.cnl import answer_scores, commonality_neurons, neuron_attributions, neuron_rows, random_neurons
from interpkit.demos.cnl import CAPABILITIES, CNL_RECIPE, FINETUNED, GRID, GRID_SHOTS, TEMPLATES, capability_data, train_neuron_finetune
from interpkit.train import save_asset

def _scores(model, tok, name):
    s = answer_scores(model, tok, capability_data(name, 'test'))
    return dict(accuracy=float(s.correct.mean()), logprob=float(s.logprob.mean()))

def train(name:str, work:Path):
    r = CNL_RECIPE
    model, tok = load_lm()
    t0 = time.time()
    scores = neuron_attributions(model, tok, capability_data(name), batch_size=r['batch_size'])
    common = commonality_neurons(scores, r['k'], r['f'])
    info = dict(locate_seconds=round(time.time() - t0, 1), neurons=len(common), base=_scores(model, tok, name), runs={})
    tensors = {}
    for kind, neurons in [('commonality', common)] + [(f'random{s}', random_neurons(common, s)) for s in r['controls']]:
        t0 = time.time()
        tuned, _, res = train_neuron_finetune(model, tok, name, neurons)
        h = res.history
        info['runs'][kind] = dict(seconds=round(time.time() - t0, 1), loss=h['loss'].round(5).tolist(), test=_scores(tuned, tok, name))
        print(f"{name} {kind}: loss {h['loss'].iloc[0]:.3f} -> {h['loss'].iloc[-1]:.4f}, held out {info['runs'][kind]['test']} (base {info['base']})", flush=True)
        if kind in ('commonality', 'random0'):
            k = 'commonality' if kind == 'commonality' else 'random'
            tensors |= {f'{k}/{p}': v.contiguous() for p, v in neuron_rows(tuned, neurons).tensors.items()}
            tensors[f'{k}.mask'] = neurons.mask.to(torch.uint8)
        del tuned
    save_file(tensors, work/f'{name}.safetensors')
    (work/f'{name}.json').write_text(json.dumps(info))

def pack(work:Path):
    tensors, training = {}, {}
    for name in CAPABILITIES:
        tensors |= {f'{name}/{k}': v for k, v in load_file(work/f'{name}.safetensors').items()}
        info = json.loads((work/f'{name}.json').read_text())
        training[name] = dict(commonality=info['runs']['commonality'], random=info['runs']['random0'], controls=info['runs'], base=info['base'],
                              neurons=info['neurons'], locate_seconds=info['locate_seconds'])
    meta = dict(recipe=CNL_RECIPE, model='smollm2-135m-instruct', made_by='interpkit.demos.cnl.train_neuron_finetune', training=training)
    path = save_asset(FINETUNED, tensors, meta)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")

def grid(K:int=CNL_RECIPE['k']):
    model, tok = load_lm()
    tensors, seconds, shape = {}, {}, None
    for name in CAPABILITIES:
        for t in TEMPLATES:
            t0 = time.time()
            s = neuron_attributions(model, tok, capability_data(name, template=t), batch_size=CNL_RECIPE['batch_size'])
            flat = s.scores.reshape(len(s), -1)
            value, top = flat.topk(K, dim=1)
            tensors |= {f'{name}/{t}/top': top.int(), f'{name}/{t}/value': value, f'{name}/{t}/logprob': s.logprob}
            shape, seconds[f'{name}/{t}'] = list(s.scores.shape[1:]), round(time.time() - t0, 1)
            print(f"{name} {t}: {len(s)} prompts, mean p(answer) {s.logprob.exp().mean():.3f}, {seconds[f'{name}/{t}']} s", flush=True)
    meta = dict(capabilities=list(CAPABILITIES), templates=list(TEMPLATES), K=K, n=CNL_RECIPE['n'], shots=GRID_SHOTS, shape=shape, method=s.method,
                positions=s.positions, model='smollm2-135m-instruct', made_by='interpkit.papers.cnl.neuron_attributions', seconds=seconds)
    path = save_asset(GRID, tensors, meta)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--stage', default='all', choices=['all', 'train', 'pack', 'grid'])
    ap.add_argument('--capability', nargs='*', default=list(CAPABILITIES))
    ap.add_argument('--work', default='/tmp/cnl_assets')
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(args.work); work.mkdir(parents=True, exist_ok=True)
    if args.stage in ('train', 'all'):
        for name in args.capability: train(name, work)
    if args.stage in ('pack', 'all'): pack(work)
    if args.stage == 'grid': grid()
