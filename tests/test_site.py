"""The documentation site in a real browser: every page of the sidebar loads, has a title and a body,
logs no console error, and every image on it has loaded. Needs Debian's chromium and Python playwright;
`make test` builds `_docs/` first (this test builds it when it is missing)."""
import functools, http.server, os, shutil, subprocess, sys, threading
from pathlib import Path
from urllib.parse import urljoin, urldefrag
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT/'_docs'
CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
         '--disable-sync', '--no-first-run', '--disable-quic']

def _missing_browser():
    "Why the browser test cannot run here, or None."
    try: import playwright  # noqa: F401
    except ImportError: return 'Python playwright is not installed (pip install playwright)'
    if not Path(CHROMIUM).exists(): return "Debian's chromium is not installed (apt-get install chromium)"

@pytest.fixture(scope='module')
def site_url():
    "Serve _docs/ on a free localhost port for the module."
    if not (DOCS/'index.html').exists():
        subprocess.run([sys.executable, str(ROOT/'tools'/'build_docs.py'), 'site'], check=True, cwd=ROOT)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(DOCS))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{server.server_address[1]}/'
    server.shutdown()

@pytest.fixture(scope='module')
def browser():
    "Headless Debian chromium driven by playwright; a missing browser fails under CI and skips elsewhere."
    why = _missing_browser()
    if why:
        if os.environ.get('CI'): pytest.fail(f'CI needs the browser test: {why}')
        pytest.skip(why)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()

def visit(browser, url):
    "Open `url`; return (status, title, body text, console errors, broken image sources, page html)."
    page = browser.new_page()
    errors = []
    page.on('console', lambda m: errors.append(m.text) if m.type == 'error' else None)
    page.on('pageerror', lambda e: errors.append(str(e)))
    resp = page.goto(url, wait_until='load')
    page.wait_for_load_state('networkidle')
    broken = page.eval_on_selector_all('img', 'imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)')
    n_imgs = page.eval_on_selector_all('img', 'imgs => imgs.length')
    out = dict(status=resp.status if resp else None, title=page.title(), body=page.inner_text('main') if page.query_selector('main') else page.inner_text('body'),
               errors=errors, broken=broken, n_imgs=n_imgs, sidebar=page.eval_on_selector_all('#quarto-sidebar a[href]', 'as => as.map(a => a.href)'),
               sections=page.eval_on_selector_all('#quarto-sidebar .sidebar-item-section > .sidebar-item-container .menu-text', 'ss => ss.map(s => s.textContent.trim())'))
    page.close()
    return out

def test_home_page(browser, site_url):
    home = visit(browser, site_url)
    assert home['status'] == 200 and home['title'].strip()
    assert 'interpkit' in home['body'] and 'make test' in home['body']
    assert home['sections'] == ['Getting started', 'Core', 'Papers', 'Demos', 'Tutorials'], home['sections']
    assert not home['errors'], home['errors']

def test_every_sidebar_page(browser, site_url):
    links = sorted({urldefrag(u)[0] for u in visit(browser, site_url)['sidebar'] if u.startswith(site_url)})
    assert len(links) >= 4, links
    n_imgs = 0
    for url in links:
        r = visit(browser, url)
        assert r['status'] == 200, url
        assert r['title'].strip(), f'{url}: empty title'
        assert len(r['body'].strip()) > 100, f'{url}: empty body'
        assert not r['errors'], f'{url}: console errors {r["errors"]}'
        assert not r['broken'], f'{url}: images that did not load {r["broken"]}'
        n_imgs += r['n_imgs']
    print(f'{len(links)} pages, {n_imgs} images, all loaded')

def test_api_reference_renders_signatures(browser, site_url):
    r = visit(browser, urljoin(site_url, 'core/errors.html'))
    assert 'def closest(' in r['body'] and 'name:str' in r['body'], r['body'][:2000]
    assert 'The valid choices nearest to' in r['body']

def test_maths_renders_offline(browser, site_url):
    page = browser.new_page()
    failed = []
    page.on('requestfailed', lambda r: failed.append(r.url))
    page.goto(urljoin(site_url, 'tutorials/contributing.html'))
    page.wait_for_load_state('networkidle')
    assert page.query_selector('.katex') is not None, 'no KaTeX-rendered maths on the contributing page'
    assert not failed, failed
    page.close()

def test_every_paper_page_shows_its_reference():
    "nbdev turns a notebook's first markdown cell into the title and description and drops the rest: the paper's reference needs a cell of its own."
    if not (DOCS/'index.html').exists(): subprocess.run([sys.executable, str(ROOT/'tools'/'build_docs.py'), 'site'], check=True, cwd=ROOT)
    pages = sorted((DOCS/'papers').glob('*.html'))
    assert pages
    missing = [p.name for p in pages if 'ICLR 2025' not in p.read_text() or 'arxiv.org/abs/' not in p.read_text()]
    assert not missing, f"pages without the paper's reference (venue and arXiv link): {missing}"
