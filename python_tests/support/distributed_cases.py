"""The multi-process checks of scl_kernels.distributed: each case runs on every rank of a gloo
group and compares with the single-process loss on the global batch, which every rank computes
for itself from the same seeded inputs. distributed/test_distributed.py spawns the ranks."""
import torch
import torch.distributed as dist
from torch import nn

import scl_kernels
import scl_kernels.distributed as sd
from .spawned_ranks import join_gloo_group, run_cases

# Local batch sizes per world size: unequal, and with 4 ranks one rank holds nothing.
SIZES = {2: [7, 4], 4: [5, 0, 6, 3]}
# Both sides compute in float32 for 16-bit inputs, but sum in different orders and round the
# gradients to the input dtype.
TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=2e-6),
             torch.bfloat16: dict(rtol=2e-2, atol=2e-3), torch.float16: dict(rtol=1e-2, atol=1e-3)}
CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


def _local(tensor, sizes, rank):
    start = sum(sizes[:rank])
    return tensor[start: start + sizes[rank]]


def _close(actual, expected, dtype, what):
    actual, expected = actual.detach().to(torch.float64), expected.detach().to(torch.float64)
    if actual.shape != expected.shape or not torch.allclose(actual, expected, **TOLERANCE[dtype]):
        error = (actual - expected).abs().max().item() if actual.shape == expected.shape else None
        raise AssertionError(f"{what}: shapes {tuple(actual.shape)} / {tuple(expected.shape)}, "
                             f"largest difference {error}")


def own_pair_ids(sizes, contrast_sizes):
    """Explicit ids that pair each rank's anchor i with that rank's own contrast row i, as the
    distributed call does without contrast labels, for the call on the global batch: (anchor ids,
    contrast ids, -1 on the contrast rows past a rank's anchors)."""
    labels = torch.arange(sum(sizes))
    contrast_labels = torch.full((sum(contrast_sizes),), -1, dtype=torch.long)
    for r in range(len(sizes)):
        start = sum(contrast_sizes[:r])
        contrast_labels[start: start + sizes[r]] = _local(labels, sizes, r)
    return labels, contrast_labels


def check_against_global_batch(rank, generator, actual, expected, *, dtype, reduction, views,
                               contrast_mode, features, contrast=None, temperature=None):
    """This rank's loss ``actual`` against ``expected``, the loss on the global batch, then both
    backward and this rank's slice of each gradient against the global one; the temperature's
    gradient, a partial sum on each rank, summed over the ranks. ``features`` and ``contrast``:
    (this rank's leaf, the global batch's leaf, the row count of each rank); ``temperature``:
    (this rank's, the global call's) when learnable.

    Per-anchor losses are weighted at random before the backward, so that a gradient that mixes
    up anchors shows; the weights are drawn from ``generator`` after every input."""
    local_features, global_features, sizes = features
    weights = torch.rand(expected.shape, dtype=expected.dtype, generator=generator) \
        if reduction == "none" else torch.ones(())
    (expected * weights).sum().backward()
    if reduction == "none":
        # The per-anchor losses of this rank, in its local order (view-major over its samples).
        # Global rows are view-major too: view v of global sample b is row v * total + b.
        total = sum(sizes)
        local_samples = _local(torch.arange(total), sizes, rank)
        view_count = 1 if not views or contrast_mode == "one" else views
        global_index = torch.cat([local_samples + v * total for v in range(view_count)])
        _close(actual, expected[global_index], dtype, "per-anchor loss")
        # In the call's dtype: the weights have the expected loss's, float64 for the oracle.
        (actual * weights[global_index].to(actual.dtype)).sum().backward()
    else:
        _close(actual, expected, dtype, "loss")
        actual.backward()
    _close(local_features.grad, _local(global_features.grad, sizes, rank), dtype,
           "features' gradient")
    if contrast is not None:
        local_contrast, global_contrast, contrast_sizes = contrast
        _close(local_contrast.grad, _local(global_contrast.grad, contrast_sizes, rank), dtype,
               "contrast's gradient")
    if temperature is not None:
        local_temperature, global_temperature = temperature
        summed = local_temperature.grad.clone()
        dist.all_reduce(summed)
        _close(summed, global_temperature.grad, dtype, "temperature's gradient summed over ranks")


def assert_each_call_raises(checks):
    """``checks``: {what: (call, part of the message)}. Each call must raise a ValueError or a
    TypeError whose message holds that part."""
    for name, (call, expected) in checks.items():
        try:
            call()
        except (ValueError, TypeError) as error:
            message = str(error)
        else:
            raise AssertionError(f"{name}: no error raised")
        assert expected in message, f"{name}: {message}"


