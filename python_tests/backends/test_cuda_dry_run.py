"""The CUDA C++ backend's host code without a GPU: its dry run (csrc/cuda_dry_run, the ops
scl::supcon_cuda_dry_run{,_backward} of a library built without CUDA) runs the backend's ATen glue
and launch choices (for an H100) on CPU tensors, its fused O(N*D) stages' row code on the CPU
(csrc/cuda/row_stages.h: the code the CUDA kernels run per thread) and the tile walks by their
definition (walk_terms.h). Checked here against the float64 reference, on the device's path
(the test hook device_preparation, as a GPU always takes): the row terms, the log-sum-exp merges, the
preparation, the per-anchor losses, the backward's weights and assembly, in every layout, both
schedules (the triangle backward for 16-bit rows at D <= 128), anchor offsets, no positives, one
class, negative labels, and the NaN / inf error."""
import pytest
import torch

import scl_kernels
from support.layouts import (LAYOUTS, few_class_rows, make_layout, many_class_rows,
                             num_anchor_rows, op_args)
from support.op_mean import check_op_mean
from support.reference64 import check_op_against_reference
from scl_kernels._testing import cuda_dry_run_built, test_hooks

pytestmark = pytest.mark.skipif(
    not cuda_dry_run_built(),
    reason="the library has no dry run of the CUDA host code: it was built with CUDA, without the "
           "tests' ops (SCL_BUILD_TESTS=1), or not at all")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def device_path():
    with test_hooks(device_preparation=True, dry_run_skips_tiles=False):
        yield


def check(args, gen, **kw):
    return check_op_against_reference(
        torch.ops.scl.supcon_cuda_dry_run, torch.ops.scl.supcon_cuda_dry_run_backward, args,
        compute_dtype=torch.float32, generator=gen, weights_dtype=torch.float32, **kw)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("temperature", [0.02, 0.1])  # 0.02: the plain schedule in single set
@pytest.mark.parametrize("normalize", [True, False])
def test_layouts(layout, dtype, temperature, normalize, randn, randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=70, d=37, classes=6)
    res = check(op_args(kw, temperature, normalize), gen)
    assert res.outputs[0].shape == (num_anchor_rows(kw),)


