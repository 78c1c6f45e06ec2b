"""The GPU smoke script (tools/gpu_smoke.py) on the CPU: every check passes in float32 and bfloat16, and every public
entry point of the core and of each paper module is exercised by it or listed, with a reason, in its NOT_SMOKED."""
import importlib, re, sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT/'tools'))
import gpu_smoke

CORE = ['interpkit.models', 'interpkit.hooks', 'interpkit.sae', 'interpkit.train', 'interpkit.testing', 'interpkit.results', 'interpkit.diffusion',
        *[f'interpkit.{m}' for m in ('stats', 'grads', 'parallel') if (ROOT/'interpkit'/f'{m}.py').exists()]]
PAPERS = sorted(f'interpkit.{d}.{p.stem}' for d in ('papers', 'demos') for p in (ROOT/'interpkit'/d).glob('*.py') if not p.stem.startswith('_'))
SMOKED_PAPERS = [m for m in PAPERS if (ROOT/'tools'/'smoke'/f"{m.rsplit('.', 1)[1]}.py").exists()]   # a demo module is smoked by its paper's file

def smoke_file(module): return ROOT/'tools'/'smoke'/('core.py' if module in CORE else f"{module.rsplit('.', 1)[1]}.py")

@pytest.mark.parametrize('module', CORE + SMOKED_PAPERS)
def test_every_public_entry_point_is_smoked(module):
    path = smoke_file(module)
    text = path.read_text()
    sys.path.insert(0, str(path.parent))
    exempt = getattr(importlib.import_module(path.stem), 'NOT_SMOKED', {})
    names = [n for n in importlib.import_module(module).__all__ if callable(getattr(importlib.import_module(module), n)) and not n.isupper()]
    missing = [n for n in names if n not in exempt and not re.search(rf'\b{re.escape(n)}\b', text.replace(f"'{n}':", ''))]
    assert not missing, f"{module}: not in {path.name} and not in its NOT_SMOKED: {missing}"

@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_smoke_passes_on_cpu(dtype, capsys):
    only = ['core'] + sorted({m.rsplit('.', 1)[1] for m in SMOKED_PAPERS})
    rows = gpu_smoke.run('cpu', [dtype], only)
    bad = [r for r in rows if not r[3]]
    assert rows and not bad, '\n'.join(f"{r[0]}.{r[1]} {r[2]}: {r[5]}" for r in bad)
