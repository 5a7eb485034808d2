"""The test oracle's multi-label positives and known false negatives (docs/MATH.md, "Multi-label
positives and known false negatives"): reference64 against the formula written as Python loops
over sets, and its reductions to the single-label loss, which must be exact."""
import math

import pytest
import torch

from support.reference64 import supcon_reference64


def _log_sum_exp(values):
    values = list(values)
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _loop_multilabel(features, label_sets, t, rule, groups=None, contrast=None,
                     contrast_sets=None, contrast_groups=None, reduction="none"):
    """l_i = LSE_i - sum_j w_ij s_ij / sum_j w_ij over Python sets and floats, rows unit-normed;
    a single set excludes the anchor's own column."""
    def unit(r):
        n = math.sqrt(sum(a * a for a in r))
        return [a / max(n, 1e-12) for a in r]

    rows = [unit(r) for r in features.double().tolist()]
    single = contrast is None
    cols = rows if single else [unit(r) for r in contrast.double().tolist()]
    col_sets = label_sets if single else contrast_sets
    col_groups = groups if single else contrast_groups

    def weight(a, b):
        shared, union = len(a & b), len(a | b)
        if rule == "any":
            return 1.0 if shared else 0.0
        return shared / union if union else 0.0

    losses, with_positives = [], 0
    for i, anchor in enumerate(rows):
        logits, weights = {}, {}
        for j, col in enumerate(cols):
            if single and j == i:
                continue
            w = weight(label_sets[i], col_sets[j])
            if (groups is not None and groups[i] >= 0 and groups[i] == col_groups[j]
                    and w == 0):
                continue  # a known false negative: neither pulled nor pushed
            logits[j] = sum(a * b for a, b in zip(anchor, col)) / t
            if w > 0:
                weights[j] = w
        with_positives += bool(weights)
        losses.append(_log_sum_exp(logits.values()) - sum(w * logits[j] for j, w in weights.items())
                      / sum(weights.values()) if weights else 0.0)
    if reduction == "none":
        return losses
    return sum(losses) / max(with_positives, 1)


def _multi_hot(sets, classes):
    hot = torch.zeros(len(sets), classes, dtype=torch.bool)
    for row, classes_of_row in enumerate(sets):
        hot[row, list(classes_of_row)] = True
    return hot


def _random_sets(randint, rows, classes, empty_every=5):
    """Up to three classes per row, some rows without a class."""
    sets = []
    for row in range(rows):
        count = 0 if row % empty_every == empty_every - 1 else int(randint(1, 4, ()))
        sets.append({int(c) for c in randint(0, classes, (count,))})
    return sets


@pytest.mark.parametrize("classes", [1, 3, 63, 64, 65, 200])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
def test_single_set_matches_the_loops(classes, rule, randn, randint):
    rows = 11
    # few classes per row among many: draw from a small window so that rows share classes
    window = min(classes, 6)
    sets = [{c + classes - window for c in s} for s in _random_sets(randint, rows, window)]
    groups = randint(-1, 3, (rows,))
    x = randn(rows, 5, dtype=torch.float64)
    for g in (None, groups):
        got = supcon_reference64(x, _multi_hot(sets, classes), 0.4, multi_label=rule, groups=g,
                                 reduction="none")
        want = _loop_multilabel(x, sets, 0.4, rule, None if g is None else g.tolist())
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("rule", ["any", "jaccard"])
def test_cross_set_matches_the_loops(rule, randn, randint):
    sets, contrast_sets = _random_sets(randint, 7, 4), _random_sets(randint, 10, 4)
    groups, contrast_groups = randint(-1, 2, (7,)), randint(-1, 2, (10,))
    x, c = randn(7, 4, dtype=torch.float64), randn(10, 4, dtype=torch.float64)
    got = supcon_reference64(x, _multi_hot(sets, 4), 0.2, contrast=c,
                             contrast_labels=_multi_hot(contrast_sets, 4), multi_label=rule,
                             groups=groups, contrast_groups=contrast_groups, reduction="mean")
    want = _loop_multilabel(x, sets, 0.2, rule, groups.tolist(), c, contrast_sets,
                            contrast_groups.tolist(), reduction="mean")
    assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_hand_computed_jaccard_and_group():
    # unit rows at 0, 90 and 180 degrees, t = 1; classes {0, 1}, {1}, {2}; rows 0 and 2 one group
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 1]])
    groups = torch.tensor([0, -1, 0])
    got = supcon_reference64(x, labels, 1.0, multi_label="jaccard", groups=groups,
                             reduction="none")
    # anchor 0: column 2 leaves (same group, no shared class); column 1 (s = 0, w = 1/2) alone
    # l = LSE - s = 0; anchor 1: columns 0 (s = 0, w = 1/2) and 2 (s = 0): l = log 2;
    # anchor 2: no positive
    assert got.tolist() == pytest.approx([0.0, math.log(2), 0.0], abs=1e-15)


