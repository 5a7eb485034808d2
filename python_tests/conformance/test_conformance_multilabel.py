"""The conformance suite, multi-label positives (multi-hot ``labels``, docs/MATH.md section 11):
every backend whose positive walk weighs pairs against the float64 reference, under both rules,
on every labelled layout, awkward class counts (C = 1, 63, 64, 65, 200) and sizes, rows without a
class, all rows one class, groups, the focal loss, fp32 / fp64 / bf16 and a learnable
temperature; one class per row is the single-label loss; the backends without pair weights
refuse the call, quoting the plan."""
import pytest
import torch

import scl_kernels
from scl_kernels._testing import test_hooks
from support.capability_plans import capability_in_plan
from support.layouts import make_layout
from support.reference64 import check_backend_against_reference

RULES = ["any", "jaccard"]
LABELLED = ["single_all", "multiview_all", "multiview_one", "cross_labels", "cross_multiview"]


def _has_pair_weights(backend):
    return capability_in_plan(backend, "multi_label", "no pair weights",
                              torch.ones(2, 3, dtype=torch.bool))


def _needs_pair_weights(backend, focal_gamma=0.0, groups=False):
    if not _has_pair_weights(backend):
        pytest.skip(f"{backend}'s walk has no pair weights (test_backends_without_them_refuse)")
    cannot = backend.info.cannot_run(focal_gamma, groups=groups, multi_label=True)
    if cannot:
        pytest.skip(f"{backend} refuses this call: {cannot}")


def _multi_hot(randint, rows, classes, per_row=3, empty_every=5):
    """[rows, classes] bool: 1 to ``per_row`` classes a row (drawn with repeats), and every
    ``empty_every``-th row without a class."""
    hot = torch.zeros(rows, classes, dtype=torch.bool)
    counts = randint(1, per_row + 1, (rows,))
    for r in range(rows):
        hot[r, randint(0, classes, (int(counts[r]),))] = True
    hot[::empty_every] = False
    return hot


def _with_multi_hot(kw, randint, classes, **draw):
    kw = dict(kw)
    samples = kw["features"].shape[0]
    kw["labels"] = _multi_hot(randint, samples, classes, **draw)
    if kw["contrast"] is not None:
        kw["contrast_labels"] = _multi_hot(randint, kw["contrast"].shape[0], classes, **draw)
    return kw


# 0.02 takes the running-max ("plain") path in fp32; 0.1 the symmetric one for single-set "all".
@pytest.mark.matrix(layout=LABELLED, dtype=[torch.float32, torch.float64], rule=RULES,
                    temperature=[0.02, 0.1], quick="each")
def test_layouts(backend, layout, dtype, rule, temperature, randn, randint, gen):
    _needs_pair_weights(backend)
    kw = _with_multi_hot(make_layout(layout, randn, randint, dtype=dtype, n=45, d=37), randint, 7)
    res = check_backend_against_reference(backend, kw, gen, temperature=temperature, multi_label=rule)
    # The rows share classes in more than one way: the weights are not all 0 / 1 for jaccard.
    if rule == "jaccard":
        assert ((res.ref.weights > 0) & (res.ref.weights < 1)).any()


