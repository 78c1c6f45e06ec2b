"""Build the documentation site and the README from the notebooks, without Quarto.

    python tools/build_docs.py site            # nbs/ -> _proc/ (nbdev's processing) -> _site_src/ -> _docs/ (smalldocs)
    python tools/build_docs.py readme [--check] # nbs/index.ipynb -> README.md
    python tools/build_docs.py vendor          # fetch KaTeX from the npm registry into .venv/ (run by `make setup`)

nbdev names pages by each notebook's `output-file` (`core/00_errors.ipynb` -> `core/errors.html`) and links
API names to those pages; smalldocs names pages after their files. The staging step renames every processed
notebook to its `output-file` name and records its number as `order`, so both agree.
"""
import json, os, re, shutil, subprocess, sys, tarfile, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS, PROC, STAGE, DOCS = ROOT/'nbs', ROOT/'_proc', ROOT/'_site_src', ROOT/'_docs'
_num_prefix = re.compile(r'^(\d+)[a-zA-Z0-9]*_')

def page_name(nb_path):
    "The page nbdev gives a notebook: its name without the number prefix, as .html."
    return _num_prefix.sub('', Path(nb_path).stem) + '.html'

def notebooks():
    "Every notebook of the site, relative to nbs/, skipping hidden and `_` files and checkpoints."
    return sorted(p.relative_to(NBS) for p in NBS.rglob('*.ipynb')
                  if not any(part.startswith(('.', '_')) for part in p.relative_to(NBS).parts))

def set_front_matter(nb, drop=(), **extra):
    "Set `extra` keys in (and `drop` keys from) the raw YAML front-matter cell that nbdev's processing put first."
    cell = next((c for c in nb['cells'] if c['cell_type'] == 'raw' and ''.join(c['source']).lstrip().startswith('---')), None)
    if cell is None:
        cell = {'cell_type': 'raw', 'metadata': {}, 'source': '---\n---'}
        nb['cells'].insert(0, cell)
    lines = ''.join(cell['source']).strip().splitlines()
    body = [l for l in lines[1:-1] if l.split(':', 1)[0].strip() not in {*extra, *drop}]
    cell['source'] = '\n'.join(['---', *body, *[f'{k}: {json.dumps(v)}' for k, v in extra.items()], '---'])

def stage():
    "Copy nbdev's processed notebooks into _site_src/ under their output-file names, with their numbers as `order`."
    if STAGE.exists(): shutil.rmtree(STAGE)
    for src in PROC.rglob('*'):
        rel = src.relative_to(PROC)
        if src.is_dir() or any(p.startswith('.') for p in rel.parts): continue
        dest = STAGE/rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix != '.ipynb': shutil.copy2(src, dest); continue
        nb = json.loads(src.read_text(encoding='utf-8'))
        m = _num_prefix.match(src.stem)
        set_front_matter(nb, drop=('output-file',), **({'order': int(m.group(1))} if m else {}))
        dest = dest.with_name(page_name(src)).with_suffix('.ipynb')
        dest.write_text(json.dumps(nb, indent=1), encoding='utf-8')

KATEX_DIR = ROOT/'.venv'/'katex'

def katex_url():
    "The KaTeX address that smalldocs writes into pages with maths."
    from smalldocs.layout import KATEX
    return KATEX

def vendor_katex():
    "Unpack the KaTeX version smalldocs uses from the npm registry into .venv/katex, so maths renders offline."
    version = re.search(r'katex@([\w.]+)', katex_url()).group(1)
    if (KATEX_DIR/'VERSION').exists() and (KATEX_DIR/'VERSION').read_text() == version: return
    if not shutil.which('npm'): print('npm not found: pages with maths will load KaTeX from its CDN', file=sys.stderr); return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(['npm', 'pack', f'katex@{version}', '--silent', '--pack-destination', tmp], check=True, stdout=subprocess.DEVNULL)
        with tarfile.open(next(Path(tmp).glob('katex-*.tgz'))) as t: t.extractall(tmp, filter='data')
        if KATEX_DIR.exists(): shutil.rmtree(KATEX_DIR)
        shutil.copytree(Path(tmp)/'package'/'dist', KATEX_DIR)
    (KATEX_DIR/'VERSION').write_text(version)
    print(f'KaTeX {version} in {KATEX_DIR.relative_to(ROOT)}/')

