"""Tests of interpkit.papers.dual_process (paper 1, Anand et al. ICLR 2025) against independent references: a row-by-row parser of
the templates, exact expected token frequencies (chi-square goodness of fit) and binomial rates, hand-written completions,
stand-in models whose answers are known, full-vocabulary logits, and snapshots of every parameter and optimizer moment around
each forgetting step."""
import dataclasses, inspect, math, warnings
import matplotlib
matplotlib.use('Agg')
import numpy as np, pandas as pd, pytest, torch
import torch.nn.functional as F
from scipy import stats
from torch import nn
from interpkit.errors import ConfigError, NotFiniteError, ShapeError
from interpkit.models import tiny_lm
from interpkit.train import Shipped, Trained, fit
import interpkit.papers.dual_process as dp
import interpkit.demos.dual_process as demo
from interpkit.papers.dual_process import (SPLITS, METRICS, FORGETTING, MOMENT_RESETS, zipf_pmf, POSTask, context_completion,
                                           memorised_completion, pos_bert, masked_logits, masked_loss, predictions, hard_accuracy,
                                           EvaluationSets, evaluation_sets, Evaluation, evaluate, reset_state, Forgetting, DualProcessRecipe,
                                           train_dual_process, curves)

torch.set_num_threads(1)

SMALL = POSTask(vocab=40, n_unseen=4, head=3)

# ---------------------------------------------------------------- the generator

def parse(task, row):
    "One sequence read by hand: (adjective, noun, query, completion), or an AssertionError if it breaks the template."
    ids, cop, mask = [int(t) for t in row], task.cop, task.mask
    assert ids[4:] == [mask] * 3, ids
    if ids[0] == cop: a, n = ids[1], ids[2]
    else: assert ids[1] == cop, ids; n, a = ids[0], ids[2]
    q = ids[3]
    assert q in (a, n), ids
    return a, n, q, ([a, a, a] if q == a else [a, n, n])

@pytest.mark.parametrize('split', SPLITS)
def test_templates_masks_and_labels_row_by_row(split):
    b = SMALL.sample(300, split, seed=5)
    for x, y in zip(b['input_ids'], b['labels']):
        a, n, q, done = parse(SMALL, x)
        assert y[:4].tolist() == [-100] * 4 and y[4:].tolist() == done
    # the two coins of the template are fair and independent of each other
    task = POSTask(vocab=400)
    x = task.sample(4000, split, seed=6)['input_ids']
    a, n = torch.where(x[:, 0] == task.cop, x[:, 1], x[:, 2]), torch.where(x[:, 0] == task.cop, x[:, 2], x[:, 0])
    x = x[a != n]                  # where the two slots hold one token, the query cannot tell the coin
    cop_first = (x[:, 0] == task.cop).numpy()
    adj_query = (x[:, 3] == torch.where(x[:, 0] == task.cop, x[:, 1], x[:, 2])).numpy()
    table = np.array([np.sum(cop_first & adj_query), np.sum(cop_first & ~adj_query), np.sum(~cop_first & adj_query), np.sum(~cop_first & ~adj_query)])
    assert stats.chisquare(table).pvalue > 1e-6, table   # level 1e-6: the false-failure rate of a fair sampler

def test_unseen_tokens_never_in_training_batches():
    task = POSTask(vocab=200, a=1.0)
    g = torch.Generator().manual_seed(0)
    seen = torch.cat([task.sample(256, 'train', g)['input_ids'].flatten() for _ in range(40)])
    assert not torch.isin(seen, task.unseen).any()
    assert not (seen == task.pad).any() and seen.max() <= task.mask
    # the other splits never use them either, except holdout, which uses nothing else
    for split in SPLITS[1:-1]: assert not torch.isin(task.sample(500, split, 1)['input_ids'], task.unseen).any()
    h = task.sample(500, 'holdout', 1)['input_ids'][:, :4]
    assert torch.isin(h[h != task.cop], task.unseen).all()
    assert (h[:, 0] == task.cop).sum() + (h[:, 1] == task.cop).sum() == 500

def expected_slot_frequencies(task, slot):
    """Exact probability of each id in the adjective ('A') or noun ('N') slot of a training sequence, by enumeration:
    the Zipf draw from its own list is kept unless it is ambiguous and the fair coin says swap; then a Zipf draw from the
    ambiguous tokens of the other list takes its place."""
    own, other = (task.adjectives, task.nouns) if slot == 'A' else (task.nouns, task.adjectives)
    amb_own, amb_other = (task.ambiguous[1], task.ambiguous[0]) if slot == 'A' else task.ambiguous
    r = np.arange(1, len(own) + 1, dtype=float)
    p_own = r ** -task.a / np.sum(r ** -task.a)
    p = np.zeros(task.n_tokens)
    swap_mass = 0.0
    for i, t in enumerate(own.tolist()):
        if t in set(amb_own.tolist()): p[t] += 0.5 * p_own[i]; swap_mass += 0.5 * p_own[i]
        else: p[t] += p_own[i]
    ra = np.arange(1, len(amb_other) + 1, dtype=float)
    p_amb = ra ** -task.a / np.sum(ra ** -task.a)
    for j, t in enumerate(amb_other.tolist()): p[t] += swap_mass * p_amb[j]
    return p

def gof(obs, exp):
    "Chi-square goodness-of-fit p-value; cells with an expected count under 5 are pooled into one (the usual validity rule)."
    obs, exp = np.asarray(obs, float), np.asarray(exp, float)
    assert obs[exp == 0].sum() == 0, "draws where none are expected"
    keep, small = exp >= 5, (exp < 5) & (exp > 0)
    o, e = obs[keep], exp[keep]
    if small.any(): o, e = np.append(o, obs[small].sum()), np.append(e, exp[small].sum())
    return stats.chisquare(o, e * o.sum() / e.sum()).pvalue

@pytest.mark.parametrize('a', [0.0, 1.2, 1.5])
@pytest.mark.parametrize('ambiguity', [0.0, 0.1])
def test_slot_frequencies_match_the_truncated_zipf_pmf(a, ambiguity):
    """Chi-square goodness of fit of 60k draws per slot to the exact frequencies. Level 1e-6 (the false-failure rate of a correct sampler, whatever
    the seed); a wrong exponent, a shifted rank or a missing swap gives p-values below 1e-10 (checked by the mutants below)."""
    task = POSTask(vocab=100, a=a, ambiguity=ambiguity, seed=3)
    x = task.sample(60000, 'train', seed=11)['input_ids']
    cop_first = x[:, 0] == task.cop
    slots = {'A': torch.where(cop_first, x[:, 1], x[:, 2]), 'N': torch.where(cop_first, x[:, 2], x[:, 0])}
    for slot, tokens in slots.items():
        p = expected_slot_frequencies(task, slot)
        obs = np.bincount(tokens.numpy(), minlength=task.n_tokens)
        assert gof(obs, p * len(tokens)) > 1e-6, slot

def test_wrong_exponents_are_rejected_by_the_same_test():
    "The goodness-of-fit test has power: draws with exponent 1.4, or ranks shifted by one, fail it."
    task = POSTask(vocab=100, a=1.5, ambiguity=0.0)
    p = expected_slot_frequencies(task, 'A')[task.adjectives]
    for wrong in (zipf_pmf(50, 1.4).numpy(), np.roll(zipf_pmf(50, 1.5).numpy(), 1)):
        draws = np.random.default_rng(0).choice(50, 60000, p=wrong / wrong.sum())
        assert gof(np.bincount(draws, minlength=50), p * 60000) < 1e-10

