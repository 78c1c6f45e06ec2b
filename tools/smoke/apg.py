"Smoke checks of interpkit.papers.apg and its demo module interpkit.demos.apg: the guidance rules, APG in the core's sampler over every supported scheduler, image statistics, the shipped model and its data."
import math
import torch
from torch import nn
from _util import on, finite, untouched
from interpkit.papers.apg import cfg, split_parallel, rescale, Momentum, apg, CFG, APG, ImageStats, image_stats
from interpkit.diffusion import sample, SUPPORTED_SCHEDULERS
from interpkit.demos.apg import digit_images, digit_unet, load_digit_diffusion, NULL_CLASS

NOT_SMOKED = {  # public names of interpkit.demos.apg with nothing device- or dtype-specific to run
    'train_digit_diffusion': 'a CPU recipe for the shipped asset (no device argument; the core smoke runs train_ddpm); tests/test_apg_demo.py runs it',
    'train_digit_classifier': 'a CPU recipe for a digit classifier (no device argument); tests/test_apg_demo.py runs it',
}

def _unet(device, dtype): return digit_unet(block_out_channels=(8, 16)).to(device=device, dtype=dtype).train()

def checks(device, dtype):
    def rules():
        g = torch.Generator().manual_seed(0)
        c, u = (torch.randn(3, 1, 8, 8, generator=g).to(device=device, dtype=dtype) for _ in range(2))
        outs = [cfg(c, u, 5.), apg(c, u, 5., eta=0., r=1., momentum=Momentum(-0.5)), rescale(c - u, 1.), *split_parallel(c, u)]
        step = APG(r=1.).start()
        outs += [step(c, u, 7.), step(c, u, 7.), CFG().start()(c, u, 7.)]
        for o in outs: assert on(o, device).dtype == dtype
        return f"{len(outs)} outputs in {dtype}"

    def sampler():
        import diffusers
        m = _unet(device, dtype)
        labels = torch.tensor([1, 7])
        got = []
        with untouched(m):
            for name in SUPPORTED_SCHEDULERS:
                x = on(sample(m, getattr(diffusers, name)(num_train_timesteps=1000), labels, NULL_CLASS, (1, 8, 8), APG(r=1.), 5., n_steps=4, batch_size=3), device, name)
                got.append(f"{name.replace('Scheduler', '')} {x.abs().mean().item():.2f}")
        return '; '.join(got)

    def stats():
        class Clf(nn.Module):   # logits in an ImageClassifierOutput-like dict, dropout in train mode
            def __init__(self): super().__init__(); self.f = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Dropout(0.5))
            def forward(self, x): return {'logits': self.f(x)}
        clf = Clf().to(device=device, dtype=dtype).train()
        x = torch.randn(20, 1, 8, 8, generator=torch.Generator().manual_seed(1)).to(device)   # float32 images: cast to the classifier's dtype
        with untouched(clf): s = image_stats(x, torch.arange(20) % 10, clf, batch_size=7)
        assert isinstance(s, ImageStats) and 0 <= s.accuracy <= 1
        finite(torch.tensor([s.saturation, s.clipped, s.std]))
        return repr(s)

    def shipped():
        import diffusers
        unet, _, meta = load_digit_diffusion()
        unet = unet.to(device=device, dtype=dtype)
        xr, y = digit_images('test', classes=(0, 1))
        assert set(y.tolist()) == {0, 1} and len(xr) == len(y)
        with untouched(unet):
            x = on(sample(unet, diffusers.EulerDiscreteScheduler.from_config({**meta['scheduler'], 'timestep_spacing': 'leading'}), torch.arange(10), NULL_CLASS, (1, 8, 8), APG(r=1.35), 15., n_steps=6), device, 'digits')
        s = image_stats(x)
        assert math.isfinite(s.saturation)
        return f"Euler, 10 digits at scale 15: {s}"

    return [('rules', rules), ('sampler', sampler), ('image_stats', stats), ('shipped model', shipped)]
