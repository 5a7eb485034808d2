"""GPU sweep of the fused SupCon op against the floors of docs/MATH.md section 5 and against
dense PyTorch (eager and torch.compile) and pytorch-metric-learning, where those fit.

    python -m bench.gpu_sweep                       # the full sweep (long: split it with flags)
    python -m bench.gpu_sweep --sizes 4096,65536 --dims 128 --dtypes bf16 --modes both

For each dtype, D, N and mode (fwd, bwd, both) it records the median time (triton's do_bench for
short calls, CUDA events over a few calls for long ones), peak memory beyond the inputs, the
achieved TFLOP/s and exp/s of the schedule the op ran, and time / floor. Rows are appended to a
CSV as they are measured, so a run cut short keeps what it did; a markdown table and a PNG plot
are written at the end. Files go to --out (bench/results/local/ by default) named by GPU and date.
"""
import csv
import datetime
import math
import sys

import torch

from bench.harness import cli, report
from bench.harness.machine import machine_description
from bench.harness.memory import PeakMemory
from bench.harness.timing import cuda_median_ms

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Hopper (H100 SXM5 / H200) dense tensor-core peaks and the exp unit, per docs/MATH.md
# section 5. fp32 inputs run as three tf32 products (tf32x3): a third of the tf32 peak.
PEAK_FLOPS = {"bf16": 989e12, "fp16": 989e12, "fp32": 495e12 / 3}
EXP_PER_SECOND = 3.9e12
TEMPERATURE = 0.1
FIELDS = ["implementation", "dtype", "n", "d", "mode", "median_ms", "peak_mb", "tflops",
          "exp_per_s", "floor_ms", "time_over_floor", "speedup_vs_dense_eager", "note"]


def schedule_work(n, d, symmetric):
    """(FLOPs, exps) per mode of the kernels the op runs. Plain: 2N^2D and N^2 forward,
    6N^2D and N^2 backward (S once, two products). Symmetric: the forward's upper triangle,
    N^2D and N^2/2; its backward sums full rows of G + G^T, 4N^2D and N^2 (no atomics)."""
    fwd = (n * n * d, n * n / 2) if symmetric else (2 * n * n * d, n * n)
    bwd = (4 * n * n * d, n * n) if symmetric else (6 * n * n * d, n * n)
    return {"fwd": fwd, "bwd": bwd, "both": (fwd[0] + bwd[0], fwd[1] + bwd[1])}


def measure(loss_fn, features, labels, mode):
    """(median ms, peak MB beyond the inputs) of one mode of a loss function."""
    def forward():
        return loss_fn(features, labels, TEMPERATURE)

    if mode == "fwd":
        fn = forward
    elif mode == "bwd":
        loss = forward()
        fn = lambda: torch.autograd.grad(loss, features, retain_graph=True)  # noqa: E731
    else:
        fn = lambda: torch.autograd.grad(forward(), features)  # noqa: E731
    fn()  # compiles, autotunes
    with PeakMemory("cuda") as memory:
        fn()
    return cuda_median_ms(fn), memory.peak_bytes / 2**20


def implementations(max_dense_n):
    import scl_kernels
    from bench import baselines
    impls = [("scl_kernels", lambda x, y, t: scl_kernels.supcon_loss(x, y, t), math.inf)]
    # The CUDA C++ backend by name beside auto (which takes it only by its size rule), when built.
    if scl_kernels.backends.cuda_kernels_built():
        impls.append(("scl_kernels_cuda",
                      lambda x, y, t: scl_kernels.supcon_loss(x, y, t, backend="cuda"), math.inf))
    else:
        print("the library has no CUDA C++ kernels (SCL_BUILD_CUDA=1): skipping backend='cuda'",
              flush=True)
    compiled_dense = torch.compile(baselines.dense_supcon)
    impls += [("dense_eager", baselines.dense_supcon, max_dense_n),
              ("dense_compiled", compiled_dense, max_dense_n)]
    try:
        import pytorch_metric_learning  # noqa: F401
        impls.append(("pml", baselines.pml_supcon, max_dense_n))
    except ImportError:
        print("pytorch-metric-learning is not installed: skipping it", flush=True)
    return impls