def test_ambiguous_tokens_in_both_roles_at_the_specified_rate():
    task = POSTask(vocab=200, a=1.2, ambiguity=0.1, seed=1)
    amb_n, amb_a = task.ambiguous
    # ceil(10%) of each of the 5 frequency bins of 100 tokens: 2 per bin, inside that bin
    for amb, ids in ((amb_n, task.nouns), (amb_a, task.adjectives)):
        assert len(amb) == 10 and len(set(amb.tolist())) == 10
        for b in ids.chunk(5): assert torch.isin(b, amb).sum() == 2
    x = task.sample(40000, 'train', seed=2)['input_ids']
    cop_first = x[:, 0] == task.cop
    a_slot, n_slot = torch.where(cop_first, x[:, 1], x[:, 2]), torch.where(cop_first, x[:, 2], x[:, 0])
    p_z = zipf_pmf(100, 1.2).numpy()
    rate_n = 0.5 * p_z[(amb_n).numpy()].sum()            # an adjective in the noun slot: an ambiguous noun was drawn and the coin said swap
    rate_a = 0.5 * p_z[(amb_a - 100).numpy()].sum()
    for k, rate in ((int((task.pos(n_slot) == 1).sum()), rate_n), (int((task.pos(a_slot) == 0).sum()), rate_a)):
        assert stats.binomtest(k, 40000, rate).pvalue > 1e-6, (k, rate)   # level 1e-6
    # only ambiguous tokens ever change role
    assert torch.isin(n_slot[task.pos(n_slot) == 1], amb_a).all() and torch.isin(a_slot[task.pos(a_slot) == 0], amb_n).all()
    assert torch.isin(amb_a, n_slot).any() and torch.isin(amb_n, a_slot).any()
    # no ambiguity: nothing changes role
    x0 = POSTask(vocab=200, a=1.2, ambiguity=0).sample(5000, 'train', seed=2)['input_ids']
    assert ((POSTask(vocab=200).pos(x0[:, :4]) >= 0).sum(1) == 3).all()
    assert (torch.where(x0[:, 0] == 200, x0[:, 1], x0[:, 2]) >= 100).all()

def test_splits_draw_from_their_token_sets():
    task = POSTask(vocab=200, head=7, tail=0.2)
    def slots(split):
        x = task.sample(3000, split, seed=4)['input_ids']
        cf = x[:, 0] == task.cop
        return torch.where(cf, x[:, 1], x[:, 2]), torch.where(cf, x[:, 2], x[:, 0])
    a, n = slots('head');        assert set(a.tolist()) == set(range(100, 107)) and set(n.tolist()) == set(range(7))
    a, n = slots('head_switch'); assert set(a.tolist()) == set(range(7)) and set(n.tolist()) == set(range(100, 107))
    a, n = slots('tail');        assert set(a.tolist()) == set(range(180, 200)) and set(n.tolist()) == set(range(80, 100))
    a, n = slots('tail_switch'); assert set(a.tolist()) == set(range(80, 100)) and set(n.tolist()) == set(range(180, 200))
    a, n = slots('switch');      assert (task.pos(a) == 0).all() and (task.pos(n) == 1).all()
    a, n = slots('holdout');     assert (a != n).all() and set(a.tolist()) | set(n.tolist()) == set(task.unseen.tolist())
    # uniform within head and tail: a chi-square against equal counts
    assert stats.chisquare(np.bincount(slots('tail')[0].numpy() - 180)).pvalue > 1e-6   # level 1e-6

def test_sampling_is_seeded_and_takes_a_generator():
    b1, b2 = SMALL.sample(50, 'train', seed=3), SMALL.sample(50, 'train', seed=3)
    assert torch.equal(b1['input_ids'], b2['input_ids'])
    assert not torch.equal(b1['input_ids'], SMALL.sample(50, 'train', seed=4)['input_ids'])
    g = torch.Generator().manual_seed(3)
    assert torch.equal(SMALL.sample(50, 'train', g)['input_ids'], b1['input_ids'])
    assert not torch.equal(SMALL.sample(50, 'train', g)['input_ids'], b1['input_ids'])   # the generator moved on

def test_vocabulary_layout():
    t = POSTask(vocab=1000)
    assert t.nouns.tolist() == list(range(500)) and t.adjectives.tolist() == list(range(500, 1000))
    assert (t.cop, t.mask) == (1000, 1001) and t.unseen.tolist() == list(range(1002, 1102))
    assert (t.pad, t.n_tokens) == (1102, 1103)
    assert POSTask(vocab=1000, n_unseen=7).unseen.tolist() == list(range(1002, 1009))
    assert t.pos(torch.tensor([0, 499, 500, 999, 1000, 1001, 1050, 1102, -100])).tolist() == [0, 0, 1, 1, -1, -1, -1, -1, -1]

def test_zipf_pmf_closed_form():
    for n, a in ((1, 1.5), (5, 0.0), (7, 1.2), (500, 1.5)):
        r = np.arange(1, n + 1, dtype=float)
        np.testing.assert_allclose(zipf_pmf(n, a).numpy(), r ** -a / (r ** -a).sum(), rtol=1e-12)
    assert zipf_pmf(4, 2).dtype == torch.float64

@pytest.mark.parametrize('kwargs,words', [
    (dict(a=-0.5), 'a=-0.5'), (dict(a=float('nan')), 'a=nan'), (dict(a=True), 'a=True'), (dict(vocab=0), 'vocab=0'), (dict(vocab=7), 'odd'),
    (dict(vocab=-4), 'vocab=-4'), (dict(vocab=10), 'unseen'), (dict(vocab=10, n_unseen=1), 'n_unseen=1'), (dict(ambiguity=1.5), 'ambiguity=1.5'),
    (dict(ambiguity=-0.1), 'ambiguity'), (dict(bins=0), 'bins=0'), (dict(vocab=8, n_unseen=2, bins=5), 'bins=5'), (dict(head=0), 'head=0'),
    (dict(tail=0), 'tail=0'), (dict(tail=1.5), 'tail=1.5'), (dict(seed=-1), 'seed=-1'), (dict(vocab=2.0), 'vocab=2.0')])
def test_task_bad_input(kwargs, words):
    with pytest.raises(ConfigError, match=words.replace('(', r'\(')): POSTask(**kwargs)

def test_sample_bad_input():
    for call, words in ((lambda: SMALL.sample(0), 'n=0'), (lambda: SMALL.sample(5, 'val'), "'val'"), (lambda: SMALL.sample(5, seed=-2), 'seed=-2'),
                        (lambda: SMALL.sample(5, seed=1.5), 'seed=1.5')):
        with pytest.raises(ConfigError, match=words): call()
    with pytest.raises(ConfigError, match='n=2.5'): zipf_pmf(2.5, 1.0)

# ---------------------------------------------------------------- completions

