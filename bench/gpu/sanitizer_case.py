r"""Forward and backward of backend="cuda" on small awkward cases, for compute-sanitizer
(bench/gpu/gpu_session.sh). Every kernel is reached: the sm_90a wgmma kernels (bf16 / fp16 with
D <= 256, in their 128- and 256-wide forms, and the triangle backward's cluster pairs, whose
exchange over distributed shared memory is synchronisation for racecheck and synccheck to
check, in both its forms: the default and the exchange by st.async, opt-in until this set and the
GPU tests pass with it) and the mma.sync kernels (everything else), each in
the symmetric schedule (single set) and the plain one (contrast_mode="one", a cross set, the raw
op with anchor_offset), with padded rows, tile tails, float64 inputs (computed in fp32) and a low
temperature. Every case runs twice: as it comes, and under
torch.use_deterministic_algorithms(True) (the atomic-free forward); each loss and each gradient
(features and contrast) is checked against the float64 reference's on the host, not only for
being finite (under memcheck, the split bug found on the first GPU run gave finite, wrong
losses): the gradient as max |g - g_ref| / max |g_ref|, at most 5e-2 on 16-bit inputs and 1e-3
on float32 and float64 ones (GRADIENT_TOLERANCE).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python -m bench.gpu.sanitizer_case
"""
import argparse

import torch

import scl_kernels
from bench.gpu.step import walk_of
from bench.gpu.walk_agreement import relative_error
from scl_kernels.backends.reference import supcon_reference
from bench.harness import cli
from bench.harness.timing import synchronize

# The triangle backward's cluster pairs with column sides: 5 row blocks (the odd last one pairs
# with padding), and 6 at D = 64 (the partners' upper half of the columns not sent).
TRIANGLE_CASES = [
    (520, 128, torch.bfloat16, "single", 0.1),
    (700, 64, torch.float16, "single", 0.1),
]
# (n, d, dtype, layout, temperature)
CASES = [
    (300, 128, torch.bfloat16, "single", 0.1),
    (300, 128, torch.bfloat16, "single", 0.02),
    (190, 72, torch.float16, "single", 0.1),
    (130, 100, torch.float16, "one", 0.1),
    (150, 128, torch.bfloat16, "cross", 0.1),
    (140, 200, torch.bfloat16, "single", 0.1),
    (130, 256, torch.float16, "cross", 0.1),
    (257, 3, torch.bfloat16, "single", 0.1),
    (100, 257, torch.bfloat16, "cross", 0.1),
    (65, 40, torch.float32, "single", 0.1),
    (70, 33, torch.float32, "cross", 0.1),
    (129, 64, torch.float64, "single", 0.1),
    (1, 8, torch.bfloat16, "single", 0.1),
] + TRIANGLE_CASES
# (n, d, dtype, num_anchors, anchor_offset): the raw op on a block of the single set's anchors.
OFFSET_CASES = [
    (300, 128, torch.bfloat16, 64, 37),
    (200, 100, torch.float32, 1, 199),
]


# Each gradient (features and contrast) against the float64 reference's, as max |g - g_ref| /
# max |g_ref|: 16-bit inputs take the backward's tile products in 16 bits (its weights rounded to
# 2^-8 or 2^-11 of themselves, as the walks' own comparison allows in python_tests/backends/
# test_cuda_backend.py); float32 and float64 inputs are computed in float32, whose sums over a
# few hundred rows at temperature 0.02 stay far inside 1e-3.
GRADIENT_TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 5e-2, torch.float32: 1e-3,
                      torch.float64: 1e-3}
# Each loss, relative and absolute: the forward's sums in float32 from the rounded inputs.
LOSS_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 3e-2, torch.float32: 1e-4,
                  torch.float64: 1e-4}


# Where the cases run: CUDA C++ under the sanitizer; the tests without a GPU run the same checks
# on the CPU backend (bench/tests/test_bench_gpu_sanitizer_case.py).
DEVICE, BACKEND = "cuda", "cuda"


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


def _float64_leaf(tensor):
    """The same values in float64 on the host, for the reference: its dense kernels then stay out
    of the sanitizer's way and its report."""
    return tensor.detach().to("cpu", torch.float64).requires_grad_(True)


def _check_loss(case, dtype, got, want):
    """The loss (or each anchor's) against the reference's, to the dtype's tolerance."""
    got, want, tolerance = got.detach().cpu().double(), want.detach(), LOSS_TOLERANCE[dtype]
    assert ((got - want).abs() <= tolerance * want.abs() + tolerance).all(), \
        (case, "loss", got.tolist(), want.tolist())


def _check_gradients(case, dtype, got, want):
    """Every gradient of ``got`` against ``want``'s (same order), to the dtype's tolerance."""
    for name, g, w in zip(("features", "contrast"), got, want):
        error = relative_error((g.cpu(),), (w,))
        assert error <= GRADIENT_TOLERANCE[dtype], (case, f"grad of {name}", error)


