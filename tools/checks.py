"""Checks that `make test` runs first: the library matches the notebooks, the notebooks are clean, and no
notebook cell mixes imports with other code (nbdev's docs build executes such cells out of context).

Each check snapshots the files, runs the nbdev command, compares, then puts every file back as it was,
so a failure stays visible until the notebooks (the source) are fixed and `make export` is run.
"""
import hashlib, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

def snapshot(folder, pattern):
    "Map every file matching `pattern` under `folder` to its bytes."
    return {p: p.read_bytes() for p in sorted(folder.rglob(pattern)) if p.is_file() and '__pycache__' not in p.parts}

def restore(before, after):
    "Put the files back as they were in `before`; remove the ones that only exist in `after`."
    for p, data in before.items():
        if after.get(p) != data: p.write_bytes(data)
    for p in after.keys() - before.keys(): p.unlink()

def run_check(cmd, folder, pattern, fix):
    "Run `cmd`; fail naming each file it would change under `folder`."
    before = snapshot(folder, pattern)
    res = subprocess.run([str(BIN/cmd)], cwd=ROOT, capture_output=True, text=True)
    after = snapshot(folder, pattern)
    restore(before, after)
    if res.returncode: sys.exit(f"{cmd} failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}")
    changed = sorted(str(p.relative_to(ROOT)) for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    if changed:
        print(f"FAIL: {cmd} would change {len(changed)} file(s):", *changed, sep='\n  ', file=sys.stderr)
        sys.exit(f"{fix}")
    print(f"ok: {cmd} changes nothing under {folder.relative_to(ROOT)}/")

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

if __name__ == '__main__':
    what = sys.argv[1] if len(sys.argv) > 1 else ''
    if what == 'export':
        run_check('nbdev_export', ROOT/'interpkit', '*.py',
                  'The library does not match the notebooks: edit the notebook, then run `make export` and commit both.')
    elif what == 'clean':
        run_check('nbdev_clean', ROOT/'nbs', '*.ipynb',
                  'Notebooks are not clean: run `make export` (it runs nbdev_clean) and commit the notebooks.')
    elif what == 'imports': check_imports()
    else: sys.exit('usage: checks.py export|clean|imports')
