"Smoke checks of paper 7 (safety heads) and its demo module interpkit.demos.safety_heads: Ships, Sahara, generation under ablation and adapters on tiny models."
import torch
from _util import lm, on, finite, ids, untouched, tiny_tokenizer
from interpkit.hooks import head_means
from interpkit.papers.safety_heads import (chat_prompts, generate, refusal_rate, harmful_batch, next_token_logits, kl_div, ships, subspace_angle,
                                           sahara, head_effect, query_weights, ablation_outcomes, head_map)
from interpkit.demos.safety_heads import merge_adapter, adapter_tensors, train_aligned_lm

NOT_SMOKED = {  # public names with nothing device- or dtype-specific to run
    'requests': 'templated strings', 'is_refusal': 'a keyword match on strings', 'replies_changed': 'compares strings',
    'specificity': 'arithmetic on an AblationOutcomes table',
    'load_aligned_lm': 'loads SmolLM2 from disk (the tests check it); its merge is `merge_adapter`, smoked',
    'SaharaResult': 'made by sahara', 'HeadEffect': 'made by head_effect', 'AblationOutcomes': 'made by ablation_outcomes',
}

def checks(device, dtype):
    tokenizer = tiny_tokenizer()

    def ships_and_sahara():
        out = []
        for arch in ('llama', 'gpt2'):
            m = lm(arch, device, dtype, n_layers=2)
            b = {'input_ids': ids(3, 7), 'attention_mask': torch.ones(3, 7, dtype=torch.long)}
            b['attention_mask'][0, :2] = 0
            with untouched(m):
                s = on(ships(m, b, batch_size=2), device, 'ships')
                s_all = ships(m, b, heads=[(-1, 0), (0, 1)], last_only=False, how='zero')
                on(s_all[[1, 0], [0, 1]], device, 'ships (every position)')
                mu = head_means(m, b, batch_size=2)
                on(ships(m, b, heads=head_map([(1, 0)]), how='mean', means=mu).nan_to_num(), device, 'ships (mean)')
                lg = on(next_token_logits(m, b, [(0, 0)], last_only=True), device, 'next-token logits')
                finite(kl_div(lg, lg.flip(0)))
                res = sahara(m, b, budget=2, candidates=[(0, 0), (1, 1), (1, 2)], batch_size=2)
                finite(torch.tensor(res.angles)); finite(subspace_angle(lg, lg + 1))
            out.append(f"{arch} ships max {s.max().item():.2g} (all positions {s_all.nan_to_num().max().item():.2g}), sahara {res.heads}")
        return '; '.join(out)

    def generation():
        m = lm('llama', device, dtype, n_layers=2)
        with untouched(m, tokenizer):
            r = generate(m, tokenizer, ['w1 w2', 'w3'], 3, heads=[(1, 0)], batch_size=1)
            e = head_effect(m, tokenizer, 'w1 w2', -1, 0, 3, how='zero')
            o = ablation_outcomes(m, tokenizer, ['w1', 'w2 w3'], {'none': [], 'L1H0': [(1, 0)]}, harmless=['w4'], max_new_tokens=2)
            finite(torch.tensor(o.table.values.astype(float)))
            enc = harmful_batch(tokenizer, ['w1'])
        assert len(r) == 2 and isinstance(e.ablated, str) and enc['input_ids'].shape[0] == 1 and query_weights(m) > 0
        return f"replies {r}, rate {refusal_rate(r)}, {len(chat_prompts(tokenizer, ['w1']))} prompt"

    def adapters():
        import peft
        out = []
        for arch, targets in (('gpt2', ['c_attn', 'attn.c_proj']), ('llama', ['q_proj', 'o_proj'])):
            m = lm(arch, device, dtype, n_layers=2)
            torch.manual_seed(0)
            pm = peft.get_peft_model(tiny_lm_copy(m), peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets, init_lora_weights=False)).eval()
            x = ids(2, 6).to(device)
            with untouched(m):
                merged = merge_adapter(m, adapter_tensors(pm), 2.)
                with torch.no_grad(): got, want = merged(input_ids=x).logits, pm(input_ids=x).logits
            on(got, device, 'merged logits')
            err = (got.float() - want.float()).abs().max().item()
            assert err < (0.1 if dtype == torch.bfloat16 else 1e-4), f"{arch}: merged logits differ from peft's by {err}"
            out.append(f"{arch} |merged - peft| {err:.2g}")
        m = lm('llama', device, dtype, n_layers=1, max_len=128)
        with untouched(m, tokenizer):
            aligned, _, res = train_aligned_lm(m, tokenizer, steps=1, batch_size=2, rank=2, answer_tokens=2, progress=False, harmful=['w1'], harmless=['w2'])
        on(next(aligned.parameters()), device, 'aligned weights')
        return ', '.join(out) + f", recipe loss {res.final_loss:.3g}"

    return [('ships_sahara', ships_and_sahara), ('generation', generation), ('adapters', adapters)]

def tiny_lm_copy(m):
    "A copy for peft to wrap (peft changes the model it is given)."
    import copy
    return copy.deepcopy(m)
