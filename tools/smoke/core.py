"Smoke checks of the core: models, hooks, sae, train, testing, results, viz, diffusion."
import tempfile
import torch
from torch import nn
from _util import lm, on, finite, ids, untouched, tiny_tokenizer
from interpkit.models import (tiny_config, model_device, model_dtype, to_model, load_lm, evaluating, check_causal_lm, pad_id, padding, chat, chat_replies, logits_at,
                              mask_positions, encode_left, pad_right, check_batch_size, iter_batches, prefix_step, load_encoder, embed, logits_of,
                              WordTokenizer, encode_texts, encode_queries)
from interpkit.hooks import (as_site, layout, module_paths, resolve, all_sites, is_linear, weight_matrix, linear_modules, final_norm, norm_gain,
                             mlp_norm, norm_eps,
                             hooked, capture, capture_grads, add, scale, patch, head_means, ablate_heads, resid_post, head_out, head_q, attn_out)
from interpkit.sae import SAE, normalized_mse, sae_metrics, stream_activations, train_sae, planted_data, match_directions
from interpkit.train import lr_factor, fit, save_asset, load_asset, load_asset_into, lm_loss, seeded
from interpkit.testing import snapshot, differences
from interpkit.results import brief
from interpkit.viz import to_numpy, heatmap
from interpkit.diffusion import (to_x0, from_x0, class_forward, sample, digit_images, digit_unet, load_digit_diffusion, DIGIT_SCHEDULER, NULL_CLASS,
                                 SUPPORTED_SCHEDULERS)

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'tiny_lm': 'used by every check', 'tiny_tokenizer': 'used by the chat checks', 'cache_dir': 'a path', 'assets_dir': 'a path',
    'quiet': 'reads the environment', 'Site': 'a value', 'CANONICAL': 'constants', 'resid_pre': 'site names', 'mlp_out': 'site names',
    'ActCache': 'made by capture', 'GradCache': 'made by capture_grads', 'HookPoint': 'made by resolve', 'Layout': 'made by layout',
    'FitResult': 'made by fit', 'SAEMetrics': 'made by sae_metrics', 'result': 'a class decorator', 'untouched': 'used by every check',
    'mlp_linears': 'module paths of a block, nothing device-specific (tests/test_hooks.py covers every tiny architecture)',
    'train_digit_diffusion': 'a CPU recipe for the shipped asset (no device argument); tests/test_diffusion.py runs it',
    'train_digit_classifier': 'a CPU recipe for a digit classifier (no device argument); tests/test_diffusion.py runs it',
}

