"Smoke checks of interpkit.papers.bilinear and its demo module interpkit.demos.bilinear: the classifier's eigendecomposition, truncation and attacks, nudge_probs, the bilinear LM readouts."
import torch
from torch import nn
from _util import lm, on, finite, untouched
from interpkit.papers.bilinear import (Bilinear, BilinearClassifier, interaction_matrix, bilinear_form, class_interactions, classifier_inputs,
                                       eigen, to_input_space, truncate, truncated_logits, truncated_accuracy, eigen_attack,
                                       to_bilinear, mlp_interaction, token_interaction, token_readout, nudge_probs)
from interpkit.demos.bilinear import load_char_lm
from interpkit.stats import effective_rank

NOT_SMOKED = {
    'Eigen': 'made by eigen', 'AttackResult': 'made by eigen_attack',
    'train_char_lm': 'a CPU recipe with no device argument; tests/test_bilinear_demo.py runs a short version',
    'train_bilinear_classifier': 'a CPU recipe with no device argument; tests/test_bilinear_demo.py runs it against the loop written out',
}

def checks(device, dtype):
    def classifier():
        clf = BilinearClassifier(d_input=16, d_hidden=8, n_classes=3).to(device=device, dtype=dtype)
        x, y = torch.rand(10, 16), torch.randint(0, 3, (10,))     # on the CPU, in float32: the functions move and cast them
        with untouched(clf):
            B = on(class_interactions(clf), device, 'class matrices')
            e = eigen(B)
            on(e.vecs, device, 'eigenvectors'); finite(effective_rank(e.vals))
            h = on(classifier_inputs(clf, x), device, 'inputs')
            on(bilinear_form(B, h), device, 'quadratic forms'); on(truncate(e, h, 2), device, 'truncation')
            on(truncated_logits(clf, x, 2, batch_size=4), device, 'truncated logits')
            acc = truncated_accuracy(clf, x, y, [1, 16], batch_size=4)
            res = eigen_attack(clf, x, 0.5, batch_size=4)
            on(res.x_adv, device, 'adversarial inputs'); assert res.pred.device.type == device.type
            eh = eigen(class_interactions(clf, 'hidden'))
            on(to_input_space(eh.vecs[:, 0], clf.embed), device, 'eigenvectors in pixels')
            on(interaction_matrix(clf.layer.w.weight, clf.layer.v.weight, torch.ones(8)), device, 'interaction matrix')
        layer = Bilinear(4, 3).to(device=device, dtype=dtype)
        on(layer(torch.ones(2, 4, device=device, dtype=dtype)), device, 'bilinear layer')
        return f"B {B.dtype}, rank-16 accuracy {acc.accuracy.iloc[-1]:.2f}, flip {res.flip_eigen:.2f}"

    def nudge():
        cnn = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Dropout(0.5), nn.Flatten(), nn.Linear(128, 4)).to(device=device, dtype=dtype).train()
        x, d = torch.rand(1, 8, 8), torch.randn(64)
        class AsDict(nn.Module):
            def __init__(self): super().__init__(); self.net = cnn
            def forward(self, x): return {'logits': self.net(x)}
        wrapped = AsDict()
        with untouched(cnn): p, q = on(nudge_probs(cnn, x, d, 1.), device, 'probabilities'), on(nudge_probs(wrapped, x, d, 1.), device, 'probabilities')
        assert torch.equal(p, q) and abs(float(p.sum()) - 1) < 1e-3 and cnn.training
        return f"probabilities {p.dtype}, train mode kept"

    def language_models():
        out = []
        for arch in ('llama', 'gemma2', 'phi3'):
            m = to_bilinear(lm(arch, device, dtype, n_layers=1))
            fold = 'fold' if arch == 'gemma2' else 'raise'
            with untouched(m):
                B = on(mlp_interaction(m, torch.ones(64), 0, fold), device, 'MLP interaction')
                Bt = on(token_interaction(m, 3, -1, fold), device, 'token interaction')
                e = eigen(Bt)
                r = token_readout(m, e.vecs[0], top_k=4)
                r2 = token_readout(m, e.vecs[0], top_k=2, tokens=[1, 2, 3])
            finite(torch.tensor(r.score.tolist())); assert set(r2.id) <= {1, 2, 3}
            out.append(f"{arch} {B.dtype}")
        return ', '.join(out)

    def char_lm():
        m, tokenizer, meta = load_char_lm()
        m = m.to(device=device, dtype=dtype)
        with untouched(m):
            e = eigen(token_interaction(m, ord('\n')))
            r = token_readout(m, e.top(1, 'pos').vecs[0], top_k=6, tokenizer=tokenizer)
        return f"newline reads {''.join(r.token)!r}"

    return [('classifier', classifier), ('nudge_probs', nudge), ('language_models', language_models), ('char_lm', char_lm)]
