"""How the library reads, in counts (issue 50's before/after): `python tools/library_metrics.py [-v]`.

Prints lines and public names per module (a paper's method module beside its demo module), export cells (median
length, how many over 40 and over 60 lines; `-v` lists those over 60) and the first line of `duplicates` over
`interpkit/`."""
import ast, json, re, subprocess, sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT/'interpkit'

def public_names(p:Path) -> list:
    "The names in a module file's `__all__`."
    for node in ast.parse(p.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '__all__' for t in node.targets):
            return [e.value for e in node.value.elts]
    return []

def export_cells(nb:Path):
    "(cell index, lines) of each export cell of a notebook."
    for i, c in enumerate(json.loads(nb.read_text())['cells']):
        src = ''.join(c['source']) if c['cell_type'] == 'code' else ''
        if re.match(r'\s*#\|\s*export', src): yield i, len(src.rstrip('\n').splitlines())

def lines(p:Path) -> int: return len(p.read_text().splitlines()) if p.exists() else 0

def main(verbose=False):
    core = sorted(p for p in LIB.glob('*.py') if not p.name.startswith('_'))
    print(f"{'core module':24} {'lines':>6} {'public':>6}")
    for p in core: print(f"{p.stem:24} {lines(p):6} {len(public_names(p)):6}")
    print(f"\n{'paper':22} {'method lines':>12} {'names':>6} {'demo lines':>11} {'names':>6}")
    tot = [0, 0, 0, 0]
    for p in sorted((LIB/'papers').glob('*.py')):
        if p.stem.startswith('_'): continue
        d = LIB/'demos'/p.name
        row = [lines(p), len(public_names(p)), lines(d), len(public_names(d)) if d.exists() else 0]
        tot = [a + b for a, b in zip(tot, row)]
        print(f"{p.stem:22} {row[0]:12} {row[1]:6} {row[2]:11} {row[3]:6}")
    print(f"{'all papers':22} {tot[0]:12} {tot[1]:6} {tot[2]:11} {tot[3]:6}")
    cells = [(nb, i, n) for nb in sorted((ROOT/'nbs').rglob('*.ipynb')) if '.ipynb_checkpoints' not in nb.parts for i, n in export_cells(nb)]
    sizes = sorted(n for *_, n in cells)
    print(f"\nexport cells: {len(cells)}; median {sizes[len(sizes) // 2]} lines; over 40: {sum(n > 40 for n in sizes)}; over 60: {sum(n > 60 for n in sizes)}")
    if verbose:
        for nb, i, n in cells:
            if n > 60: print(f"  {nb.relative_to(ROOT)} cell {i}: {n} lines")
    out = subprocess.run(['duplicates', '--most', '200'], cwd=LIB, capture_output=True, text=True).stdout if subprocess.run(['which', 'duplicates'], capture_output=True).returncode == 0 else ''
    print('duplicates over interpkit/:', out.splitlines()[0] if out else '(the duplicates tool is not installed here)')

if __name__ == '__main__': main('-v' in sys.argv)