@pytest.mark.matrix(classes=[1, 63, 64, 65, 200], rule=RULES)
def test_class_counts(backend, classes, rule, randn, randint, gen):
    """C across the 64-bit words' edges; many classes a row, so that pairs share several and
    are counted once, under the lowest."""
    _needs_pair_weights(backend)
    per_row = max(1, classes // 3)
    kw = make_layout("single_all", randn, randint, n=70, d=16)
    kw["labels"] = _multi_hot(randint, 70, classes, per_row=per_row)
    kw["labels"][1::7, classes - 1] = True  # the last class, in its last word
    check_backend_against_reference(backend, kw, gen, temperature=0.1, multi_label=rule)


@pytest.mark.matrix(n=[1, 2, 7, 130, 300], d=[1, 64], rule=RULES)
def test_awkward_shapes(backend, n, d, rule, randn, randint, gen):
    _needs_pair_weights(backend)
    kw = _with_multi_hot(make_layout("single_all", randn, randint, n=n, d=d), randint, 5)
    check_backend_against_reference(backend, kw, gen, temperature=torch.tensor(0.07, requires_grad=True), reduction="none",
         multi_label=rule)


@pytest.mark.matrix(layout=["single_all", "cross_labels"], rule=RULES)
def test_rows_without_a_class_and_one_class_for_all(backend, layout, rule, randn, randint, gen):
    _needs_pair_weights(backend)
    kw = make_layout(layout, randn, randint, n=30, d=8)
    kw["labels"] = torch.ones(30, 4, dtype=torch.bool)
    kw["labels"][::3] = False
    if kw["contrast"] is not None:
        kw["contrast_labels"] = torch.zeros(kw["contrast"].shape[0], 4, dtype=torch.bool)
        kw["contrast_labels"][:, 2] = True
    check_backend_against_reference(backend, kw, gen, temperature=0.1, reduction="none", multi_label=rule)


def _few_classes(randint, rows, classes):
    """Rows of 1 or 2 classes, every fifth without one, and one row each of 7 and 8 classes
    (the most that sums over class subsets take)."""
    hot = _multi_hot(randint, rows, classes, per_row=2)
    hot[1:3] = False
    hot[1, :8] = True
    hot[2, 1:8] = True
    return hot


@pytest.mark.matrix(layout=LABELLED, rule=RULES, way=["pair_walk", "class_subsets"])
def test_pair_walk_and_class_subsets(backend, layout, rule, way, randn, randint, gen):
    """The CPU and CUDA C++ weigh multi-hot positives by sums over class subsets where the rows
    hold few classes (csrc/cpu/class_subset_sums.h; csrc/core/class_subset_gathers.h) and pair
    by pair otherwise (the CPU's pair walk; csrc/core/class_overlap_products.h): each way,
    forced by the test hook (which fails where the rows do not fit the sums), on every labelled
    layout."""
    if backend.name not in ("cpu", "cuda"):
        pytest.skip("the two ways of the CPU and CUDA C++ backends")
    kw = make_layout(layout, randn, randint, n=45, d=37)
    kw["labels"] = _few_classes(randint, kw["features"].shape[0], 11)
    if kw["contrast"] is not None:
        kw["contrast_labels"] = _few_classes(randint, kw["contrast"].shape[0], 11)
    with test_hooks(multi_label_positives=way):
        check_backend_against_reference(backend, kw, gen, temperature=0.1, multi_label=rule)


def test_class_subsets_take_rows_of_at_most_eight_classes():
    kw = dict(features=torch.randn(40, 5), labels=torch.zeros(40, 12, dtype=torch.bool))
    kw["labels"][:, 0] = True
    with test_hooks(multi_label_positives="class_subsets"):
        scl_kernels.supcon_loss(**kw, backend="cpu")
        kw["labels"][3, :9] = True
        with pytest.raises(RuntimeError, match="too many classes for sums over class subsets"):
            scl_kernels.supcon_loss(**kw, backend="cpu")


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"], rule=RULES)
def test_groups(backend, layout, rule, randn, randint, gen):
    _needs_pair_weights(backend, groups=True)
    kw = _with_multi_hot(make_layout(layout, randn, randint, n=40, d=9), randint, 6)
    kw["groups"] = randint(-1, 5, (kw["features"].shape[0],))
    if kw["contrast"] is not None:
        kw["contrast_groups"] = randint(-1, 5, (kw["contrast"].shape[0],))
    check_backend_against_reference(backend, kw, gen, temperature=0.1, multi_label=rule)


@pytest.mark.matrix(layout=["single_all", "cross_labels"], focal_gamma=[0.5, 2.0], rule=RULES)
def test_focal_loss(backend, layout, focal_gamma, rule, randn, randint, gen):
    _needs_pair_weights(backend, focal_gamma=focal_gamma)
    kw = _with_multi_hot(make_layout(layout, randn, randint, n=40, d=9), randint, 5)
    check_backend_against_reference(backend, kw, gen, temperature=0.1, focal_gamma=focal_gamma, multi_label=rule)


@pytest.mark.matrix(layout=["single_all", "cross_labels"], rule=RULES, dtype=[torch.bfloat16])
def test_half_precision(backend, layout, rule, dtype, randn, randint, gen):
    _needs_pair_weights(backend)
    kw = _with_multi_hot(make_layout(layout, randn, randint, dtype=dtype, n=45, d=37), randint, 6)
    check_backend_against_reference(backend, kw, gen, temperature=0.1, multi_label=rule)


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"], rule=RULES)
def test_one_class_per_row_is_the_single_label_loss(backend, layout, rule, randn, randint):
    """One-hot rows (and empty ones for negative labels) give the class-id call's loss and
    gradients to rounding (another summation order)."""
    _needs_pair_weights(backend)
    kw = backend.put(make_layout(layout, randn, randint, n=33, d=7, classes=5))
    kw["labels"] = torch.where(randint(0, 6, kw["labels"].shape) == 0, -1, kw["labels"])

    def one_hot(labels):
        return torch.nn.functional.one_hot(labels.clamp_min(0), 5).bool() & (labels >= 0)[:, None]

    def loss_and_grad(**labels):
        features = kw["features"].detach().requires_grad_(True)
        loss = scl_kernels.supcon_loss(**dict(kw, features=features, **labels), temperature=0.1,
                                       backend=backend.name, multi_label=rule)
        return loss, torch.autograd.grad(loss, features)[0]

    hot = dict(labels=backend.put(one_hot(kw["labels"])))
    if kw["contrast_labels"] is not None:
        hot["contrast_labels"] = backend.put(one_hot(kw["contrast_labels"]))
    single, multi = loss_and_grad(), loss_and_grad(**hot)
    torch.testing.assert_close(multi[0], single[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(multi[1], single[1], rtol=1e-4, atol=1e-6)


def test_backends_without_them_refuse(backend, randn, randint):
    if _has_pair_weights(backend):
        pytest.skip(f"{backend} weighs multi-label pairs")
    kw = backend.put(dict(features=randn(6, 4), labels=torch.ones(6, 3, dtype=torch.bool)))
    with pytest.raises(ValueError, match="cannot_run: no pair weights.*cpu"):
        scl_kernels.supcon_loss(**kw, backend=backend.name)
    if backend.info.forward_op is not None:
        with pytest.raises(NotImplementedError, match="cannot_run: no pair weights"):
            backend.info.forward_op(kw["features"], kw["labels"], None, None,
                                    torch.tensor(0.1, dtype=torch.float64), 6, True)


@pytest.mark.parametrize("bad, error, match", [
    (dict(labels=torch.ones(6, 0, dtype=torch.bool)), ValueError, "at least one class"),
    (dict(labels=torch.ones(6, 3, 2, dtype=torch.bool)), ValueError, "labels must be one-dim"),
    (dict(labels=torch.ones(6, 3)), TypeError, "labels must be an integer"),
    (dict(labels=torch.full((6, 3), 2)), ValueError, "multi-hot labels must hold 0 or 1"),
    (dict(multi_label="all"), ValueError, "multi_label must be one of"),
    (dict(contrast=torch.ones(4, 5), contrast_labels=torch.ones(4, 2, dtype=torch.bool)),
     ValueError, "contrast_labels must be multi-hot rows of shape \\[4, 3\\]"),
    (dict(contrast=torch.ones(4, 5), contrast_labels=torch.ones(4, dtype=torch.long)),
     ValueError, "contrast_labels must be multi-hot rows"),
])
@pytest.mark.parametrize("name", ["cpu", "reference"])
def test_bad_arguments(name, bad, error, match):
    kw = dict(features=torch.randn(6, 5), labels=torch.ones(6, 3, dtype=torch.bool))
    kw.update(bad)
    with pytest.raises(error, match=match):
        scl_kernels.supcon_loss(**kw, backend=name)


@pytest.mark.parametrize("bad, error, match", [
    (dict(multi_label="all"), ValueError, "multi_label must be 'any' or 'jaccard'"),
    (dict(labels=torch.full((6, 3), 2)), ValueError, "multi-hot labels must hold 0 or 1"),
    (dict(labels=torch.ones(6, 3)), TypeError, "labels as multi-hot rows must be a bool or int"),
    (dict(contrast=torch.ones(4, 5), contrast_labels=torch.ones(4, dtype=torch.long)),
     ValueError, "contrast_labels must take the form of labels"),
])
def test_the_ops_own_checks(bad, error, match):
    kw = dict(features=torch.randn(6, 5), labels=torch.ones(6, 3, dtype=torch.bool),
              contrast=None, contrast_labels=None)
    kw.update(bad)
    num_anchors = 6
    with pytest.raises(error, match=match):
        torch.ops.scl.supcon(kw.pop("features"), kw.pop("labels"), kw.pop("contrast"),
                             kw.pop("contrast_labels"), torch.tensor(0.1, dtype=torch.float64),
                             num_anchors, True, **kw)


def test_explain_names_the_rule():
    plan = scl_kernels.explain(torch.randn(8, 4), torch.ones(8, 3, dtype=torch.bool),
                               multi_label="jaccard", backend="cpu").plan
    assert plan["multi_label"] == "jaccard"
    assert plan["forward_finish"] == "positive walk"
