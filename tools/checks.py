"""Checks that `make test` runs first: the library matches the notebooks, the notebooks are clean, no
notebook cell mixes imports with other code (nbdev's docs build executes such cells out of context), and the
library keeps its own rules (`library`): paper modules import only the core and no private names, no unused
imports (ruff F401), no notebook-only imports in export cells, no public name exported by two paper modules; and the
Reproduction report page (`report`) shows the committed records of nbs/_records.

Each check runs the nbdev command on a scratch copy of the project and compares its result with the checkout, which
is never written: a failure stays visible until the notebooks (the source) are fixed and `make export` is run, and
a check never undoes what another process writes meanwhile.
"""
import ast, hashlib, shutil, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

def snapshot(folder, pattern):
    "Map every file matching `pattern` under `folder` to its bytes."
    return {p: p.read_bytes() for p in sorted(folder.rglob(pattern)) if p.is_file() and '__pycache__' not in p.parts}

def scratch_copy(dest):
    "Copy what nbdev's commands read and write (settings, notebooks, the library without its assets) into `dest`."
    for name in ('settings.ini', 'setup.py', 'pyproject.toml', '_quarto.yml'):
        if (ROOT/name).exists(): shutil.copy2(ROOT/name, dest/name)
    shutil.copytree(ROOT/'nbs', dest/'nbs', symlinks=True, ignore=shutil.ignore_patterns('.ipynb_checkpoints', '_records'))
    shutil.copytree(ROOT/'interpkit', dest/'interpkit', ignore=shutil.ignore_patterns('assets', '__pycache__'))

def run_check(cmd, folder, pattern, fix):
    "Run `cmd` on a scratch copy of the project; fail naming each file it would change under `folder` (the checkout is never written)."
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scratch_copy(tmp)
        res = subprocess.run([str(BIN/cmd)], cwd=tmp, capture_output=True, text=True)
        if res.returncode: sys.exit(f"{cmd} failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}")
        rel = folder.relative_to(ROOT)
        before = {p.relative_to(folder): d for p, d in snapshot(folder, pattern).items() if 'assets' not in p.relative_to(folder).parts}
        after = {p.relative_to(tmp/rel): d for p, d in snapshot(tmp/rel, pattern).items()}
    changed = sorted(str(rel/p) for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    if changed:
        print(f"FAIL: {cmd} would change {len(changed)} file(s):", *changed, sep='\n  ', file=sys.stderr)
        sys.exit(f"{fix}")
    print(f"ok: {cmd} changes nothing under {rel}/")

def mixed_import_cells(nb_path):
    "Indices of code cells that nbdev's docs build would execute because they mix imports with other code."
    import ast
    from nbdev.processors import _do_eval, _ast_contains
    from nbdev.process import NBProcessor
    nb, bad = NBProcessor(nb_path, rm_directives=False).nb, []
    for cell in nb.cells:
        if cell.cell_type != 'code' or cell.directives_.keys() & {'export', 'exports', 'exporti', 'exec_doc'}: continue
        trees = cell.parsed_()
        if not trees or not _do_eval(cell): continue
        if _ast_contains(trees, (ast.Import, ast.ImportFrom)) and _ast_contains(trees, (ast.Expr, ast.Assign)): bad.append(cell.idx_)
    return bad

def check_imports():
    "Fail naming each notebook cell that mixes imports with other code."
    import warnings
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for p in sorted((ROOT/'nbs').rglob('*.ipynb')):
            if '.ipynb_checkpoints' in p.parts: continue
            found += [f"{p.relative_to(ROOT)}: cell {i}" for i in mixed_import_cells(p)]
    if found:
        print("FAIL: cells that mix imports with other code (the docs build runs them without the cells before them):", *found, sep='\n  ', file=sys.stderr)
        sys.exit('Move the imports into a cell of their own.')
    print('ok: no notebook cell mixes imports with other code')

NOTEBOOK_ONLY = ('nbdev', 'fastcore.test', 'pytest')  # modules an exported cell has no business importing

def library_problems():
    "Break-downs of the library's own rules, one line each."
    import ast
    out = []
    papers = sorted((ROOT/'interpkit'/'papers').glob('*.py')) + sorted((ROOT/'interpkit'/'demos').glob('*.py'))
    owners = {}
    for p in papers:
        if p.stem.startswith('_'): continue
        demo = p.parent.name == 'demos'   # a demo module may import its own paper module (and the core); a paper module never a demo
        own = {f'interpkit.papers.{p.stem}', f'..papers.{p.stem}'} if demo else set()
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = ('.' * node.level) + (node.module or '')
                if mod in own: pass
                elif node.level == 1 or mod.startswith(('interpkit.papers', '..papers', 'interpkit.demos', '..demos')):
                    out.append(f"{p.relative_to(ROOT)}:{node.lineno}: imports another paper or demo module ({mod}); move what two papers share into the core")
                if node.level >= 2 or mod.startswith('interpkit'):
                    out += [f"{p.relative_to(ROOT)}:{node.lineno}: imports the private name {a.name} from {mod}; make it public in the core"
                            for a in node.names if a.name.startswith('_')]
            elif isinstance(node, ast.Import):
                out += [f"{p.relative_to(ROOT)}:{node.lineno}: imports {a.name}; import the core, not other paper or demo modules"
                        for a in node.names if a.name.startswith(('interpkit.papers', 'interpkit.demos')) and a.name not in own]
        for name in _all_of(tree): owners.setdefault(name, []).append(f"{p.parent.name}.{p.stem}")
    out += [f"the public name {n!r} is exported by {len(ms)} paper or demo modules ({', '.join(ms)}); give each a name that says what it is"
            for n, ms in sorted(owners.items()) if len(ms) > 1]
    for p in sorted((ROOT/'interpkit').rglob('*.py')):
        if p.name == '_modidx.py': continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ''] if isinstance(node, ast.ImportFrom) else []
            out += [f"{p.relative_to(ROOT)}:{node.lineno}: imports {n}, which only notebooks need: import it in a cell that is not exported"
                    for n in names if n.split('.')[0] in {m.split('.')[0] for m in NOTEBOOK_ONLY} and any(n == m or n.startswith(m + '.') for m in NOTEBOOK_ONLY)]
    res = subprocess.run([str(BIN/'ruff'), 'check', '--select', 'F401', '--no-cache', '--output-format', 'concise', '--exclude', '_modidx.py', 'interpkit'],
                         cwd=ROOT, capture_output=True, text=True)
    out += [f"{line} (remove it from the export cell; a notebook-only import goes in a cell that is not exported)" for line in res.stdout.splitlines() if ': F401' in line]
    return out

