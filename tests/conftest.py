"""Fixtures shared by the test files: `untouched`, the check that a method left a model (and its tokenizer) exactly as it found them."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
import pytest
from interpkit.testing import untouched as _untouched

@pytest.fixture
def untouched():
    "`with untouched(model, tokenizer, ...): ...` fails the test if the block changed weights, flags, hooks, `requires_grad`, `.grad`, configs or the tokenizer."
    return _untouched
