"Smoke checks of interpkit.papers.monosemantic and its demo module interpkit.demos.monosemantic: InfoNCE, the contrastive nets (SimCLR, NCL, rep-ReLU) and their loss, projector features with and without an SAE, short training runs, the probes and noise protocols, the digit pairs and augmentations, and the shipped models."
import math
import torch
from torch import nn
from _util import on, finite, untouched
from interpkit.sae import SAE
from interpkit.train import assets_dir
from interpkit.papers.monosemantic import (NON_NEGATIVE, info_nce, non_negative, ContrastiveNet, contrastive_loss, train_contrastive, projector_features, semantic_consistency, monosemanticity, top_activating, symmetric_label_noise, gaussian_input_noise, few_shot_indices, label_noise_curve, input_noise_curve, robustness_table, train_feature_sae)
from interpkit.demos.monosemantic import (DIGIT_MODELS, digit_pairs, DigitAugment, DigitEncoder, train_digit_net, load_digit_models)
from interpkit.stats import linear_probe

NOT_SMOKED = {'Monosemanticity': 'made by monosemanticity', 'DigitPairs': 'made by digit_pairs', 'DigitModels': 'made by load_digit_models', 'encoder_features': 'run by every ContrastiveNet call below'}

def _net(non_neg, device, dtype, seed=0):
    "A ContrastiveNet with a tiny DigitEncoder on `device` in `dtype`."
    return ContrastiveNet(DigitEncoder(16, seed=seed), 16, 12, 16, non_neg, seed=seed).to(device=device, dtype=dtype)

def _images(n=8, seed=0): return torch.rand(n, 1, 8, 16, generator=torch.Generator().manual_seed(seed))    # CPU float32: the library moves them