def test_completions_against_hand_made_sequences():
    c, m = SMALL.cop, SMALL.mask      # nouns 0..19, adjectives 20..39, unseen 42..45
    rows = [[c, 25, 3, 25, m, m, m],  # adjective query: A A A either way
            [3, c, 25, 3, m, m, m],   # noun query
            [c, 3, 25, 3, m, m, m],   # switched: the noun 3 sits in the adjective slot and is the query
            [25, c, 3, 25, m, m, m],  # switched: the adjective 25 sits in the noun slot and is the query
            [c, 3, 5, 5, m, m, m],    # two nouns: the lists are silent on which is the adjective, the slots decide
            [c, 42, 43, 43, m, m, m], # unseen tokens
            [c, 25, 3, 25, m, m, m]]
    x = torch.tensor(rows)
    assert context_completion(SMALL, x).tolist() == [[25] * 3, [25, 3, 3], [3] * 3, [3, 25, 25], [3, 5, 5], [42, 43, 43], [25] * 3]
    assert memorised_completion(SMALL, x).tolist() == [[25] * 3, [25, 3, 3], [25, 3, 3], [25] * 3, [3, 5, 5], [42, 43, 43], [25] * 3]

@pytest.mark.parametrize('split', SPLITS)
def test_context_completion_is_the_label_and_memory_disagrees_only_when_switched(split):
    task = POSTask(vocab=100, a=1.2)
    b = task.sample(2000, split, seed=8)
    x, y = b['input_ids'], b['labels'][:, 4:]
    assert torch.equal(context_completion(task, x), y)
    mem = memorised_completion(task, x)
    differs = (mem != y).any(1)
    cf = x[:, 0] == task.cop
    a, n = torch.where(cf, x[:, 1], x[:, 2]), torch.where(cf, x[:, 2], x[:, 0])
    both_swapped = (task.pos(a) == 0) & (task.pos(n) == 1)
    assert torch.equal(differs, both_swapped)
    if split.endswith('switch'): assert differs.all() and (mem[:, 1:] == y[:, 1:]).all()   # they differ in the first masked token only
    if split in ('tail', 'head', 'holdout'): assert not differs.any()

def test_completion_bad_shapes():
    for bad in (torch.zeros(3, 6, dtype=torch.long), torch.zeros(7, dtype=torch.long)):
        with pytest.raises(ShapeError, match='Sequences of the task'): context_completion(SMALL, bad)
        with pytest.raises(ShapeError): memorised_completion(SMALL, bad)

# ---------------------------------------------------------------- model, logits, loss, evaluation

class Rule(nn.Module):
    "A stand-in model: one-hot logits of a completion rule at the last three positions, zeros elsewhere."
    def __init__(self, task, rule): super().__init__(); self.task, self.rule = task, rule
    def forward(self, ids):
        lg = torch.zeros(*ids.shape, self.task.n_tokens)
        done = self.rule(self.task, ids)
        for i in range(ids.shape[0]):
            for j in range(3): lg[i, 4 + j, done[i, j]] = 1.0
        return lg

def test_evaluate_on_models_whose_answers_are_known(untouched):
    task = POSTask(vocab=60, n_unseen=6, head=4)
    ctx, mem = Rule(task, context_completion), Rule(task, memorised_completion)
    with untouched(ctx): e_ctx = evaluate(ctx, task, n=300, batch_size=64)
    e_mem = evaluate(mem, task, n=300, batch_size=7)
    assert isinstance(e_ctx, Evaluation) and list(e_ctx.row()) == list(METRICS)
    assert all(e_ctx[k] == 1.0 for k in METRICS if not k.startswith('iwl')) and all(e_ctx[k] == 0.0 for k in ('iwl', 'iwl_tail', 'iwl_head'))
    assert [e_mem[k] for k in ('switch', 'tail_switch', 'head_switch')] == [0.0] * 3
    assert [e_mem[k] for k in ('iwl', 'iwl_tail', 'iwl_head', 'tail', 'head', 'holdout')] == [1.0] * 6
    b = evaluation_sets(task, 300, 1)['train']
    x = b['input_ids']; cf = x[:, 0] == task.cop
    both = (task.pos(torch.where(cf, x[:, 1], x[:, 2])) == 0) & (task.pos(torch.where(cf, x[:, 2], x[:, 0])) == 1)
    assert e_mem['val'] == pytest.approx(1 - both.float().mean().item())
    # a model right on one position in two: 0 hard accuracy where that position decides
    class Half(Rule):
        def forward(self, ids):
            lg = super().forward(ids); lg[::2, 5] = 0; lg[::2, 5, task.mask] = 1; return lg
    e_half = evaluate(Half(task, context_completion), task, n=300)
    assert e_half['val'] == pytest.approx(0.5) and e_half['holdout'] == pytest.approx(0.5)

def test_evaluate_uses_fresh_fixed_sets_and_different_seeds_differ():
    s1, s2 = evaluation_sets(SMALL, 50, 1), evaluation_sets(SMALL, 50, 2)
    assert all(torch.equal(s1[k]['input_ids'], SMALL.sample(50, k, 1 + 1000 * i)['input_ids']) for i, k in enumerate(SPLITS))
    assert not torch.equal(s1['train']['input_ids'], s2['train']['input_ids'])
    assert not torch.equal(s1['train']['input_ids'][:, :4], s1['switch']['input_ids'][:, :4])

def test_hard_accuracy_against_a_loop():
    g = torch.Generator().manual_seed(0)
    p, t = torch.randint(0, 3, (500, 3), generator=g), torch.randint(0, 3, (500, 3), generator=g)
    assert hard_accuracy(p, t) == pytest.approx(sum(all(p[i, j] == t[i, j] for j in range(3)) for i in range(500)) / 500)
    assert hard_accuracy(t, t) == 1.0
    for a, b in ((p, t[:, :2]), (p[0], t[0]), (p[:0], t[:0])):
        with pytest.raises(ShapeError): hard_accuracy(a, b)

@pytest.mark.parametrize('arch', ['bert', 'gpt2', 'llama'])
def test_masked_logits_equal_the_full_logits(arch, untouched):
    m = tiny_lm(arch, n_layers=1, d_model=32, vocab_size=50, seed=0)
    ids = torch.randint(0, 50, (5, 7), generator=torch.Generator().manual_seed(1))
    with untouched(m), torch.no_grad():
        full = m(input_ids=ids).logits
        for n in (1, 3, 7):
            got = masked_logits(m, ids, n)
            assert got.shape == (5, n, 50)
            torch.testing.assert_close(got, full[:, -n:], rtol=1e-5, atol=1e-5)
        for bad in (0, 8, -1, 2.0):                 # no position, more positions than the sequence has, not an int: typed errors (k=0 gave every position)
            with pytest.raises(ConfigError, match=f'n={bad}'): masked_logits(m, ids, bad)

def test_masked_logits_of_a_plain_module_and_the_loss_by_hand():
    task = POSTask(vocab=20, n_unseen=2, bins=2)
    torch.manual_seed(0)
    emb, head = nn.Embedding(task.n_tokens, 8), nn.Linear(8, task.n_tokens)
    net = nn.Sequential(emb, head)
    b = task.sample(6, 'train', seed=0)
    with torch.no_grad():
        lg = head(emb(b['input_ids']))
        torch.testing.assert_close(masked_logits(net, b['input_ids']), lg[:, -3:])
        lp = lg[:, 4:].log_softmax(-1)
        ref = -sum(lp[i, j, b['labels'][i, 4 + j]] for i in range(6) for j in range(3)) / 18
        torch.testing.assert_close(masked_loss(net, b), ref)

