"""Build a TrackStar gradient index of a text corpus, and optionally search it: `python tools/trackstar_index.py --out index/ ...`.

A thin command line over `interpkit.papers.trackstar.GradIndex.build` and `GradIndex.search`. Under torchrun every process
builds its shard of the same index (nccl on GPUs, gloo on CPUs); the folder must be on a file system every process sees:

    torchrun --nproc_per_node 8 tools/trackstar_index.py --model HuggingFaceTB/SmolLM2-135M-Instruct --texts corpus.txt \\
        --out index/ --batch-size 16 --max-len 512 --dtype bfloat16 --store-dtype float16 --queries queries.tsv --results hits.json

`--model fact-lm` and `--texts fact-corpus` / `--queries fact-corpus` are the tutorial's shipped model and corpus
(`interpkit.demos.trackstar`). The old `interpkit-trackstar` command (`interpkit.papers.trackstar.trackstar_cli`) runs this
file, with a deprecation warning.
"""
import argparse, datetime, json, os
from pathlib import Path
import torch
import torch.distributed as dist
from interpkit.papers.trackstar import LOSSES, STORE_DTYPES, GradIndex   # first: it imports torch.distributed.fsdp before any process group exists
from interpkit.demos.trackstar import fact_corpus, load_fact_lm, load_fact_lm_moments
from interpkit.grads import DISTRIBUTIONS
from interpkit.models import encode_queries, encode_texts, load_lm

def read_lines(path:str) -> list[str]:
    "The non-empty lines of a text file."
    lines = [l.rstrip('\n') for l in Path(path).read_text().splitlines()]
    return [l for l in lines if l.strip()]

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog='python tools/trackstar_index.py', description="Build a TrackStar gradient index of a text corpus; under torchrun every process builds its shard.")
    ap.add_argument('--model', default='fact-lm', help="'fact-lm' (the shipped tiny model), 'smollm2-135m-instruct', a hub id or a local path")
    ap.add_argument('--texts', default='fact-corpus', help="a text file, one training example per line, or 'fact-corpus'")
    ap.add_argument('--limit', type=int, default=None, help='index the first LIMIT texts only')
    ap.add_argument('--out', required=True, help='index folder (on a file system every process sees)')
    ap.add_argument('--queries', default=None, help="a file of 'prompt<TAB>target' lines, or 'fact-corpus': searched after the build")
    ap.add_argument('--results', default=None, help='JSON file for the top-k of each query (written by rank 0)')
    ap.add_argument('--top-k', type=int, default=10)
    ap.add_argument('--batch-size', type=int, default=8)
    ap.add_argument('--max-len', type=int, default=128)
    ap.add_argument('--k-out', type=int, default=16); ap.add_argument('--k-in', type=int, default=16)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--dist', default='gaussian', choices=DISTRIBUTIONS); ap.add_argument('--loss', default='mean', choices=LOSSES)
    ap.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16', 'float16'], help="the model's dtype")
    ap.add_argument('--store-dtype', default='float32', choices=list(STORE_DTYPES))
    ap.add_argument('--moments', default=None, help="'fact-lm', or a .safetensors file of exp_avg_sq by parameter name; default: no correction")
    ap.add_argument('--overwrite', action='store_true')
    return ap

def main(argv:list[str]|None=None) -> None:
    "Build the index (and search it with --queries); under torchrun, join the process group first and leave it at the end."
    a = parser().parse_args(argv)
    launched = 'RANK' in os.environ and 'WORLD_SIZE' in os.environ
    cuda = torch.cuda.is_available()
    if launched and not dist.is_initialized():
        if cuda: torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)))
        dist.init_process_group('nccl' if cuda else 'gloo', timeout=datetime.timedelta(minutes=30))
    try:
        device = torch.device('cuda', torch.cuda.current_device()) if cuda else torch.device('cpu')
        dtype = getattr(torch, a.dtype)
        fc = fact_corpus(seed=0) if 'fact-corpus' in (a.texts, a.queries) else None
        if a.model == 'fact-lm': model, tokenizer, _ = load_fact_lm(); model = model.to(device, dtype)
        else: model, tokenizer = load_lm(a.model, dtype=dtype, device=device)
        texts = fc.passages if a.texts == 'fact-corpus' else read_lines(a.texts)
        texts = texts[:a.limit] if a.limit else texts
        moments = None
        if a.moments == 'fact-lm': moments = load_fact_lm_moments()
        elif a.moments:
            from safetensors.torch import load_file
            moments = load_file(a.moments)
        idx = GradIndex.build(model, encode_texts(tokenizer, texts, max_len=a.max_len), a.out, moments=moments, k_out=a.k_out, k_in=a.k_in, seed=a.seed, overwrite=a.overwrite,
                              batch_size=a.batch_size, loss=a.loss, dist=a.dist, store_dtype=a.store_dtype)
        if a.queries:
            pairs = fc.queries if a.queries == 'fact-corpus' else [tuple(l.split('\t', 1)) for l in read_lines(a.queries)]
            hits = idx.search(model, encode_queries(tokenizer, [p for p, _ in pairs], [t for _, t in pairs]), top_k=a.top_k, moments=moments, batch_size=a.batch_size)
            rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
            if a.results and rank == 0:
                Path(a.results).write_text(json.dumps(dict(indices=hits.indices.tolist(), scores=hits.scores.tolist(), world_size=world)))
    finally:
        if launched and dist.is_initialized(): dist.destroy_process_group()

if __name__ == '__main__':
    main()
