"""A reader in JupyterLab: `jupyter lab` from the project's environment (as `make lab` starts it), headless, on a copy
of a paper notebook; the notebook is run from the Run menu in a real browser (Debian's chromium, driven by
playwright), a control of its Explore widget is moved, and the widget's figure is seen to change."""
import json, os, shutil, socket, subprocess, sys, time, urllib.request
from pathlib import Path
import pytest
from test_site import CHROMIUM, FLAGS, _missing_browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT/'nbs'/'papers'/'02_rsvc.ipynb'   # a paper page that runs in seconds; its widget has a dropdown (class) and a slider (concept)
TOKEN = 'interpkit-lab-test'

def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    "A JupyterLab server on a free localhost port, serving a folder with a copy of the notebook; its URL."
    why = _missing_browser()
    if why:
        if os.environ.get('CI'): pytest.fail(f'CI needs the JupyterLab test: {why}')
        pytest.skip(why)
    root = tmp_path_factory.mktemp('lab')
    shutil.copy(NOTEBOOK, root/NOTEBOOK.name)
    settings = root/'.settings'/'@jupyterlab'/'notebook-extension'
    settings.mkdir(parents=True)
    (settings/'tracker.jupyterlab-settings').write_text('{"windowingMode": "none"}')   # render every cell: by default JupyterLab 4 hides cells outside the view
    port = free_port()
    env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'OMP_NUM_THREADS': '1', 'JUPYTER_CONFIG_DIR': str(root/'.jupyter'), 'JUPYTER_RUNTIME_DIR': str(root/'.runtime'),
           'JUPYTERLAB_SETTINGS_DIR': str(root/'.settings')}
    jupyter = Path(sys.executable).parent/'jupyter'
    log = open(root/'lab.log', 'w')
    proc = subprocess.Popen([str(jupyter), 'lab', '--no-browser', f'--port={port}', '--ip=127.0.0.1', f'--ServerApp.token={TOKEN}',
                             f'--ServerApp.root_dir={root}', '--ServerApp.allow_root=True', '--LabApp.news_url=', '--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate'],
                            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f'http://127.0.0.1:{port}'
    try:
        for _ in range(120):
            if proc.poll() is not None: pytest.fail(f"jupyter lab exited:\n{(root/'lab.log').read_text()[-4000:]}")
            try:
                urllib.request.urlopen(f'{url}/api/status?token={TOKEN}', timeout=2)
                break
            except OSError: time.sleep(0.5)
        else: pytest.fail('jupyter lab did not answer within 60 s')
        yield url, root
    finally:
        proc.terminate()
        try: proc.wait(20)
        except subprocess.TimeoutExpired: proc.kill()
        log.close()

def api(url, path):
    "The JSON the server answers at `path`."
    with urllib.request.urlopen(f'{url}{path}?token={TOKEN}', timeout=10) as r: return json.load(r)

def kernel_states(url) -> list[str]:
    "The execution state of every running kernel; ['error: ...'] when the server cannot list them."
    try: return [k.get('execution_state') for k in api(url, '/api/kernels')]
    except OSError as e: return [f'error: {e}']

def diagnosis(page, url, root) -> str:
    "What the page and the server show: a screenshot's path, dialogs, error outputs, kernel states and the server log's tail."
    shot = root/'failure.png'
    try: page.screenshot(path=str(shot), full_page=True)
    except Exception as e: shot = f'no screenshot ({e})'
    grab = lambda sel: page.eval_on_selector_all(sel, 'es => es.map(e => e.innerText.slice(0, 1500))')
    return (f"screenshot: {shot}\ndialogs: {grab('.jp-Dialog')}\nerrors in outputs: {grab('.jp-OutputArea-output[data-mime-type*=stderr], .jp-RenderedText[data-mime-type*=error]')}\n"
            f"prompts: {grab('.jp-InputPrompt')[:80]}\nkernels: {kernel_states(url)}\nserver log:\n{(root/'lab.log').read_text()[-3000:]}")

def wait_for(page, url, root, selector, seconds):
    "Wait until `selector` is on the page; fail early, with a diagnosis, when a dialog opens, an error is shown or the kernel dies."
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if page.query_selector(selector): return
        if page.query_selector('.jp-Dialog, .jp-OutputArea-output[data-mime-type*=error]') or 'dead' in kernel_states(url): break
        page.wait_for_timeout(1000)
    pytest.fail(f'{selector!r} did not appear within {seconds} s\n{diagnosis(page, url, root)}')

def widget_image(page) -> str:
    "The src of the figure inside the Explore widget's output."
    return page.eval_on_selector('.widget-interact .jp-OutputArea-output img, .widget-interact img', 'i => i.src')

def test_widget_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright
    url, root = lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={'width': 1400, 'height': 900})
            errors = []
            page.on('pageerror', lambda e: errors.append(str(e)))
            page.goto(f'{url}/lab/tree/{NOTEBOOK.name}?token={TOKEN}')
            wait_for(page, url, root, '.jp-NotebookPanel', 120)
            for _ in range(120):                                               # the notebook's kernel started and idle
                if kernel_states(url) == ['idle']: break
                page.wait_for_timeout(1000)
            else: pytest.fail(f'no idle kernel within 120 s\n{diagnosis(page, url, root)}')
            started = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => /\\[(\\*|\\d+)\\]/.test(p.innerText))"
            for attempt in range(3):                                           # a click while the page is still settling can be lost: try again
                page.get_by_role('menuitem', name='Run', exact=True).click()
                page.get_by_text('Run All Cells', exact=True).click()
                try:
                    page.wait_for_function(started, timeout=30_000)            # a cell is queued or has run
                    break
                except Exception: continue
            else: pytest.fail(f'Run All Cells started no cell in 3 tries\n{diagnosis(page, url, root)}')
            wait_for(page, url, root, '.widget-interact select', 300)          # the Explore widget's dropdown, once its cell has run
            page.wait_for_function("() => document.querySelector('.widget-interact img')", timeout=60_000)
            before = widget_image(page)
            select = page.locator('.widget-interact select').first
            options = select.locator('option').all_text_contents()
            assert len(options) > 1, options
            select.select_option(index=len(options) - 1)                     # the last class in the list
            page.wait_for_function("before => { const i = document.querySelector('.widget-interact img'); return i && i.src !== before; }",
                                   arg=before, timeout=60_000)
            after = widget_image(page)
            assert after.startswith('data:image/png') and after != before
            assert not [e for e in errors if 'widget' in e.lower()], errors
        finally:
            browser.close()
