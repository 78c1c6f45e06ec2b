"""The project's own tools: page naming, the checks `make test` runs first, the README builder, the executor's skip rule."""
import sys
from pathlib import Path
import nbformat
from nbformat.v4 import new_notebook, new_code_cell, new_markdown_cell

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT/'tools'))
import build_docs, checks, execute_nbs  # noqa: E402

def test_page_names_follow_nbdev_output_file():
    from nbdev.frontmatter import _nbpath2html
    for nb in ['nbs/papers/11_bilinear.ipynb', 'nbs/core/02_hooks.ipynb', 'nbs/index.ipynb', 'nbs/tutorials/contributing.ipynb', 'nbs/papers/02a_x.ipynb']:
        assert build_docs.page_name(nb) == _nbpath2html(Path(nb)).name, nb

def test_every_notebook_has_a_page_name_and_unique_pages():
    pages = [str(p.parent/build_docs.page_name(p)) for p in build_docs.notebooks()]
    assert len(pages) == len(set(pages)), 'two notebooks would share a page'
    assert 'index.html' in pages and 'core/hooks.html' in pages

def test_front_matter_edit():
    nb = {'cells': [{'cell_type': 'raw', 'metadata': {}, 'source': '---\ntitle: x\noutput-file: a.html\n---'}]}
    build_docs.set_front_matter(nb, drop=('output-file',), order=11)
    assert nb['cells'][0]['source'] == '---\ntitle: x\norder: 11\n---'

def test_scratch_copy_holds_what_nbdev_reads_and_not_the_assets(tmp_path):
    checks.scratch_copy(tmp_path)
    assert (tmp_path/'settings.ini').exists() and (tmp_path/'nbs'/'index.ipynb').exists() and (tmp_path/'interpkit'/'errors.py').exists()
    assert not (tmp_path/'interpkit'/'assets').exists()
    assert checks.snapshot(tmp_path/'interpkit', '*.py').keys() == {tmp_path/p.relative_to(ROOT) for p in checks.snapshot(ROOT/'interpkit', '*.py')}

def _nb(tmp_path, *sources):
    p = tmp_path/'t.ipynb'
    nb = new_notebook(cells=[new_markdown_cell('# t')] + [new_code_cell(s) for s in sources])
    nb.metadata = {'kernelspec': {'name': 'python3', 'display_name': 'python3', 'language': 'python'}}
    nbformat.write(nb, p)
    return p

def test_mixed_import_cells(tmp_path):
    assert checks.mixed_import_cells(_nb(tmp_path, 'import math', 'x = math.pi')) == []
    assert checks.mixed_import_cells(_nb(tmp_path, 'import math\nx = math.pi')) == [1]
    assert checks.mixed_import_cells(_nb(tmp_path, '#| export\nimport math\nx = 1')) == []
    assert checks.mixed_import_cells(_nb(tmp_path, '#| eval: false\nimport math\nx = 1')) == []

def test_readme_links_point_at_notebooks():
    text = build_docs.readme_text()
    assert '(nbs/papers/11_bilinear.ipynb)' in text and 'papers/bilinear.html' not in text
    assert text == (ROOT/'README.md').read_text(encoding='utf-8')

def test_executor_skips_what_nbdev_test_skips():
    cells = [new_code_cell('#| eval: false\n1/0'), new_code_cell('import nbdev; nbdev.nbdev_export()'), new_markdown_cell('x'), new_code_cell('1+1')]
    assert [execute_nbs.skipped(c) for c in cells] == [True, True, True, False]

def _notebook(tmp_path, *sources):
    "A notebook of code cells in a temporary folder; its path."
    path = tmp_path/'nb.ipynb'
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), path)
    return path

def test_nbtest_starts_each_notebook_from_its_own_random_state(tmp_path):
    "A check that passes only from some random states fails for some run seeds and passes for others; the verdict is replayable."
    import nbtest
    path = _notebook(tmp_path, 'import torch', 'assert torch.rand(1).item() < 0.5')
    verdicts = {s: nbtest.test_one(path, s, [], None)[0] for s in range(12)}
    assert set(verdicts.values()) == {True, False}, verdicts   # P(12 equal verdicts) = 2 * 0.5**12
    assert all(nbtest.test_one(path, s, [], None)[0] == v for s, v in list(verdicts.items())[:4])
    assert nbtest.notebook_seed(1, path) != nbtest.notebook_seed(2, path)

