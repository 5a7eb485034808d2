"""Forward and backward of backend="cuda" on small awkward cases, for compute-sanitizer
(bench/gpu_session.sh): both kernel families (the sm_90a wgmma kernels take bf16 / fp16 with
D <= 128; the mma.sync kernels everything else), every layout, padded rows and tile tails.

    compute-sanitizer --tool memcheck python -m bench.cuda_sanitizer_case
"""
import torch

import scl_kernels

# (n, d, dtype, layout): single set (symmetric schedule), "one" and cross set (plain schedule).
CASES = [
    (300, 128, torch.bfloat16, "single"),
    (130, 100, torch.float16, "one"),
    (257, 3, torch.bfloat16, "single"),
    (100, 257, torch.bfloat16, "cross"),
    (65, 40, torch.float32, "single"),
    (70, 33, torch.float32, "cross"),
    (1, 8, torch.bfloat16, "single"),
]


def run(n, d, dtype, layout):
    gen = torch.Generator().manual_seed(n * 1000 + d)
    x = torch.randn(n, d, generator=gen).to("cuda", dtype).requires_grad_(True)
    labels = torch.randint(0, 5, (n,), generator=gen).cuda()
    kw = {}
    if layout == "one":
        x = x[: n // 2 * 2].detach().reshape(n // 2, 2, d).requires_grad_(True)
        labels, kw = labels[: n // 2], {"contrast_mode": "one"}
    elif layout == "cross":
        kw = {"contrast": torch.randn(n + 7, d, generator=gen).to("cuda", dtype),
              "contrast_labels": torch.randint(0, 5, (n + 7,), generator=gen).cuda()}
    loss = scl_kernels.supcon_loss(x, labels, 0.1, backend="cuda", **kw)
    loss.backward()
    torch.cuda.synchronize()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all(), (n, d, dtype, layout)


def main():
    for case in CASES:
        run(*case)
        torch.use_deterministic_algorithms(True)  # the plain forward for the single set too
        try:
            run(*case)
        finally:
            torch.use_deterministic_algorithms(False)
    print(f"{len(CASES)} cases, twice (default and deterministic): finite losses and gradients")


if __name__ == "__main__":
    main()
