"Helpers of the smoke checks: tiny models on a device, and checks that results are finite and where they should be."
import torch
from interpkit.models import tiny_lm, tiny_tokenizer
from interpkit.testing import untouched

def lm(arch, device, dtype, **kw):
    "A tiny `transformers` LM of `arch` on `device` in `dtype`."
    return tiny_lm(arch, **kw).to(device=device, dtype=dtype)

def on(t, device, what='result'):
    "Check that tensor `t` is on `device` and finite; return it."
    assert torch.is_tensor(t), f"{what} is a {type(t).__name__}, not a tensor"
    assert t.device.type == torch.device(device).type, f"{what} is on {t.device}, not {device}"
    assert torch.isfinite(t.float()).all(), f"{what} has non-finite values"
    return t

def finite(t, what='result'):
    "Check that tensor `t` (any device) is finite; return it."
    assert torch.isfinite(torch.as_tensor(t).float()).all(), f"{what} has non-finite values"
    return t

def ids(n=2, t=8, vocab=128, seed=0):
    "Random token ids on the CPU (the library moves them)."
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))

__all__ = ['lm', 'on', 'finite', 'ids', 'untouched', 'tiny_tokenizer']
