"Smoke checks of the core: models, hooks, sae, train, testing, results, viz, diffusion (APG's digit model is checked in apg.py)."
import tempfile
import torch
from torch import nn
from _util import lm, on, finite, ids, untouched, tiny_tokenizer
from interpkit.models import (tiny_config, model_device, model_dtype, to_model, load_lm, evaluating, check_causal_lm, pad_id, padding, chat, chat_replies, logits_at,
                              mask_positions, encode_left, pad_right, check_batch_size, iter_batches, prefix_step, load_encoder, embed, logits_of,
                              word_vocab, word_tokenizer, encode_texts, encode_queries, chat_text, generate_greedy, check_batch, resolve_lm)
from interpkit.hooks import (as_site, layout, module_paths, resolve, all_sites, is_linear, weight_matrix, linear_modules, final_norm, norm_gain,
                             mlp_norm, norm_eps,
                             hooked, capture, capture_grads, add, scale, patch, head_means, ablate_heads, resid_post, head_out, head_q, attn_out)
from interpkit.sae import SAE, normalized_mse, sae_metrics, stream_activations, train_sae, planted_data, match_directions
from interpkit.train import lr_factor, fit, save_asset, load_asset, load_asset_into, lm_loss, seeded, train_tiny_lm, save_tiny_lm, load_tiny_lm
from interpkit.testing import snapshot, differences
from interpkit.results import brief
from interpkit.viz import to_numpy, heatmap
from interpkit.diffusion import to_x0, from_x0, denoiser_forward, check_scale, sample, training_target, train_ddpm, SUPPORTED_SCHEDULERS

from interpkit.grads import (Task, LMTask, grad_modules, grad_shape, make_projection, project_flat, adam_moments, factor_moments, check_grad_setup,
                             per_example_grads, lm_labels)

