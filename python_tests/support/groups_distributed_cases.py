"""The multi-process checks of known false negatives (``groups=``) under scl_kernels.distributed:
each case runs on every rank of a gloo group and compares the loss and the gradients with the
float64 oracle (supcon_reference64) on the concatenated global batch, which every rank computes
for itself from the same seeded inputs; with a cross-batch memory, on the global batch followed
by the memory's rows. distributed/test_distributed_groups.py spawns the ranks."""
import torch

import scl_kernels.distributed as sd
from scl_kernels.nn import SupConMemory
from .distributed_cases import (SIZES, _close, _local, assert_each_call_raises,
                                check_against_global_batch, own_pair_ids)
from .memory_oracle import multi_hot, oracle_with_memory
from .reference64 import supcon_reference64
from .spawned_ranks import join_gloo_group, run_cases

CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


def _ids(kind, count, generator):
    """Group ids: some negative (no group) and a few groups, so that each group spans ranks and
    holds positives and non-positives alike; "one": every row in group 0; "none": all -1;
    None: no group ids given."""
    if kind is None:
        return None
    if kind == "one":
        return torch.zeros(count, dtype=torch.long)
    if kind == "none":
        return torch.full((count,), -1, dtype=torch.long)
    return torch.randint(-1, 3, (count,), generator=generator)


def _labels(kind, classes, count, generator):
    """Class ids in [0, 3) ("classes"), some of them -1 ("with_none"); with ``classes`` C,
    multi-hot rows of C classes instead (support/memory_oracle.py: multi_hot), a quarter of
    them without a class for "with_none"."""
    if classes is not None:
        return multi_hot(count, classes, generator,
                         no_class_share=0.25 if kind == "with_none" else 0.0)
    return torch.randint(-1 if kind == "with_none" else 0, 3, (count,), generator=generator)


def compare(rank, world, *, dim=5, dtype=torch.float64, views=0, labels="classes",
            contrast=False, contrast_labels=True, extra_contrast=0, reduction="mean",
            contrast_mode="all", normalize=True, learnable_temperature=False, seed=0,
            focal_gamma=0.0, groups="some", backend="cpu", module=False, classes=None,
            multi_label="any"):
    """Loss, feature (and contrast, temperature) gradients of the distributed call with group
    ids on every rank (none with ``groups=None``) against the float64 oracle on the
    concatenated global batch; ``classes`` C: multi-hot labels of C classes, weighed by
    ``multi_label``."""
    sizes = SIZES[world]
    generator = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    shape = (total, views, dim) if views else (total, dim)
    features = torch.randn(shape, dtype=dtype, generator=generator)
    global_labels = None if labels is None else _labels(labels, classes, total, generator)
    global_groups = _ids(groups, total, generator)
    contrast_sizes = [size + extra_contrast for size in sizes] if contrast else None
    global_contrast, global_contrast_labels, global_contrast_groups = None, None, None
    if contrast:
        global_contrast = torch.randn(sum(contrast_sizes), dim, dtype=dtype, generator=generator)
        global_contrast_groups = _ids(groups, sum(contrast_sizes), generator)
        if contrast_labels:
            global_contrast_labels = _labels("classes", classes, sum(contrast_sizes), generator)

    # The oracle on the global batch. Without contrast labels a rank's anchor i pairs with its
    # own contrast row i: the oracle is given those pairs as explicit ids.
    oracle_labels, oracle_contrast_labels = global_labels, global_contrast_labels
    if contrast and not contrast_labels:
        oracle_labels, oracle_contrast_labels = own_pair_ids(sizes, contrast_sizes)
    oracle_features = features.to(torch.float64, copy=True).requires_grad_()
    oracle_contrast = (None if global_contrast is None
                       else global_contrast.to(torch.float64, copy=True).requires_grad_())
    oracle_temperature = (torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
                          if learnable_temperature else 0.3)
    expected = supcon_reference64(oracle_features, oracle_labels, oracle_temperature,
                                  contrast=oracle_contrast, contrast_labels=oracle_contrast_labels,
                                  contrast_mode=contrast_mode, normalize=normalize,
                                  reduction=reduction, focal_gamma=focal_gamma,
                                  groups=global_groups, contrast_groups=global_contrast_groups,
                                  multi_label=multi_label)

    local_features = _local(features, sizes, rank).clone().requires_grad_()
    local_contrast = (_local(global_contrast, contrast_sizes, rank).clone().requires_grad_()
                      if contrast else None)
    temperature = (torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
                   if learnable_temperature else 0.3)
    options = dict(contrast_mode=contrast_mode, normalize=normalize, reduction=reduction,
                   backend=backend, focal_gamma=focal_gamma, multi_label=multi_label)
    tensors = dict(
        contrast=local_contrast,
        contrast_labels=(None if global_contrast_labels is None
                         else _local(global_contrast_labels, contrast_sizes, rank)),
        groups=None if global_groups is None else _local(global_groups, sizes, rank),
        contrast_groups=(None if global_contrast_groups is None
                         else _local(global_contrast_groups, contrast_sizes, rank)))
    local_labels = None if global_labels is None else _local(global_labels, sizes, rank)
    if module:
        actual = sd.SupConLoss(temperature, **options)(local_features, local_labels, **tensors)
    else:
        actual = sd.supcon_loss(local_features, local_labels, temperature, **tensors, **options)
    check_against_global_batch(
        rank, generator, actual, expected, dtype=dtype, reduction=reduction, views=views,
        contrast_mode=contrast_mode, features=(local_features, oracle_features, sizes),
        contrast=(local_contrast, oracle_contrast, contrast_sizes) if contrast else None,
        temperature=(temperature, oracle_temperature) if learnable_temperature else None)


