"""Make the asset of paper 8 (TED): `python tools/make_ted_assets.py`.

SmolLM2-135M-Instruct answers `interpkit.papers.ted.QUERIES` (greedy), then edits each answer for the control
instruction and for every phrase of `PHRASES` (`edit_outputs`, recipe `TED_RECIPE`). The operational embeddings are
computed on the first `n_embed` queries; the rest are held out for verification, where SmolLM2 judges (`lm_judge`, both
A/B orders) the candidates of each failure type and random pairs. Writes `interpkit/assets/ted_smollm2.safetensors`
(the embeddings) and its `.json` (recipe, every output, counts, the LM judge's rates, timings).

Stages, so that two processes can share the work on two cores:
  --stage responses                  the first answers (one process)
  --stage generate --part K --parts N   the edits for phrases K, K+N, ... (part 0 keeps the control's)
  --stage embed --part K --parts N      their operational embeddings
  --stage judge --part K --parts N      the LM judge on pairs K, K+N, ... of the judged set
  --stage pack                       write the asset from --work (default /tmp/ted_assets)
  --stage all                        (default) everything in turn in one process
"""
import argparse, json, time
from pathlib import Path
import pandas as pd, torch
from safetensors.torch import load_file, save_file
from interpkit.models import chat_replies, load_lm
from interpkit.papers.ted import (EXPECTED, UNEXPECTED, EditOutputs, OperationalEmbeddings, candidates, edit_outputs, lm_judge, operational_embeddings,
                                  random_pairs, reference_labels, thesaurus, verify_pairs)
from interpkit.demos.ted import PHRASES, QUERIES, TED_ASSET, TED_RECIPE
from interpkit.train import save_asset

R = TED_RECIPE

def _read(p:Path): return json.loads(p.read_text())
def _write(p:Path, obj): tmp = p.with_suffix('.tmp'); tmp.write_text(json.dumps(obj)); tmp.rename(p)

def responses(work:Path):
    model, tok = load_lm(); t0 = time.time()
    rs = chat_replies(model, tok, list(QUERIES), R['response_tokens'], R['batch_size'])
    _write(work/'responses.json', dict(responses=rs, seconds=round(time.time() - t0, 1)))

def generate(work:Path, part:int, parts:int):
    model, tok = load_lm(); t0 = time.time()
    rs = _read(work/'responses.json')['responses']
    out = edit_outputs(model, list(QUERIES), list(PHRASES[part::parts]), tok, responses=rs, max_new_tokens=R['max_new_tokens'], batch_size=R['batch_size'])
    _write(work/f'gen_{part}.json', dict(control=out.control if part == 0 else None, outputs=out.outputs, seconds=round(time.time() - t0, 1)))
    print(f"generate part {part}: {len(out.outputs)} phrases in {time.time() - t0:.0f} s", flush=True)

def _all_outputs(work:Path) -> EditOutputs:
    rs = _read(work/'responses.json')['responses']
    gens = sorted(work.glob('gen_*.json'))
    parts = [_read(p) for p in gens]
    control = next(g['control'] for g in parts if g['control'] is not None)
    outputs = {w: o for g in parts for w, o in g['outputs'].items()}
    return EditOutputs(list(QUERIES), rs, control, {w: outputs[w] for w in PHRASES})

def _split(data:EditOutputs):
    n = R['n_embed']
    return data.subset(queries=range(n)), data.subset(queries=range(n, len(data.queries)))

def embed(work:Path, part:int, parts:int):
    model, tok = load_lm(); t0 = time.time()
    train, _ = _split(_all_outputs(work))
    e = operational_embeddings(model, train, tok, list(PHRASES[part::parts]), R['n_keep'], R['grad_batch_size'])
    save_file({'vectors': e.vectors}, str(work/f'emb_{part}.safetensors'))
    _write(work/f'emb_{part}.json', dict(phrases=e.phrases, counts=e.counts, seconds=round(time.time() - t0, 1)))
    print(f"embed part {part}: {len(e.phrases)} phrases in {time.time() - t0:.0f} s", flush=True)

def _embeddings(work:Path) -> OperationalEmbeddings:
    metas = {int(p.stem.split('_')[1]): _read(p) for p in work.glob('emb_*.json')}
    vecs = {int(p.stem.split('_')[1]): load_file(str(p))['vectors'] for p in work.glob('emb_*.safetensors')}
    rows = {w: (v, c) for k in metas for w, v, c in zip(metas[k]['phrases'], vecs[k], metas[k]['counts'])}
    return OperationalEmbeddings(list(PHRASES), torch.stack([rows[w][0] for w in PHRASES]), [rows[w][1] for w in PHRASES])

def judged_pairs(emb:OperationalEmbeddings) -> pd.DataFrame:
    "The pairs the LM judge sees: the top candidates of each failure type and random pairs."
    lab = reference_labels(thesaurus(emb, R['token']).pairs())
    groups = [candidates(lab, UNEXPECTED, R['k_candidates']).assign(group='side-effect candidate'),
              candidates(lab, EXPECTED, R['k_candidates']).assign(group='inadequate-update candidate'),
              random_pairs(list(PHRASES), R['k_random'], R['seed']).merge(lab, on=['w_eval', 'w_edit']).assign(group='random')]
    return pd.concat(groups).reset_index(drop=True)

def judge(work:Path, part:int, parts:int):
    model, tok = load_lm(); t0 = time.time()
    _, test = _split(_all_outputs(work))
    pairs = judged_pairs(_embeddings(work)).iloc[part::parts]
    res = verify_pairs(test, pairs, lm_judge(model, tok, batch_size=R['batch_size']), R['seed'])
    _write(work/f'judge_{part}.json', dict(rows=res.to_dict('records'), seconds=round(time.time() - t0, 1)))
    print(f"judge part {part}: {len(res)} pairs in {time.time() - t0:.0f} s", flush=True)

def pack(work:Path):
    data, emb = _all_outputs(work), _embeddings(work)
    train, test = _split(data)
    rates = [r for p in sorted(work.glob('judge_*.json')) for r in _read(p)['rows']]
    seconds = {p.stem: _read(p)['seconds'] for p in work.glob('*.json') if 'seconds' in _read(p)}
    as_dict = lambda d: dict(queries=d.queries, responses=d.responses, control=d.control, outputs=d.outputs)
    meta = dict(model='smollm2-135m-instruct', recipe=R, phrases=emb.phrases, counts=emb.counts, train=as_dict(train), test=as_dict(test),
                lm_rates=rates, seconds=seconds, made_by='tools/make_ted_assets.py')
    print(save_asset(TED_ASSET, {'embeddings': emb.vectors.contiguous()}, meta))

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--stage', default='all', choices=['responses', 'generate', 'embed', 'judge', 'pack', 'all'])
    ap.add_argument('--part', type=int, default=0); ap.add_argument('--parts', type=int, default=1)
    ap.add_argument('--work', type=Path, default=Path('/tmp/ted_assets'))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(R['seed'])
    if a.stage == 'all':
        responses(a.work); generate(a.work, 0, 1); embed(a.work, 0, 1); judge(a.work, 0, 1); pack(a.work)
    elif a.stage in ('responses', 'pack'): globals()[a.stage](a.work)
    else: globals()[a.stage](a.work, a.part, a.parts)