def localise_katex():
    "Point pages at a copy of KaTeX inside the site instead of its CDN (the site works with no network)."
    cdn = katex_url()
    pages = [p for p in DOCS.rglob('*.html') if cdn in p.read_text(encoding='utf-8')]
    if not pages or not KATEX_DIR.exists(): return
    shutil.copytree(KATEX_DIR, DOCS/'site_libs'/'katex')
    for p in pages:
        rel = os.path.relpath(DOCS/'site_libs'/'katex', p.parent)
        p.write_text(p.read_text(encoding='utf-8').replace(cdn, rel), encoding='utf-8')

def build_site():
    "Process the notebooks with nbdev (serially), stage them, render with smalldocs into _docs/."
    from nbdev.serve import proc_nbs
    from smalldocs.site import build
    proc_nbs(path=str(NBS), n_workers=0)
    stage()
    site = build(STAGE, quiet=True)
    for w in site.warnings: print('smalldocs warning:', w, file=sys.stderr)
    out = STAGE/'_docs'
    if DOCS.exists(): shutil.rmtree(DOCS)
    shutil.move(str(out), str(DOCS))
    localise_katex()
    pages = sorted(DOCS.rglob('*.html'))
    print(f'Built {len(pages)} pages into {DOCS.relative_to(ROOT)}/')

_directive = re.compile(r'^\s*#\s*\|')

def readme_text():
    "README.md made from nbs/index.ipynb: markdown as is, code with its text output; links to pages become links to notebooks."
    nb = json.loads((NBS/'index.ipynb').read_text(encoding='utf-8'))
    pages = {str(p.parent/page_name(p)).lstrip('./'): 'nbs/' + str(p) for p in notebooks()}
    out = []
    for c in nb['cells']:
        src = ''.join(c['source'])
        if c['cell_type'] == 'markdown': out.append(src.strip()); continue
        if c['cell_type'] != 'code': continue
        lines = src.splitlines()
        if any(re.match(r'^\s*#\s*\|\s*(hide|include:\s*false)\s*$', l) for l in lines): continue
        code = '\n'.join(l for l in lines if not _directive.match(l)).strip()
        if code: out.append(f'```python\n{code}\n```')
        for o in c.get('outputs', []):
            txt = ''.join(o.get('text', '')) if o.get('output_type') == 'stream' else ''.join(o.get('data', {}).get('text/plain', ''))
            if txt.strip() and 'text/html' not in o.get('data', {}) and 'image/png' not in o.get('data', {}): out.append(f'```\n{txt.rstrip()}\n```')
    text = '\n\n'.join(out) + '\n'
    def relink(m):
        target, anchor = m.group(2), m.group(3) or ''
        return f'{m.group(1)}({pages[target]}{anchor})' if target in pages else m.group(0)
    return re.sub(r'(\[[^\]]*\])\(([\w/.-]+\.html)(#[\w-]+)?\)', relink, text)

def readme(check=False):
    "Write README.md, or with `check` fail if it differs from what the notebook gives."
    text, path = readme_text(), ROOT/'README.md'
    if check:
        if not path.exists() or path.read_text(encoding='utf-8') != text:
            sys.exit('FAIL: README.md does not match nbs/index.ipynb: run `make readme` (or `make export`) and commit README.md.')
        print('ok: README.md matches nbs/index.ipynb')
    else:
        path.write_text(text, encoding='utf-8'); print('wrote README.md')

if __name__ == '__main__':
    what = sys.argv[1:] or ['site']
    if what[0] == 'site': build_site()
    elif what[0] == 'readme': readme(check='--check' in what)
    elif what[0] == 'vendor': vendor_katex()
    else: sys.exit(__doc__)
