"""The schedule floor of docs/MATH.md section 5 on this device: what a forward+backward would take
if it did nothing but its GEMMs (timed through torch.mm) and its exps (through torch.exp).

    python -m bench.floor --sizes 16384 --dims 128 --dtypes float32 --device cpu

One GEMM pass is an N x N x D product (2 N^2 D FLOPs). The plain schedule needs 4 passes and
2 N^2 exps (forward S; backward S again plus the two gradient products); the symmetric one
(single set, contrast_mode="all") needs half of each.

Both terms are timed on bounded buffers and scaled to N^2, so the floor of N = 65536 costs no
more memory than a few hundred MB. Caveat for the exp term: torch.exp streams its buffer through
memory. On a CPU the buffer is kept cache-sized, so it measures the exp arithmetic (ATen's
exact exp, which may be slower than a kernel's polynomial one); on a GPU torch.exp is bound by
memory bandwidth, far below the exp units' rate, so there the exp term, and the floor, are
upper bounds.
"""
import torch

from .harness import cli
from .harness.timing import median_seconds

# Largest GEMM block, per side: 8192 x 8192 outputs (256 MiB in fp32) are big enough to run a
# GEMM at full rate and small enough for any device.
GEMM_BLOCK = 8192
# Elements of the exp buffer. CPU: 2^18 fp32 in and out (2 MiB, split over the threads) stay in
# L2 yet give each thread enough work to hide the parallel-region overhead. CUDA: 2^26 amortise
# the launch.
EXP_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 26}
# Each timing lasts at least this long, so launch and synchronisation overheads average out.
MIN_SECONDS = 0.05


def gemm_pass_seconds(n, d, dtype, device, *, repeats=5):
    """Seconds of one N x N x D product through torch.mm, from a block of at most GEMM_BLOCK^2."""
    rows = cols = min(n, GEMM_BLOCK)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(rows, d, generator=generator).to(device=device, dtype=dtype)
    z = torch.randn(cols, d, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(rows, cols, device=device, dtype=dtype)
    block = median_seconds(lambda: torch.mm(q, z.T, out=out), device, repeats=repeats,
                           min_seconds=MIN_SECONDS)
    return block * (n / rows) * (n / cols)


def exp_n2_seconds(n, dtype, device, *, repeats=5):
    """Seconds of N^2 exps through torch.exp, in the dtype the logit tiles are kept in (fp32,
    fp64 for fp64 inputs)."""
    exp_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    count = min(n * n, EXP_ELEMENTS.get(torch.device(device).type, 1 << 24))
    # Logits of unit rows at t = 0.1 shifted by 1/t lie in [-20, 0].
    values = torch.empty(count, device=device, dtype=exp_dtype).uniform_(-20.0, 0.0)
    out = torch.empty_like(values)
    per_element = median_seconds(lambda: torch.exp(values, out=out), device, repeats=repeats,
                                 min_seconds=MIN_SECONDS) / count
    return per_element * n * n


def measure_floor(n, d, dtype=torch.float32, device="cpu"):
    """Seconds: one GEMM pass, N^2 exps, and the plain and symmetric forward+backward floors."""
    gemm = gemm_pass_seconds(n, d, dtype, device)
    exps = exp_n2_seconds(n, dtype, device)
    return {"gemm_pass": gemm, "exp_n2": exps,
            "plain_floor": 4 * gemm + 2 * exps, "symmetric_floor": 2 * gemm + exps}


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, writes_files=False, device=cli.default_device(),
                                  sizes="4096", dims="128", dtypes="float32")
    args = parser.parse_args(argv)
    print(f"{'N':>8} {'D':>5} {'dtype':>9} {'GEMM pass':>10} {'N^2 exps':>10} {'plain':>10} "
          f"{'symmetric':>10}   (ms, {args.device})")
    for dtype_name in args.dtypes:
        for d in args.dims:
            for n in args.sizes:
                f = measure_floor(n, d, getattr(torch, dtype_name), args.device)
                print(f"{n:>8} {d:>5} {dtype_name:>9} {f['gemm_pass'] * 1e3:>10.3f} "
                      f"{f['exp_n2'] * 1e3:>10.3f} {f['plain_floor'] * 1e3:>10.3f} "
                      f"{f['symmetric_floor'] * 1e3:>10.3f}", flush=True)


if __name__ == "__main__":
    main()
