"Smoke checks of interpkit.papers.dual_process and its demo module interpkit.demos.dual_process: the task's batches on a device, a BERT and two causal LMs scored at the masked positions, evaluation, forgetting inside `fit`, a short training run and the shipped runs with their curves."
import torch
from _util import lm, on, finite, untouched
from interpkit.train import assets_dir, fit
from interpkit.papers.dual_process import (POSTask, DualProcessRecipe, Forgetting, pos_bert, masked_logits, masked_loss, predictions, evaluate,
                                           train_dual_process, curves, run_summary)
from interpkit.demos.dual_process import RUNS_ASSET, SHIPPED_WEIGHTS, load_run, load_curves, recipe_of

NOT_SMOKED = {
    'zipf_pmf': 'device-free float64 arithmetic (POSTask.sample uses it)', 'context_completion': 'device-free rule on CPU token ids',
    'memorised_completion': 'device-free rule on CPU token ids', 'hard_accuracy': 'compares CPU predictions (predictions returns them on the CPU)',
    'evaluation_sets': 'device-free sampling (evaluate uses it)', 'reset_state': 'called by Forgetting on the optimizer of a device model',
    'plot_curves': 'a matplotlib figure of a DataFrame', 'EvaluationSets': 'made by evaluation_sets', 'Evaluation': 'made by evaluate',
    'ShippedCurves': 'made by load_curves',
}

TASK = POSTask(vocab=40, n_unseen=4, head=3)

def checks(device, dtype):
    def models():
        out = []
        batch = TASK.sample(6, 'train', seed=0)
        for name, m in (('bert', pos_bert(TASK, hidden=16, n_layers=1, intermediate=32)), ('gpt2', lm('gpt2', 'cpu', torch.float32, n_layers=1, d_model=16, vocab_size=TASK.n_tokens)),
                        ('llama', lm('llama', 'cpu', torch.float32, n_layers=1, d_model=16, vocab_size=TASK.n_tokens))):
            m = m.to(device=device, dtype=dtype)
            with untouched(m), torch.no_grad():
                lg = on(masked_logits(m, batch['input_ids']), device, f'{name} masked logits')     # CPU ids: moved to the model
                assert lg.shape == (6, 3, TASK.n_tokens) and lg.dtype == dtype
                loss = on(masked_loss(m, batch), device, f'{name} loss')
                p = predictions(m, batch['input_ids'], batch_size=4)
            assert p.shape == (6, 3) and p.device.type == 'cpu'
            out.append(f"{name} loss {float(loss):.2f}")
        return ', '.join(out) + f" ({dtype})"

    def evaluation():
        m = pos_bert(TASK, hidden=16, n_layers=1, intermediate=32).to(device=device, dtype=dtype).train()
        with untouched(m): e = evaluate(m, TASK, n=30, batch_size=16)
        finite(torch.tensor(list(e.row().values())), 'metrics')
        return f"val {e['val']:.2f}, holdout {e['holdout']:.2f} (random weights, {dtype})"

    def forgetting():
        m = lm('gpt2', device, torch.float32, n_layers=1, d_model=16, vocab_size=TASK.n_tokens)
        cb = Forgetting(every=2, until=5, moments='embeddings')
        res = fit(m, lambda step, g: TASK.sample(4, 'train', g), masked_loss, steps=6, lr=1e-2, progress=False, callback=cb)
        w = on(m.get_input_embeddings().weight.detach(), device, 'reset embeddings')
        finite(torch.tensor(res.history['loss'].to_numpy()), 'loss')
        assert cb.resets == [2, 4]
        return f"resets after steps {cb.resets}, embedding std {w.float().std():.2f} (float32)"

    def training():
        r = DualProcessRecipe(TASK, 'temporary', every=2, until=4, hidden=16, n_layers=1, intermediate=32)
        m, tok, res = train_dual_process(None, r, steps=4, batch_size=8, eval_every=2, eval_n=20, progress=False, device=device)
        assert tok is None and all(p.device.type == device.type for p in m.parameters())
        c = curves(res)
        finite(torch.tensor(c.to_numpy()), 'curves')
        return f"4 steps, loss {res.final_loss:.2f}, {len(c)} evaluations (float32)"

    def shipped():
        if not (assets_dir()/f'{RUNS_ASSET}.safetensors').exists(): return f"{RUNS_ASSET} not built yet: skipped"
        m, _, meta = load_run('temporary')
        m = m.to(device=device, dtype=dtype)
        task = recipe_of(meta, 'temporary').task
        with untouched(m): e = evaluate(m, task, n=200, seed=3)
        s = run_summary(load_curves()['temporary'])
        return f"temporary forgetting here: holdout {e['holdout']:.2f}, head IWL {e['iwl_head']:.2f}; shipped end {s['holdout']:.2f}, {s['iwl_head']:.2f} ({dtype})"

    return [('models', models), ('evaluate', evaluation), ('Forgetting', forgetting), ('train_dual_process', training), ('shipped', shipped)]