def _all_of(tree):
    "The names in a module's `__all__`."
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '__all__' for t in node.targets):
            return [e.value for e in node.value.elts]
    return []

def check_library():
    "Fail listing every break of the library's own rules."
    found = library_problems()
    if found:
        print(f"FAIL: {len(found)} problem(s) with the library's rules:", *found, sep='\n  ', file=sys.stderr)
        sys.exit('Fix them in the notebooks, then run `make export`.')
    print('ok: paper modules import only the core and no private names; no unused or notebook-only imports; no public name in two paper modules')

REPORT = ROOT/'nbs'/'reproduction.ipynb'

def report_problems():
    "Whether the Reproduction report page shows the committed records: its table output against one built from nbs/_records."
    import json
    from interpkit.report import report_markdown, report_table
    nb = json.loads(REPORT.read_text())
    shown = [''.join(o.get('data', {}).get('text/markdown', '')) for c in nb['cells'] if c['cell_type'] == 'code' for o in c.get('outputs', [])]
    papers = [p.stem.split('_', 1)[1] for p in sorted((ROOT/'nbs'/'papers').glob('[0-9]*.ipynb'))]
    want = report_markdown(report_table(ROOT/'nbs'/'_records', pages={p: f'papers/{p}.html' for p in papers}))
    return [] if want in shown else [f"{REPORT.relative_to(ROOT)} does not show the records in nbs/_records: run `make execute NB={REPORT.relative_to(ROOT)}` and commit it"]

def check_report():
    "Fail when the Reproduction report page is older than the records it is built from."
    found = report_problems()
    if found: sys.exit('FAIL: ' + found[0])
    print('ok: the Reproduction report shows the committed records')

