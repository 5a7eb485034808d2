"""The multi-process checks of multi-hot labels under scl_kernels.distributed: each case runs on
every rank of a gloo group and compares the loss and the gradients with the float64 oracle
(supcon_reference64 with ``multi_label``) on the concatenated global batch (the comparison is
groups_distributed_cases.compare's, given C), and with a cross-batch memory on the global batch
followed by the memory's rows; errors on every rank. distributed/test_distributed_multilabel.py
spawns the ranks."""
import torch

import scl_kernels.distributed as sd
from scl_kernels.nn import SupConMemory
from .distributed_cases import SIZES, _close, _local, assert_each_call_raises
from .groups_distributed_cases import compare
from .memory_oracle import multi_hot, oracle_with_memory
from .spawned_ranks import join_gloo_group, run_cases

CASES = {}
RULES = ("any", "jaccard")


def case(function):
    CASES[function.__name__] = function
    return function


@case
def single_set_reductions(rank, world):
    for rule in RULES:
        for reduction in ("mean", "sum", "none"):
            compare(rank, world, classes=65, multi_label=rule, groups=None, reduction=reduction,
                    learnable_temperature=True, seed=30)


@case
def awkward_class_counts(rank, world):
    """One class (every pair of labelled rows positive), exactly one 64-bit word, one past it."""
    for rule in RULES:
        for classes in (1, 64, 65):
            compare(rank, world, classes=classes, multi_label=rule, groups=None, seed=31 + classes)


@case
def rows_without_a_class_unnormalised(rank, world):
    for rule in RULES:
        compare(rank, world, classes=5, multi_label=rule, labels="with_none", groups=None,
                normalize=False, reduction="none", seed=32)


@case
def views(rank, world):
    for mode in ("all", "one"):
        compare(rank, world, classes=65, multi_label="jaccard", views=2, contrast_mode=mode,
                groups=None, learnable_temperature=True, seed=33)
        compare(rank, world, classes=3, views=3, contrast_mode=mode, groups=None,
                labels="with_none", reduction="none" if mode == "one" else "mean", seed=34)


@case
def cross_set(rank, world):
    for rule in RULES:
        compare(rank, world, classes=65, multi_label=rule, contrast=True, extra_contrast=2,
                groups=None, learnable_temperature=True, seed=35)
        compare(rank, world, classes=2, multi_label=rule, contrast=True, labels="with_none",
                groups=None, reduction="none", seed=36)


@case
def with_group_ids(rank, world):
    """Multi-hot rows and group ids gathered together (the ids as bytes beside the classes)."""
    for rule in RULES:
        compare(rank, world, classes=65, multi_label=rule, labels="with_none", seed=37)
        compare(rank, world, classes=3, multi_label=rule, contrast=True, extra_contrast=1,
                groups="one", seed=38)
        compare(rank, world, classes=64, multi_label=rule, views=2, reduction="none", seed=39)


@case
def float32(rank, world):
    compare(rank, world, classes=65, multi_label="jaccard", dtype=torch.float32, dim=33,
            groups=None, learnable_temperature=True, seed=40)


@case
def reference_backend_and_module(rank, world):
    compare(rank, world, classes=4, multi_label="jaccard", backend="reference", groups=None,
            seed=41)
    compare(rank, world, classes=4, multi_label="jaccard", module=True, views=2, seed=42)