@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("views", [1, 2])
def test_one_class_per_row_is_the_single_label_loss_exactly(rule, views, randn, randint):
    """One-hot labels give today's loss and gradients bit for bit, on either rule; so do groups
    that hold no pair (all negative)."""
    b, classes = 13, 4
    ids = randint(-1, classes, (b,))
    one_hot = torch.zeros(b, classes, dtype=torch.int64)
    one_hot[ids >= 0, ids[ids >= 0]] = 1
    shape = (b, views, 6) if views > 1 else (b, 6)
    x = randn(*shape, dtype=torch.float64).requires_grad_(True)
    t = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    results = []
    for labels, groups in ((ids, None), (one_hot, None), (one_hot, torch.full((b,), -1))):
        loss = supcon_reference64(x, labels, t, multi_label=rule, groups=groups)
        results.append((loss, *torch.autograd.grad(loss, (x, t))))
    for other in results[1:]:
        for want, got in zip(results[0], other):
            assert torch.equal(want, got)


def test_groups_leave_only_the_non_positive_pairs_of_a_group(randn):
    """Every row in one group: the denominator holds the positives only; an anchor whose
    positives are its only columns has l = LSE - mean s over equal logits, and one without
    positives has none and gives 0 with finite gradients."""
    x = randn(6, 3, dtype=torch.float64).requires_grad_(True)
    labels = torch.tensor([0, 0, 1, 1, 1, -1])
    ref = supcon_reference64(x, labels, 0.5, groups=torch.zeros(6, dtype=torch.int64),
                             reduction="none", full=True)
    assert torch.equal(ref.allowed, ref.positive)
    assert ref.per_anchor[5] == 0 and not ref.allowed[5].any()
    # anchor 0's only column is its positive: pi = 1, the loss is exactly 0
    assert ref.per_anchor[0] == 0
    ref.per_anchor.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_rows_without_a_class_are_nobody_s_positive(randn):
    x = randn(5, 3, dtype=torch.float64)
    labels = torch.tensor([[1, 0], [0, 0], [1, 0], [0, 0], [0, 1]])
    for rule in ("any", "jaccard"):
        ref = supcon_reference64(x, labels, 0.5, multi_label=rule, reduction="none", full=True)
        assert not ref.positive[:, [1, 3]].any() and not ref.positive[[1, 3]].any()
        assert ref.num_positives.tolist() == [1, 0, 1, 0, 0]


def test_jaccard_weights_the_positives(randn):
    x = randn(3, 3, dtype=torch.float64)
    labels = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    ref = supcon_reference64(x, labels, 0.5, multi_label="jaccard", reduction="none", full=True)
    assert ref.weights.tolist() == [[0.0, 1 / 3, 2 / 3], [1 / 3, 0.0, 1 / 2], [2 / 3, 1 / 2, 0.0]]
    any_rule = supcon_reference64(x, labels, 0.5, multi_label="any", reduction="none", full=True)
    assert torch.equal(any_rule.weights, (ref.weights > 0).double())
    assert not torch.equal(ref.per_anchor, any_rule.per_anchor)


def test_gradients_pass_gradcheck(randn, randint):
    x = randn(7, 3, dtype=torch.float64).requires_grad_(True)
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    labels = _multi_hot(_random_sets(randint, 7, 3), 3)
    groups = randint(-1, 2, (7,))

    def loss(rows, temperature):
        return supcon_reference64(rows, labels, temperature, multi_label="jaccard",
                                  groups=groups, focal_gamma=0.0)

    assert torch.autograd.gradcheck(loss, (x, t))


def test_focal_weights_each_positive_term(randn):
    """The focal loss with weights: sum_j w_ij (1 - pi)^gamma (-log pi) / sum_j w_ij, the
    single-label focal loss for one-hot labels."""
    x = randn(8, 3, dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])
    one_hot = torch.nn.functional.one_hot(ids, 3)
    want = supcon_reference64(x, ids, 0.5, focal_gamma=2.0)
    assert torch.equal(supcon_reference64(x, one_hot, 0.5, focal_gamma=2.0,
                                          multi_label="jaccard"), want)


def test_unknown_rule_is_a_value_error(randn):
    with pytest.raises(ValueError, match="multi_label must be 'any' or 'jaccard'"):
        supcon_reference64(randn(3, 2, dtype=torch.float64), torch.tensor([0, 0, 1]),
                           multi_label="all")