from interpkit.stats import effective_rank, linear_probe

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'check_in_memory': 'a check (tests/test_device_map.py)', 'frozen': 'autograd flags, no device maths (checked on the models page; used by CNL and TED)', 'on_execution_device': 'a context for accelerate-offloaded models (tests/test_device_map.py)', 'rank_world': 'process-group plumbing, no device maths (two-process tests in tests/test_parallel*.py)', 'share': 'process-group plumbing', 'rows_of_mine': 'process-group plumbing', 'all_sum': 'process-group plumbing', 'gather_rows': 'process-group plumbing', 'launch': 'starts processes',
    'tiny_lm': 'used by every check', 'tiny_tokenizer': 'used by the chat checks', 'cache_dir': 'a path', 'assets_dir': 'a path',
    'quiet': 'reads the environment', 'as_random': 'Python random, no device', 'Heads': 'a type', 'StateDict': 'a type', 'DictView': 'a mixin of results', 'FieldsByName': 'a mixin of results', 'vocab_size': 'reads a size', 'check_token_ids': 'a check on ids', 'position_limit': 'reads a size', 'right_align': 'moves tokens (tested in test_train and test_g_effect)', 'check_template': 'a check', 'last_hidden_of': 'reads an output', 'check_seed': 'a check', 'check_texts': 'a check', 'check_denoiser': 'a check, run by sample below', 'Site': 'a value', 'CANONICAL': 'constants', 'resid_pre': 'site names', 'mlp_out': 'site names',
    'ActCache': 'made by capture', 'GradCache': 'made by capture_grads', 'HookPoint': 'made by resolve', 'Layout': 'made by layout',
    'FitResult': 'made by fit', 'SAEMetrics': 'made by sae_metrics', 'result': 'a class decorator', 'untouched': 'used by every check',
    'mlp_linears': 'module paths of a block, nothing device-specific (tests/test_hooks.py covers every tiny architecture)',
    'Probe': 'made by linear_probe', 'Projection': 'made by make_projection', 'Shipped': 'a named tuple made by load_tiny_lm', 'Trained': 'a named tuple made by train_tiny_lm', 'pad_left': 'builds CPU tensors from id lists',
    'check_scale': 'checks a number',
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
            wt = word_tokenizer(word_vocab(['w1 w2 w3']))
            assert check_batch(to_model(m, enc), left_padded=True, complete=True) is not None and resolve_lm(m, tok) == (m, tok)
            greedy = generate_greedy(m, tok, [chat_text(tok, 'w1 w2 w3'), chat_text(tok, 'w2')], max_new_tokens=3, batch_size=2)
            assert len(greedy) == 2 and all(isinstance(r, str) for r in greedy)
            for b in (encode_texts(wt, ['w1 w2', 'w3']), encode_queries(tok, ['w1 w2'], ['w3'])):
                with evaluating(m), torch.no_grad(): on(logits_of(m(**to_model(m, {k: b[k] for k in ('input_ids', 'attention_mask')}))), device, 'logits of an encoded batch')
        return f"chat {reply!r}"

    def encoder():
        m = lm('bert', device, dtype).bert
        with untouched(m): e = on(embed(m, ['w1 w2', 'w3'], tok, batch_size=1), device, 'embeddings')
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
        s = SAE(64, 32, 'topk', top_k=4).to(device=device, dtype=dtype)
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
        wt = word_tokenizer(word_vocab(['w1 w2 w3', 'w3 w1']))
        tm, _, tfit = train_tiny_lm(wt, ['w1 w2 w3', 'w3 w1'], steps=2, batch_size=2, progress=False, device=device, n_layers=1, d_model=16, n_heads=2, max_len=16)
        finite(tfit.final_loss); assert model_device(tm).type == device.type
        with tempfile.TemporaryDirectory() as d:
            save_tiny_lm(tm, wt, 'smoke_lm', folder=d)
            back = load_tiny_lm('smoke_lm', folder=d)
        assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(tm.state_dict().values(), back.model.state_dict().values()))
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
        from diffusers import UNet2DModel
        def unet(**kw):   # a small class-conditional UNet of 8x8 images with 10 classes and a null class 10 (APG's digit model, narrower)
            with torch.random.fork_rng():
                torch.manual_seed(0)
                return UNet2DModel(**{**dict(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16), norm_num_groups=8,
                                             down_block_types=('DownBlock2D',) * 2, up_block_types=('UpBlock2D',) * 2, num_class_embeds=11), **kw})
        NULL_CLASS, SCHED = 10, dict(num_train_timesteps=1000, beta_schedule='squaredcos_cap_v2', clip_sample=False)
        m = unet().to(device=device, dtype=dtype).train()
        labels, got = torch.tensor([1, 7]), []
        with untouched(m):
            for name in SUPPORTED_SCHEDULERS:
                x = on(sample(m, getattr(diffusers, name)(num_train_timesteps=1000), labels, NULL_CLASS, (1, 8, 8), cfg, 3., n_steps=4, batch_size=3), device, name)
                got.append(f"{name.replace('Scheduler', '')} {x.abs().mean().item():.2f}")
            # float conditions (a dict with embeddings) go to the model's device and dtype; a forward reading them must see that
            seen = []
            def fwd(model, x, t, c):
                seen.append((x.device.type, x.dtype, c['emb'].device.type, c['emb'].dtype, c['lab'].device.type))
                return denoiser_forward(model, x, t, c['lab'])
            cond = {'lab': labels, 'emb': torch.zeros(2, 4)}
            null = {'lab': torch.full((2,), NULL_CLASS), 'emb': torch.ones(2, 4)}
            on(sample(m, diffusers.DDIMScheduler(**SCHED), cond, null, (1, 8, 8), cfg, 3., n_steps=2, space='pred', forward=fwd), device, 'dict conditions')
        assert set(seen) == {(device.type, dtype, device.type, dtype, device.type)}, seen
        mu = unet(num_class_embeds=None).to(device=device, dtype=dtype)   # unconditional: called as model(x, t)
        with untouched(mu): on(sample(mu, diffusers.DDPMScheduler(**SCHED), None, None, (1, 8, 8), n_steps=3, n=3, batch_size=2), device, 'unconditional')
        return '; '.join(got)

    def ddpm_training():
        import diffusers
        g = torch.Generator().manual_seed(2)
        x0, eps, t = torch.randn(4, 1, 8, 8, generator=g), torch.randn(4, 1, 8, 8, generator=g), torch.tensor([1, 10, 500, 999])
        sched = diffusers.DDPMScheduler(num_train_timesteps=1000, prediction_type='v_prediction')
        on(training_target(sched, x0.to(device, dtype), eps.to(device, dtype), t.to(device)), device, 'v target')
        from diffusers import UNet2DModel
        with torch.random.fork_rng():
            torch.manual_seed(0)
            m = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 16), norm_num_groups=8,
                            down_block_types=('DownBlock2D',) * 2, up_block_types=('UpBlock2D',) * 2, num_class_embeds=3).to(device=device, dtype=dtype)
        images = torch.randn(12, 1, 8, 8, generator=g)   # on the CPU in float32: train_ddpm moves each batch to the model
        res = train_ddpm(m, sched, images, torch.arange(12) % 2, null=2, p_uncond=0.2, steps=2, batch_size=6, progress=False).fit
        finite(torch.tensor(res.history['loss'].tolist()))
        assert next(m.parameters()).dtype == dtype and next(m.parameters()).device.type == device.type
        return f"train_ddpm: loss {res.history['loss'].iloc[0]:.3f} -> {res.history['loss'].iloc[-1]:.3f}"


    def grads():
        m = lm('gpt2', device, dtype, n_layers=2, d_model=32)
        mods = grad_modules(m)
        b = dict(input_ids=ids(3, 8), attention_mask=torch.ones(3, 8, dtype=torch.long)); b['attention_mask'][0, 5:] = 0
        b['labels'] = lm_labels(b['input_ids'], b['attention_mask'])
        v = {n: torch.rand(p.shape, generator=torch.Generator().manual_seed(0)).to(device, p.dtype) + 0.1 for n, p in m.named_parameters()}
        proj = make_projection(mods, 'two_sided', 2, 2)
        check_grad_setup(mods, proj, v)
        with untouched(m):
            g = on(per_example_grads(m, b, LMTask(), proj=proj, moments=v, max_bytes=1), device, 'corrected projected gradients')
            on(per_example_grads(m, b, proj=proj, moments=factor_moments(v, mods)), device, 'factored')
            on(LMTask().logprob(m, b), device, 'log-probabilities')
        cnn = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * 16, 1)).to(device, dtype)
        x = torch.randn(4, 1, 4, 4).to(device, dtype)
        task = Task(loss=lambda model, batch: model(batch['x']).float().pow(2).sum(1))
        with untouched(cnn): c = on(per_example_grads(cnn, dict(x=x), task, bias=True, batch_size=3), device, 'CNN gradients with biases')
        assert c.shape == (4, sum(p.numel() for p in cnn.parameters())) and grad_shape(cnn[0], bias=True) == (2, 10)
        on(project_flat(c, 8), device, 'flat projection')
        opt = torch.optim.AdamW(cnn.parameters()); cnn(x).float().sum().backward(); opt.step(); cnn.zero_grad(set_to_none=True)
        assert set(adam_moments(cnn, opt)) == {n for n, _ in cnn.named_parameters()}
        return f"gpt2 {tuple(g.shape)} {g.dtype}, cnn {tuple(c.shape)}"

    def stats():
        on(effective_rank(torch.rand(3, 6, device=device).to(dtype)), device, 'effective rank')
        x, y = torch.randn(40, 3, device=device, dtype=dtype), torch.arange(40, device=device) % 2
        p = linear_probe(x, y, test_frac=0.5)   # scikit-learn, on the CPU
        assert 0 <= p.accuracy <= 1 and p.predict(x).shape == (40,)
        return f"probe {p.accuracy:.2f}"

    return [('models', models), ('encoder', encoder), ('grads', grads), ('stats', stats), ('hooks', hooks), ('sae', sae), ('train', train), ('testing', testing_and_display),
            ('diffusion', diffusion), ('DDPM training', ddpm_training)]