def test_rng_audit_flags_unseeded_draws_only(tmp_path):
    import rng_audit
    path = _notebook(tmp_path, 'import torch\nfrom interpkit.train import seeded', 'x = torch.randn(2)',
                     'with seeded(0): y = torch.randn(2)', 'torch.manual_seed(3); z = torch.randn(2)', 'print(round(float(z.sum()), 4))', 'print(float(x.sum()))')
    lines = rng_audit.compare(path, rng_audit.run(path, 11), rng_audit.run(path, 22))
    assert lines == ['  cell 1: draws from unseeded torch', '  cell 5: output differs'], lines

def test_report_check_sees_a_page_older_than_its_records(tmp_path, monkeypatch):
    "The committed Reproduction report passes; a record added after the page was executed makes the check fail, naming the command."
    assert checks.report_problems() == []
    import json, shutil
    root = tmp_path/'proj'
    shutil.copytree(ROOT/'nbs', root/'nbs', ignore=shutil.ignore_patterns('.ipynb_checkpoints'))
    monkeypatch.setattr(checks, 'ROOT', root); monkeypatch.setattr(checks, 'REPORT', root/'nbs'/'reproduction.ipynb')
    assert checks.report_problems() == []
    (root/'nbs'/'_records').mkdir(exist_ok=True)
    claim = dict(paper='apg', key='new', claim='c', paper_value='p', ours=1.0, setting='s', verdict='reproduced', reason='', rtol=1e-3)
    (root/'nbs'/'_records'/'apg.json').write_text(json.dumps({'new': claim}))
    assert len(p := checks.report_problems()) == 1 and 'make execute NB=nbs/reproduction.ipynb' in p[0]

def test_vocabulary_check_names_every_kind_of_break(monkeypatch):
    "Each rule of the vocabulary check fires on a signature that breaks it, and only there."
    import types
    mod = types.ModuleType('interpkit.papers.vocab_fixture')
    monkeypatch.setitem(sys.modules, mod.__name__, mod)   # dataclasses look their module up while the class is made
    exec('''
from __future__ import annotations
import dataclasses
from typing import NamedTuple
class Shipped(NamedTuple):
    model: object; tokenizer: object; meta: dict
@dataclasses.dataclass
class Scores:
    x: float
def good(model, tokenizer, top_k:int=3, seed:int=0, layers=None, n_heads:int=2) -> Scores: ...
def load_good() -> Shipped: ...
def load_scores() -> Scores: ...
def encode_rows(model) -> dict: ...
def uses_k(model, k:int=3): ...
def uses_rng(model, rng=None): ...
def model_second(x, model): ...
def encoder_arg(encoder, x): ...
def counts(model, layers:int=2, heads:int|None=None, layer:int=0): ...
def indices(model, layers:list|None=None, heads:dict|None=None): ...
def bare(model) -> dict: ...
def load_tuple() -> tuple: ...
def shipped_runs() -> Scores: ...
def train_thing(steps:int=3) -> tuple: ...
class Part:
    def __init__(self, encoder, d:int): ...
__all__ = ['good', 'load_good', 'load_scores', 'encode_rows', 'uses_k', 'uses_rng', 'model_second', 'encoder_arg', 'counts', 'indices', 'bare',
           'load_tuple', 'shipped_runs', 'train_thing', 'Part', 'Shipped', 'Scores']
''', mod.__dict__)
    found = checks.vocabulary_problems([mod.__name__])
    by = {}
    for line in found: by.setdefault(line.split(':')[0].rsplit('.', 1)[1], []).append(line.split(': ', 1)[1])
    assert set(by) == {'uses_k', 'uses_rng', 'model_second', 'encoder_arg', 'counts', 'bare', 'load_tuple', 'shipped_runs', 'train_thing'}, by
    assert by['uses_k'] == ['argument k= should be top_k (how many of the highest), rank (how many directions), n_draws (random draws) or n (how many items)']
    assert by['uses_rng'] == ['argument rng= should be seed'] and by['model_second'] == ['model should be the first argument']
    assert by['encoder_arg'] == ['argument encoder= should be model (the first argument)']
    assert by['counts'] == ['layers: int is a count: call it n_layers (layers are indices)', 'heads: int is a count: call it n_heads (heads are indices)']
    assert by['bare'] == ['returns a bare dict: return a @result dataclass or a DataFrame']
    assert by['load_tuple'] == ['a loader returns Shipped (model, tokenizer, meta) or a @result, not tuple']
    assert by['shipped_runs'] == ['a loader is called load_<name>'] and by['train_thing'] == ['a trainer returns Trained (model, tokenizer, fit), not tuple']

def test_vocabulary_check_runs_over_every_public_module():
    mods = checks.vocabulary_modules()
    assert 'interpkit.models' in mods and 'interpkit.papers.orion' in mods and not any('._' in m or m.endswith('__init__') for m in mods)

