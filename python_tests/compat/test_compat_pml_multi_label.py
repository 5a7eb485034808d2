"""scl_kernels.compat.pml.MultiSupConLoss, the multi-label SupCon of
pytorch-metric-learning PR #667 in that library's style. No release of pytorch-metric-learning ships a MultiSupConLoss to test
against, so the drop-in is held to the formula its docstring states, Jaccard-weighted positives
(docs/MATH.md section 11) reduced by AvgNonZeroReducer, against the float64 oracle: value and
gradients, fp64 and fp32, single and cross sets, rows without a class, every multi-hot form; with
one class per row, to pytorch-metric-learning's own SupConLoss; and its errors."""
import pytest
import torch
import torch.nn.functional as F

from scl_kernels.compat import pml
from support.pml_calls import random_rows, value_and_grads
from support.reference64 import supcon_reference64

COMPAT_MODULE = pml  # whose supcon_loss calls the fused_calls fixture records


def random_multi_hot(seed, rows, classes, density=0.35):
    """bool [rows, classes]; some rows come out without a class."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(rows, classes, generator=generator) < density


def oracle(embeddings, labels, temperature, ref_emb=None, ref_labels=None):
    """The docstring's formula: the float64 Jaccard SupCon per anchor, then the mean over the
    anchors whose loss is > 0 (0 when none is)."""
    per_anchor = supcon_reference64(embeddings, labels.bool(), temperature, contrast=ref_emb,
                                    contrast_labels=None if ref_labels is None else ref_labels.bool(),
                                    multi_label="jaccard", reduction="none")
    counted = per_anchor > 0
    return torch.where(counted, per_anchor, 0).sum() / counted.sum().clamp_min(1)


# (id, N, D, C, ref rows M (None: no ref_emb), temperature, quick)
CASES = [
    ("single-set", 20, 8, 5, None, 0.07, True),
    ("many-classes", 32, 16, 40, None, 0.1, False),
    ("one-class", 12, 8, 1, None, 0.2, False),
    ("ref-emb", 17, 8, 6, 13, 0.07, True),
    ("ref-emb-more-rows", 9, 8, 4, 40, 0.2, False),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("rows,dim,classes,ref_rows,temperature", [
    pytest.param(*case[1:6], id=case[0], marks=[pytest.mark.quick] if case[6] else [])
    for case in CASES])
def test_value_and_gradients_are_the_jaccard_formula(assert_results_close, scl_backend, fused_calls,
                                                     dtype, rows, dim, classes, ref_rows,
                                                     temperature):
    embeddings = random_rows(1, rows, dim, dtype)
    labels = random_multi_hot(2, rows, classes)
    ref_emb = None if ref_rows is None else random_rows(3, ref_rows, dim, dtype)
    ref_labels = None if ref_rows is None else random_multi_hot(4, ref_rows, classes)
    criterion = pml.MultiSupConLoss(classes, temperature, backend=scl_backend)
    got = value_and_grads(criterion, embeddings, labels, ref_emb, ref_labels)
    expected = value_and_grads(lambda e, y, **ref: oracle(e, y, temperature, **ref),
                               embeddings, labels, ref_emb, ref_labels)
    assert_results_close(got, expected, dtype, ["loss", "d embeddings", "d ref_emb"])
    assert [call["multi_label"] for call in fused_calls] == ["jaccard"]


@pytest.mark.parametrize("form", ["float32", "int64", "uint8"])
def test_every_multi_hot_form_gives_the_same_loss(form):
    embeddings = random_rows(5, 16, 8, torch.float64)
    labels = random_multi_hot(6, 16, 5)
    criterion = pml.MultiSupConLoss(5)
    torch.testing.assert_close(criterion(embeddings, labels.to(getattr(torch, form))),
                               criterion(embeddings, labels), rtol=0, atol=0)


def test_ref_emb_that_is_the_embeddings_with_the_labels_is_the_single_set():
    embeddings = random_rows(7, 14, 8, torch.float64)
    labels = random_multi_hot(8, 14, 4)
    criterion = pml.MultiSupConLoss(4)
    torch.testing.assert_close(criterion(embeddings, labels, ref_emb=embeddings, ref_labels=labels),
                               criterion(embeddings, labels), rtol=0, atol=0)


def test_a_batch_without_a_shared_class_gives_zero_and_a_zero_gradient():
    embeddings = random_rows(9, 4, 8, torch.float64).requires_grad_(True)
    labels = torch.eye(4, dtype=torch.bool)
    loss = pml.MultiSupConLoss(4)(embeddings, labels)
    loss.backward()
    assert loss.item() == 0.0 and not embeddings.grad.any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_one_class_per_row_is_pml_supcon(assert_results_close, dtype):
    """w_ij is then 1 for a same-class pair: pytorch-metric-learning's own SupConLoss, on a batch
    that has a negative pair."""
    pml_losses = pytest.importorskip(
        "pytorch_metric_learning.losses",
        reason="the oracle is pytorch-metric-learning's own SupConLoss "
               "(pip install pytorch-metric-learning)")
    embeddings = random_rows(10, 24, 8, dtype)
    classes = torch.randint(0, 5, (24,), generator=torch.Generator().manual_seed(11))
    got = value_and_grads(pml.MultiSupConLoss(5, 0.1), embeddings, F.one_hot(classes, 5))
    expected = value_and_grads(pml_losses.SupConLoss(temperature=0.1), embeddings, classes)
    assert_results_close(got, expected, dtype, ["loss", "d embeddings"])


def test_bad_calls_say_what_is_wrong():
    embeddings = random_rows(12, 6, 4, torch.float64)
    labels = random_multi_hot(13, 6, 3)
    criterion = pml.MultiSupConLoss(3)
    with pytest.raises(NotImplementedError, match="indices_tuple"):
        criterion(embeddings, labels, indices_tuple=(torch.tensor([0]),) * 3)
    with pytest.raises(ValueError, match=r"labels must be multi-hot rows of shape \[6, 3\]"):
        criterion(embeddings, labels[:, :2])
    with pytest.raises(ValueError, match=r"labels as multi-hot rows must have shape"):
        criterion(embeddings, labels.long().argmax(1))
    soft = labels.double()
    soft[4, 1] = 0.7
    with pytest.raises(ValueError, match="must hold 0 or 1, got 0.7 at row 4, class 1"):
        criterion(embeddings, soft)
    with pytest.raises(ValueError, match="ref_emb and ref_labels must be given together"):
        criterion(embeddings, labels, ref_emb=embeddings.clone())
    with pytest.raises(ValueError, match=r"leaves out the pairs \(i, i\)"):
        criterion(embeddings, labels, ref_emb=embeddings.clone(), ref_labels=labels)
    with pytest.raises(ValueError, match=r"ref_labels must be multi-hot rows of shape \[5, 3\]"):
        criterion(embeddings, labels, ref_emb=embeddings[:5], ref_labels=labels.clone())
    for num_classes in (0, 2.0, True):
        with pytest.raises(ValueError, match="num_classes must be a positive int"):
            pml.MultiSupConLoss(num_classes)