def checks(device, dtype):
    tok = tiny_tokenizer()

    def models():
        m = lm('gpt2', device, dtype)
        with untouched(m, tok):
            assert (model_device(m).type, model_dtype(m)) == (device.type, dtype)
            b = to_model(m, {'input_ids': ids(), 'x': torch.zeros(2)})
            assert b['input_ids'].device.type == device.type and b['x'].dtype == dtype
            reply = chat(m, tok, 'w1 w2 w3', max_new_tokens=4)
            enc = encode_left(tok, ['w1', 'w2 w3 w4'])
            with evaluating(m), torch.no_grad(): out = on(logits_of(m(**to_model(m, enc))), device, 'logits of encode_left')
            step = prefix_step(m, enc['input_ids'], enc['attention_mask'])
            with evaluating(m), torch.no_grad(): last2 = on(logits_at(m, to_model(m, enc), 2), device, 'logits_at')
            torch.testing.assert_close(last2.float(), out[:, -2:].float(), atol=0.1, rtol=0.1)
            replies = chat_replies(m, tok, ['w1 w2 w3', 'w2'], max_new_tokens=4, batch_size=2)
            assert len(replies) == 2 and all(isinstance(r, str) for r in replies)
            with torch.no_grad(): torch.testing.assert_close(step().logits[:, -1].float(), out[:, -1].float(), atol=0.1, rtol=0.1)
            assert check_causal_lm(m, 'x') is m and pad_id(tok) == tok.eos_token_id
            with padding(tok, 'right'): pass
            m2, _ = load_lm(m, dtype=torch.float32)   # a converted copy
            assert next(m2.parameters()).dtype == torch.float32
            assert pad_right([[1, 2], [3]], 0)['input_ids'].shape == (2, 2) and mask_positions(enc['attention_mask']).shape == (2, 3)
            assert check_batch_size(3) == 3 and len(list(iter_batches(enc, 1))) == 2 and tiny_config('qwen3').model_type == 'qwen3'
            wt = WordTokenizer.fit(['w1 w2 w3'])
            for b in (encode_texts(wt, ['w1 w2', 'w3']), encode_queries(tok, ['w1 w2'], ['w3'])):
                with evaluating(m), torch.no_grad(): on(logits_of(m(**to_model(m, {k: b[k] for k in ('input_ids', 'attention_mask')}))), device, 'logits of an encoded batch')
        return f"chat {reply!r}"

    def encoder():
        m = lm('bert', device, dtype).bert
        with untouched(m): e = on(embed(['w1 w2', 'w3'], m, tok, batch_size=1), device, 'embeddings')
        m2, _ = load_encoder(m)
        assert m2 is m and e.shape == (2, 64)
        return f"embed {tuple(e.shape)} {e.dtype}"

    def hooks():
        out = []
        for arch in ('llama', 'gpt2', 'gemma2', 'phi3', 'olmoe'):
            m = lm(arch, device, dtype, n_layers=2)
            with untouched(m):
                assert layout(m) is not None and len(all_sites(m)) == 12 and module_paths(m) and resolve(m, as_site('resid_post(1)')).path
                with torch.no_grad(), capture(m, [resid_post(0), head_out(1), head_q(0)]) as c: m(to_model(m, ids()))
                on(c[resid_post(0)], device, 'captured'); assert c[resid_post(0)].dtype == dtype
                with torch.no_grad(), patch(m, {resid_post(0): add(torch.ones(64)), attn_out(1): scale(0.5)}): on(m(to_model(m, ids())).logits, device, 'patched logits')
                mu = head_means(m, ids(), batch_size=1)
                with torch.no_grad(), ablate_heads(m, {1: [0]}, how='mean', means=mu), ablate_heads(m, {0: [1]}, how='scale_query'): on(m(to_model(m, ids())).logits, device)
                with capture_grads(m, [resid_post(0), head_out(1)]) as g: g.backward(m(to_model(m, ids())).logits.float().sum())
                on(g.grads[head_out(1)], device, 'gradient')
                with capture_grads(m, [resid_post(0), resid_post(1)], on_grad=lambda site, gr: gr.float().square().sum(), keep_acts=False) as g2:
                    g2.backward(m(to_model(m, ids())).logits.float().sum(), wrt=[resid_post(0)])
                on(g2.grads[resid_post(1)], device, 'reduced gradient'); assert len(g2.acts) == 0
                with hooked([]): pass
                lins = linear_modules(m)
                w = weight_matrix(next(iter(lins.values())))
                assert is_linear(next(iter(lins.values()))) and w.device.type == device.type
                on(norm_gain(final_norm(m)), device, 'norm gain')
                assert norm_eps(mlp_norm(m, 0)) > 0   # every pre-LN family here has a norm in front of its MLP
            out.append(arch)
        return ', '.join(out)

    def sae():
        m = lm('llama', device, dtype)
        with untouched(m): chunks = list(stream_activations(m, ids(8, 10), 'resid_post(0)', batch_size=4))
        s = SAE(64, 32, 'topk', k=4).to(device=device, dtype=dtype)
        res = train_sae(s, torch.cat(chunks), steps=3, batch_size=16, progress=False)
        met = sae_metrics(s, torch.cat(chunks).to(device))
        x, D = planted_data(64, d=8, n_features=8)
        finite(match_directions(D.to(device), D.to(device))); finite(normalized_mse(x, x * 0.9))
        return f"{met} loss {res.final_loss:.3g}"

    def train():
        m = lm('llama', device, dtype)
        batch = {'input_ids': ids(4, 8)}
        res = fit(m, [batch], lm_loss, steps=2, lr=1e-3, progress=False)
        finite(res.final_loss); assert 0 < lr_factor(1, 10, 2) <= 1
        with tempfile.TemporaryDirectory() as d:
            save_asset('smoke', m, {'dtype': str(dtype)}, folder=d)
            tensors, meta = load_asset('smoke', folder=d)
            m2 = lm('llama', device, dtype); load_asset_into(m2, 'smoke', folder=d)
        assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
        state = lambda: torch.cuda.get_rng_state(device) if device.type == 'cuda' else torch.get_rng_state()
        before = state()
        with seeded(0): a = torch.randn(3, device=device, dtype=dtype)
        with seeded(0): b = torch.randn(3, device=device, dtype=dtype)
        assert torch.equal(a, b) and torch.equal(state(), before)   # the same draws inside; the caller's state is back
        return f"loss {res.history.loss.iloc[0]:.3g} -> {res.final_loss:.3g}"

    def testing_and_display():
        m = lm('gpt2', device, dtype)
        s = snapshot(m)
        with torch.no_grad(): m.lm_head.weight.mul_(2)
        assert differences(s, snapshot(m)), 'a change was not seen'
        t = torch.randn(3, 4, device=device, dtype=dtype)
        a = to_numpy(t)
        fig = heatmap(t)
        import matplotlib.pyplot as plt; plt.close('all')
        return f"{brief(t)}, numpy {a.dtype}"

    def diffusion():
        import diffusers
        g = torch.Generator().manual_seed(0)
        c, u = (torch.randn(3, 1, 8, 8, generator=g).to(device=device, dtype=dtype) for _ in range(2))
        ab = torch.tensor([0.9, 0.5, 0.1])
        x0 = to_x0(c, u, ab, 'v_prediction')
        for o in (x0, from_x0(x0, u, ab, 'v_prediction'), to_x0(c, u, 0.3), from_x0(c, u, 0.3)): assert on(o, device).dtype == dtype
        cfg = lambda c_, u_, w: u_ + w * (c_ - u_)   # classifier-free guidance
        m = digit_unet(block_out_channels=(8, 16)).to(device=device, dtype=dtype).train()
        labels, got = torch.tensor([1, 7]), []
        with untouched(m):
            for name in SUPPORTED_SCHEDULERS:
                x = on(sample(m, getattr(diffusers, name)(num_train_timesteps=1000), labels, NULL_CLASS, (1, 8, 8), cfg, 3., steps=4, batch_size=3), device, name)
                got.append(f"{name.replace('Scheduler', '')} {x.abs().mean().item():.2f}")
            # float conditions (a dict with embeddings) go to the model's device and dtype; a forward reading them must see that
            seen = []
            def fwd(model, x, t, c):
                seen.append((x.device.type, x.dtype, c['emb'].device.type, c['emb'].dtype, c['lab'].device.type))
                return class_forward(model, x, t, c['lab'])
            cond = {'lab': labels, 'emb': torch.zeros(2, 4)}
            null = {'lab': torch.full((2,), NULL_CLASS), 'emb': torch.ones(2, 4)}
            on(sample(m, diffusers.DDIMScheduler(**DIGIT_SCHEDULER), cond, null, (1, 8, 8), cfg, 3., steps=2, space='pred', forward=fwd), device, 'dict conditions')
        assert set(seen) == {(device.type, dtype, device.type, dtype, device.type)}, seen
        mu = digit_unet(block_out_channels=(8, 16), num_class_embeds=None).to(device=device, dtype=dtype)   # unconditional: called as model(x, t)
        with untouched(mu): on(sample(mu, diffusers.DDPMScheduler(**DIGIT_SCHEDULER), None, None, (1, 8, 8), steps=3, n=3, batch_size=2), device, 'unconditional')
        return '; '.join(got)

    def digit_model():
        import diffusers
        unet, _, meta = load_digit_diffusion()
        unet = unet.to(device=device, dtype=dtype)
        xr, y = digit_images('test', classes=(0, 1))
        assert set(y.tolist()) == {0, 1} and len(xr) == len(y)
        with untouched(unet):
            x = on(sample(unet, diffusers.DDIMScheduler(**meta['scheduler']), torch.arange(10), NULL_CLASS, (1, 8, 8), steps=6), device, 'digits')
        return f"DDIM, 10 digits without guidance: mean |x| {x.float().abs().mean().item():.2f}"

    return [('models', models), ('encoder', encoder), ('hooks', hooks), ('sae', sae), ('train', train), ('testing', testing_and_display),
            ('diffusion', diffusion), ('digit model', digit_model)]