# Sizes around the kernels' blocks (64, 128) and the terms' padding (256), and widths around the
# triangle's limit (128) and the 16-byte row padding (8 bf16 elements).
@pytest.mark.parametrize("n,d", [(1, 5), (2, 8), (129, 128), (257, 130), (300, 17)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sizes(n, d, dtype, randn, randint, gen):
    labels = randint(0, 4, (n,))
    check((randn(n, d, dtype=dtype), labels, None, None, torch.tensor(0.1), n, True), gen)


@pytest.mark.parametrize("case", [
    ("no-positives", lambda n: torch.arange(n)),
    ("one-class", lambda n: torch.zeros(n, dtype=torch.int64)),
    ("negative-labels", lambda n: torch.arange(n) % 5 - 2),
    ("int32-labels", lambda n: (torch.arange(n) % 3).to(torch.int32)),
], ids=lambda c: c[0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_labels(case, dtype, randn, gen):
    n = 90
    res = check((randn(n, 24, dtype=dtype), case[1](n), None, None, torch.tensor(0.1), n, True), gen)
    if case[0] == "no-positives":
        assert not res.outputs[0].any()


@pytest.mark.parametrize("n,num_anchors,offset", [(45, 13, 17), (45, 1, 44), (300, 130, 129)])
@pytest.mark.parametrize("temperature", [0.02, 0.1])
def test_anchor_offset(n, num_anchors, offset, temperature, randn, randint, gen):
    args = (randn(n, 37, dtype=torch.bfloat16), randint(-1, 5, (n,)), None, None,
            torch.tensor(temperature, dtype=torch.float64), num_anchors, True)
    res = check(args, gen, anchor_offset=offset)
    assert res.outputs[0].shape == (num_anchors,)


# mean=True: the per-anchor losses' stage reduces them itself (one block sum and ticket per
# block on the device) and the backward's weights divide by its count.
@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels"])
@pytest.mark.parametrize("n,dtype", [(70, torch.bfloat16), (300, torch.float32)], ids=str)
def test_mean(layout, n, dtype, randn, randint):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=n, d=37, classes=n // 4)
    check_op_mean(torch.ops.scl.supcon_cuda_dry_run, torch.ops.scl.supcon_cuda_dry_run_backward,
                  op_args(kw))


# The single set's mean takes the class sums for the weighted ones (class_shares_weight) at
# sizes around the blocks and with labels that leave anchors without positives (not 2 rows of
# one class: their loss and gradients are exactly 0, and the paths' float32 noise differs).
@pytest.mark.parametrize("n", [1, 3, 129])
@pytest.mark.parametrize("labels", ["no-positives", "one-class", "negative-labels"])
def test_mean_on_awkward_labels(n, labels, randn):
    y = {"no-positives": torch.arange(n), "one-class": torch.zeros(n, dtype=torch.int64),
         "negative-labels": torch.arange(n) % 5 - 2}[labels]
    check_op_mean(torch.ops.scl.supcon_cuda_dry_run, torch.ops.scl.supcon_cuda_dry_run_backward,
                  (randn(n, 37, dtype=torch.bfloat16), y, None, None, torch.tensor(0.1), n, True))


def test_deterministic_mode_takes_the_core_steps(randn, randint, gen):
    """torch.use_deterministic_algorithms(True): the core's ATen preparation and weights and the
    full-row symmetric backward instead of the atomics; the same values."""
    args = (randn(80, 40, dtype=torch.bfloat16), randint(0, 4, (80,)), None, None,
            torch.tensor(0.1), 80, True)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        check(args, gen)
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("where", ["features", "contrast"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_rows_are_an_error(where, value, randn, randint):
    x, c = randn(20, 8), randn(25, 8)
    (x if where == "features" else c)[3, 2] = value
    with pytest.raises(ValueError, match=f"{where} contains NaN or inf"):
        torch.ops.scl.supcon_cuda_dry_run(x, randint(0, 3, (20,)), c, randint(0, 3, (25,)),
                                          torch.tensor(0.1), 20, True)


def test_a_captured_call_leaves_the_value_checks_alone(randn, randint):
    """While the stream captures a CUDA graph (the dry run told so) a call neither checks its own
    values nor reads an earlier call's verdict: on a GPU even asking whether that verdict has
    landed ends the capture (an H100, 2026-11-27). The first call outside the capture reports it."""
    labels = randint(0, 3, (20,))

    def args(x):
        return (x, labels, None, None, torch.tensor(0.1), 20, True)

    bad = randn(20, 8)
    bad[3, 1] = float("nan")
    clean = args(randn(20, 8))
    with test_hooks(value_checks="next_call"):  # the earlier verdict is left unread
        torch.ops.scl.supcon_cuda_dry_run(*args(bad))
        with test_hooks(dry_run_capturing=True):
            _, lse, _ = torch.ops.scl.supcon_cuda_dry_run(*clean)
            torch.ops.scl.supcon_cuda_dry_run_backward(torch.ones(20), *clean, lse)
            loss, _, _ = torch.ops.scl.supcon_cuda_dry_run(*args(bad))  # its own NaN: not checked
        assert torch.isnan(loss).any()
        with pytest.raises(ValueError, match="features.*earlier call"):
            torch.ops.scl.supcon_cuda_dry_run(*clean)
    assert scl_kernels.raise_deferred_value_errors() is None  # the captured call queued none


def test_skipped_tiles_are_recorded_and_left_unwritten(randn, randint):
    """With the tiles skipped the launches are the same and the tiles' outputs stay as allocated:
    the loss differs from the emulated one (the switch takes effect)."""
    args = (randn(30, 8), randint(0, 3, (30,)), None, None, torch.tensor(0.1), 30, True)
    emulated, _, _ = torch.ops.scl.supcon_cuda_dry_run(*args)
    with test_hooks(dry_run_skips_tiles=True):
        skipped, _, _ = torch.ops.scl.supcon_cuda_dry_run(*args)
    assert not torch.equal(emulated, skipped)


# The walk chosen (the test hook symmetric_backward_walk, in place of SCL_CUDA_SYMMETRIC_BACKWARD)
# -> the plan's symmetric_backward_walk and the backward tile kernel the glue launches for the
# single set (16-bit rows, D <= 128, an H100).
SYMMETRIC_BACKWARDS = {"": ("triangle", "sm90.grad_triangle"),
                       "triangle": ("triangle", "sm90.grad_triangle"),
                       "triangle-async": ("triangle by st.async", "sm90.grad_triangle_async"),
                       "rows": ("full rows", "sm90.grad_rows_symmetric")}


def _symmetric_backward_launches(args, gen):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        check(args, gen)
    return {e.name.removeprefix("cuda_kernel::") for e in prof.events()
            if e.name.startswith("cuda_kernel::") and "grad" in e.name}


def _plan(args):
    text = torch.ops.scl.supcon_cuda_dry_run_plan(*args, 0, 0.0, False)
    return dict(line.split(": ", 1) for line in text.splitlines())


@pytest.mark.parametrize("walk", list(SYMMETRIC_BACKWARDS), ids=lambda walk: walk or "default")
@pytest.mark.parametrize("n,d", [(300, 64), (257, 128), (129, 5)])
def test_symmetric_backward_walks(walk, n, d, randn, randint, gen):
    """Each symmetric backward walk chosen is the plan's, reaches its kernel, and the glue around
    it (the triangle's padded, zeroed accumulator and its view, or the full rows') gives the
    reference's gradients. The triangle's two exchanges differ only in their synchronisation,
    which the dry run does not emulate: the GPU tests and compute-sanitizer check that."""
    args = (randn(n, d, dtype=torch.bfloat16), randint(0, 4, (n,)), None, None, torch.tensor(0.1),
            n, True)
    planned, kernel = SYMMETRIC_BACKWARDS[walk]
    with test_hooks(symmetric_backward_walk=walk):
        assert _plan(args)["symmetric_backward_walk"] == planned
        assert _symmetric_backward_launches(args, gen) == {kernel}


def test_deterministic_mode_plans_and_launches_the_full_rows(randn, randint, gen):
    """The triangle adds by atomics: in deterministic mode the plan takes the full rows whatever
    walk is asked for, and the glue launches them."""
    args = (randn(200, 64, dtype=torch.bfloat16), randint(0, 4, (200,)), None, None,
            torch.tensor(0.1), 200, True)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with test_hooks(symmetric_backward_walk="triangle"):
            plan = _plan(args)
            assert (plan["backward_schedule"], plan["symmetric_backward_walk"]) == \
                ("symmetric", "full rows")
            assert _symmetric_backward_launches(args, gen) == {"sm90.grad_rows_symmetric"}
    finally:
        torch.use_deterministic_algorithms(previous)


def test_the_symmetric_backward_walk_is_checked(randn, randint):
    args = (randn(40, 16, dtype=torch.bfloat16), randint(0, 4, (40,)), None, None,
            torch.tensor(0.1), 40, True)
    with test_hooks(symmetric_backward_walk="async"):
        with pytest.raises(ValueError, match='the test hook symmetric_backward_walk must be '
                                             '"triangle", "triangle-async" or "rows", got "async"'):
            torch.ops.scl.supcon_cuda_dry_run(*args)


# Known false negatives (groups=, docs/MATH.md section 11): every walk's group mask, by the
# kernels' own test (tile_math::group_masks_pair), against the float64 reference. The
# conformance suite runs supcon_loss's backends, which the dry run is not one of.
def _group_args(case, dtype, temperature, randn, randint):
    n, m, d = 150, 130, 37
    ids = {"groups": randint(-1, 8, (n,))}
    contrast = contrast_labels = None
    num_anchors, offset = n, None
    if case == "anchor-block":
        num_anchors, offset = 60, 45
    elif case == "cross":
        contrast, contrast_labels = randn(m, d, dtype=dtype), randint(0, 6, (m,))
        ids["contrast_groups"] = randint(-1, 8, (m,))
    args = (randn(n, d, dtype=dtype), randint(0, 6, (n,)), contrast, contrast_labels,
            torch.tensor(temperature, dtype=torch.float64), num_anchors, True)
    return args, offset, ids


@pytest.mark.parametrize("case", ["single", "anchor-block", "cross"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("temperature", [0.02, 0.1])  # 0.1: the symmetric schedule, single set
def test_groups(case, dtype, temperature, randn, randint, gen):
    args, offset, ids = _group_args(case, dtype, temperature, randn, randint)
    ref = check(args, gen, anchor_offset=offset, **ids).ref.ref
    # The groups took pairs out: the loss is not the one without them.
    assert not torch.equal(ref.allowed, ~torch.eye(*ref.allowed.shape, dtype=torch.bool)
                           if ref.single_set else torch.ones_like(ref.allowed))


@pytest.mark.parametrize("walk", list(SYMMETRIC_BACKWARDS), ids=lambda walk: walk or "default")
@pytest.mark.parametrize("n,groups", [(300, 20), (129, 1), (1, 1)])
def test_groups_in_the_symmetric_backward_walks(walk, n, groups, randn, randint, gen):
    """Every symmetric backward walk with groups (the triangle masks a tile once for both of
    its sides), one group for all (anchors without positives have no column left)."""
    args = (randn(n, 64, dtype=torch.bfloat16), randint(0, 9, (n,)), None, None,
            torch.tensor(0.1), n, True)
    with test_hooks(symmetric_backward_walk=walk):
        check(args, gen, groups=randint(-1 if groups > 1 else 0, groups, (n,)))


# Multi-hot labels (multi_label "any" / "jaccard", docs/MATH.md section 11): the positives are
# ATen ops on the rows' device beside the tiles that run without labels: sums over class subsets
# gathered there for rows of few classes (csrc/core/class_subset_gathers.cpp), the pairs' class
# overlaps in blocks for rows of more (csrc/core/class_overlap_products.cpp). With groups, or the
# focal loss, the plan refuses.
def _multi_hot_args(case, hot_rows, dtype, temperature, randn, randint):
    n, m, d = 150, 130, 37
    contrast = contrast_labels = None
    num_anchors, offset = n, None
    if case == "anchor-block":
        num_anchors, offset = 60, 45
    elif case == "cross":
        contrast, contrast_labels = randn(m, d, dtype=dtype), hot_rows(m)
    args = (randn(n, d, dtype=dtype), hot_rows(n), contrast, contrast_labels,
            torch.tensor(temperature, dtype=torch.float64), num_anchors, True)
    return args, offset


# The paths: the backend's choice by the rows, and (few-class rows) the blocks of pairs forced,
# in blocks of 11 x 12 pairs so that the walks cross them.
POSITIVE_PATHS = {"choice": {}, "pairs": dict(multi_label_positives="pair_walk",
                                                chunk_elements=11 * 12)}


@pytest.mark.parametrize("case", ["single", "anchor-block", "cross"])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("temperature", [0.02, 0.1])  # 0.1: the symmetric schedule, single set
@pytest.mark.parametrize("path", POSITIVE_PATHS)
def test_multi_hot(case, rule, dtype, temperature, path, randn, randint, gen):
    args, offset = _multi_hot_args(case, lambda rows: few_class_rows(randint, rows, 9), dtype,
                                   temperature, randn, randint)
    with test_hooks(**POSITIVE_PATHS[path]):
        ref = check(args, gen, anchor_offset=offset, multi_label=rule).ref.ref
    if rule == "jaccard":  # rows share classes in more than one way
        assert ((ref.weights > 0) & (ref.weights < 1)).any()


@pytest.mark.parametrize("case", ["single", "anchor-block", "cross"])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("blocks", [0, 11 * 12])  # 0: one block
def test_multi_hot_rows_of_many_classes(case, rule, dtype, blocks, randn, randint, gen):
    """Rows of up to 70 classes take the blocks of pairs; `blocks` pairs a block crosses them."""
    args, offset = _multi_hot_args(case, lambda rows: many_class_rows(randint, rows, 130),
                                   dtype, 0.1, randn, randint)
    with test_hooks(chunk_elements=blocks):
        check(args, gen, anchor_offset=offset, multi_label=rule)


@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("classes", [2048, 2100])  # the last C whose overlaps float16 holds, one past
def test_multi_hot_rows_of_thousands_of_classes(rule, classes, randn, gen):
    """Rows of every class: overlaps up to C, exact in float16 to 2,048, in float32 past it."""
    n = 24
    hot = torch.zeros(n, classes, dtype=torch.bool)
    hot[0] = hot[1] = True  # overlap C
    hot[2, 1:classes - 10] = True  # overlap C - 11 with rows 0 and 1: odd, past 2,048 no float16
    hot[3:, :] = torch.arange(classes) % (torch.arange(3, n) + 2).unsqueeze(1) == 0
    check((randn(n, 16, dtype=torch.float32), hot, None, None, torch.tensor(0.1), n, True), gen,
          multi_label=rule)


def test_multi_hot_blocks_narrow_for_many_classes(randn, randint, gen):
    """C = 2^17: a block's class rows (2^24 values at most) hold 128 rows, so 150 rows cross
    two blocks a side."""
    n, classes = 150, 1 << 17
    hot = torch.zeros(n, classes, dtype=torch.bool)
    hot[torch.arange(n).repeat_interleave(12), randint(0, classes, (12 * n,))] = True
    hot[:, classes - 1] = torch.arange(n) % 3 == 0  # shared, in the last word
    hot[::5] = False
    check((randn(n, 16, dtype=torch.float32), hot, None, None, torch.tensor(0.1), n, True), gen,
          multi_label="jaccard")


@pytest.mark.parametrize("classes", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("path", POSITIVE_PATHS)
def test_multi_hot_class_counts(classes, rule, path, randn, randint, gen):
    """C across the 64-bit words' edges, the last class of the last word held."""
    n = 70
    hot = torch.zeros(n, classes, dtype=torch.bool)
    for r in range(n):
        hot[r, randint(0, classes, (int(randint(0, 4, ())),))] = True
    hot[1::7, classes - 1] = True
    with test_hooks(**POSITIVE_PATHS[path]):
        check((randn(n, 16, dtype=torch.bfloat16), hot, None, None, torch.tensor(0.1), n, True),
              gen, multi_label=rule)


@pytest.mark.parametrize("case", ["no-class", "one-class", "one-row"])
@pytest.mark.parametrize("path", POSITIVE_PATHS)
def test_multi_hot_awkward_labels(case, path, randn, gen):
    n = 1 if case == "one-row" else 40
    hot = torch.zeros(n, 5, dtype=torch.bool)
    if case != "no-class":
        hot[:, 2] = True
    with test_hooks(**POSITIVE_PATHS[path]):
        res = check((randn(n, 24, dtype=torch.float32), hot, None, None, torch.tensor(0.1), n,
                     True), gen, multi_label="jaccard")
    if case != "one-class":
        assert not res.outputs[0].any()


# Groups with multi-hot labels: the group mask compares one id per row, so every pair of one
# group leaves the tiles and the pairs of one group that share a class come back beside them
# (csrc/core/group_shared_class_pairs.cpp).
@pytest.mark.parametrize("case", ["single", "anchor-block", "cross"])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("temperature", [0.02, 0.1])  # 0.1: the symmetric schedule, single set
@pytest.mark.parametrize("path", POSITIVE_PATHS)
@pytest.mark.parametrize("groups", [4, 1])  # 1: one group for all
def test_multi_hot_groups(case, rule, dtype, temperature, path, groups, randn, randint, gen):
    args, offset = _multi_hot_args(case, lambda rows: few_class_rows(randint, rows, 9), dtype,
                                   temperature, randn, randint)
    kw = dict(groups=randint(-1 if groups > 1 else 0, groups, (args[0].shape[0],)))
    if case == "cross":
        kw["contrast_groups"] = randint(0, groups, (args[2].shape[0],))
    with test_hooks(**POSITIVE_PATHS[path]):
        ref = check(args, gen, anchor_offset=offset, multi_label=rule, **kw).ref.ref
    # Pairs of one group leave the denominator where they share no class, and stay where they do.
    assert ref.weights.numel() and (ref.weights > 0).any()


@pytest.mark.parametrize("groups", [False, True])
def test_multi_hot_under_graph_capture(groups, randn, randint, gen):
    """A captured call takes the class overlaps in blocks of pairs (the sums over class subsets
    read sizes on the host): the same loss and gradients (its host reads:
    bench/tests/test_bench_launch_count.py)."""
    args, _ = _multi_hot_args("single", lambda rows: few_class_rows(randint, rows, 9),
                              torch.bfloat16, 0.1, randn, randint)
    kw = dict(groups=randint(-1, 4, (args[0].shape[0],))) if groups else {}
    with test_hooks(dry_run_capturing=True):
        check(args, gen, multi_label="jaccard", **kw)


def test_multi_hot_groups_leave_anchors_only_their_positives(randn, gen):
    """One group for all: an anchor's denominator is its positives alone (the tiles' is empty)."""
    hot = torch.zeros(30, 6, dtype=torch.bool)
    hot[:, 0] = torch.arange(30) % 2 == 0
    hot[:, 1] = torch.arange(30) % 3 == 0
    check((randn(30, 12), hot, None, None, torch.tensor(0.1), 30, True), gen,
          groups=torch.zeros(30, dtype=torch.int64), multi_label="jaccard")


def test_multi_hot_focal_is_refused(randn):
    hot = torch.zeros(20, 4, dtype=torch.bool)
    hot[:, 1] = True
    with pytest.raises(NotImplementedError, match="cannot_run: no focal walk"):
        torch.ops.scl.supcon_cuda_dry_run(randn(20, 8), hot, None, None, torch.tensor(0.1), 20,
                                          True, focal_gamma=1.0)
