"Smoke checks of interpkit.papers.rsvc and its demo module interpkit.demos.rsvc: pooled activations, concepts, integrated gradients and compare on a CNN and a transformers ViT in the given dtype and device; the toy data, the recipe and the shipped models."
import functools, warnings
import torch, transformers
from sklearn.exceptions import ConvergenceWarning
from _util import on, finite, untouched
from interpkit.papers.rsvc import (SITE_POOLINGS, Patches, patchify, pool_acts, pooled_acts, Concepts, extract_concepts, pearson_matrix, lasso_r2,
                                   concept_logit_fn, concept_attributions, Comparison, compare, top_patches, ConceptMatch, concept_match)
from interpkit.demos.rsvc import ToyDigits, paste_square, toy_digits, ToyCNN, train_toy_cnn, ToyModels, load_toy_models, TOY_SITE

NOT_SMOKED = {'Patches': 'made by patchify', 'Concepts': 'made by extract_concepts', 'Comparison': 'made by compare',
              'ConceptMatch': 'made by concept_match', 'ToyDigits': 'made by toy_digits', 'ToyModels': 'made by load_toy_models'}

VIT_SITE = 'vit.layers.0.mlp.activation_fn'

def _vit(device, dtype):
    "A tiny transformers ViT on 8×8 images (it returns an ImageClassifierOutput)."
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, hidden_act='relu', num_labels=4)
        return transformers.ViTForImageClassification(cfg).to(device=device, dtype=dtype).eval()

def _images(n=6, seed=0): return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))   # float32 on the CPU: the library moves them

def _quiet(fn):
    "`fn` without scikit-learn's NMF convergence warnings (tiny random models stop at max_iter; the checks look at finiteness)."
    @functools.wraps(fn)
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', ConvergenceWarning)
            return fn()
    return run

def checks(device, dtype):
    def cnn_pipeline():
        m = ToyCNN(n_classes=4, seed=1).to(device=device, dtype=dtype).train()
        ims = _images()
        p = patchify(ims.to(device), 4)
        on(p.x, device, 'patches')
        assert pool_acts(p.x[:, :, 0]).device.type == device.type
        with untouched(m):
            a = pooled_acts(m, TOY_SITE, p.x, batch_size=16)
            assert a.device.type == 'cpu' and a.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
            finite(a, 'pooled activations')
            c = extract_concepts(a, n_concepts=3)
            f = concept_logit_fn(m, TOY_SITE, c.W, 1)
            with torch.no_grad(): on(f(c.U[:4].to(device), p.x[:4]), device, 'concept logits')
            att = finite(concept_attributions(m, TOY_SITE, c, p.x, 1, n_steps=4, batch_size=32), 'attributions (patched)')
            att_h = finite(concept_attributions(m, TOY_SITE, c, p.x, 1, readout=m.head, n_steps=4), 'attributions (head)')
            assert att.device.type == 'cpu' and (att - att_h).abs().max() < 0.1 * att.abs().max() + 1e-3
            res = compare(m, m, ims, 1, TOY_SITE, n_concepts=3, folds=3, n_steps=2, batch_size=32)
        finite(torch.tensor(res.table.to_numpy(float)), 'comparison table')
        d = concept_match(res, 0, top_k=3)
        assert d.top_a.shape == (3,) and top_patches(res.coeffs_a, 1, 2).shape == (2,)
        finite(pearson_matrix(res.coeffs_a, res.coeffs_b), 'pearson'); finite(lasso_r2(a, res.coeffs_a[:len(a)], folds=2), 'lasso r2')
        return f"pearson {res.table.pearson.mean():.2f}, attributions {att.sum(1).mean():.3g}"

    def vit_vs_cnn():
        v, m = _vit(device, dtype), ToyCNN(n_classes=4, seed=2).to(device=device, dtype=dtype).eval()
        with untouched(v, m):
            res = compare(v, m, _images(), 2, VIT_SITE, TOY_SITE, n_concepts=2, folds=3, n_steps=2)   # 'auto': the ViT's class token, the CNN's spatial mean
            cls = pooled_acts(v, VIT_SITE, _images(2), 'cls')
        finite(torch.tensor(res.table.to_numpy(float)), 'comparison table'); finite(cls, 'class-token activations')
        assert set(SITE_POOLINGS) >= {'auto', 'mean', 'cls'}
        return f"ViT vs CNN: r2 {', '.join(f'{r:.2f}' for r in res.table.r2)}"

    def toy():
        tr = toy_digits('test')
        x, mask = paste_square(tr.x[:4].to(device), torch.tensor([True, False, True, False]))
        on(x, device, 'pasted images'); assert mask.device.type == device.type and int(mask.sum()) == 50
        data = ToyDigits(tr.x[:32].to(device), tr.y[:32].to(device), tr.square_mask[:32].to(device))
        model, _, res = train_toy_cnn(data, steps=2, batch_size=8)
        assert next(model.parameters()).device.type == device.type
        finite(torch.tensor(res.history.loss.to_numpy()), 'training loss')
        models, _, meta = load_toy_models()
        a = models.a.to(device=device, dtype=dtype)
        with torch.no_grad(): on(a(x.to(dtype)), device, 'shipped model logits')
        return f"loss {res.history.loss.iloc[0]:.3g}, {len(list(models))} shipped models"

    return [('cnn_pipeline', _quiet(cnn_pipeline)), ('vit_vs_cnn', _quiet(vit_vs_cnn)), ('toy', toy)]