def compare(rank, world, *, dim=5, dtype=torch.float64, views=0, labels="classes",
            contrast=False, contrast_labels=True, extra_contrast=0, reduction="mean",
            contrast_mode="all", normalize=True, strategy="gather", learnable_temperature=False,
            seed=0, focal_gamma=0.0):
    """Loss, feature (and contrast, temperature) gradients of the distributed call on every
    rank against the single-process call on the concatenated global batch."""
    sizes = SIZES[world]
    generator = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    shape = (total, views, dim) if views else (total, dim)
    features = torch.randn(shape, dtype=dtype, generator=generator)
    classes = {"classes": 3, "with_none": 3, "one": 1, "many": total}.get(labels)
    global_labels = (None if labels is None else
                     torch.randint(-1, classes, (total,), generator=generator) if labels == "with_none"
                     else torch.randint(0, classes, (total,), generator=generator))
    contrast_sizes = [size + extra_contrast for size in sizes] if contrast else None
    global_contrast = (torch.randn(sum(contrast_sizes), dim, dtype=dtype, generator=generator)
                       if contrast else None)
    global_contrast_labels = (torch.randint(0, classes, (sum(contrast_sizes),), generator=generator)
                              if contrast and contrast_labels else None)
    temperature = torch.tensor(0.3, dtype=torch.float64, requires_grad=True) \
        if learnable_temperature else 0.3
    options = dict(contrast_mode=contrast_mode, normalize=normalize, reduction=reduction,
                   backend="cpu", focal_gamma=focal_gamma)

    # The single-process call on the global batch. Without contrast labels and with extra
    # contrast rows per rank, a rank's anchor i pairs with its own contrast row i: the single
    # process is given those pairs as explicit ids.
    single_features = features.clone().requires_grad_()
    single_contrast = None if global_contrast is None else global_contrast.clone().requires_grad_()
    single_labels, single_contrast_labels = global_labels, global_contrast_labels
    if contrast and not contrast_labels:
        single_labels, single_contrast_labels = own_pair_ids(sizes, contrast_sizes)
    single_temperature = temperature.detach().clone().requires_grad_() \
        if learnable_temperature else temperature
    expected = scl_kernels.supcon_loss(single_features, single_labels, single_temperature,
                                       contrast=single_contrast,
                                       contrast_labels=single_contrast_labels, **options)

    local_features = _local(features, sizes, rank).clone().requires_grad_()
    local_contrast = (_local(global_contrast, contrast_sizes, rank).clone().requires_grad_()
                      if contrast else None)
    local_temperature = temperature.detach().clone().requires_grad_() \
        if learnable_temperature else temperature
    actual = sd.supcon_loss(
        local_features, None if global_labels is None else _local(global_labels, sizes, rank),
        local_temperature, contrast=local_contrast,
        contrast_labels=(None if global_contrast_labels is None
                         else _local(global_contrast_labels, contrast_sizes, rank)),
        strategy=strategy, **options)
    check_against_global_batch(
        rank, generator, actual, expected, dtype=dtype, reduction=reduction, views=views,
        contrast_mode=contrast_mode, features=(local_features, single_features, sizes),
        contrast=(local_contrast, single_contrast, contrast_sizes) if contrast else None,
        temperature=(local_temperature, single_temperature) if learnable_temperature else None)


STRATEGIES = ("gather", "ring")


def _both_strategies(rank, world, **options):
    for strategy in STRATEGIES:
        try:
            compare(rank, world, strategy=strategy, **options)
        except AssertionError as failure:
            raise AssertionError(f"strategy={strategy!r}: {failure}") from None


@case
def single_set_reductions(rank, world):
    for reduction in ("mean", "sum", "none"):
        _both_strategies(rank, world, reduction=reduction, learnable_temperature=True)


@case
def single_set_without_normalisation(rank, world):
    _both_strategies(rank, world, normalize=False, labels="with_none")


@case
def views_without_labels(rank, world):
    for mode in ("all", "one"):
        _both_strategies(rank, world, views=2, labels=None, contrast_mode=mode,
                         reduction="none" if mode == "one" else "mean")


@case
def views_with_labels(rank, world):
    for mode in ("all", "one"):
        _both_strategies(rank, world, views=3, contrast_mode=mode, learnable_temperature=True)


@case
def cross_set(rank, world):
    _both_strategies(rank, world, contrast=True, learnable_temperature=True)
    _both_strategies(rank, world, contrast=True, reduction="none")


@case
def cross_set_without_labels(rank, world):
    _both_strategies(rank, world, contrast=True, labels=None, contrast_labels=False)
    _both_strategies(rank, world, contrast=True, labels=None, contrast_labels=False,
                     extra_contrast=2)


@case
def label_edge_cases(rank, world):
    # Every sample its own class (no anchor has a positive), one class, "no class" labels.
    for labels in ("many", "one", "with_none"):
        _both_strategies(rank, world, labels=labels)


@case
def float32(rank, world):
    _both_strategies(rank, world, dtype=torch.float32, dim=33, learnable_temperature=True)


@case
def half_precision(rank, world):
    for dtype in (torch.bfloat16, torch.float16):
        _both_strategies(rank, world, dtype=dtype, dim=40, learnable_temperature=True)
        _both_strategies(rank, world, dtype=dtype, dim=40, contrast=True, reduction="none")


