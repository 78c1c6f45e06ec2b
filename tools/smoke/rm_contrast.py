"Smoke checks of interpkit.papers.rm_contrast and its demo module interpkit.demos.rm_contrast: rewards from a tiny sequence classifier and from pooled hidden states (Llama 'last', BERT 'mean'), head features and a trained head, the lexicon and the demo data, explanations with their tables and views, the LM rewriter, and the shipped demo."
import numpy as np, torch, transformers
from _util import lm, finite, untouched, tiny_tokenizer
from interpkit.models import tiny_config
from interpkit.train import assets_dir
from interpkit.papers.rm_contrast import (RESPONSE_ATTRIBUTES, PreferencePair, Attribute, SpanEditor, as_comparisons, rewards, classifier_reward,
                                          head_reward, head_features, attribute, rewrite_prompts, LMRewriter, random_edit,
                                          syntactic_distance, semantic_distances, orient, perturbations, explain, coverage, sensitivity,
                                          local_sensitivity, representatives, perturbation_view, plot_sensitivity)
from interpkit.demos.rm_contrast import (PLANTED, RM_ASSET, train_reward_head, demo_response, demo_prompt, attribute_levels, planted_reward,
                                         demo_comparisons, load_rm_demo)

NOT_SMOKED = {'Span': 'made by Attribute.spans', 'Explanation': 'made by explain', 'RMDemo': 'made by load_rm_demo',
              'representatives_null': 'shuffles an Explanation table (numpy)', 'lexicon_detector': 'a phrase match on strings',
              'detector_shifts': 'calls a detector on strings; no model of the caller', 'revalidate': 'the same, on an Explanation table',
              'detector_agreement': 'the same, on strings', 'demo_heldout': 'reads the shipped demo split',
              'DescriptionDetector': 'runs the offline sentence encoder on the CPU (tests/test_rm_contrast.py)'}

P, R = ['w1 w2', 'w3', 'w4 w5 w6'], ['w7 w8 w9', 'w10', 'w11']

