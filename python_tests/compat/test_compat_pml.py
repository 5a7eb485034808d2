"""scl_kernels.compat.pml.SupConLoss against pytorch-metric-learning's own SupConLoss.

Same value and gradients, fp64 to 1e-12, on random cases that cover anchors without positives,
negative labels, ref_emb with its own labels, ref_emb that is the embeddings, batches without a
positive or without a negative pair (pml's 0), and pml's exclusion of the pairs (i, i) when
``ref_labels is labels`` (dense, with a warning once); pml's default distance and reducer passed
explicitly, any other refused naming pml's own class.
"""
import subprocess
import sys

import pytest
import torch

from scl_kernels.compat import pml
from support.pml_calls import random_rows, value_and_grads

pml_losses = pytest.importorskip(
    "pytorch_metric_learning.losses",
    reason="the oracle is pytorch-metric-learning's own SupConLoss "
           "(pip install pytorch-metric-learning)")

from pytorch_metric_learning.distances import CosineSimilarity, LpDistance  # noqa: E402
from pytorch_metric_learning.reducers import AvgNonZeroReducer, MeanReducer  # noqa: E402

COMPAT_MODULE = pml  # whose supcon_loss calls the fused_calls fixture records


def random_labels(seed, count, low, high):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (count,), generator=generator)


def assert_matches_oracle(check, ours, oracle, dtype, call):
    """``call(criterion)`` returns the tuple to compare; it runs for both criteria."""
    expected, got = call(oracle), call(ours)
    check(got, expected, dtype, ["loss", "d embeddings", "d ref_emb"])
    return got


# (id, N, D, anchor labels in [low, high), ref rows M (None: no ref_emb), ref labels in [low, high),
#  temperature, quick)
CASES = [
    ("some-singletons", 20, 8, (0, 8), None, None, 0.1, True),
    ("few-classes", 32, 16, (0, 3), None, None, 0.05, False),
    ("negative-labels", 18, 8, (-4, 2), None, None, 0.1, False),
    ("ref-emb", 17, 8, (0, 6), 13, (0, 10), 0.1, True),
    ("ref-emb-more-rows", 9, 8, (0, 4), 40, (0, 5), 0.2, False),
    ("ref-emb-negative-labels", 12, 8, (-3, 3), 15, (-3, 3), 0.1, False),
    ("ref-emb-one-row", 10, 8, (0, 2), 1, (0, 1), 0.1, False),
    ("larger", 64, 32, (0, 10), None, None, 0.07, False),
    ("larger-ref-emb", 48, 32, (0, 10), 80, (0, 10), 0.07, False),
]


def _case_params():
    return [pytest.param(*case[1:7], id=case[0], marks=[pytest.mark.quick] if case[7] else [])
            for case in CASES]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("rows,dim,label_range,ref_rows,ref_label_range,temperature",
                         _case_params())
