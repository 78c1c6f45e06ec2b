"""Fixtures and hooks shared by the test files.

- `untouched`: the check that a method left a model (and its tokenizer) exactly as it found them.
- Every test starts from its own random state in `random`, numpy and torch, drawn from a run seed (new each run,
  printed in the header; `--seed N` or `SEED=N make pytest` replays a run) and the test's id, so a test whose
  verdict depends on an unseeded draw fails in your runs rather than by chance on another machine.
- A test that leaves torch's global settings changed (default dtype, gradient mode) fails: the tests after it
  in the same worker would run under them.
"""
import hashlib, os, random
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import numpy as np, pytest, torch
from interpkit.testing import untouched as _untouched

def pytest_addoption(parser):
    parser.addoption('--seed', type=int, default=None, help='run seed of the random states the tests start from (default: a new one, printed)')

def pytest_configure(config):
    if hasattr(config, 'workerinput'): seed = config.workerinput['interpkit_seed']
    else: seed = config.getoption('--seed') if config.getoption('--seed') is not None else os.environ.get('SEED') or random.SystemRandom().randrange(2**31)
    config.interpkit_seed = int(seed)

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    "pytest-xdist: every worker uses the run seed of the controller."
    node.workerinput['interpkit_seed'] = node.config.interpkit_seed

def pytest_report_header(config):
    return f"random state: run seed {config.interpkit_seed} (replay: pytest --seed {config.interpkit_seed} or SEED={config.interpkit_seed} make pytest)"

def test_seed(run_seed:int, nodeid:str) -> int:
    "The seed a test starts from: a hash of the run seed and the test's id."
    return int.from_bytes(hashlib.sha256(f'{run_seed}:{nodeid}'.encode()).digest()[:4], 'little')
test_seed.__test__ = False

@pytest.fixture(autouse=True)
def _own_random_state(request):
    "Start the test from its own random state; fail it if it leaves torch's global settings changed."
    seed = test_seed(request.config.interpkit_seed, request.node.nodeid)
    random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    state = (torch.get_rng_state(), np.random.get_state()[1].copy())
    yield
    report = os.environ.get('INTERPKIT_RNG_REPORT')   # a file: list the tests that drew from the global generators (their numbers depend on the run seed)
    if report and not (torch.equal(state[0], torch.get_rng_state()) and np.array_equal(state[1], np.random.get_state()[1])):
        with open(report, 'a') as f: f.write(request.node.nodeid + '\n')
    assert torch.get_default_dtype() == dtype, f"the test left torch's default dtype at {torch.get_default_dtype()} (was {dtype})"
    assert torch.is_grad_enabled() == grad, f"the test left gradients {'on' if torch.is_grad_enabled() else 'off'}"

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    "Name the random state in the report of a failed test."
    rep = (yield).get_result()
    if rep.failed:
        seed = item.config.interpkit_seed
        rep.sections.append(('random state', f"run seed {seed}, test seed {test_seed(seed, item.nodeid)}; replay: pytest '{item.nodeid}' --seed {seed}"))

@pytest.fixture
def untouched():
    "`with untouched(model, tokenizer, ...): ...` fails the test if the block changed weights, flags, hooks, `requires_grad`, `.grad`, configs or the tokenizer."
    return _untouched
