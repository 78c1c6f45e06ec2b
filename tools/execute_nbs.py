"""Re-execute notebooks in place so the site shows fresh outputs: `python tools/execute_nbs.py [NB ...]`.

Outputs and widget state are saved; the claims the notebooks record (`interpkit.report.record_claim`) are written to
nbs/_records/, the records the Reproduction report is built from; cells that nbdev_test skips (`#| eval: false`, `nbdev_export()`) are skipped;
each notebook runs in its own folder; the notebook is cleaned with nbdev_clean afterwards.
"""
import os, re, subprocess, sys, time
from pathlib import Path
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
_no_eval = re.compile(r'^\s*#\s*\|\s*eval\s*:\s*false\s*$', re.MULTILINE | re.IGNORECASE)

def skipped(cell):
    "Whether nbdev_test would skip this cell: not code, `#| eval: false`, or the `nbdev_export()` cell."
    return cell.cell_type != 'code' or bool(_no_eval.search(cell.source)) or 'nbdev_export(' in cell.source

def execute(path, timeout=600):
    "Execute the notebook at `path` in place; return the seconds it took."
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name='python3', resources={'metadata': {'path': str(path.parent)}})
    t0 = time.time()
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if skipped(cell): continue
            client.execute_cell(cell, i)
        client.set_widgets_metadata()
    nbformat.write(nb, path)
    subprocess.run([str(Path(sys.executable).parent/'nbdev_clean'), '--fname', str(path)], check=True, cwd=ROOT)
    return time.time() - t0

if __name__ == '__main__':
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    os.environ['INTERPKIT_RECORDS'] = str(ROOT/'nbs'/'_records')   # the kernels inherit it
    paths = sys.argv[1:] or sorted(str(p) for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
    for p in paths:
        print(f'{execute(p):7.1f} s  {p}', flush=True)