@case
def errors_raise_on_every_rank(rank, world):
    features = torch.randn(3, 4, dtype=torch.float64)
    labels = torch.tensor([[1, 0], [0, 1], [1, 1]], dtype=torch.bool)
    contrast = torch.randn(2, 4, dtype=torch.float64)
    contrast_labels = torch.tensor([[1, 0], [0, 0]], dtype=torch.bool)
    wide = torch.ones(3, 3, dtype=torch.bool)
    bad_values = torch.tensor([[1, 0], [0, 2], [1, 1]])
    checks = {
        "another C on one rank": (
            lambda: sd.supcon_loss(features, wide if rank == 1 else labels),
            "the ranks disagree on label_classes (rank 0: multi-hot rows of 2 classes, "
            "rank 1: multi-hot rows of 3 classes"),
        "class ids on one rank": (
            lambda: sd.supcon_loss(features, torch.tensor([0, 1, 0]) if rank == 0 else labels),
            "the ranks disagree on label_classes (rank 0: class ids, rank 1: multi-hot rows"),
        "another rule on one rank": (
            lambda: sd.supcon_loss(features, labels,
                                   multi_label="jaccard" if rank == world - 1 else "any"),
            "the ranks disagree on multi_label"),
        "ring": (lambda: sd.supcon_loss(features, labels, strategy="ring"),
                 "multi-hot labels need strategy='gather'"),
        "values other than 0 / 1 on one rank's anchors": (
            lambda: sd.supcon_loss(features, bad_values if rank == 1 else labels.long(),
                                   contrast=contrast, contrast_labels=contrast_labels),
            "multi-hot labels must hold 0 or 1, and do not on rank(s) [1]"),
        "contrast labels of another C": (
            lambda: sd.supcon_loss(features, labels, contrast=contrast,
                                   contrast_labels=torch.ones(2, 3, dtype=torch.bool)),
            "contrast_labels must be multi-hot rows of shape [2, 2]"),
        "a bad rule": (lambda: sd.supcon_loss(features, labels, multi_label="all"),
                       "multi_label must be one of"),
        "a memory of class ids": (
            lambda: sd.supcon_loss(features, labels, memory=SupConMemory(8, 4)),
            "labels are multi-hot rows of 2 classes but the memory holds class ids"),
    }
    assert_each_call_raises(checks)


def _memory(classes, seed=51, size=15, held=9, dim=4):
    """The same partly filled multi-hot memory on every rank and for the oracle."""
    generator = torch.Generator().manual_seed(seed)
    memory = SupConMemory(size, dim, num_classes=classes, dtype=torch.float64)
    memory.enqueue(torch.randn(held, dim, generator=generator, dtype=torch.float64),
                   multi_hot(held, classes, generator), torch.randint(-1, 3, (held,),
                                                                      generator=generator))
    return memory


@case
def memory_steps(rank, world):
    """Each rank's loss and gradient against the oracle on [global batch; memory] over steps
    with multi-hot labels (with and without group ids) and a SimCLR step (views, no labels);
    every rank's memory ends as the oracle's."""
    sizes = SIZES[world]
    for rule, classes in (("any", 65), ("jaccard", 3)):
        memory, reference = _memory(classes), _memory(classes)
        generator = torch.Generator().manual_seed(52)
        for step in ("labels", "groups", "none", "labels"):
            total = sum(sizes)
            views = 2 if step == "none" else 0
            shape = (total, views, 4) if views else (total, 4)
            features = torch.randn(shape, dtype=torch.float64, generator=generator)
            labels = None if step == "none" else multi_hot(total, classes, generator)
            groups = torch.randint(-1, 3, (total,), generator=generator) if step == "groups" \
                else None
            local = _local(features, sizes, rank).clone().requires_grad_()
            loss = sd.supcon_loss(local, None if labels is None else _local(labels, sizes, rank),
                                  0.3, memory=memory, multi_label=rule,
                                  groups=None if groups is None else _local(groups, sizes, rank))
            (grad,) = torch.autograd.grad(loss, local)
            whole = features.clone().requires_grad_()
            expected = oracle_with_memory(whole, labels, groups, reference, 0.3,
                                          multi_label=rule)
            (expected_grad,) = torch.autograd.grad(expected, whole)
            _close(loss, expected, torch.float64, f"{rule} {step}: loss against the memory")
            _close(grad, _local(expected_grad, sizes, rank), torch.float64,
                   f"{rule} {step}: features' gradient")
            if views:  # the gathered batch: each rank's view-major block in turn
                rows = torch.cat([_local(features, sizes, r).transpose(0, 1).reshape(-1, 4)
                                  for r in range(world)])
                reference.enqueue(rows, None)
            else:
                reference.enqueue(features, labels, groups)
            for name, value in reference.state_dict().items():
                if not torch.equal(memory.state_dict()[name], value):
                    raise AssertionError(f"{rule} {step}: memory {name} differs from the "
                                         "oracle's memory")


def run_rank(rank, world, store, names, results):
    """Spawned entry point: joins the gloo group and runs the named cases, recording each."""
    join_gloo_group(rank, world, store)
    run_cases(CASES, names, rank, results)