@case
def single_set_reductions(rank, world):
    for reduction in ("mean", "sum", "none"):
        compare(rank, world, reduction=reduction, learnable_temperature=True)


@case
def single_set_labels_with_none_unnormalised(rank, world):
    compare(rank, world, labels="with_none", normalize=False, seed=1)


@case
def views(rank, world):
    for mode in ("all", "one"):
        compare(rank, world, views=2, contrast_mode=mode, learnable_temperature=True, seed=2)
        compare(rank, world, views=3, labels=None, contrast_mode=mode,
                reduction="none" if mode == "one" else "mean", seed=3)


@case
def cross_set(rank, world):
    compare(rank, world, contrast=True, extra_contrast=2, learnable_temperature=True, seed=4)
    compare(rank, world, contrast=True, labels="with_none", reduction="none", seed=5)


@case
def cross_set_without_labels(rank, world):
    compare(rank, world, contrast=True, labels=None, contrast_labels=False, seed=6)
    compare(rank, world, contrast=True, labels=None, contrast_labels=False, extra_contrast=2,
            reduction="sum", seed=7)


@case
def one_group_for_all(rank, world):
    """Every row in one group, across every rank: an anchor's denominator is its positives, and
    an anchor without one has no column left, no loss and a zero gradient."""
    compare(rank, world, groups="one", labels="with_none", reduction="none", seed=8)
    compare(rank, world, groups="one", views=2, learnable_temperature=True, seed=9)
    compare(rank, world, groups="one", contrast=True, extra_contrast=1, seed=10)


@case
def no_group_ids_at_all(rank, world):
    compare(rank, world, groups="none", labels="with_none", seed=11)


@case
def float32(rank, world):
    compare(rank, world, dtype=torch.float32, dim=33, learnable_temperature=True, seed=12)
    compare(rank, world, dtype=torch.float32, dim=33, contrast=True, reduction="none", seed=13)


@case
def focal_loss(rank, world):
    compare(rank, world, focal_gamma=2.0, learnable_temperature=True, seed=14)
    compare(rank, world, focal_gamma=0.5, contrast=True, extra_contrast=2, labels="with_none",
            seed=15)


@case
def reference_backend_and_module(rank, world):
    compare(rank, world, backend="reference", seed=16)
    compare(rank, world, module=True, views=2, seed=17)


