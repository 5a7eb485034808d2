"""Sweep N (and D, dtype) over supcon_loss and the baselines; write CSV, markdown and a plot.

    python -m bench.sweep                                   # CPU: N = 1024, 4096, 16384
    python -m bench.sweep --sizes 1024,4096,16384,65536 --max-dense-n 16384
    python -m bench.sweep --sizes 256 --impls scl_kernels,dense --repeats 3   # quick

Each configuration runs in a fresh subprocess, so that its CPU peak memory is its own (a
process' peak RSS never comes back down, and heap memory freed by an earlier configuration would
hide a later one's allocations) and so that an out-of-memory kill or a crashing kernel costs one
row, not the sweep.

Per configuration: one warm-up forward+backward, one forward and one forward+backward under
PeakMemory, then the median times of both passes. Dense PyTorch implementations (the baselines,
and supcon_loss where it resolves to its reference backend) stop at --max-dense-n; any
implementation whose memory estimate exceeds the free memory is skipped.

Writes supcon_sweep_<device>_<date>_<time>.{csv,md,png} to --out (bench/results/local/ by default).
"""
import argparse
import itertools
import json
import subprocess
import sys
import time
import traceback

import torch

from . import sweep_report
from .floor import measure_floor
from .harness import cli, report
from .harness.machine import machine_description
from .harness.memory import PeakMemory
from .harness.timing import make_step, median_seconds
from .implementations import (NUM_CLASSES, TEMPERATURE, by_name, implementations, make_inputs,
                              require_fused, skip_reason)

DEFAULT_SIZES = {"cpu": "1024,4096,16384", "cuda": "4096,16384,65536"}
DEFAULT_DTYPES = {"cpu": "float32", "cuda": "bfloat16"}
DEFAULT_MAX_DENSE_N = {"cpu": 16384, "cuda": 65536}
RESULT_MARK = "SWEEP_RESULT "
# Timings of short calls batch calls up to this long (launch overheads average out).
MIN_SECONDS = 0.02


def _measure_implementation(task):
    impl = by_name(task["impl"])
    n, d, device = task["n"], task["d"], task["device"]
    reason = skip_reason(impl, n, d, device)
    if reason:
        return {"status": f"skipped: {reason}"}
    features, labels = make_inputs(n, d, getattr(torch, task["dtype"]), device,
                                   num_classes=task["classes"])
    forward = make_step(impl.loss, features, labels, task["temperature"], backward=False)
    train = make_step(impl.loss, features, labels, task["temperature"], backward=True)
    train()
    with PeakMemory(device) as forward_memory:
        forward()
    with PeakMemory(device) as train_memory:
        loss = train()
    timing = dict(warmup=task["warmup"], repeats=task["repeats"], min_seconds=MIN_SECONDS,
                  max_seconds=task["max_seconds"])
    return {"status": "ok", "loss": float(loss),
            "fwd_ms": median_seconds(forward, device, **timing) * 1e3,
            "fwd_bwd_ms": median_seconds(train, device, **timing) * 1e3,
            "fwd_peak_mb": forward_memory.peak_bytes / 2**20,
            "peak_mb": train_memory.peak_bytes / 2**20}


def _run_task(task):
    """One configuration, measured in this process; returns a JSON-able dict."""
    if task["kind"] == "machine":
        return machine_description(task["device"])
    if task["kind"] == "floor":
        floor = measure_floor(task["n"], task["d"], getattr(torch, task["dtype"]), task["device"])
        return {f"{key}_ms": seconds * 1e3 for key, seconds in floor.items()}
    try:
        return _measure_implementation(task)
    except torch.cuda.OutOfMemoryError:
        return {"status": "out of memory"}
    except Exception as error:  # one failing configuration must not end the sweep
        traceback.print_exc()
        return {"status": f"error: {type(error).__name__}: {error}".splitlines()[0][:200]}