def test_pos_bert_is_the_papers_config():
    task = POSTask(vocab=100)
    m = pos_bert(task)
    c = m.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (64, 6, 1, 128)
    assert c.vocab_size == task.n_tokens and c.pad_token_id == task.pad and c.hidden_dropout_prob == 0.1
    assert m.get_input_embeddings().padding_idx == task.pad and not m.training
    assert m.cls.predictions.decoder.weight is m.get_input_embeddings().weight
    assert torch.equal(pos_bert(task, seed=3).bert.encoder.layer[0].attention.self.query.weight, pos_bert(task, seed=3).bert.encoder.layer[0].attention.self.query.weight)
    assert not torch.equal(pos_bert(task, seed=3).get_input_embeddings().weight, pos_bert(task, seed=4).get_input_embeddings().weight)

def test_predictions_in_bfloat16_and_untouched(untouched):
    m = pos_bert(SMALL, hidden=16, n_layers=1, intermediate=32).to(torch.bfloat16).train()
    x = SMALL.sample(9, 'holdout', 0)['input_ids']
    with untouched(m):
        p = predictions(m, x, batch_size=4)
        e = evaluate(m, SMALL, n=20)
    assert p.shape == (9, 3) and p.dtype == torch.long and p.device.type == 'cpu'
    assert set(e.row()) == set(METRICS) and all(0 <= v <= 1 for v in e.row().values())
    with pytest.raises(ConfigError, match='batch_size=0'): predictions(m, x, batch_size=0)

# ---------------------------------------------------------------- forgetting

