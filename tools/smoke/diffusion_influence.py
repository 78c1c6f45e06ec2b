"Smoke checks of interpkit.papers.diffusion_influence and its demo module interpkit.demos.diffusion_influence: measurements, per-example gradients, K-FAC/EK-FAC influence, the baselines and the LDS on a device."
import torch
from _util import on, finite, untouched
from diffusers import DDIMScheduler, DDPMScheduler
from interpkit.diffusion import denoiser_forward
from interpkit.grads import grad_modules, project_flat
from interpkit.papers.diffusion_influence import (CURVATURES, DDPM_SCHEDULER, MEASUREMENTS, draws, elbo_weights, measurement_grads, ggn_curvature,
                                                  influence_params, influence_scores, lds, measure, noised,
                                                  precondition, retrain_ceiling, spearman, top_influences, trak_scores, mean_eigenvalue)
from interpkit.demos.diffusion_influence import demo_images, demo_labels, load_influence_demo, load_retraining, Retraining, tiny_ddpm

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'train_influence_demo': 'a CPU recipe for the shipped asset (full-batch training, no device argument); tests/test_diffusion_influence.py runs it',
}

def checks(device, dtype):
    def grads():
        m = tiny_ddpm(0).to(device=device, dtype=dtype).train()
        x = demo_images()[:3]
        out = []
        with untouched(m):
            for sched in (DDPMScheduler(**DDPM_SCHEDULER), DDIMScheduler(**DDPM_SCHEDULER)):
                for meas in MEASUREMENTS:
                    on(measure(m, sched, x, meas, n_draws=4), 'cpu', f'{meas} measurement')
                    g = on(measurement_grads(m, sched, x, meas, n_draws=2, batch_size=4), device, f'{meas} gradients')
                    assert g.shape[1] == sum(p.numel() for p in influence_params(grad_modules(m)))
                out.append(f"{type(sched).__name__} {tuple(g.shape)} {g.dtype}")
        t, e = draws(2, 3, (1, 8, 8), 1000)
        on(noised(DDPMScheduler(**DDPM_SCHEDULER), x[:2].to(device), t[:, 0], e[:, 0].to(device)), device, 'noised images')
        finite(elbo_weights(DDPMScheduler(**DDPM_SCHEDULER)))
        on(denoiser_forward(m, x.to(device, dtype), torch.zeros(3, dtype=torch.long, device=device)), device, 'prediction')
        return ', '.join(out)

    def influence():
        m = tiny_ddpm(1).to(device=device, dtype=dtype)
        sched = DDPMScheduler(**DDPM_SCHEDULER)
        x, q = demo_images()[:6], demo_images()[6:8]
        with untouched(m):
            gt, gq = measurement_grads(m, sched, x, 'loss', n_draws=2), measurement_grads(m, sched, q, 'elbo', n_draws=2)
            out = []
            for kind in CURVATURES:
                G = ggn_curvature(m, sched, x, kind, n_draws=2)
                assert mean_eigenvalue(G) > 0, f'{kind} mean eigenvalue'
                s = on(influence_scores(gq, gt, G, 1e-3), 'cpu', f'{kind} scores')
                on(precondition(G, gq, 1e-2), device, f'{kind} preconditioned')
                out.append(f"{kind} {tuple(s.shape)}")
        on(influence_scores(gq, gt, None, 1.), 'cpu', 'identity scores')
        on(trak_scores(gq, gt, dim=32, damping=1.), "cpu", "TRAK scores"); on(trak_scores(project_flat(gq, 8), project_flat(gt, 8), dim=None, damping=1.), "cpu", "TRAK on projections")
        keep = torch.rand(5, 6, generator=torch.Generator().manual_seed(0)) < 0.5
        keep[:, 0] = True
        r = lds(s, keep, torch.randn(3, 5, 2))
        finite(retrain_ceiling(torch.randn(3, 5, 2)).score); finite(spearman(torch.arange(5.), torch.arange(5.) ** 2))
        top_influences(s, 0, top_k=2)
        return ', '.join(out) + f", LDS {r.score:.2f}"

    def demo():
        unet, _, meta = load_influence_demo()
        unet, sched, res = unet.to(device=device, dtype=dtype), DDPMScheduler(**meta['scheduler']), load_retraining()
        with untouched(unet): v = on(measure(unet, sched, res.queries[:2], 'loss', n_draws=8), 'cpu', 'shipped model loss')
        assert len(demo_labels()) == len(demo_images()) and isinstance(res, Retraining)
        return f"shipped model, query loss {v.mean().item():.3g}"

    return [('grads', grads), ('influence', influence), ('demo', demo)]