def write_markdown(rows, path, machine, command):
    lines = report.markdown_header("GPU sweep", machine, {"command": f"`{command}`"})
    # As measured (str): the table's two-digit rounding would hide sub-millisecond times.
    lines += ["", report.markdown_table(FIELDS, [[str(row[f]) for f in FIELDS] for row in rows])]
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def write_plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    keys = sorted({(r["implementation"], r["dtype"], r["d"]) for r in rows if r["mode"] == "both"
                   and r["median_ms"] != ""})
    for impl, dtype, d in keys:
        points = sorted((r["n"], r["median_ms"], r["peak_mb"]) for r in rows
                        if (r["implementation"], r["dtype"], r["d"], r["mode"]) == (impl, dtype, d, "both")
                        and r["median_ms"] != "")
        label = f"{impl} {dtype} D={d}"
        time_ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        memory_ax.plot([p[0] for p in points], [p[2] for p in points], marker="o", label=label)
    for ax, ylabel in ((time_ax, "forward+backward ms (median)"), (memory_ax, "peak MB beyond inputs")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    time_ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, sizes="4096,16384,32768,65536,262144,1048576",
                                  dims="128,256,768", dtypes="bf16,fp32",
                                  helps={"dtypes": "of bf16, fp16, fp32, comma-separated "
                                                   "(default %(default)s)"})
    parser.add_argument("--modes", default="fwd,bwd,both",
                        type=cli.choice_list({"fwd", "bwd", "both"}),
                        help="of fwd, bwd, both, comma-separated (default %(default)s)")
    parser.add_argument("--max-dense-n", type=int, default=32768,
                        help="largest N for the dense and pml baselines (default %(default)s)")
    args = parser.parse_args(argv)
    unknown = set(args.dtypes) - set(DTYPES)
    if unknown:
        parser.error(f"unknown dtypes {sorted(unknown)}; choose from {sorted(DTYPES)}")
    if not torch.cuda.is_available():
        sys.exit("bench.gpu_sweep needs a CUDA GPU; see bench/sweep.py for the CPU sweep")
    from scl_kernels.backends import require_fused
    require_fused("auto", "cuda", "python -m bench.gpu_sweep")  # its "scl_kernels" rows

    from bench.implementations import make_inputs

    machine = machine_description("cuda")
    print("\n".join(f"{label}: {text}" for label, text in machine.items()), flush=True)
    gpu = torch.cuda.get_device_name(0).replace(" ", "_")
    stem = report.result_stem(args.out, f"gpu_sweep_{gpu}_{datetime.date.today().isoformat()}")
    rows = []
    sizes = args.sizes
    with open(stem + ".csv", "a", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, FIELDS)
        if csv_file.tell() == 0:
            writer.writeheader()
        for dtype_name in args.dtypes:
            for d in args.dims:
                for n in sizes:
                    features, labels = make_inputs(n, d, DTYPES[dtype_name], "cuda")
                    # One normalised set at t = 0.1: the core takes the symmetric schedule.
                    work = schedule_work(n, d, symmetric=True)
                    dense_ms = {}
                    for name, loss_fn, max_n in implementations(args.max_dense_n):
                        if n > max_n:
                            continue
                        for mode in args.modes:
                            row = dict.fromkeys(FIELDS, "")
                            row.update(implementation=name, dtype=dtype_name, n=n, d=d, mode=mode)
                            try:
                                ms, peak = measure(loss_fn, features, labels, mode)
                                row.update(median_ms=round(ms, 4), peak_mb=round(peak, 1))
                                if name == "dense_eager":
                                    dense_ms[mode] = ms
                                if name == "scl_kernels":
                                    flops, exps = work[mode]
                                    floor = max(flops / PEAK_FLOPS[dtype_name], exps / EXP_PER_SECOND)
                                    row.update(tflops=round(flops / ms / 1e9, 1),
                                               exp_per_s=f"{exps / ms * 1e3:.3g}",
                                               floor_ms=round(floor * 1e3, 4),
                                               time_over_floor=round(ms / (floor * 1e3), 2))
                            except torch.cuda.OutOfMemoryError:
                                row["note"] = "out of memory"
                            except Exception as error:  # a baseline that breaks (compile) is noted
                                if name == "scl_kernels":
                                    raise
                                row["note"] = f"failed: {type(error).__name__}"
                            torch.cuda.empty_cache()
                            rows.append(row)
                    for row in rows:
                        if (row["n"], row["d"], row["dtype"]) == (n, d, dtype_name) and row["median_ms"] != "" \
                                and row["mode"] in dense_ms:
                            row["speedup_vs_dense_eager"] = round(dense_ms[row["mode"]] / row["median_ms"], 1)
                    for row in rows:
                        if (row["n"], row["d"], row["dtype"]) == (n, d, dtype_name):
                            writer.writerow(row)
                            print(", ".join(f"{k}={row[k]}" for k in FIELDS if row[k] != ""), flush=True)
                    csv_file.flush()
                    del features, labels
    write_markdown(rows, stem + ".md", machine, report.command_line("bench.gpu_sweep", argv))
    write_plot(rows, stem + ".png")
    print(f"wrote {stem}.csv, .md, .png", flush=True)


if __name__ == "__main__":
    main()