def checks(device, dtype):
    tok = tiny_tokenizer()
    def head(d=32, seed=0):
        torch.manual_seed(seed)
        return torch.nn.Linear(d, 1).to(device=device, dtype=dtype)

    def classifier():
        cfg = tiny_config('llama', d_model=32, num_labels=1, pad_token_id=1)
        cfg._attn_implementation = 'eager'
        torch.manual_seed(0)
        m = transformers.LlamaForSequenceClassification(cfg).eval().to(device=device, dtype=dtype)
        with untouched(m, tok):
            rm = classifier_reward(m, tok)
            s = rm(P, R)
            r = rewards(rm, P, R, batch_size=2)
            chat = classifier_reward(m, tok, template='chat')(P, R)
        assert s.shape == (3,) and s.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) and r.dtype == np.float64 and chat.shape == (3,)
        finite(s, 'classifier rewards'); finite(chat, 'chat rewards')
        np.testing.assert_allclose(r, s.cpu().numpy(), atol=0.05 if dtype == torch.bfloat16 else 1e-4)
        return f"logits {np.round(r, 3).tolist()} ({dtype})"

    def heads():
        out = []
        for arch, pooling in (('llama', 'last'), ('bert', 'mean')):
            m, h = lm(arch, device, dtype, d_model=32, seed=1), head()
            with untouched(m, tok, h):
                s = head_reward(m, tok, h, pooling=pooling)(P, R)
                f = head_features(m, tok, P, R, pooling=pooling, batch_size=2)
            assert s.shape == (3,) and f.shape == (3, 32) and f.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) and f.device.type == 'cpu' and tok.pad_token is None
            finite(s, f'{arch} head reward'); finite(f, f'{arch} features')
            out.append(f"{arch} {pooling} |f| {f.norm():.2e}")
        g = torch.Generator().manual_seed(0)
        c, r = torch.randn(64, 8, generator=g) + 0.5, torch.randn(64, 8, generator=g)
        t = train_reward_head(c, r, steps=50, seed=0)
        finite(t.model.weight, 'trained head')
        return ', '.join(out) + f" ({dtype})"

    def lexicon_and_demo():
        cs = as_comparisons(demo_comparisons(4, PLANTED['helpful'], seed=0, beta=np.inf))
        a = attribute('conciseness')
        y = demo_response(0, {b.name: [-1]*len(b.pairs) for b in RESPONSE_ATTRIBUTES})
        assert demo_response(1, seed=0) == demo_response(1, seed=0) != demo_response(1, seed=1)
        e = SpanEditor()([y], a, 1)[0]
        x = random_edit(y, e, a, seed=0)
        assert isinstance(cs[0], PreferencePair) and isinstance(a, Attribute) and attribute_levels(e)['conciseness'] == 1
        assert demo_prompt(0).startswith('How do I') and planted_reward([e], {'conciseness': 1.0})[0] == 1.0
        assert 0 < syntactic_distance(y, e) <= 1 and 0 < syntactic_distance(y, x) <= 1 and len(rewrite_prompts('q', y, a, 1)) == 2
        return f"{len(cs)} comparisons, {len(x.split())} words in the random edit"

    explained = {}
    def explanations():
        m, h = lm('llama', device, dtype, d_model=32, seed=2), head(seed=2)
        enc = lm('bert', device, dtype, d_model=32, seed=3).bert
        rm = head_reward(m, tok, h)
        cs = demo_comparisons(3, PLANTED['harmless'], seed=1, beta=np.inf)
        with untouched(m, tok, h, enc):
            oc, m0, sw = orient(rm, cs)
            t = perturbations(oc, ['politeness', 'formality', 'directness'], baseline=True)
            ex = explain(rm, cs, attributes=['politeness', 'formality', 'directness'], baseline=True, embedder=enc, embedder_tokenizer=tok, batch_size=4)
            d = semantic_distances(['w1 w2', 'w3'], ['w1', 'w3'], enc, tok)
        assert len(t) == len(ex.table) == 3*3*3*2 and len(oc) == 3 and (m0 >= 0).all()
        finite(torch.tensor(ex.table[['margin', 'new_margin', 'syntactic', 'semantic']].to_numpy(np.float64)), 'explanation table')
        finite(torch.tensor(d), 'semantic distances')
        cov, sens, loc = coverage(ex), sensitivity(ex), local_sensitivity(ex, 'random')
        rep = representatives(ex, top_k=2, min_attributes=2)
        v = perturbation_view(ex, 0, 'politeness', 'both')
        import matplotlib.pyplot as plt
        plt.close(plot_sensitivity({'rm': sens}, {'rm': PLANTED['harmless']}).figure)
        explained['ex'] = ex
        return f"{int(ex.table.counterfactual.sum())} CFs, {int(ex.table.semifactual.sum())} SFs, {len(rep)} representatives, view {v.shape} ({dtype})"

    def rewriter():
        m = lm('llama', device, dtype, d_model=32, seed=4)
        with untouched(m, tok):
            lmr = LMRewriter(m, tok, max_new_tokens=5, list_tokens=3, batch_size=2)
            out = lmr(['w1 w2', 'w3', 'w4 w5'], attribute('politeness'), -1, ['w6', 'w7', 'w8'])
        assert len(out) == 3 and all(o is None or isinstance(o, str) for o in out) and len(lmr.transcripts) == 3
        return f"{sum(o is not None for o in out)} of 3 rewrites ({dtype})"

    def demo():
        if not (assets_dir()/f'{RM_ASSET}.safetensors').exists(): return f"{RM_ASSET} not built yet: skipped"
        from interpkit.models import load_encoder
        enc, etok = load_encoder(dtype=dtype, device=device)
        with untouched(enc, etok):
            dm = load_rm_demo(enc, etok)
            ex = dm.explanations['helpful']
            live = explain(dm.reward_models['helpful'], ex.comparisons[:1], attributes=['specificity'], embedder=False)
        shipped = ex.table[(ex.table.comparison == 0) & (ex.table.attribute == 'specificity') & (ex.table.editor == 'attribute')]
        finite(torch.tensor(live.table.new_margin.to_numpy()), 'live margins')
        err = float(np.abs(live.table.new_margin.to_numpy() - shipped.new_margin.to_numpy()).max())
        assert err < (0.5 if dtype == torch.bfloat16 else 1e-3), err
        return f"{len(dm.comparisons['helpful'])} comparisons, live vs shipped margin {err:.1e} ({dtype})"

    return [('classifier', classifier), ('heads', heads), ('lexicon_and_demo', lexicon_and_demo), ('explanations', explanations),
            ('rewriter', rewriter), ('demo', demo)]