def run(n, d, dtype, layout, temperature):
    gen = torch.Generator().manual_seed(n * 1000 + d)
    x = _randn(gen, n, d, dtype=dtype).requires_grad_(True)
    labels = torch.randint(0, 5, (n,), generator=gen).to(DEVICE)
    kw = {}
    if layout == "one":
        x = x[: n // 2 * 2].detach().reshape(n // 2, 2, d).requires_grad_(True)
        labels, kw = labels[: n // 2], {"contrast_mode": "one"}
    elif layout == "cross":
        kw = {"contrast": _randn(gen, n + 7, d, dtype=dtype).requires_grad_(True),
              "contrast_labels": torch.randint(0, 5, (n + 7,), generator=gen).to(DEVICE)}
    inputs = [x] + ([kw["contrast"]] if "contrast" in kw else [])
    loss = scl_kernels.supcon_loss(x, labels, temperature, backend=BACKEND, **kw)
    grads = torch.autograd.grad(loss, inputs)
    synchronize(DEVICE)
    case = (n, d, dtype, layout, temperature)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads), case
    # Finite is not enough (a wrong sum can be finite): the loss and the gradients against the
    # dense reference in float64, to the dtype's tolerance (the conformance suite checks
    # everything else).
    wide_inputs = [_float64_leaf(t) for t in inputs]
    wide = {"contrast_mode": "one"} if layout == "one" else {}
    if "contrast" in kw:
        wide.update(contrast=wide_inputs[1], contrast_labels=kw["contrast_labels"].cpu())
    want = scl_kernels.supcon_loss(wide_inputs[0], labels.cpu(), temperature, backend="reference",
                                   **wide)
    _check_loss(case, dtype, loss, want)
    _check_gradients(case, dtype, grads, torch.autograd.grad(want, wide_inputs))


def run_async_triangle(*case):
    """A cluster-pair case with the triangle's exchange by st.async
    (SCL_CUDA_SYMMETRIC_BACKWARD=triangle-async)."""
    with walk_of("cuda:triangle-async"):
        run(*case)


def run_offset(n, d, dtype, num_anchors, anchor_offset):
    gen = torch.Generator().manual_seed(n * 1000 + d + anchor_offset)
    x = _randn(gen, n, d, dtype=dtype)
    labels = torch.randint(0, 5, (n,), generator=gen).to(DEVICE)
    temperature = torch.tensor(0.1, dtype=torch.float64, device=DEVICE)
    args = (x, labels, None, None, temperature, num_anchors, True)
    loss, lse, _ = torch.ops.scl.supcon(*args, anchor_offset)
    grad_loss = torch.ones(num_anchors, device=DEVICE, dtype=loss.dtype)
    grad_x = torch.ops.scl.supcon_backward(grad_loss, *args, lse, anchor_offset)[0]
    synchronize(DEVICE)
    case = (n, d, dtype, num_anchors, anchor_offset)
    assert torch.isfinite(loss).all() and torch.isfinite(grad_x).all(), case
    # The reference op on the same anchor block, in float64: each anchor's loss, and the gradient
    # of their sum (the upstream gradient of ones above).
    wide_x = _float64_leaf(x)
    want, _ = supcon_reference(wide_x, labels.cpu(), None, None, temperature.cpu(), num_anchors,
                               True, anchor_offset)
    _check_loss(case, dtype, loss, want)
    _check_gradients(case, dtype, (grad_x,), torch.autograd.grad(want.sum(), [wide_x]))


def all_runs():
    """(function, case) of every case, in the order of their numbers."""
    return ([(run, case) for case in CASES] + [(run_offset, case) for case in OFFSET_CASES]
            + [(run_async_triangle, case) for case in TRIANGLE_CASES])


def case_groups(count, groups):
    """Case numbers 1..count dealt round-robin into at most `groups` comma-separated lists, so
    that the slow cases (the cluster pairs' 14 and 15, and 18 and 19 by st.async) land in
    different groups."""
    dealt = [[] for _ in range(min(groups, count))]
    for number in range(1, count + 1):
        dealt[(number - 1) % len(dealt)].append(str(number))
    return [",".join(group) for group in dealt]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=cli.int_list, default=None,
                        help="the cases to run, by their numbers as printed (1-based; default: all)")
    parser.add_argument("--print-groups", type=int, default=None, metavar="G",
                        help="print every case number in G groups, one comma-separated line each "
                             "(for --cases), and exit: the groups that gpu_session.sh runs side by "
                             "side")
    args = parser.parse_args()
    runs = all_runs()
    if args.print_groups is not None:
        if args.print_groups < 1:
            parser.error("--print-groups must be at least 1")
        print("\n".join(case_groups(len(runs), args.print_groups)))
        return
    assert scl_kernels.backends.cuda_kernels_built(), \
        "the library has no CUDA C++ kernels: build with SCL_BUILD_CUDA=1"
    if args.cases is not None:
        if max(args.cases) > len(runs):
            parser.error(f"--cases: there are {len(runs)} cases")
        runs = [runs[number - 1] for number in args.cases]
    # Every case runs, whatever an earlier one gave: a sanitizer's verdict must cover them all
    # (the first session's stopped at the case that failed, and "0 hazards" covered 8 of 15).
    failures = []
    for index, (fn, case) in enumerate(runs, 1):
        for deterministic in (False, True):  # deterministic: the plain forward for the single set too
            torch.use_deterministic_algorithms(deterministic)
            try:
                fn(*case)
            except AssertionError as error:
                failures.append(f"case {index} of {len(runs)} {case}, deterministic={deterministic}: "
                                f"{error}")
                print("FAILED", failures[-1], flush=True)
            finally:
                torch.use_deterministic_algorithms(False)
    if failures:
        raise SystemExit(f"{len(failures)} of {2 * len(runs)} runs failed (all {len(runs)} cases ran)")
    print(f"{len(runs)} cases, twice (default and deterministic): finite, losses and gradients as "
          "the float64 reference's")


if __name__ == "__main__":
    main()