# ---- the vocabulary (Contributing page, "One vocabulary"): what can be checked on public signatures ----
FORBIDDEN = {  # parameter name -> what to call it (see the Contributing page)
    'net': 'model', 'reward_model': 'model', 'denoiser': 'model', 'tok': 'tokenizer', 'rng': 'seed',
    'k': 'top_k (how many of the highest), rank (how many directions), n_draws (random draws) or n (how many items)',
    'samples': 'n_draws', 'normalise': 'normalize', 'centre': 'center', 'epsilon': 'eps', 'pool': 'pooling',
    'heldout_frac': 'test_frac', 'train_frac': 'test_frac (the held-out share)', 'max_elems': 'max_bytes',
    'chunk': 'batch_size or max_bytes', 'chunk_size': 'batch_size or max_bytes'}
MODEL_SYNONYMS = ('encoder',)   # names a function's model argument must not have (a class may take an `encoder` part)
COUNTS = {'layers': 'n_layers', 'heads': 'n_heads'}   # as ints these are counts: `layers`/`heads` are indices
VALUE_TYPES = ('Heads', 'StateDict')   # interpkit.results: vocabulary values that are dicts ({layer: [head, ...]}, {name: tensor}), not results
VOCAB_TODO = ROOT/'tools'/'vocabulary_todo.txt'

def vocabulary_modules():
    "Every module whose public names the vocabulary covers: the core, the paper modules and their demo modules."
    lib = ROOT/'interpkit'
    return sorted('interpkit.' + '.'.join(p.relative_to(lib).with_suffix('').parts) for p in lib.rglob('*.py')
                  if not any(s.startswith('_') for s in p.relative_to(lib).parts) and 'assets' not in p.parts)

def _signature(obj):
    "(parameters without self, return annotation as text) of a function or class, or None."
    import dataclasses, inspect
    target = obj.__init__ if inspect.isclass(obj) and not dataclasses.is_dataclass(obj) else obj
    try: sig = inspect.signature(target)
    except (TypeError, ValueError): return None
    ps = [p for p in sig.parameters.values() if p.name not in ('self', 'cls') and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    ret = sig.return_annotation
    return ps, '' if ret is inspect.Signature.empty else (ret if isinstance(ret, str) else getattr(ret, '__name__', str(ret)))

def _is_result(mod, annotation:str) -> bool:
    "Whether `annotation` names a dataclass (a `@result`), a NamedTuple or a DataFrame."
    import dataclasses
    if annotation in ('Shipped', 'Trained', 'pd.DataFrame', 'DataFrame') + VALUE_TYPES: return True
    obj = getattr(mod, annotation.split('.')[-1], None)
    return dataclasses.is_dataclass(obj) or (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, '_fields'))

def vocabulary_problems(modules=None # Module names; None: `vocabulary_modules()`
                       ):
    "Every place a public signature breaks the vocabulary, one line each; result shapes (no bare dicts, `load_*` and `train_*`) are checked in paper and demo modules."
    import importlib, inspect, warnings
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for m in modules or vocabulary_modules():
            mod = importlib.import_module(m)
            for name in getattr(mod, '__all__', []):
                obj = getattr(mod, name, None)
                if not callable(obj) or (name.isupper() and not inspect.isclass(obj)): continue   # constants, but not classes named in capitals (SAE, APG)
                sig = _signature(obj)
                if sig is None: continue
                ps, ret = sig
                where, names = f"{m}.{name}", [p.name for p in ps]
                out += [f"{where}: argument {n}= should be {FORBIDDEN[n]}" for n in names if n in FORBIDDEN]
                if not inspect.isclass(obj):
                    out += [f"{where}: argument {n}= should be model (the first argument)" for n in names if n in MODEL_SYNONYMS]
                    if 'model' in names and names[0] != 'model': out.append(f"{where}: model should be the first argument")
                out += [f"{where}: {p.name}: int is a count: call it {COUNTS[p.name]} ({p.name} are indices)"
                        for p in ps if p.name in COUNTS and str(p.annotation).split('|')[0].strip() == 'int']
                if not inspect.isclass(obj) and m.startswith(('interpkit.papers.', 'interpkit.demos.')):   # the core's own loaders (load_lm -> (model, tokenizer)) keep their shapes
                    bare = ret.split('[')[0].strip() in ('dict', 'Dict')
                    if bare and not (name.startswith('encode_') or name.endswith('_batch')):
                        out.append(f"{where}: returns a bare dict: return a @result dataclass or a DataFrame")
                    if name.startswith('shipped_'): out.append(f"{where}: a loader is called load_<name>")
                    if name.startswith('load_') and not _is_result(mod, ret):
                        out.append(f"{where}: a loader returns Shipped (model, tokenizer, meta) or a @result, not {ret or 'an unannotated value'}")
                    if name.startswith('train_') and ret != 'Trained':
                        out.append(f"{where}: a trainer returns Trained (model, tokenizer, fit), not {ret or 'an unannotated value'}")
    return out

