"""Tests of interpkit.demos.bilinear: the digit classifier's recipe against a loop written out with the core's `fit`, the
character-level language model's recipe (short, deterministic, learning) and its shipped weights (a loss far below a uniform guess)."""
import math
import pytest, torch
from torch import nn
import torch.nn.functional as F
from interpkit.data import corpus, digits
from interpkit.train import Shipped, Trained, fit
from interpkit.papers.bilinear import BilinearClassifier, eigen, token_interaction
from interpkit.demos.bilinear import CHAR_LM, train_bilinear_classifier, train_char_lm, load_char_lm

def test_train_digit_classifier_is_the_recipe_written_out():
    r = train_bilinear_classifier(weight_decay=0.1, noise=0.2, steps=15, seed=3)
    assert isinstance(r, Trained) and r.tokenizer is None and len(r.fit.history) == 15 and not r.model.training
    x_tr, y_tr, _, _ = digits()
    ref = BilinearClassifier(seed=3)
    def batches(step, g):
        i = torch.randint(0, len(x_tr), (256,), generator=g)
        return x_tr[i] + 0.2 * torch.randn(x_tr[i].shape, generator=g), y_tr[i]
    fit(ref, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1]), steps=15, lr=1e-3, weight_decay=0.1, seed=3, progress=False)
    for (k, a), b in zip(r.model.state_dict().items(), ref.state_dict().values()): assert torch.equal(a, b), k
    model, tokenizer, res = train_bilinear_classifier(steps=2)   # unpacks as (model, tokenizer, fit)
    assert isinstance(model, BilinearClassifier) and tokenizer is None and len(res.history) == 2

def test_train_digit_classifier_learns():
    model, _, res = train_bilinear_classifier(steps=60, seed=1)
    _, _, x_te, y_te = digits()
    with torch.no_grad(): acc = (model(x_te).argmax(-1) == y_te).float().mean().item()
    assert acc > 0.8, acc   # 60 steps of the paper's recipe: far above chance (0.1)
    assert res.history.loss.iloc[-10:].mean() < res.history.loss.iloc[:10].mean() / 2

def test_train_char_lm_short_and_deterministic():
    m1, tok1, r1 = train_char_lm(steps=30, batch_size=8, n_tokens=20_000)
    m2, _, _ = train_char_lm(steps=30, batch_size=8, n_tokens=20_000)
    assert m1.state_dict().keys() == m2.state_dict().keys() and all(torch.equal(v, m2.state_dict()[k]) for k, v in m1.state_dict().items())
    h = r1.history['loss']
    assert len(h) == 30 and h.iloc[-5:].mean() < h.iloc[:5].mean() - 0.3
    assert isinstance(m1.model.layers[0].mlp.act_fn, nn.Identity) and not m1.training
    assert tok1.encode('Hi') == [72, 105] and tok1.decode([72, 105]) == 'Hi'

def test_shipped_char_lm():
    shipped = load_char_lm()
    assert isinstance(shipped, Shipped)
    lm, tokenizer, meta = shipped
    assert meta['tiny_lm'] == CHAR_LM and meta['steps'] == 1000
    assert isinstance(lm.model.layers[0].mlp.act_fn, nn.Identity)
    b = corpus(64 * 65, tokenizer, block=65, seed=1)
    with torch.no_grad(): lg = lm(b[:, :-1]).logits
    loss = F.cross_entropy(lg.flatten(0, 1), b[:, 1:].flatten()).item()
    assert loss < 2.3 < math.log(128)                               # trained: far below the uniform 4.85
    assert eigen(token_interaction(lm, ord('\n'))).vals.shape == (64,)

