"""interpkit's TrackStar index build against `bergson build` as whole processes (issue 52): peak resident memory and wall time of
each tool's own process, side by side, and a check that the outputs agree.

usage: OMP_NUM_THREADS=1 python benchmarks/bench_trackstar_bergson.py [--n 64] [--tokens 150] [--batch-size 0] [--repeats 1]
                                                                      [--bergson /work/venv-bergson/bin/python] [--skip-bergson] [--reuse-bergson DIR]

Workload: the first `--n` Shakespeare passages (`interpkit.data.shakespeare_docs`), tokenised once by interpkit's `encode_texts` (BOS first) and
cut to `--tokens` tokens, on SmolLM2-135M-Instruct in float32 (interpkit's offline copy: the safetensors folder `load_lm` converts into its
cache, which bergson loads as a local path), one thread (OMP_NUM_THREADS=1 in every process).

Each tool runs in a fresh process, timed and measured from the outside: wall seconds of the whole process (start, imports, model loading, build,
exit) and its peak resident set (`ru_maxrss` of the child, from `os.wait4`). The workers also print their build time alone. With `--repeats N`
the two tools run N times each, interleaved (bergson, interpkit, bergson, ...), and the table gives the median wall time and the largest peak.
  bergson    the CLI, `bergson build RUN --model DIR --dataset DS --projection_dim 16 --token_batch_size 2048` from its own venv (`--bergson`,
             a python with bergson installed; see below): its defaults otherwise (fp32, summed cross-entropy per document, Rademacher
             matrices of variance 1/16, one two-sided projection per linear module, batches of at most 2048 tokens packed by length).
             DS is the same token ids saved as a `datasets` folder (an `input_ids` column: bergson does not tokenise again).
  interpkit  `GradIndex.build(model, batch, folder, projection=..., loss='sum', batch_size=--batch-size)` after `load_lm()`: the same
             settings as bergson (bergson's own Rademacher matrices, dumped by a preparation process in bergson's venv, passed as a `Projection`),
             plus what bergson's build does not do: the block-diagonal R_train (float64) that TrackStar's whitening needs. `--batch-size 0`
             (the default) leaves `GradIndex.build`'s own default.

Agreement: the per-example projected gradients of both indexes (interpkit's rows in corpus order; bergson's `gradients.bin`, whose columns
are laid out module by module as its `info.json` lists them) are compared: the largest difference relative to the largest entry, the
smallest cosine between a row and its counterpart, and the rank agreement of the cosine nearest neighbours of every example within the
corpus (top-1 and top-5 overlap), which is what an index is searched for.

A venv for bergson (CPU torch kept; bergson's install pulls torchvision and torchaudio builds that break `import transformers` beside the CPU
torch, so they are removed):
    python3 -m venv /work/venv-bergson && /work/venv-bergson/bin/pip install torch==2.13.0
    /work/venv-bergson/bin/pip install bergson torch==2.13.0 && /work/venv-bergson/bin/pip uninstall -y torchvision torchaudio
Wall-clock numbers are only meaningful on an otherwise idle machine.

Where interpkit's memory went (issue 52; SmolLM2-135M-Instruct in float32, 150-token passages), and what changed:
  - autograd's saved activations, ~1.4 MB per token (about 9 d-wide and 4 I-wide float32 values per token and layer): 6.6 GB with the
    old default batch_size=32 (4,800 tokens a pass), against bergson's ~1,950 (13 passages of its 2,048-token budget). GradIndex.build and
    example_grads now default to batch_size=8 (1,200 tokens, 1.7 GB); the output does not depend on the batch.
  - the vocabulary, ~3 GB at 32 rows: the logits at the scored positions (0.94 GB), a float32 log-softmax of them kept for the backward
    pass, its zero-filled gradient from `gather`, the log-softmax's gradient, a zero-filled copy from the row selection (`lg[0]`) in the
    backward pass, and in the forward pass an int64 copy of the whole (positions, vocabulary) array made by the finiteness check
    (`isnan().sum()`, 1.9 GB). `interpkit.grads` now computes each target's log-probability a block of rows at a time (`_TargetLogProb`:
    only the logits are kept, one gradient array in the backward pass) and checks finiteness with one maximum; together with the squeeze
    in place of the row selection, the copies are gone, and with them ~25% of the build's time (page faults of fresh 0.2-2 GB arrays).
  - not the cause: the model in float32 (bergson loads it in float32 too), per-example gradients (the two-sided projection never forms
    them), R_train (float64 but block-diagonal: 110 MB), the write buffer (a batch's rows, < 30 MB).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TQDM_DISABLE', '1')
SCRIPT = Path(__file__).resolve()
P = 16  # projection per side and module (bergson's --projection_dim)

def env():
    return {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'TQDM_DISABLE': '1', 'TOKENIZERS_PARALLELISM': 'false'}

def timed(cmd, cwd=None):
    "Run `cmd` as a child process: (wall seconds, peak resident MB of the child, its stdout); raise with its stderr if it fails."
    t = time.perf_counter()
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env(), cwd=cwd)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t
    out.seek(0); err.seek(0)
    so, se = out.read().decode(errors='replace'), err.read().decode(errors='replace')
    if os.waitstatus_to_exitcode(status): raise RuntimeError(f"{cmd[:3]} failed:\n{so[-2000:]}\n{se[-4000:]}")
    return dt, ru.ru_maxrss / 1024, so

# ------------------------------------------------------------------------------------------------ workers
def worker_data(a):
    "In interpkit's venv: the token ids of the workload, and the model folder."
    from interpkit.data import shakespeare_docs
    from interpkit.models import _offline_lm_dir, encode_texts, load_lm
    _, tok = load_lm()
    docs = [d.replace('\n', ' ') for d in shakespeare_docs(words=2 * a.tokens)[:a.n]]
    b = encode_texts(tok, docs, max_len=a.tokens)
    ids = [r[m.bool()].tolist() for r, m in zip(b['input_ids'], b['attention_mask'])]
    json.dump(dict(ids=ids, model=str(_offline_lm_dir('smollm2-135m-instruct'))), open(a.work/'data.json', 'w'))

def worker_prep(a):
    "In bergson's venv: the dataset folder bergson reads, and bergson's projection matrices of every linear module."
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from bergson.collector.collector import HookCollectorBase, create_module_projection_matrix
    d = json.load(open(a.work/'data.json'))
    Dataset.from_dict(dict(input_ids=d['ids'], length=[len(r) for r in d['ids']])).save_to_disk(str(a.work/'ds'))
    model = AutoModelForCausalLM.from_pretrained(d['model'], dtype=torch.float32)
    mods = dict(model.base_model.named_modules())
    mats = {n: tuple(create_module_projection_matrix(n, role, P, dim, torch.float32, torch.device('cpu'), 'rademacher', 'jl', None)
                     for role, dim in (('left', mods[n].weight.shape[0]), ('right', mods[n].weight.shape[1])))
            for n in HookCollectorBase.discover_targets(model.base_model)}
    torch.save(dict(prefix=model.base_model_prefix, mats=mats), a.work/'proj.pt')

def worker_interpkit(a):
    "In interpkit's venv, measured: load the model, build the index with bergson's settings."
    t0 = time.perf_counter()
    import torch
    torch.set_num_threads(1)
    from interpkit.grads import Projection
    from interpkit.models import load_lm, pad_right
    from interpkit.papers.trackstar import GradIndex
    model, tok = load_lm()
    d, pr = json.load(open(a.work/'data.json')), torch.load(a.work/'proj.pt')
    proj = Projection('two_sided', P, P, 0, {f"{pr['prefix']}.{n}": m for n, m in pr['mats'].items()}, 'rademacher')
    batch = pad_right(d['ids'], 0)
    kw = dict(batch_size=a.batch_size) if a.batch_size else {}
    t1 = time.perf_counter()
    GradIndex.build(model, batch, a.work/'ik', projection=proj, loss='sum', progress=False, overwrite=True, **kw)
    print('RESULT ' + json.dumps(dict(load_s=t1 - t0, build_s=time.perf_counter() - t1)))

# ------------------------------------------------------------------------------------------------ comparison
def compare(work):
    "Agreement of interpkit's and bergson's per-example projected gradients."
    import numpy as np, torch
    ik = json.load(open(work/'ik'/'meta.json'))
    G = torch.from_numpy(np.fromfile(work/'ik'/ik['shards'][0]['file'], dtype='<f4').reshape(ik['n'], ik['dim'])).double()
    info = json.load(open(work/'bg'/'info.json'))
    Gb = torch.from_numpy(np.fromfile(work/'bg'/'gradients.bin', dtype=info['base_dtype']).reshape(info['num_grads'], -1).astype(np.float64))
    prefix = torch.load(work/'proj.pt')['prefix'] + '.'
    offs, o = {}, 0
    for n, s in info['grad_sizes'].items(): offs[prefix + n] = (o, s); o += s
    Gb = torch.cat([Gb[:, offs[n][0]:offs[n][0] + offs[n][1]] for n in ik['modules']], 1)  # bergson's columns in interpkit's module order
    assert G.shape == Gb.shape, (G.shape, Gb.shape)
    rel = float((G - Gb).abs().max() / Gb.abs().max())
    cos_rows = float(torch.nn.functional.cosine_similarity(G, Gb, dim=1).min())
    def nn_rank(X):
        X = torch.nn.functional.normalize(X, dim=1); S = X @ X.T; S.fill_diagonal_(-2)
        return S.topk(5, 1).indices
    a, b = nn_rank(G), nn_rank(Gb)
    return dict(n=G.shape[0], D=G.shape[1], max_rel_diff=rel, min_row_cosine=cos_rows, top1_same=float((a[:, 0] == b[:, 0]).double().mean()),
                top5_overlap=float(np.mean([len(set(x.tolist()) & set(y.tolist())) / 5 for x, y in zip(a, b)])),
                norm_ratio_median=float((G.norm(dim=1) / Gb.norm(dim=1)).median()))

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--n', type=int, default=64); ap.add_argument('--tokens', type=int, default=150)
    ap.add_argument('--batch-size', type=int, default=0, help="interpkit's batch_size; 0: GradIndex.build's default")
    ap.add_argument('--repeats', type=int, default=1, help='runs of each tool, interleaved: median time, largest peak')
    ap.add_argument('--bergson', default='/work/venv-bergson/bin/python', help='a python with bergson installed')
    ap.add_argument('--skip-bergson', action='store_true', help="interpkit alone (no agreement check)")
    ap.add_argument('--reuse-bergson', default='', help="a work folder of an earlier run: take its bergson index and numbers instead of running bergson again")
    ap.add_argument('--work', type=Path, default=None, help=argparse.SUPPRESS); ap.add_argument('--worker', default='', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker: return {'data': worker_data, 'prep': worker_prep, 'interpkit': worker_interpkit}[a.worker](a)
    work = Path(tempfile.mkdtemp(prefix='bench_ts_bergson_'))
    args = ['--work', str(work), '--n', str(a.n), '--tokens', str(a.tokens), '--batch-size', str(a.batch_size)]
    rows = {}
    try:
        timed([sys.executable, str(SCRIPT), '--worker', 'data', *args])
        d = json.load(open(work/'data.json'))
        have_bergson = not a.skip_bergson and Path(a.bergson).exists()
        print(f"workload: {len(d['ids'])} passages, {sum(map(len, d['ids']))} tokens (longest {max(map(len, d['ids']))}), SmolLM2-135M-Instruct float32, one thread; "
              f"projection {P}x{P} per linear module ({'bergson' if have_bergson or a.reuse_bergson else 'interpkit'}'s Rademacher matrices), summed loss", flush=True)
        if a.reuse_bergson:
            old = Path(a.reuse_bergson)
            shutil.copytree(old/'bg', work/'bg'); shutil.copy(old/'proj.pt', work/'proj.pt'); rows['bergson build'] = json.load(open(old/'bergson.json'))
        elif have_bergson:
            timed([a.bergson, str(SCRIPT), '--worker', 'prep', *args])
            cli = [a.bergson, '-m', 'bergson', 'build', str(work/'bg'), '--model', d['model'], '--dataset', str(work/'ds'), '--projection_dim', str(P),
                   '--token_batch_size', '2048', '--overwrite', 'true']
        else:
            import torch
            from interpkit.grads import grad_modules, make_projection
            from interpkit.models import load_lm
            m = load_lm()[0]
            torch.save(dict(prefix=m.base_model_prefix, mats={n.removeprefix(m.base_model_prefix + '.'): v for n, v in make_projection(grad_modules(m, kinds=('linear',)), k_out=P, k_in=P, dist='rademacher').mats.items()}), work/'proj.pt')
        runs = {'bergson build': [], 'interpkit': []}
        for _ in range(a.repeats):
            if have_bergson and not a.reuse_bergson:
                s, mb, _ = timed(cli); runs['bergson build'].append(dict(seconds=s, peak_mb=mb))
            s, mb, out = timed([sys.executable, str(SCRIPT), '--worker', 'interpkit', *args])
            r = json.loads(next(l for l in out.splitlines() if l.startswith('RESULT '))[7:])
            runs['interpkit'].append(dict(seconds=s, peak_mb=mb, build_s=r['build_s']))
        med = lambda k, f: statistics.median(x[f] for x in runs[k])
        if runs['bergson build']:
            rows['bergson build'] = dict(seconds=med('bergson build', 'seconds'), peak_mb=max(x['peak_mb'] for x in runs['bergson build']), all=runs['bergson build'])
            json.dump(rows['bergson build'], open(work/'bergson.json', 'w'))
        rows[f"interpkit GradIndex.build (batch_size={a.batch_size or 'default'}) + R_train"] = dict(seconds=med('interpkit', 'seconds'), peak_mb=max(x['peak_mb'] for x in runs['interpkit']),
                                                                                                   build_s=med('interpkit', 'build_s'), all=runs['interpkit'])
        print(f"\n| process | wall s | peak RSS MB |\n|---|---:|---:|")
        for k, v in rows.items(): print(f"| {k} | {v['seconds']:.1f} | {v['peak_mb']:.0f} |")
        if a.repeats > 1: print('runs (wall s, peak MB): ' + '; '.join(f"{k}: " + ', '.join(f"{x['seconds']:.1f} s {x['peak_mb']:.0f} MB" for x in v.get('all', [])) for k, v in rows.items()))
        if 'bergson build' in rows:
            ik, bg = rows[next(k for k in rows if k.startswith('interpkit'))], rows['bergson build']
            print(f"\ninterpkit / bergson: time {ik['seconds'] / bg['seconds']:.2f}x, peak memory {ik['peak_mb'] / bg['peak_mb']:.2f}x (interpkit's build alone {ik['build_s']:.1f} s)")
            print('agreement: ' + json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in compare(work).items()}))
        print(f"work folder: {work}")
    except BaseException:
        print(f"work folder kept: {work}"); raise

if __name__ == '__main__': main()