def _planted(n, seed, C=4, d=6):
    mu = 3 * torch.randn(C, d, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % C
    return mu[y] + torch.randn(n, d, generator=g), y

def checks(device, dtype):
    def nets():
        out = []
        for kind in NON_NEGATIVE:
            net = _net(kind, device, dtype).train()
            sae = SAE(12, 12, 'topk', 2).to(device=device, dtype=dtype).train()
            x = _images()
            with untouched(net, sae):
                on(projector_features(net, x, batch_size=3), device, f'{kind} raw features')
                f = on(projector_features(net, x, normalize=True, batch_size=3), device, f'{kind} features')
                assert f.dtype == torch.float32 and torch.allclose(f.norm(dim=1), torch.ones(len(x), device=device), atol=3e-2)
                if kind != 'none': assert (f >= 0).all()
                fs = on(projector_features(net, x, sae, batch_size=5), device, f'{kind} SAE latents')
                assert ((fs != 0).sum(1) <= 2).all()
                with torch.no_grad(): loss, logged = contrastive_loss(net, (x, x.flip(-1)), 0.2, 1.0)
                on(loss, device, f'{kind} loss'); finite(torch.tensor(list(logged.values())), 'logged')
            z = on(non_negative(torch.randn(4, 3, device=device, dtype=dtype), kind), device, 'non_negative')
            out.append(f"{kind} loss {loss.item():.2f}")
        z1, z2 = torch.randn(5, 4, device=device, dtype=dtype), torch.randn(5, 4, device=device, dtype=dtype)
        on(info_nce(z1, z2), device, 'info_nce')
        return ', '.join(out) + f" ({dtype})"

    def training():
        net = _net('relu', device, dtype)
        _, _, res = train_contrastive(net, _images(16), DigitAugment(), steps=2, batch_size=4, progress=False)    # CPU images
        finite(torch.tensor(res.history['loss'].to_numpy()), 'contrastive training loss')
        assert all(p.device.type == device.type and p.dtype == dtype for p in net.parameters())
        _, _, res2 = train_contrastive(net, _images(16).to(device), DigitAugment(), steps=1, batch_size=4, progress=False)   # images on the device
        finite(torch.tensor(res2.history['loss'].to_numpy()), 'contrastive training loss (device images)')
        d, _, rd = train_digit_net('ncl', _images(16), steps=2, batch_size=4, activation_weight=1.0, device=device, progress=False)
        assert not d.training and all(p.device.type == device.type for p in d.parameters())
        finite(torch.tensor(rd.history['loss'].to_numpy()), 'train_digit_net loss')
        with untouched(d):
            sae, _, rs = train_feature_sae(d, _images(16), steps=2, batch_size=4, progress=False)
        assert sae.top_k == 32 and next(sae.parameters()).device.type == device.type
        finite(torch.tensor(rs.history['loss'].to_numpy()), 'train_feature_sae loss')
        return f"contrastive loss {res.final_loss:.2f}, digit net {rd.final_loss:.2f}, SAE {rs.final_loss:.3g}"

    def probes():
        x, y = _planted(200, 1); xt, yt = _planted(200, 2)
        xd, yd = x.to(device=device, dtype=dtype), y.to(device)
        p = linear_probe(xd, yd, xt.to(device=device, dtype=dtype), yt.to(device), standardize=False)   # the protocols' probe (scikit-learn, on the CPU)
        acc = p.score(xt.to(device=device, dtype=dtype), yt.to(device))
        assert 0 <= acc <= 1
        c = semantic_consistency(xd.relu(), yd); m = monosemanticity(xd.relu(), yd)
        assert math.isfinite(c) and 0 < m.consistency <= 1 and 0 <= m.sparsity <= 1
        assert top_activating(xd, 0, 3).tolist() == xd[:, 0].float().cpu().topk(3).indices.tolist()
        noisy = symmetric_label_noise(yd, 0.5)
        assert noisy.device.type == device.type and (noisy != yd).sum() == 100
        on(gaussian_input_noise(xd, 0.3), device, 'input noise')
        assert len(few_shot_indices(yd, 3)) == 12
        maps = {'id': lambda v: v.to(device=device, dtype=dtype)}
        curve = label_noise_curve(maps, x, y, xt, yt, rates=(0.0, 0.5))
        table = robustness_table(maps, x, y, xt, yt)
        finite(torch.tensor(input_noise_curve(maps, x, y, xt, yt, sigmas=(0.0, 0.3)).to_numpy(float)), 'input-noise curve')
        finite(torch.tensor(curve.to_numpy(float)), 'label-noise curve'); finite(torch.tensor(table.to_numpy(float)), 'robustness table')
        return f"probe {acc:.2f}, consistency {c:.2f}, table clean {table.iloc[0, 0]:.2f}"

    def digits_and_augment():
        pairs = digit_pairs('test', n=40)
        x = pairs.x.to(device=device, dtype=dtype)
        out = on(DigitAugment()(x, torch.Generator().manual_seed(0)), device, 'augmented view')
        assert out.shape == x.shape and out.dtype == dtype
        enc = DigitEncoder(32).to(device=device, dtype=dtype)
        with untouched(enc), torch.no_grad(): on(enc(out), device, 'DigitEncoder output')
        return f"{len(pairs)} pairs, view change {(out - x).abs().float().mean().item():.3f}"

    def shipped():
        if not (assets_dir()/f'{DIGIT_MODELS}.safetensors').exists(): return f"{DIGIT_MODELS} not built yet: skipped"
        models, _, meta = load_digit_models()
        for m in (models.simclr, models.ncl, models.sae): m.to(device=device, dtype=dtype)
        x = digit_pairs('test', n=64).x
        with untouched(models.simclr, models.ncl, models.sae):
            feats = {k: on(f(x), device, f'{k} features') for k, f in models.feature_maps(batch_size=32).items()}
        assert (feats['NCL'] >= 0).all() and ((feats['SAE'] != 0).sum(1) <= models.sae.top_k).all()
        return ', '.join(f"{k} {(v == 0).float().mean().item():.2f} zeros" for k, v in feats.items()) + f" ({dtype})"

    return [('nets', nets), ('training', training), ('probes', probes), ('digits_and_augment', digits_and_augment), ('shipped', shipped)]