def test_long_export_cells_are_found(tmp_path, monkeypatch):
    "An export cell of 61 lines is reported with its notebook and id; one of 60 lines, a long cell that exports nothing and a hidden folder are not."
    body = lambda n: '#| export\n' + '\n'.join(f'x{i} = {i}' for i in range(n - 1))
    nb = new_notebook(cells=[new_code_cell(body(61)), new_code_cell(body(60)), new_code_cell('\n'.join(['1'] * 80))])
    nb.cells[0].id = 'long1'
    (tmp_path/'nbs'/'papers').mkdir(parents=True); (tmp_path/'nbs'/'_hidden').mkdir()
    nbformat.write(nb, tmp_path/'nbs'/'papers'/'01_x.ipynb'); nbformat.write(nb, tmp_path/'nbs'/'_hidden'/'y.ipynb')
    monkeypatch.setattr(checks, 'ROOT', tmp_path)
    assert checks.long_export_cells() == ['nbs/papers/01_x.ipynb cell long1: an export cell of 61 lines (at most 60): split it']


def test_vocabulary_update_drops_fixed_cases_but_never_adds_a_new_one(tmp_path, monkeypatch):
    import pytest
    "The ratchet only shrinks: --update writes the listed cases that are still found, and a new case still fails the check."
    todo = tmp_path/'todo.txt'
    todo.write_text('# list\nold.fixed: gone\nold.kept: still here\n')
    monkeypatch.setattr(checks, 'VOCAB_TODO', todo)
    monkeypatch.setattr(checks, 'ROOT', tmp_path)
    monkeypatch.setattr(checks, 'vocabulary_problems', lambda: ['old.kept: still here', 'new.case: broken'])
    monkeypatch.setattr(checks, 'long_export_cells', lambda: [])
    with pytest.raises(SystemExit): checks.check_vocabulary(update=True)
    assert [l for l in todo.read_text().splitlines() if not l.startswith('#')] == ['old.kept: still here']
    monkeypatch.setattr(checks, 'vocabulary_problems', lambda: ['old.kept: still here'])
    checks.check_vocabulary()   # passes once the new case is fixed


def test_vocabulary_check_reads_classes_named_in_capitals(monkeypatch):
    "A class named in capitals (SAE, APG) is checked like any other; constants are not."
    import types
    mod = types.ModuleType('interpkit.papers.caps_fixture')
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    exec('''
class SAE:
    def __init__(self, d:int, k:int=3): ...
LIMITS = dict(k=1)
__all__ = ['SAE', 'LIMITS']
''', mod.__dict__)
    assert [l.split(': ', 1)[1].split(' should')[0] for l in checks.vocabulary_problems([mod.__name__])] == ['argument k=']


def test_bench_scale_runs_its_rows_in_their_own_processes():
    "benchmarks/bench_scale.py at the tiny size: every asked row prints its peak, time and reference (the full table is `make bench-scale`)."
    import subprocess
    out = subprocess.run([sys.executable, str(Path(__file__).parents[1]/'benchmarks'/'bench_scale.py'), '--size', 'tiny', '--threads', '1', '--only', 'forward,logits_at,g_effect'],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [l for l in out.stdout.splitlines() if l.split(' ')[0] in ('forward', 'forward_backward', 'logits_at', 'g_effect')]
    assert [r.split()[0] for r in rows] == ['forward', 'forward_backward', 'logits_at', 'g_effect'] and not any('FAILED' in r for r in rows), out.stdout


def test_bench_scale_documented_costs_are_on_their_pages():
    "Every cost bench_scale checks is stated, in the same words, on the page of its entry point; and the formula is in bytes of the model's sizes."
    import argparse, importlib.util, json
    spec = importlib.util.spec_from_file_location('bench_scale', Path(__file__).parents[1]/'benchmarks'/'bench_scale.py'); bs = importlib.util.module_from_spec(spec); spec.loader.exec_module(bs)
    root = Path(__file__).parents[1]
    for row, (page, words, formula, *ref) in bs.COSTS.items():
        text = ' '.join(''.join(c['source']) for c in json.loads((root/page).read_text())['cells'] if c['cell_type'] == 'markdown')
        assert '**Cost.**' in text and words in ' '.join(text.split()), (row, page, words)
        s = argparse.Namespace(P=10**9, b=2, B=2, T=48, d=2048, L=20, I=5632, V=32000, K=512)
        assert isinstance(formula(s), int), row
        assert bs.reference_of(row) in ('forward', 'forward_backward') and ref in ([], ['forward'], ['forward_backward']), row
    assert set(bs.COSTS) <= set(bs.ROWS)
