r"""Forward and backward of backend="cuda" on small awkward cases, for compute-sanitizer
(bench/gpu/gpu_session.sh). Every kernel is reached: the sm_90a wgmma kernels (bf16 / fp16 with
D <= 256, in their 128- and 256-wide forms, and the triangle backward's cluster pairs, whose
exchange over distributed shared memory is synchronisation for racecheck and synccheck to
check, in both its forms: the default and the exchange by st.async, opt-in until this set and the
GPU tests pass with it) and the mma.sync kernels (everything else), each in
the symmetric schedule (single set) and the plain one (contrast_mode="one", a cross set, the raw
op with anchor_offset), with padded rows, tile tails, float64 inputs (computed in fp32) and a low
temperature. Every case runs twice: as it comes, and under
torch.use_deterministic_algorithms(True) (the atomic-free forward); each loss is checked against
the float64 reference, not only for being finite (under memcheck, the split bug found on the
first GPU run gave finite, wrong losses).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
        python -m bench.gpu.sanitizer_case
"""
import argparse

import torch

import scl_kernels
from bench.gpu.step import walk_of
from bench.harness import cli

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


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to("cuda", dtype)


def run(n, d, dtype, layout, temperature):
    gen = torch.Generator().manual_seed(n * 1000 + d)
    x = _randn(gen, n, d, dtype=dtype).requires_grad_(True)
    labels = torch.randint(0, 5, (n,), generator=gen).cuda()
    kw = {}
    if layout == "one":
        x = x[: n // 2 * 2].detach().reshape(n // 2, 2, d).requires_grad_(True)
        labels, kw = labels[: n // 2], {"contrast_mode": "one"}
    elif layout == "cross":
        kw = {"contrast": _randn(gen, n + 7, d, dtype=dtype).requires_grad_(True),
              "contrast_labels": torch.randint(0, 5, (n + 7,), generator=gen).cuda()}
    loss = scl_kernels.supcon_loss(x, labels, temperature, backend="cuda", **kw)
    loss.backward()
    torch.cuda.synchronize()
    grads = [x.grad] + ([kw["contrast"].grad] if "contrast" in kw else [])
    case = (n, d, dtype, layout, temperature)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads), case
    # Finite is not enough (a wrong sum can be finite): the loss against the dense reference in
    # float64, to the dtype's tolerance (the conformance suite checks everything else).
    wide = {k: v.detach().double() if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in kw.items()}
    want = scl_kernels.supcon_loss(x.detach().double(), labels, temperature, backend="reference", **wide)
    tolerance = 3e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    assert abs(loss.item() - want.item()) <= tolerance * abs(want.item()) + tolerance, \
        (case, loss.item(), want.item())


def run_async_triangle(*case):
    """A cluster-pair case with the triangle's exchange by st.async
    (SCL_CUDA_SYMMETRIC_BACKWARD=triangle-async)."""
    with walk_of("cuda:triangle-async"):
        run(*case)


def run_offset(n, d, dtype, num_anchors, anchor_offset):
    gen = torch.Generator().manual_seed(n * 1000 + d + anchor_offset)
    x = _randn(gen, n, d, dtype=dtype)
    labels = torch.randint(0, 5, (n,), generator=gen).cuda()
    temperature = torch.tensor(0.1, dtype=torch.float64, device="cuda")
    args = (x, labels, None, None, temperature, num_anchors, True)
    loss, lse, _ = torch.ops.scl.supcon(*args, anchor_offset)
    grad_loss = torch.ones(num_anchors, device="cuda", dtype=loss.dtype)
    grad_x = torch.ops.scl.supcon_backward(grad_loss, *args, lse, anchor_offset)[0]
    torch.cuda.synchronize()
    assert torch.isfinite(loss).all() and torch.isfinite(grad_x).all(), \
        (n, d, dtype, num_anchors, anchor_offset)


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
    print(f"{len(runs)} cases, twice (default and deterministic): finite gradients, losses as the "
          "float64 reference's")


if __name__ == "__main__":
    main()