MAX_EXPORT_LINES = 60

def long_export_cells():
    "Export cells over `MAX_EXPORT_LINES` lines, one line each (fastcore's notebooks: one definition or a small family per export cell)."
    import json, re
    out = []
    for nb in sorted((ROOT/'nbs').rglob('*.ipynb')):
        if any(part.startswith(('.', '_')) for part in nb.relative_to(ROOT/'nbs').parts): continue
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source']) if c['cell_type'] == 'code' else ''
            n = len(src.rstrip('\n').splitlines())
            if re.match(r'\s*#\|\s*export', src) and n > MAX_EXPORT_LINES:
                out.append(f"{nb.relative_to(ROOT)} cell {c.get('id', '?')}: an export cell of {n} lines (at most {MAX_EXPORT_LINES}): split it")
    return out

def check_vocabulary(update=False):
    "Fail on a public signature that breaks the vocabulary, or an export cell over 60 lines, that is not listed in tools/vocabulary_todo.txt (the known cases left), or on a listed case that is fixed."
    found = set(vocabulary_problems()) | set(long_export_cells())
    todo = {l for l in VOCAB_TODO.read_text().splitlines() if l and not l.startswith('#')} if VOCAB_TODO.exists() else set()
    if update:   # drops the fixed cases only: a new case is never written in, it fails below until it is fixed
        found &= todo
        VOCAB_TODO.write_text("# Public signatures that break the vocabulary, and export cells over 60 lines, still to fix (issue 50). `tools/checks.py vocabulary` fails on a new one\n"
                              "# and on a listed one that is fixed: then run `python tools/checks.py vocabulary --update` to drop it from this list.\n"
                              + ''.join(f"{l}\n" for l in sorted(found)))
        print(f"wrote {VOCAB_TODO.relative_to(ROOT)}: {len(found)} case(s) left"); found, todo = set(vocabulary_problems()) | set(long_export_cells()), found
    new, fixed = sorted(found - todo), sorted(todo - found)
    if new: print(f"FAIL: {len(new)} public signature(s) break the vocabulary (see the Contributing page):", *new, sep='\n  ', file=sys.stderr)
    if fixed: print(f"FAIL: {len(fixed)} case(s) in {VOCAB_TODO.relative_to(ROOT)} are fixed: run `python tools/checks.py vocabulary --update`", *fixed, sep='\n  ', file=sys.stderr)
    if new or fixed: sys.exit('Fix the signatures in the notebooks (old names keep working through interpkit.errors.renamed/moved).')
    print(f"ok: public signatures keep the vocabulary ({len(todo)} known case(s) left in {VOCAB_TODO.relative_to(ROOT)})")

if __name__ == '__main__':
    what = sys.argv[1] if len(sys.argv) > 1 else ''
    if what == 'export':
        run_check('nbdev_export', ROOT/'interpkit', '*.py',
                  'The library does not match the notebooks: edit the notebook, then run `make export` and commit both.')
    elif what == 'clean':
        run_check('nbdev_clean', ROOT/'nbs', '*.ipynb',
                  'Notebooks are not clean: run `make export` (it runs nbdev_clean) and commit the notebooks.')
    elif what == 'imports': check_imports()
    elif what == 'library': check_library()
    elif what == 'report': check_report()
    elif what == 'vocabulary': check_vocabulary(update='--update' in sys.argv)
    else: sys.exit('usage: checks.py export|clean|imports|library|report|vocabulary [--update]')
