"Tiny LMs for reference checks, shared by the test files: weights redrawn at unit scale, and float64 without float32 islands."
import math
import torch
from interpkit.models import tiny_lm

class RMSNorm(torch.nn.Module):
    "RMSNorm in the input's dtype (transformers' LlamaRMSNorm computes in float32, which would put float32 noise into float64 checks)."
    def __init__(self, norm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon
    def forward(self, x): return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

def exact_norms(m):
    "Replace a Llama model's RMSNorms by `RMSNorm`s, in place."
    for layer in m.model.layers:
        layer.input_layernorm, layer.post_attention_layernorm = RMSNorm(layer.input_layernorm), RMSNorm(layer.post_attention_layernorm)
    m.model.norm = RMSNorm(m.model.norm)

def unit_scale_lm(arch='llama', seed=0, dtype=torch.float32, gain=1.0, d_model=32):
    "A tiny LM with weights redrawn at unit scale (1/sqrt(fan-in): peaked logits, gradients far from 0); float64 runs in float64 throughout."
    m = tiny_lm(arch, d_model=d_model, n_heads=4, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() < 2: continue
            emb = any(s in n for s in ('wte', 'wpe', 'embed'))
            fan_in = 1 if emb else p.shape[0] if arch == 'gpt2' else p.shape[1]   # GPT-2's Conv1D stores (in, out)
            p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(fan_in))
    if dtype == torch.float64:
        if arch == 'llama': exact_norms(m)
        m.config._attn_implementation = 'sdpa'   # eager attention takes its softmax in float32
    return m.to(dtype).eval()