def test_matches_pml(assert_results_close, scl_backend, dtype, rows, dim, label_range, ref_rows,
                     ref_label_range, temperature):
    embeddings = random_rows(rows, rows, dim, dtype)
    labels = random_labels(rows + 1, rows, *label_range)
    ref_emb = ref_labels = None
    if ref_rows is not None:
        ref_emb = random_rows(ref_rows + 2, ref_rows, dim, dtype)
        ref_labels = random_labels(ref_rows + 3, ref_rows, *ref_label_range)
    got = assert_matches_oracle(
        assert_results_close, pml.SupConLoss(temperature, backend=scl_backend),
        pml_losses.SupConLoss(temperature), dtype,
        lambda criterion: value_and_grads(criterion, embeddings, labels, ref_emb, ref_labels))
    assert torch.isfinite(got[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("labels,ref_labels", [
    pytest.param(torch.arange(8), None, id="no-positive-pair"),
    pytest.param(torch.full((8,), 3), None, id="no-negative-pair", marks=pytest.mark.quick),
    pytest.param(torch.arange(8), torch.arange(10, 16), id="ref-emb-no-positive-pair",
                 marks=pytest.mark.quick),
    pytest.param(torch.full((8,), 3), torch.full((6,), 3), id="ref-emb-no-negative-pair"),
])
def test_batches_without_pairs_give_zero(assert_results_close, scl_backend, dtype, labels,
                                         ref_labels):
    """pml's 0 with zero gradients, where the native mean would give a loss for "no negative"."""
    embeddings = random_rows(1, labels.shape[0], 8, dtype)
    ref_emb = None if ref_labels is None else random_rows(2, ref_labels.shape[0], 8, dtype)
    got = assert_matches_oracle(
        assert_results_close, pml.SupConLoss(0.1, backend=scl_backend), pml_losses.SupConLoss(0.1),
        dtype,
        lambda criterion: value_and_grads(criterion, embeddings, labels, ref_emb, ref_labels))
    assert got[0] == 0 and all((g == 0).all() for g in got[1:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_ref_emb_that_is_the_embeddings(assert_results_close, scl_backend, fused_calls, dtype):
    """With labels itself as ref_labels pml leaves each anchor out of its softmax (a single set);
    with a copy of the labels each anchor is its own positive and takes part (a cross set)."""
    embeddings = random_rows(4, 16, 8, dtype)
    labels = random_labels(5, 16, 0, 5)

    def same_tensors(criterion):
        leaf = embeddings.clone().requires_grad_(True)
        loss = criterion(leaf, labels, ref_emb=leaf, ref_labels=labels)
        return loss.detach(), torch.autograd.grad(loss, leaf)[0]

    def copied_labels(criterion):
        leaf = embeddings.clone().requires_grad_(True)
        loss = criterion(leaf, labels, ref_emb=leaf, ref_labels=labels.clone())
        return loss.detach(), torch.autograd.grad(loss, leaf)[0]

    ours, oracle = pml.SupConLoss(0.1, backend=scl_backend), pml_losses.SupConLoss(0.1)
    single = assert_matches_oracle(assert_results_close, ours, oracle, dtype, same_tensors)
    cross = assert_matches_oracle(assert_results_close, ours, oracle, dtype, copied_labels)
    assert abs(single[0] - cross[0]) > 0.01
    assert [call.get("contrast") is not None for call in fused_calls] == [False, True]


@pytest.mark.quick
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_ref_labels_is_labels_runs_dense_with_one_warning(assert_results_close, scl_backend,
                                                          fused_calls, fresh_warnings, recwarn,
                                                          dtype):
    embeddings, ref_emb = random_rows(6, 14, 8, dtype), random_rows(7, 14, 8, dtype)
    labels = random_labels(8, 14, 0, 4)
    ours = pml.SupConLoss(0.1, backend=scl_backend)
    assert_matches_oracle(assert_results_close, ours, pml_losses.SupConLoss(0.1), dtype,
                          lambda criterion: value_and_grads(criterion, embeddings, labels,
                                                            ref_emb, labels))
    ours(embeddings, labels, ref_emb=ref_emb, ref_labels=labels)
    warnings = [w for w in recwarn if "pair (i, i)" in str(w.message)]
    assert len(warnings) == 1 and "labels.clone()" in str(warnings[0].message)
    assert not fused_calls


@pytest.mark.parametrize("call,error,match", [
    (lambda c, e, l: c(e, l, indices_tuple=(l, l, l)), NotImplementedError, "indices_tuple"),
    (lambda c, e, l: c(e), ValueError, "labels is required"),
    (lambda c, e, l: c(e, l, ref_labels=l), ValueError, "ref_labels given without ref_emb"),
    (lambda c, e, l: c(e, l, ref_emb=e), ValueError, "ref_labels is required"),
    (lambda c, e, l: c(e[None], l), ValueError, r"embeddings must have shape \[N, D\]"),
    (lambda c, e, l: c(e, l[:3]), ValueError, r"labels must have shape \[4\]"),
    (lambda c, e, l: c(e, l, ref_emb=e[:2], ref_labels=l), ValueError,
     r"ref_labels must have shape \[2\]"),
], ids=["indices-tuple", "no-labels", "ref-labels-alone", "ref-emb-alone", "three-dims",
        "labels-count", "ref-labels-count"])
def test_bad_calls_raise(call, error, match):
    with pytest.raises(error, match=match):
        call(pml.SupConLoss(backend="reference"), torch.randn(4, 3), torch.tensor([0, 0, 1, 1]))


def test_pmls_default_distance_and_reducer_passed_explicitly_are_the_default(assert_results_close):
    embeddings, labels = random_rows(5, 12, 6, torch.float64), random_labels(6, 12, 0, 4)
    explicit = dict(distance=CosineSimilarity(), reducer=AvgNonZeroReducer())
    assert_matches_oracle(assert_results_close, pml.SupConLoss(0.1, backend="reference", **explicit),
                          pml_losses.SupConLoss(0.1, **explicit), torch.float64,
                          lambda criterion: value_and_grads(criterion, embeddings, labels))


@pytest.mark.parametrize("name, value, error, got", [
    ("distance", LpDistance(), TypeError, "LpDistance"),
    ("distance", CosineSimilarity(power=2), ValueError, "CosineSimilarity(power=2)"),
    ("distance", "cosine", TypeError, "str"),
    ("reducer", MeanReducer(), TypeError, "MeanReducer"),
    ("reducer", AvgNonZeroReducer(collect_stats=True), ValueError,
     "AvgNonZeroReducer(collect_stats=True)"),
], ids=["lp-distance", "cosine-power-2", "string", "mean-reducer", "collecting-stats"])
def test_other_distances_and_reducers_name_pmls_own_class(name, value, error, got):
    wanted = ("pytorch_metric_learning.distances.CosineSimilarity() with its default settings, "
              "the only distance" if name == "distance" else
              "pytorch_metric_learning.reducers.AvgNonZeroReducer() with its default settings, "
              "the only reduction")
    with pytest.raises(error) as raised:
        pml.SupConLoss(**{name: value})
    assert str(raised.value) == (f"{name} must be {wanted} this drop-in computes, got {got}; use "
                                 "pytorch_metric_learning.losses.SupConLoss for any other")


def test_the_drop_in_leaves_pml_unimported():
    """pml is imported only to check an explicit distance or reducer."""
    code = ("import sys, torch, scl_kernels, scl_kernels.compat.pml as p; "
            "p.SupConLoss(backend='reference')(torch.randn(4, 3), torch.tensor([0, 0, 1, 1])); "
            "assert 'pytorch_metric_learning' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