def state_of(model, opt):
    "Copies of every parameter and every tensor of the optimizer's state, by parameter name."
    names = {id(p): n for n, p in model.named_parameters()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = {(names[id(p)], k): v.detach().clone() for p, st in opt.state.items() for k, v in st.items() if torch.is_tensor(v)}
    return params, moments

class Spy:
    "Wraps a callback and records, for each step, which parameters and which optimizer moments it changed."
    def __init__(self, cb): self.cb, self.log = cb, []
    def __call__(self, model, opt, step):
        (p0, m0) = state_of(model, opt)
        self.cb(model, opt, step)
        (p1, m1) = state_of(model, opt)
        self.log.append((step + 1, {n for n in p0 if not torch.equal(p0[n], p1[n])}, {k for k in m0 if not torch.equal(m0[k], m1[k])}, m1))

def batches(step, g): return torch.randint(0, 64, (4, 8), generator=g)
def xent(m, ids): return F.cross_entropy(m(input_ids=ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

@pytest.mark.parametrize('moments', MOMENT_RESETS)
@pytest.mark.parametrize('until', [None, 7])
def test_forgetting_resets_exactly_the_embeddings_and_the_named_moments(moments, until):
    lm = tiny_lm('llama', n_layers=1, d_model=32, vocab_size=64, seed=0)     # untied input and output embeddings
    cb = Forgetting(every=3, until=until, moments=moments)
    spy = Spy(cb)
    fit(lm, batches, xent, steps=11, lr=1e-2, progress=False, callback=spy)
    due = [t for t in range(1, 12) if t % 3 == 0 and (until is None or t < until)]
    assert cb.resets == due
    emb = 'model.embed_tokens.weight'
    how = ('all' if until is not None else 'none') if moments == 'official' else moments
    for done, params, moms, after in spy.log:
        if done not in due: assert not params and not moms; continue
        assert params == {emb}
        names = {n for n, _ in lm.named_parameters()}
        expect = {'none': set(), 'embeddings': {emb}, 'all': names}[how]
        assert {n for n, _ in moms} == expect
        for (n, k), v in after.items():
            if n in expect: assert not v.any(), (n, k)     # zeroed: exp_avg, exp_avg_sq and step
    assert 0.8 < lm.get_input_embeddings().weight.std().item() < 1.2 if due else True

def test_forgetting_draws_a_fresh_standard_normal_matrix_and_keeps_the_padding_row_zero():
    task = POSTask(vocab=200)
    m = pos_bert(task, hidden=32, n_layers=1, intermediate=32)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    torch.manual_seed(0)
    Forgetting(every=1)(m, opt, 0)
    w = m.get_input_embeddings().weight.detach()
    assert not w[task.pad].any()
    rest = torch.cat([w[:task.pad], w[task.pad + 1:]]).flatten().numpy()
    assert stats.kstest(rest, 'norm').pvalue > 1e-6   # level 1e-6 (seeded above all the same)
    assert m.cls.predictions.decoder.weight is m.get_input_embeddings().weight    # still tied, so the output rows are new too
    # a custom initialisation is used instead
    Forgetting(every=1, init=lambda e: torch.nn.init.constant_(e.weight, 0.25))(m, opt, 0)
    assert (m.get_input_embeddings().weight == 0.25).all()

def test_temporary_forgetting_stops_at_until_and_counts_from_one():
    cb = Forgetting(every=10, until=35)
    assert [t for t in range(1, 100) if cb.due(t)] == [10, 20, 30]
    assert [t for t in range(1, 40) if Forgetting(every=10).due(t)] == [10, 20, 30]
    assert [t for t in range(1, 40) if Forgetting(every=10, until=30).due(t)] == [10, 20]
    assert not any(Forgetting(every=1, until=0).due(t) for t in range(1, 10))

def test_reset_state_counts_and_handles_plain_numbers():
    p, q = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p, q], lr=0.1, momentum=0.9)
    p.grad = torch.ones(3); q.grad = torch.ones(2); opt.step()
    opt.state[p]['count'] = 5
    assert reset_state(opt, [p]) == 1
    assert not opt.state[p]['momentum_buffer'].any() and opt.state[p]['count'] == 0 and opt.state[q]['momentum_buffer'].all()
    assert reset_state(opt, [nn.Parameter(torch.ones(1))]) == 0

def test_forgetting_bad_input():
    torch.manual_seed(0)   # the module built below only has to lack embeddings; seeded all the same
    for kw, words in ((dict(every=0), 'every=0'), (dict(every=-3), 'every=-3'), (dict(every=2.5), 'every=2.5'), (dict(every=10, until=-1), 'until=-1'),
                      (dict(every=10, moments='half'), 'half'), (dict(every=10, init=3), 'init=int')):
        with pytest.raises(ConfigError, match=words): Forgetting(**kw)
    with pytest.raises(ConfigError, match='no input embeddings'): Forgetting(every=1)(nn.Linear(2, 2), None, 0)

# ---------------------------------------------------------------- recipes and training

def test_recipe_checks_and_callbacks():
    assert DualProcessRecipe().callback() is None
    cb = DualProcessRecipe(forgetting='active', every=500).callback()
    assert (cb.every, cb.until, cb.moments) == (500, None, 'official')
    cb = DualProcessRecipe(forgetting='temporary', every=10, until=2000).callback()
    assert (cb.every, cb.until) == (10, 2000)
    r = DualProcessRecipe()
    assert (r.lr, r.batch_size, r.weight_decay, r.hidden, r.n_layers, r.n_heads, r.intermediate, r.every) == (5e-5, 128, 0.01, 64, 6, 1, 128, 1000)
    for kw, words in ((dict(forgetting='temporary'), 'until=None'), (dict(forgetting='active', until=5), 'until=5'), (dict(forgetting='sometimes'), 'sometimes'),
                      (dict(forgetting='active', every=0), 'every=0')):
        with pytest.raises(ConfigError, match=words): DualProcessRecipe(**kw)

TINY = DualProcessRecipe(POSTask(vocab=40, n_unseen=4, head=3), hidden=16, n_layers=1, intermediate=32)

def test_training_is_reproducible_logs_every_metric_and_learns():
    r = dataclasses.replace(TINY, forgetting='temporary', every=4, until=9)
    m1, tok, res = train_dual_process(None, r, steps=12, batch_size=8, lr=1e-3, eval_every=6, eval_n=20, progress=False)
    m2, _, _ = train_dual_process(None, r, steps=12, batch_size=8, lr=1e-3, eval_every=6, eval_n=20, progress=False)
    assert tok is None and all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    c = curves(res)
    assert list(c.index) == [6, 12] and list(c.columns) == list(METRICS)
    assert res.history['lr'].eq(1e-3).all() and res.optimizer.param_groups[0]['weight_decay'] == 0.01
    # the same run without the recipe's forgetting ends elsewhere
    m3, _, _ = train_dual_process(None, dataclasses.replace(r, forgetting='vanilla', until=None), steps=12, batch_size=8, lr=1e-3, eval_every=6, eval_n=20, progress=False)
    assert not torch.equal(m1.get_input_embeddings().weight, m3.get_input_embeddings().weight)
    # a short run of the shipped recipe's training code learns the task on a small vocabulary
    _, _, res = train_dual_process(None, TINY, steps=300, batch_size=32, lr=3e-3, eval_every=300, eval_n=200, progress=False)
    assert res.history['loss'].iloc[-20:].mean() < 0.6 * res.history['loss'].iloc[:20].mean()
    assert curves(res)['val'].iloc[-1] > 0.3

def test_train_on_a_model_of_ones_own_and_refuse_a_small_vocabulary():
    lm = tiny_lm('gpt2', n_layers=1, d_model=32, vocab_size=TINY.task.n_tokens, seed=0)
    out = train_dual_process(lm, TINY, steps=4, batch_size=4, eval_every=2, eval_n=10, progress=False)
    m, _, res = out
    assert isinstance(out, Trained) and out.model is m is lm and out.fit is res and out.tokenizer is None and len(curves(res)) == 2
    with pytest.raises(ShapeError, match='ids up to 46'): train_dual_process(tiny_lm('gpt2', n_layers=1, d_model=32, vocab_size=40), TINY, steps=2, progress=False)
    with pytest.raises(ConfigError, match='batch_size=0'): train_dual_process(None, TINY, batch_size=0, steps=2, progress=False)

def test_curves_shift_steps_to_counts_and_strip_the_prefix():
    hist = pd.DataFrame({'step': [0, 1, 2, 3], 'loss': [4., 3., 2., 1.], 'eval_val': [np.nan, 0.5, np.nan, 0.7], 'eval_holdout': [np.nan, 0.1, np.nan, 0.2]})
    c = curves(dp.FitResult(hist, None))
    assert list(c.index) == [2, 4] and list(c.columns) == ['val', 'holdout'] and c.loc[4, 'val'] == 0.7

# ---------------------------------------------------------------- shipped runs and their summaries

def test_run_summary_against_hand_made_curves():
    c = pd.DataFrame({'val': [0.1, 0.5, 0.9, 1.0, 1.0], 'holdout': [0.2, 0.8, 0.6, 0.3, 0.1], 'iwl_head': [0.0, 0.2, 0.5, 0.7, 0.9]}, index=pd.Index([10, 20, 30, 40, 50], name='step'))
    s = dp.run_summary(c, last=2)
    assert s['peak_holdout'] == 0.8 and s['peak_step'] == 20
    assert s['holdout'] == pytest.approx(0.2) and s['val'] == pytest.approx(1.0) and s['iwl_head'] == pytest.approx(0.8)
    assert dp.run_summary(c, last=1)["holdout"] == pytest.approx(0.1) and dp.run_summary(c, last=5)['val'] == pytest.approx(0.7)
    assert list(dp.run_summary(c).index) == ['peak_holdout', 'peak_step', 'val', 'holdout', 'iwl_head']
    for bad, words in ((dict(last=0), 'last=0'), (dict(curves=c.iloc[:0]), 'No evaluations')):
        with pytest.raises((ConfigError, ShapeError), match=words): dp.run_summary(**{'curves': c, **bad})

def test_plot_curves_draws_the_chosen_metrics():
    c = pd.DataFrame({m: np.linspace(0, 1, 4) for m in METRICS}, index=pd.Index([1, 2, 3, 4], name='step'))
    ax = dp.plot_curves(c, metrics=('val', 'holdout'), title='t', step=3)
    assert [l.get_label() for l in ax.get_lines()][:2] == ['val', 'holdout'] and ax.get_title() == 't'
    assert ax.get_lines()[-1].get_xdata()[0] == 3 and ax.get_ylim() == (-0.03, 1.03)

def test_shipped_runs_are_the_papers_settings():
    r = demo.SHIPPED_RUNS
    assert (r['vanilla'].steps, r['vanilla'].lr, r['vanilla'].batch_size, r['vanilla'].task.a, r['vanilla'].task.vocab) == (62_500, 5e-5, 128, 1.5, 1000)
    assert (r['active'].forgetting, r['active'].every, r['active'].until) == ('active', 1000, None)
    assert (r['temporary'].forgetting, r['temporary'].every, r['temporary'].until) == ('temporary', 10, 2000)
    assert {k: v.task.a for k, v in r.items() if ' a=' in k} == {'vanilla a=0.0': 0.0, 'active a=0.0': 0.0, 'vanilla a=1.2': 1.2, 'active a=1.2': 1.2}
    assert r['vanilla v=10000'].task.vocab == 10_000 and set(demo.SHIPPED_WEIGHTS) <= set(r)

@pytest.fixture(scope='module')
def shipped():
    return {k: demo.load_run(k) for k in demo.SHIPPED_WEIGHTS}

def test_shipped_asset_holds_every_run_with_its_recipe(shipped):
    meta = shipped['vanilla'][2]
    assert set(meta['runs']) == set(demo.SHIPPED_RUNS)
    for k, r in demo.SHIPPED_RUNS.items():
        assert demo.recipe_of(meta, k) == r
        c = demo.load_curves()[k]
        assert list(c.columns) == list(METRICS) and c.index[-1] == r.steps and (np.diff(c.index) == demo.SHIPPED_EVAL['eval_every']).all()
        assert ((c >= 0) & (c <= 1)).all().all()
    with pytest.raises(ConfigError, match='nope'): demo.recipe_of(meta, 'nope')
    with pytest.raises(ConfigError, match='vanilla a=0.0'): demo.load_run('vanilla a=0.0')

def test_shipped_final_models_reach_their_logged_accuracy_on_fresh_sequences(shipped):
    """The final weights (stored in float16) give the tool's last logged evaluation again on the same evaluation sets (seed 1), and agree
    with it within sampling error on sequences drawn with another seed: two independent shares of 1,000 sequences differ with sd
    sqrt(2 p (1 - p) / 1000); 6 sd (p from the logged share, shrunk away from 0 and 1) is a false failure below 1e-7 over the 30 checks.
    Measured on three CPUs' kernels (AVX-512, AVX2, none): the same sets give at most 0.001."""
    for k, (m, _, meta) in shipped.items():
        task, last = demo.recipe_of(meta, k).task, demo.load_curves()[k].iloc[-1]
        same, other = evaluate(m, task, n=1000, seed=1), evaluate(m, task, n=1000, seed=7)
        for metric in METRICS:
            assert abs(same[metric] - last[metric]) <= 0.005, (k, metric, same[metric], last[metric])
            p = (last[metric] * 1000 + 2) / 1004
            assert abs(other[metric] - last[metric]) < 6 * math.sqrt(2 * p * (1 - p) / 1000) + 0.005, (k, metric, other[metric], last[metric])

def test_the_first_steps_of_the_shipped_vanilla_run_are_reproduced():
    """Training is deterministic: 250 steps of the vanilla recipe give the tool's first logged evaluation exactly (up to float summation order).
    Measured on three CPUs' kernels (AVX-512, AVX2, none): a difference of 0 (and 0 after 1,500 steps)."""
    r = demo.SHIPPED_RUNS['vanilla']
    _, _, res = train_dual_process(None, r, steps=250, progress=False, **demo.SHIPPED_EVAL)
    got, want = curves(res).iloc[0], demo.load_curves()['vanilla'].loc[250]
    for metric in METRICS: assert abs(got[metric] - want[metric]) <= 0.01, (metric, got[metric], want[metric])

# ---------------------------------------------------------------- defaults, boundaries and constants (gaps found by mutation testing)

def test_documented_defaults():
    t = POSTask()
    assert (t.vocab, t.a, t.ambiguity, t.n_unseen, t.bins, t.head, t.tail, t.seed) == (1000, 1.5, 0.1, None, 5, 20, 0.1, 0)
    f = Forgetting(every=7)
    assert (f.until, f.moments, f.init, f.resets) == (None, 'official', None, [])
    r = DualProcessRecipe()
    assert (r.task, r.forgetting, r.until, r.steps) == (POSTask(), 'vanilla', None, 62_500)
    d, e = evaluation_sets(SMALL), evaluation_sets(SMALL, 1000, 1)              # n=1000, seed=1
    assert all(torch.equal(d[k]['input_ids'], e[k]['input_ids']) for k in SPLITS)
    assert SPLITS == ('train', 'switch', 'tail', 'tail_switch', 'head', 'head_switch', 'holdout')
    assert FORGETTING == ('vanilla', 'active', 'temporary') and MOMENT_RESETS == ('official', 'embeddings', 'all', 'none')
    m = pos_bert(SMALL, hidden=16, n_layers=1, intermediate=32)
    torch.manual_seed(0); a = torch.randn(1)
    pos_bert(SMALL, hidden=16, n_layers=1, intermediate=32)
    torch.manual_seed(0); assert torch.equal(a, torch.randn(1))                # building a model leaves the global RNG alone
    assert torch.equal(m.get_input_embeddings().weight, pos_bert(SMALL, hidden=16, n_layers=1, intermediate=32, seed=0).get_input_embeddings().weight)
    assert m.config.max_position_embeddings >= 7

def test_evaluate_defaults_match_explicit_arguments():
    rule = Rule(SMALL, context_completion)
    assert evaluate(rule, SMALL) == evaluate(rule, SMALL, n=1000, batch_size=1000, seed=1)
    assert predictions(rule, SMALL.sample(3, 'train', 0)['input_ids']).shape == (3, 3)

def test_tasks_are_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError): SMALL.vocab = 10
    with pytest.raises(dataclasses.FrozenInstanceError): DualProcessRecipe().steps = 1
    assert hash(POSTask(vocab=40, n_unseen=4, head=3)) == hash(SMALL) and len({POSTask(), POSTask(a=1.2)}) == 2

