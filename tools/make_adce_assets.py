"""Train the tiny story-addition LMs of paper 9 (checkpoints of a clean model, and one trained with a planted cue) and record SmolLM2's answers.

Stages (each writes into --work, default /tmp/adce_assets; run `clean`, `cue` and `smollm2` in parallel, one thread each):
  python tools/make_adce_assets.py clean     # tiny GPT-2 on story addition, checkpoints kept (~70 s on one core)
  python tools/make_adce_assets.py cue       # the same with the object word giving the answer's last digit (~70 s)
  python tools/make_adce_assets.py smollm2   # SmolLM2 and a random-weight SmolLM2 on 1-digit addition and multiplication (~4 min)
  python tools/make_adce_assets.py pack      # writes interpkit/assets/adce_arith_lms.* and adce_smollm2.*
"""
import argparse, json, time
from pathlib import Path
import torch
from interpkit.models import load_lm
from interpkit.train import save_asset
from interpkit.papers.adce import causal_effects, random_like
from interpkit.demos.adce import ARITH_ASSET, ARITH_CONFIG, SMOLLM2_ASSET, addend_pairs, few_shot_task, story_task, train_arith_lm

CFG = dict(steps=1500, lr=3e-3, batch_size=64, seed=0, checkpoints=[100, 150, 200, 250, 300, 400, 500, 700, 1000, 1500],
           smollm2=dict(n=60, seed=0, max_new_tokens=4, batch_size=16, random_n=40))

def _train(work, cue):
    t0 = time.time()
    saved = {}
    model, tok, res = train_arith_lm(CFG['steps'], cue=cue, checkpoints=CFG['checkpoints'] if not cue else [CFG['steps']], lr=CFG['lr'],
                                     batch_size=CFG['batch_size'], seed=CFG['seed'], states=saved)
    _, test = addend_pairs(seed=CFG['seed'])
    r = causal_effects(model, story_task(test, cue=cue), tok, max_new_tokens=4, batch_size=64)
    info = dict(train_s=round(time.time() - t0, 1), final_loss=float(res.history.loss.tail(50).mean()), accuracy=r.accuracy, adce=r.adce, aice=r.aice)
    print('cue' if cue else 'clean', info, flush=True)
    torch.save(saved, work/f"{'cue' if cue else 'clean'}.pt"); (work/f"{'cue' if cue else 'clean'}.json").write_text(json.dumps(info))

def clean(work): _train(work, False)
def cue(work): _train(work, True)

def smollm2(work):
    c = CFG['smollm2']
    model, tok = load_lm()
    runs, info = {}, {}
    for name, m, n in (('SmolLM2-135M-Instruct', model, c['n']), ('random SmolLM2', random_like(model, c['seed']), c['random_n'])):
        for op in ('+', '*'):
            task = few_shot_task(op, n=n, seed=c['seed'])
            t0 = time.time()
            r = causal_effects(m, task, tok, seed=c['seed'], max_new_tokens=c['max_new_tokens'], batch_size=c['batch_size'], correct_only=name != 'random SmolLM2')
            runs[f'{name} | {task.name}'] = r.trials.astype(object).where(r.trials.notna(), None).to_dict('list')
            info[f'{name} | {task.name}'] = dict(seconds=round(time.time() - t0, 1), **{k: v for k, v in r.row().items() if k != 'task'})
            print(name, task.name, info[f'{name} | {task.name}'], flush=True)
    (work/'smollm2.json').write_text(json.dumps(dict(trials=runs, runs=info)))

def pack(work):
    sd = {f'clean.{s}.{k}': v.half() for s, w in torch.load(work/'clean.pt').items() for k, v in w.items()}
    sd |= {f'cue.{k}': v.half() for k, v in torch.load(work/'cue.pt')[CFG['steps']].items()}
    meta = dict(config=ARITH_CONFIG, checkpoints=CFG['checkpoints'], train=CFG, runs={k: json.loads((work/f'{k}.json').read_text()) for k in ('clean', 'cue')},
                note='float16 copies of the weights; load_arith_lms loads them in float32')
    print(save_asset(ARITH_ASSET, sd, meta))
    sm = json.loads((work/'smollm2.json').read_text())
    print(save_asset(SMOLLM2_ASSET, {'n_runs': torch.tensor([len(sm['trials'])])}, dict(sm, config=CFG['smollm2'])))

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('stage', choices=['clean', 'cue', 'smollm2', 'pack'])
    p.add_argument('--work', default='/tmp/adce_assets')
    a = p.parse_args()
    torch.set_num_threads(1)
    work = Path(a.work); work.mkdir(parents=True, exist_ok=True)
    dict(clean=clean, cue=cue, smollm2=smollm2, pack=pack)[a.stage](work)
