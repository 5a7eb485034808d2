"""The fused op's forward + backward time over a sweep of N, fitted as t(N) = a + b N + c N^2:
a is the per-call part that no size removes (launches, host work the GPU waits for), b N the
O(N D) passes, c N^2 the tiles. Each point is the median of several synchronised steps, with the
spread (max - min) of those steps and the fit's residual beside it, so that a reader can tell a
real fixed part from noise.

    python -m bench.gpu.size_fit                     # CUDA: triton and cuda, N = 4,096 .. 65,536
    python -m bench.gpu.size_fit --device cpu --backends cpu --sizes 256,512,1024 --dims 32

Writes size_fit_<device>_<date>.md to --out (bench/results/local/ by default). The CPU run exists
so that the script is tested without a GPU.
"""
import datetime
import statistics
import time

import numpy as np
import torch

from bench.gpu import options
from bench.gpu.step import CLASSES, TEMPERATURE, supcon_step, warm_up
from bench.harness import cli, report
from bench.harness.machine import machine_description
from bench.harness.timing import synchronize



def step_times(backend, n, d, dtype, device, repeats):
    """Seconds of ``repeats`` synchronised forward + backward steps, after the warm-up."""
    step = supcon_step(backend, "single", n, d, dtype, device)
    warm_up(step, device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def fit(sizes, millis):
    """(a, b, c) of the least-squares t = a + b N + c N^2, and the residual of each point."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(millis, dtype=np.float64)
    design = np.stack([np.ones_like(n), n, n * n], axis=1)
    coefficients, *_ = np.linalg.lstsq(design, t, rcond=None)
    return tuple(float(c) for c in coefficients), (t - design @ coefficients).tolist()


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, device="cuda",
                                  sizes="4096,8192,16384,24576,32768,49152,65536", dims="128",
                                  repeats=7, helps={"repeats": "synchronised steps per point; "
                                                               "the median is fitted "
                                                               "(default %(default)s)"})
    options.add_step_options(parser)
    args = parser.parse_args(argv)
    import scl_kernels
    device = torch.device(args.device)
    dtype = options.DTYPES[args.dtype]
    if len(args.sizes) < 3:
        raise SystemExit("python -m bench.gpu.size_fit: three sizes at least fit three coefficients")
    lines = report.markdown_header(
        f"Forward + backward time against N: {device.type}, {datetime.date.today().isoformat()}",
        machine_description(device),
        {"problem": f"{args.dtype}, single set, {CLASSES} classes, t = {TEMPERATURE}",
         "command": f"`{report.command_line('bench.gpu.size_fit', argv)}`",
         "fit": "least squares t(N) = a + b N + c N^2 over the medians (a fit, not a measurement "
                "of any part)"})
    for backend in args.backends:
        why_not = scl_kernels.backends.why_not_fused(backend, device)
        if why_not:
            print(f"{backend}: skipped: {why_not}", flush=True)
            continue
        for d in args.dims:
            rows = []
            for n in args.sizes:
                times = step_times(backend, n, d, dtype, device, args.repeats)
                rows.append((n, 1e3 * statistics.median(times), 1e3 * (max(times) - min(times))))
                print(f"{backend} D={d} N={n}: {rows[-1][1]:.3f} ms (spread {rows[-1][2]:.3f})",
                      flush=True)
            (a, b, c), residuals = fit([r[0] for r in rows], [r[1] for r in rows])
            summary = (f"{backend}, D = {d}: t(N) = {a:.3f} ms {b * 1e3:+.4f} ms x (N / 1,000) "
                       f"{c * 1e6:+.5f} ms x (N / 1,000)^2")
            print(summary, flush=True)
            lines += ["", f"## {summary}", "", "| N | median ms | spread ms | fit ms | residual ms |",
                      "|---|---|---|---|---|"]
            lines += [f"| {n} | {ms:.3f} | {spread:.3f} | {ms - r:.3f} | {r:+.3f} |"
                      for (n, ms, spread), r in zip(rows, residuals)]
    path = report.result_stem(args.out, f"size_fit_{device.type}_{datetime.date.today().isoformat()}")
    with open(path + ".md", "w") as out:
        out.write("\n".join(lines) + "\n")
    print("wrote", path + ".md")


if __name__ == "__main__":
    main()