def test_integer_checks_accept_their_boundaries():
    POSTask(vocab=2, n_unseen=2, bins=1, head=1, tail=1.0, seed=0, ambiguity=1.0)
    POSTask(vocab=20, ambiguity=0.0)                                            # v/10 = 2 unseen tokens is enough
    with pytest.raises(ConfigError, match='v/10 = 1'): POSTask(vocab=18)
    POSTask(vocab=10, n_unseen=2, bins=5)                                       # one token per bin
    assert SMALL.sample(1, 'holdout', 0)['input_ids'].shape == (1, 7)
    assert SMALL.sample(2, 'train', seed=np.int64(0))['input_ids'].shape == (2, 7)
    Forgetting(every=1, until=0)
    assert zipf_pmf(1, 0).tolist() == [1.0] and zipf_pmf(2, 0.0).tolist() == [0.5, 0.5]
    for bad in (dict(vocab=True), dict(n_unseen=1.5), dict(bins=True), dict(head=2.0), dict(tail=True), dict(ambiguity=True), dict(a=float('inf'))):
        with pytest.raises(ConfigError): POSTask(**bad)

def test_reset_state_skips_parameters_without_state_and_zeroes_numbers():
    p, q, r = (nn.Parameter(torch.ones(2)) for _ in range(3))
    opt = torch.optim.AdamW([p, q, r], lr=0.1)
    q.grad = torch.ones(2); r.grad = torch.ones(2); opt.step()                  # p has no state
    opt.state[q]['count'], opt.state[q]['scale'], opt.state[q]['flag'] = 3, 2.5, True
    assert reset_state(opt, [p, q, r]) == 2
    assert all(not v.any() for v in opt.state[r].values() if torch.is_tensor(v))
    assert (opt.state[q]['count'], opt.state[q]['scale'], opt.state[q]['flag']) == (0, 0.0, True)
    assert type(opt.state[q]['count']) is int and type(opt.state[q]['scale']) is float

def test_the_vocabulary_projection_runs_at_the_masked_positions_only():
    m = pos_bert(SMALL, hidden=16, n_layers=1, intermediate=32)
    seen = []
    h = m.cls.predictions.decoder.register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape)))
    try:
        for n in (1, 3):
            masked_logits(m, SMALL.sample(5, 'train', 0)['input_ids'], n)
            assert seen[-1] == (5, n, SMALL.n_tokens)
    finally: h.remove()
    gpt = tiny_lm('gpt2', n_layers=1, d_model=32, vocab_size=50)
    seen.clear(); h = gpt.lm_head.register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape)))
    try: masked_logits(gpt, torch.zeros(2, 9, dtype=torch.long), 2); assert seen == [(2, 2, 50)]
    finally: h.remove()

def test_forgetting_refuses_a_non_callable_init_and_a_model_without_embeddings():
    for bad in (3, 'normal', [1]):
        with pytest.raises(ConfigError, match='init='): Forgetting(every=2, init=bad)
    class NoEmb(nn.Module):
        def get_input_embeddings(self): return None
    with pytest.raises(ConfigError, match='NoEmb has no input embeddings'): Forgetting(every=1)(NoEmb(), None, 0)
    Forgetting(every=2)(NoEmb(), None, 0)            # step 1 is not due: nothing is looked at