def _run_isolated(task, timeout):
    try:
        done = subprocess.run([sys.executable, "-m", "bench.sweep", "--worker", json.dumps(task)],
                              cwd=report.REPO_ROOT, stdout=subprocess.PIPE, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    return {"status": f"crashed (exit code {done.returncode})"}


def _ratios(rows):
    """time / dense, memory / dense and time / floor for every measured row."""
    dense = {(r["n"], r["d"], r["dtype"]): r for r in rows
             if r["implementation"] == "dense" and r["status"] == "ok"}
    for r in rows:
        if r["status"] != "ok":
            continue
        ref = dense.get((r["n"], r["d"], r["dtype"]))
        if ref:
            r["time_vs_dense"] = r["fwd_bwd_ms"] / ref["fwd_bwd_ms"]
            r["memory_vs_dense"] = (r["peak_mb"] / ref["peak_mb"]) if ref["peak_mb"] else None
        if r.get("plain_floor_ms"):
            r["vs_plain_floor"] = r["fwd_bwd_ms"] / r["plain_floor_ms"]
            r["vs_symmetric_floor"] = r["fwd_bwd_ms"] / r["symmetric_floor_ms"]


def _describe(row):
    if row["status"] != "ok":
        return row["status"]
    return (f"fwd {row['fwd_ms']:.2f} ms, fwd+bwd {row['fwd_bwd_ms']:.2f} ms, "
            f"peak {row['peak_mb']:.1f} MB, loss {row['loss']:.5f}")


def _parse(argv):
    parser = cli.benchmark_parser(
        __doc__, device=cli.default_device(), sizes=None, dims="128", dtypes=None, repeats=5,
        warmup=0, max_seconds=60.0,
        helps={"sizes": "N values, comma-separated (default: 1024,4096,16384 CPU, "
                        "4096,16384,65536 CUDA)",
               "dtypes": "comma-separated (default: float32 CPU, bfloat16 CUDA)",
               "warmup": "extra warm-up calls before timing (three calls already precede it; "
                         "default %(default)s)"})
    parser.add_argument("--impls", default=",".join(i.name for i in implementations()),
                        help="implementations, e.g. scl_kernels,scl_kernels[reference],dense,"
                             "chunked,pml (scl_kernels = backend auto)")
    parser.add_argument("--max-dense-n", type=int,
                        help="largest N for dense PyTorch implementations (default 16384 CPU, "
                             "65536 CUDA)")
    parser.add_argument("--classes", type=int, default=NUM_CLASSES)
    parser.add_argument("--temperature", type=float, default=TEMPERATURE)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor measurement")
    parser.add_argument("--in-process", action="store_true",
                        help="no subprocess per configuration: quicker, but allocator state "
                             "carries over and a crash ends the sweep")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _floor(run, n, d, dtype, device):
    measured = run({"kind": "floor", "n": n, "d": d, "dtype": dtype, "device": device})
    if "plain_floor_ms" not in measured:
        print(f"floor N={n} D={d} {dtype}: {measured.get('status')}", flush=True)
        return {}
    print(f"floor N={n} D={d} {dtype}: plain {measured['plain_floor_ms']:.2f} ms, "
          f"symmetric {measured['symmetric_floor_ms']:.2f} ms", flush=True)
    return measured


def _row(run, args, impl, n, d, dtype, max_dense_n):
    row = {"implementation": impl.name, "backend": impl.resolved_backend(args.device),
           "device": torch.device(args.device).type, "n": n, "d": d, "dtype": dtype}
    if impl.is_dense(args.device) and n > max_dense_n:
        row["status"] = f"skipped: N > --max-dense-n {max_dense_n}"
        return row
    row.update(run({"kind": "implementation", "impl": impl.name, "n": n, "d": d, "dtype": dtype,
                    "device": args.device, "classes": args.classes,
                    "temperature": args.temperature, "warmup": args.warmup,
                    "repeats": args.repeats, "max_seconds": args.max_seconds}))
    return row


def main(argv=None):
    args = _parse(argv)
    if args.worker:
        print(RESULT_MARK + json.dumps(_run_task(json.loads(args.worker))), flush=True)
        return

    kind = torch.device(args.device).type
    sizes = args.sizes or cli.int_list(DEFAULT_SIZES[kind])
    dims = args.dims
    dtypes = args.dtypes or [DEFAULT_DTYPES[kind]]
    impls = [by_name(name) for name in args.impls.split(",")]
    require_fused(impls, args.device, "python -m bench.sweep")
    max_dense_n = args.max_dense_n or DEFAULT_MAX_DENSE_N[kind]

    def run(task):
        return _run_task(task) if args.in_process else _run_isolated(task, args.timeout)

    stamp = report.timestamp()
    base = report.result_stem(args.out, f"supcon_sweep_{kind}_{stamp}")
    title = f"SupCon loss sweep, {kind}, {stamp}"
    machine = run({"kind": "machine", "device": args.device})
    print("\n".join(f"{label}: {text}" for label, text in machine.items()), flush=True)
    settings = {
        "command": report.command_line("bench.sweep", argv),
        "problem": f"single set [N, D] (contrast_mode all), labels uniform over {args.classes} "
                   f"classes, temperature {args.temperature}, features require grad",
    }
    memory_method = ("max_memory_allocated" if kind == "cuda" else
                     "peak RSS, one fresh process per configuration; small sizes include "
                     "allocator slack")
    notes = [f"Times: median of up to {args.repeats} timings after warm-up, in ms. Peak MB: "
             f"memory a call adds above its inputs ({memory_method}). time / dense and "
             "memory / dense: this row's forward+backward over the dense baseline's at the same "
             "N, D and dtype."]

    rows = []
    total = len(sizes) * len(dims) * len(dtypes) * len(impls)
    try:
        for d, dtype, n in itertools.product(dims, dtypes, sizes):
            floor = {} if args.no_floor else _floor(run, n, d, dtype, args.device)
            for impl in impls:
                print(f"[{len(rows) + 1}/{total}] {impl.name} N={n} D={d} {dtype} ...", end=" ",
                      flush=True)
                started = time.perf_counter()
                rows.append({**_row(run, args, impl, n, d, dtype, max_dense_n), **floor})
                print(f"{_describe(rows[-1])} ({time.perf_counter() - started:.1f} s)", flush=True)
                _ratios(rows)
                # partial results survive an interrupt
                report.write_csv(base + ".csv", rows, sweep_report.FIELDS)
    finally:
        if rows:
            _ratios(rows)
            report.write_csv(base + ".csv", rows, sweep_report.FIELDS)
            sweep_report.write_markdown(base + ".md", rows, title=title, machine=machine,
                                        settings=settings, notes=notes)
            sweep_report.write_plot(base + ".png", rows, title=title)
            print(f"wrote {base}.csv, .md, .png", flush=True)
    if rows:
        with open(base + ".md") as markdown:
            print("\n" + markdown.read())


if __name__ == "__main__":
    main()
