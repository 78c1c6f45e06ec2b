"Smoke checks of interpkit.papers.position_coupling and interpkit.demos.position_coupling: the coupled, absolute and position-free transformers, collate, the loss, exact match, greedy decoding, the accuracy grid, a short training run and the shipped adders."
import random
import torch
from _util import on, finite, untouched
from interpkit.train import assets_dir
from interpkit.papers.position_coupling import (CoupledTransformer, encode_addition, encode_multiplication, collate_batch, answer_loss, exact_match,
                                                greedy_answer, evaluation_problems, accuracy_grid)
from interpkit.demos.position_coupling import ADDERS_ASSET, AdderRecipe, train_adder, training_problem, load_adder, load_grids

NOT_SMOKED = {
    'padded_width': 'device-free arithmetic', 'check_operands': 'device-free input checking', 'Encoded': 'made by encode_addition',
    'parse_answer': 'device-free text parsing', 'position_table': 'device-free table of an Encoded',
    'sample_operands': 'device-free sampling (training_problem uses it)', 'ShippedGrids': 'made by load_grids', 'random_starts': 'device-free sampling (training_problem uses it)',
    'in_range': 'device-free DataFrame logic', 'summarize': 'device-free DataFrame logic', 'plot_position_ids': 'a matplotlib figure of an Encoded',
}

TINY = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32)

def checks(device, dtype):
    def models():
        out = []
        probs = [encode_addition([57, 8, 123]), encode_addition([4, 5], starts=(3, 2)), training_problem(0, AdderRecipe(table_size=21))]
        for positions in ('coupled', 'absolute', 'none'):
            torch.manual_seed(0)
            m = CoupledTransformer(positions, 2, 21, 128, **TINY).to(device=device, dtype=dtype).train()
            with untouched(m):
                batch = collate_batch(probs, device)
                assert all(v.device.type == device.type for v in batch.values())
                with torch.no_grad():
                    on(m(batch['input_ids'], batch['position_ids']), device, f'{positions} logits')
                    loss = on(answer_loss(m, collate_batch(probs)), device, f'{positions} loss')    # a CPU batch: moved to the model
                em = exact_match(m, probs, batch_size=2)
                assert em.dtype == torch.bool and em.shape == (3,)
                text = greedy_answer(m, probs[0])
                assert isinstance(text, str) and len(text) <= len(probs[0].text) - probs[0].answer_start
            assert m.training
            out.append(f"{positions} loss {float(loss):.2f}")
        return ', '.join(out) + f", {dtype}"

    def multiplication():
        torch.manual_seed(0)
        m = CoupledTransformer('coupled', 3, 16, **TINY).to(device=device, dtype=dtype)
        probs = [encode_multiplication(123, 45), encode_multiplication(7, 86)]
        with untouched(m):
            with torch.no_grad(): loss = on(answer_loss(m, collate_batch(probs)), device, 'multiplication loss')
            em = exact_match(m, probs)
            greedy_answer(m, probs[1])
        return f"loss {float(loss):.2f}, exact {int(em.sum())}/2"

    def grid():
        torch.manual_seed(0)
        m = CoupledTransformer('coupled', 1, 16, **TINY).to(device=device, dtype=dtype).eval()
        with untouched(m):
            g = accuracy_grid(m, digits=[1, 2], counts=[2, 3], n=8, scratchpad=False, batch_size=5)
            em = exact_match(m, evaluation_problems(3, 4, 6, scratchpad=False))
        finite(torch.tensor(g.to_numpy(dtype=float)), 'grid')
        assert g.shape == (2, 2) and em.shape == (6,)
        return f"grid mean {g.to_numpy(dtype=float).mean():.2f}"

    def training():
        r = AdderRecipe(scratchpad=False, max_digits=2, counts=(2, 3), table_size=10, steps=3, batch_size=4, **TINY)
        m, tok, res = train_adder(r, device=device, progress=False)
        assert tok is None and not m.training and all(p.device.type == device.type for p in m.parameters())
        finite(torch.tensor(res.history['loss'].to_numpy()), 'training loss')
        with untouched(m): exact_match(m, evaluation_problems(1, 2, 4, scratchpad=False))
        return f"3 steps, loss {res.final_loss:.2f} (float32)"

    def shipped():
        if not (assets_dir()/f'{ADDERS_ASSET}.safetensors').exists(): return f"{ADDERS_ASSET} not built yet: skipped"
        grids = load_grids().grids
        m, _, _ = load_adder('coupled')
        m = m.to(device=device, dtype=dtype)
        probs = evaluation_problems(3, 3, 50)
        with untouched(m): acc = exact_match(m, probs).float().mean().item()
        return f"coupled adder, 3 digits x 3 operands: {acc:.2f} here, {grids['coupled'].loc[3, 3]:.2f} shipped ({dtype})"

    return [('models', models), ('multiplication', multiplication), ('accuracy_grid', grid), ('train_adder', training), ('shipped', shipped)]