def test_error_messages_name_the_fix():
    "The hints of the task's checks carry the right numbers (gaps found by mutation testing)."
    with pytest.raises(ConfigError, match=r'Use vocab=8\.'): POSTask(vocab=7)
    with pytest.raises(ConfigError, match=r'v/10 = 1 unseen'): POSTask(vocab=10)
    with pytest.raises(ConfigError, match=r'bins=6 for 5 tokens per part of speech(.|\n)*Use bins <= 5\.(?!0)'): POSTask(vocab=10, n_unseen=2, bins=6)
    with pytest.raises(ConfigError, match=r'tail=1\.5(.|\n)*a fraction in \(0, 1\]'): POSTask(tail=1.5)

def test_sample_defaults_to_seed_0_and_a_tiny_tail_keeps_the_rarest_token():
    assert torch.equal(SMALL.sample(50, 'train')['input_ids'], SMALL.sample(50, 'train', seed=0)['input_ids'])
    t = POSTask(vocab=40, tail=0.001)               # round(0.001 * 20) = 0 tokens: the split keeps the single rarest one of each list
    x = t.sample(300, 'tail')['input_ids'][:, :4]
    assert set(x[(x != t.cop)].unique().tolist()) == {19, 39}
    assert inspect.signature(predictions).parameters['batch_size'].default == 500

def test_defaults_of_training_evaluation_and_summaries(monkeypatch):
    "Documented defaults, checked by what they do (gaps found by mutation testing)."
    r = DualProcessRecipe(POSTask(vocab=40, n_unseen=4), steps=3)
    assert torch.equal(r.build().get_input_embeddings().weight, r.build(0).get_input_embeddings().weight)
    sig = inspect.signature(train_dual_process).parameters
    assert (sig['seed'].default, sig['eval_every'].default, sig['eval_n'].default, sig['progress'].default) == (0, 100, 1000, True)
    assert [(p.default) for k, p in inspect.signature(evaluate).parameters.items() if k in ('n', 'batch_size', 'seed')] == [1000, 500, 1]
    c = pd.DataFrame({m: np.linspace(0, 1, 10) ** (i + 1) for i, m in enumerate(METRICS)}, index=pd.Index(range(1, 11), name='step'))
    assert dp.run_summary(c).equals(dp.run_summary(c, last=8)) and not dp.run_summary(c).equals(dp.run_summary(c, last=9))
    assert [l.get_label() for l in dp.plot_curves(c).get_lines()] == ['val', 'holdout', 'switch', 'tail', 'iwl_head'] == list(dp.CURVE_METRICS)
    moved = []                                       # a model built here goes to `device`; the CPU by default
    real_to = nn.Module.to
    monkeypatch.setattr(nn.Module, 'to', lambda self, *a, **k: (moved.append(a[0] if a else k.get('device')), real_to(self, 'cpu'))[1])
    train_dual_process(None, r, steps=1, eval_every=1, eval_n=2, progress=False)
    train_dual_process(recipe=r, steps=1, eval_every=1, eval_n=2, progress=False, device='cuda:3')
    assert moved[0] == 'cpu' and 'cuda:3' in moved

def test_choices_name_the_argument_and_plots_label_their_axes(shipped):
    for call, words in ((lambda: SMALL.sample(3, 'val'), "split='val'"), (lambda: Forgetting(every=2, moments='adam'), "moments='adam'"),
                        (lambda: DualProcessRecipe(forgetting='never'), "forgetting='never'"), (lambda: demo.load_run('vanilla a=1.2'), "run='vanilla a=1.2'")):
        with pytest.raises(ConfigError, match=words): call()
    c = pd.DataFrame({m: [0.5] for m in METRICS}, index=pd.Index([1], name='step'))
    ax = dp.plot_curves(c)
    assert (ax.get_xlabel(), ax.get_ylabel()) == ('step', 'accuracy')
    out = demo.load_run()                            # the default run is temporary forgetting
    m, _, meta = out
    assert isinstance(out, Shipped) and out.tokenizer is None and out.meta is meta
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), shipped['temporary'][0].state_dict().values()))
    assert not torch.equal(m.get_input_embeddings().weight, shipped['vanilla'][0].get_input_embeddings().weight)

# ---------------------------------------------------------------- results, and the old names and orders (they keep working, with a FutureWarning)

def test_evaluation_sets_and_evaluate_are_results():
    sets = evaluation_sets(SMALL, 30, 4)
    assert isinstance(sets, EvaluationSets) and all(torch.equal(sets[s]['input_ids'], getattr(sets, s)['input_ids']) for s in SPLITS)
    with pytest.raises(ConfigError, match="split='val'"): sets['val']
    e = evaluate(Rule(SMALL, context_completion), SMALL, n=30)
    assert e['holdout'] == e.holdout == 1.0 and e.row() == {k: getattr(e, k) for k in METRICS} and 'holdout=1' in repr(e)
    with pytest.raises(ConfigError, match="metric='accuracy'"): e['accuracy']

def test_the_shipped_runs_moved_to_the_demo_module():
    for name in ('RUNS_ASSET', 'SHIPPED_RUNS', 'SHIPPED_WEIGHTS', 'SHIPPED_EVAL', 'recipe_of', 'load_run'):
        with pytest.warns(FutureWarning, match=f'dual_process.{name} is now interpkit.demos.dual_process.{name}'):
            assert getattr(dp, name) is getattr(demo, name)
    with pytest.raises(AttributeError): dp.no_such_name

def test_shipped_curves_is_load_curves():
    new = demo.load_curves()
    with pytest.warns(FutureWarning, match=r'load_curves\(\)\.curves'):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', FutureWarning)   # the moved name's own warning
            old_fn = dp.shipped_curves
        old = old_fn(new.meta)
    assert sorted(old) == sorted(new.curves) and all(old[k].equals(new[k]) for k in old)

def test_layers_and_heads_are_now_n_layers_and_n_heads():
    with pytest.warns(FutureWarning) as caught:
        old = pos_bert(SMALL, hidden=16, layers=2, heads=2, intermediate=32)
    said = ' '.join(str(w.message) for w in caught)
    assert 'layers= is now called n_layers=' in said and 'heads= is now called n_heads=' in said
    new = pos_bert(SMALL, hidden=16, n_layers=2, n_heads=2, intermediate=32)
    assert (old.config.num_hidden_layers, old.config.num_attention_heads) == (2, 2)
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    with pytest.warns(FutureWarning) as caught:
        r = DualProcessRecipe(SMALL, layers=1, heads=2)
    said = ' '.join(str(w.message) for w in caught)
    assert 'DualProcessRecipe.__init__: the argument layers= is now called n_layers=' in said and 'heads= is now called n_heads=' in said
    assert r == DualProcessRecipe(SMALL, n_layers=1, n_heads=2) and r.build().config.num_attention_heads == 2
    with pytest.raises(ConfigError, match='both layers= and n_layers='): DualProcessRecipe(layers=1, n_layers=1)