@case
def one_row_in_all(rank, world):
    """A global batch of one row, on the last rank: no positive, loss 0, zero gradient."""
    features = torch.randn(1 if rank == world - 1 else 0, 4, dtype=torch.float64,
                           requires_grad=True)
    groups = torch.zeros(features.shape[0], dtype=torch.long)
    loss = sd.supcon_loss(features, groups.clone(), groups=groups)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.all(features.grad == 0)


@case
def errors_raise_on_every_rank(rank, world):
    features = torch.randn(3, 4, dtype=torch.float64)
    labels, groups = torch.tensor([0, 1, 0]), torch.tensor([0, 0, -1])
    contrast, contrast_labels = torch.randn(2, 4, dtype=torch.float64), torch.tensor([1, 0])
    checks = {
        "groups on some ranks only": (
            lambda: sd.supcon_loss(features, labels, groups=groups if rank else None),
            "disagree on groups"),
        "ring": (lambda: sd.supcon_loss(features, labels, groups=groups, strategy="ring"),
                 "groups= needs strategy='gather'"),
        "a rank's bad groups": (
            lambda: sd.supcon_loss(features, labels, groups=groups[:2] if rank == 1 else groups),
            "groups has 2 entries but features has 3 samples" if rank == 1
            else "rejected their inputs"),
        "float groups": (lambda: sd.supcon_loss(features, labels, groups=groups.double()),
                         "groups must be an integer tensor"),
        "cross set without contrast_groups": (
            lambda: sd.supcon_loss(features, labels, contrast=contrast,
                                   contrast_labels=contrast_labels, groups=groups),
            "groups and contrast_groups must be given together"),
    }
    assert_each_call_raises(checks)


# A cross-batch memory under the distributed loss, with group ids.

def _memory(seed=21, size=15, held=9, dim=4):
    """The same partly filled memory on every rank and for the oracle: rows enqueued with group
    ids, then rows enqueued without (stored in no group)."""
    generator = torch.Generator().manual_seed(seed)
    memory = SupConMemory(size, dim, dtype=torch.float64)
    memory.enqueue(torch.randn(held - 3, dim, generator=generator, dtype=torch.float64),
                   torch.randint(-1, 3, (held - 3,), generator=generator),
                   torch.randint(-1, 3, (held - 3,), generator=generator))
    memory.enqueue(torch.randn(3, dim, generator=generator, dtype=torch.float64),
                   torch.randint(0, 3, (3,), generator=generator))
    return memory


@case
def memory_with_groups(rank, world):
    """Each rank's loss and gradient against the oracle on [global batch; memory], over steps
    with and without groups; every rank's memory ends as the oracle's, group ids included."""
    sizes = SIZES[world]
    memory, reference = _memory(), _memory()
    generator = torch.Generator().manual_seed(22)
    for step_has_groups in (True, False, True):
        total = sum(sizes)
        features = torch.randn(total, 4, dtype=torch.float64, generator=generator)
        labels = torch.randint(0, 3, (total,), generator=generator)
        groups = torch.randint(-1, 3, (total,), generator=generator) if step_has_groups else None
        local = _local(features, sizes, rank).clone().requires_grad_()
        loss = sd.supcon_loss(local, _local(labels, sizes, rank), 0.3, memory=memory,
                              groups=None if groups is None else _local(groups, sizes, rank))
        (grad,) = torch.autograd.grad(loss, local)
        whole = features.clone().requires_grad_()
        expected = oracle_with_memory(whole, labels, groups, reference, 0.3)
        (expected_grad,) = torch.autograd.grad(expected, whole)
        reference.enqueue(features, labels, groups)
        _close(loss, expected, torch.float64, "loss against the memory")
        _close(grad, _local(expected_grad, sizes, rank), torch.float64, "features' gradient")
        for name, value in reference.state_dict().items():
            if not torch.equal(memory.state_dict()[name], value):
                raise AssertionError(f"memory {name} differs from the oracle's memory")


def run_rank(rank, world, store, names, results):
    """Spawned entry point: joins the gloo group and runs the named cases, recording each."""
    join_gloo_group(rank, world, store)
    run_cases(CASES, names, rank, results)