@case
def a_rank_without_grad(rank, world):
    # Rank 0 holds no rows and its empty tensor does not require grad; the others' backward is
    # a collective that it must still join.
    features = torch.randn(0 if rank == 0 else 4, 3, dtype=torch.float64,
                           requires_grad=rank != 0)
    labels = torch.arange(features.shape[0]) % 2
    for strategy in STRATEGIES:
        loss = sd.supcon_loss(features, labels, strategy=strategy)
        assert loss.requires_grad, "every rank's loss must join the backward"
        loss.backward()


@case
def a_subgroup(rank, world):
    # The even ranks form their own group: the ring's peers are then named by global rank.
    members = list(range(0, world, 2))
    group = dist.new_group(members)
    if rank not in members:
        return
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(len(members) * 3, 4, dtype=torch.float64, generator=generator)
    labels = torch.randint(0, 2, (features.shape[0],), generator=generator)
    expected = scl_kernels.supcon_loss(features, labels)
    position = members.index(rank)
    for strategy in STRATEGIES:
        actual = sd.supcon_loss(features[3 * position: 3 * position + 3],
                                labels[3 * position: 3 * position + 3], strategy=strategy,
                                group=group)
        _close(actual, expected, torch.float64, f"strategy={strategy!r}: loss in a subgroup")


@case
def one_row_in_all(rank, world):
    features = torch.randn(1 if rank == world - 1 else 0, 4, dtype=torch.float64,
                           requires_grad=True)
    for strategy in STRATEGIES:
        loss = sd.supcon_loss(features, torch.zeros(features.shape[0], dtype=torch.long),
                              strategy=strategy)
        loss.backward()
        assert float(loss) == 0.0 and torch.all(features.grad == 0)


@case
def focal_loss(rank, world):
    """The gather strategy passes focal_gamma to the op (ring refuses it: test_focal_options)."""
    for reduction in ("mean", "none"):
        compare(rank, world, focal_gamma=2.0, reduction=reduction, learnable_temperature=True)
    compare(rank, world, focal_gamma=0.5, contrast=True, extra_contrast=2, labels="with_none")
    compare(rank, world, focal_gamma=2.0, views=2, contrast_mode="one")


@case
def disagreements_raise_on_every_rank(rank, world):
    features = torch.randn(3, 4, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0])
    checks = {
        "dim": lambda: sd.supcon_loss(torch.randn(3, 4 + rank % 2, dtype=torch.float64), labels),
        "dtype": lambda: sd.supcon_loss(features.to(torch.float32 if rank else torch.float64),
                                        labels),
        "reduction": lambda: sd.supcon_loss(features, labels,
                                            reduction="sum" if rank else "mean"),
        "labels": lambda: sd.supcon_loss(features, labels if rank else None),
        "temperature": lambda: sd.supcon_loss(features, labels, temperature=0.1 + 0.1 * rank),
        "strategy": lambda: sd.supcon_loss(features, labels,
                                           strategy="ring" if rank else "gather"),
        "focal_gamma": lambda: sd.supcon_loss(features, labels, focal_gamma=float(rank)),
        "NaN": lambda: sd.supcon_loss(features * (float("nan") if rank == 1 else 1.0), labels),
        # One rank's own argument check fails; the others must not wait for it.
        "rejected": lambda: sd.supcon_loss(features, labels[:2] if rank == 1 else labels),
    }
    messages = {"NaN": "NaN",
                "rejected": "labels has 2 entries" if rank == 1 else "rejected their inputs"}
    assert_each_call_raises({name: (call, messages.get(name, f"disagree on {name}"))
                             for name, call in checks.items()})


@case
def ddp_matches_one_process(rank, world):
    sizes = SIZES[world]
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(sum(sizes), 6, dtype=torch.float64, generator=generator)
    labels = torch.randint(0, 3, (sum(sizes),), generator=generator)
    torch.manual_seed(3)  # the same initial model on every rank, as the single process has
    initial = nn.Linear(6, 4).double()
    for strategy in STRATEGIES:
        single, replica = nn.Linear(6, 4).double(), nn.Linear(6, 4).double()
        single.load_state_dict(initial.state_dict())
        replica.load_state_dict(initial.state_dict())
        model = nn.parallel.DistributedDataParallel(replica)
        optimisers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (single, model)]
        for _ in range(3):
            for optimiser in optimisers:
                optimiser.zero_grad()
            scl_kernels.supcon_loss(single(inputs), labels).backward()
            sd.supcon_loss(model(_local(inputs, sizes, rank)), _local(labels, sizes, rank),
                           strategy=strategy, gradients_averaged=True).backward()
            for optimiser in optimisers:
                optimiser.step()
        for name, parameter in replica.named_parameters():
            _close(parameter, dict(single.named_parameters())[name], torch.float64,
                   f"strategy={strategy!r}: DDP-trained {name}")


def run_rank(rank, world, store, names, results):
    """Spawned entry point: joins the gloo group and runs the named cases, recording each."""
    join_gloo_group(rank, world, store)
    run_cases(CASES, names, rank, results)