def test_masked_logits_k_is_now_n():
    m = pos_bert(SMALL, hidden=16, n_layers=1, intermediate=32)
    ids = SMALL.sample(4, 'train', 0)['input_ids']
    with torch.no_grad():
        with pytest.warns(FutureWarning, match='k= is now called n='): old = masked_logits(m, ids, k=2)
        assert torch.equal(old, masked_logits(m, ids, n=2))
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match='n=0'): masked_logits(m, ids, k=0)

def test_train_dual_process_takes_the_model_first_and_the_old_order_warns():
    def run(*args, **kw):
        out = train_dual_process(*args, steps=3, batch_size=4, eval_every=3, eval_n=5, progress=False, **kw)
        return out, [p.detach().clone() for p in out.model.parameters()]
    new, w_new = run(None, TINY)
    with pytest.warns(FutureWarning, match=r'now train_dual_process\(model, recipe\)'): old, w_old = run(TINY)
    assert isinstance(old, Trained) and all(torch.equal(a, b) for a, b in zip(w_old, w_new)) and curves(old.fit).equals(curves(new.fit))
    for call in (lambda lm: run(TINY, model=lm), lambda lm: run(TINY, lm)):   # the old keyword and the old positions
        lm = tiny_lm('gpt2', n_layers=1, d_model=16, vocab_size=TINY.task.n_tokens, seed=0)
        with pytest.warns(FutureWarning, match='the model comes first'): out, _ = call(lm)
        assert out.model is lm
    assert list(inspect.signature(train_dual_process).parameters)[:2] == ['model', 'recipe']


# ---------------------------------------------------------------- issue 51: inputs as users have them

def test_hard_accuracy_takes_arrays_and_lists_against_a_loop():
    g = np.random.default_rng(0)
    p, t = g.integers(0, 3, (200, 3)), g.integers(0, 3, (200, 3))
    want = sum(all(p[i, j] == t[i, j] for j in range(3)) for i in range(200)) / 200
    assert 0 < want < 1
    for a, b in ((p, t), (p.tolist(), t.tolist()), (torch.as_tensor(p), t), (p, torch.as_tensor(t))):
        assert hard_accuracy(a, b) == pytest.approx(want)
    with pytest.raises(ShapeError, match=r'\(200, 3\) and target \(200, 2\)'): hard_accuracy(p, t[:, :2])
    with pytest.raises(ShapeError, match='target of type list.*tensors or arrays of token ids'): hard_accuracy(p[:1], [['a', 'b', 'c']])

class _Plain(nn.Module):
    "A model of one's own: an embedding of `n` ids and a readout, called with the ids."
    def __init__(self, n, out=None): super().__init__(); self.emb, self.out = nn.Embedding(n, 8), nn.Linear(8, out or n)
    def forward(self, ids): return self.out(self.emb(ids))

@pytest.mark.parametrize('make', [lambda: pos_bert(POSTask(vocab=10, n_unseen=2), hidden=16, n_layers=1, intermediate=16),
                                  lambda: tiny_lm('gpt2', n_layers=1, d_model=16, vocab_size=10)], ids=['bert', 'gpt2'])
def test_evaluate_with_another_vocabulary_names_both(make, untouched):
    m = make()
    with untouched(m), pytest.raises(ConfigError, match=rf"embeds \d+ token ids, but the task uses ids 0 to {SMALL.n_tokens - 1}.*pos_bert\(task\)"):
        evaluate(m, SMALL, n=5)
    with untouched(m), pytest.raises(ConfigError, match=r'embeds ids 0 to \d+.*own tokenizer'): masked_logits(m, SMALL.sample(3, 'holdout', 0)['input_ids'])

def test_a_plain_module_with_another_vocabulary_gets_a_typed_error():
    with pytest.raises(ConfigError, match=rf'_Plain failed on token ids up to \d+ with IndexError.*vocabulary covers'): evaluate(_Plain(12), SMALL, n=5)
    b = SMALL.sample(4, 'train', 0)
    with pytest.raises(ConfigError, match=rf'labels up to \d+, but _Plain predicts 10 tokens'): masked_loss(_Plain(SMALL.n_tokens, 10), b)
    m = _Plain(SMALL.n_tokens)   # one that covers the task works, and its loss is the cross-entropy of its full logits
    with torch.no_grad():
        lg = m(b['input_ids'])[:, -3:]
        assert float(masked_loss(m, b)) == pytest.approx(float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), b['labels'][:, -3:].reshape(-1))), rel=1e-6)

def test_values_that_meant_something_else_are_typed_errors():
    "A plain model's NaN logits gave predictions of token 0, one sequence without its batch dimension gave one prediction per token, and curves without a metric gave a KeyError."
    x = SMALL.sample(6, 'train', 0)['input_ids']
    nan = lambda ids: torch.full((*ids.shape, SMALL.n_tokens), float('nan'))
    with pytest.raises(NotFiniteError, match='NaN or inf logits'): predictions(nan, x)
    with pytest.raises(NotFiniteError): evaluate(nan, SMALL, n=5)
    rule = lambda ids: F.one_hot(ids, SMALL.n_tokens).float()   # predicts its own input: the last three tokens, the masks
    assert predictions(rule, x).tolist() == [[SMALL.mask] * 3] * 6
    with pytest.raises(ShapeError, match=r'input_ids of shape \(7,\).*\(batch, pos\)'): predictions(rule, x[0])
    with pytest.raises(ShapeError, match=r'\(batch, pos\)'): masked_logits(rule, x[0])
    c = pd.DataFrame({'holdout': [0.1, 0.5, 0.3], 'val': [0.2, 0.4, 0.6]}, index=pd.Index([10, 20, 30], name='step'))
    s = dp.run_summary(c, last=3)
    assert s['peak_holdout'] == 0.5 and s['peak_step'] == 20 and s['val'] == pytest.approx(0.4) and s['holdout'] == pytest.approx(0.3)
    with pytest.raises(ConfigError, match=r"columns \['val'\], no 'holdout'"): dp.run_summary(c[['val']])
    with pytest.raises(ConfigError, match=r"metrics \['iwl'\] are not columns of curves.*\['holdout', 'val'\]"): dp.plot_curves(c, ['val', 'iwl'])
    ax = dp.plot_curves(c, 'val'); assert [l.get_label() for l in ax.get_lines()][:1] == ['val']
    matplotlib.pyplot.close('all')

def test_train_dual_process_on_a_model_of_another_vocabulary():
    "A model of one's own that cannot read the task's ids fails before training (it embeds too few) or at the first step with a typed error, not an IndexError."
    class Embeds(_Plain):
        def get_input_embeddings(self): return self.emb
    with pytest.raises(ShapeError, match=f'The model has 12 tokens.*{TINY.task.n_tokens - 1}'): train_dual_process(Embeds(12), TINY, steps=1, progress=False)
    with pytest.raises(ConfigError, match='_Plain failed on token ids up to'): train_dual_process(_Plain(12), TINY, steps=1, eval_every=1, eval_n=5, progress=False)

def test_evaluation_sets_need_a_count():
    "evaluation_sets(n=[3]) raised TypeError inside the sampler; n=0 gave empty splits."
    from interpkit.papers.dual_process import evaluation_sets
    for n in ([3], 0, 2.5):
        with pytest.raises(ConfigError, match=r'n='): evaluation_sets(SMALL, n=n)
    assert len(evaluation_sets(SMALL, n=2).train['input_ids']) == 2
