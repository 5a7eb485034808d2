"""Small fine-tuning batches on the CPU: the fused op against dense PyTorch SupCon, in one process.

    python -m bench.small_batch                                   # N = 16 .. 2048, D = 128, 768, 1024
    python -m bench.small_batch --sizes 16,256 --dims 128 --rounds 50
    python -m bench.small_batch --sizes 16 --dims 128 --rounds 5 --retries 0 --wait-quiet 0   # quick
    python -m bench.small_batch --sizes 16,64,256,1024 --dims 16,768 --load spin   # beside a load

At small N the fused op's fixed cost (argument checks, ATen glue, autograd plumbing) decides, not
its N^2 tiles, so this benchmark times short calls many times over instead of one fresh process
per size (bench/sweep.py): per (N, D) it builds one batch, warms every implementation up, then
runs rounds in which each implementation's forward and forward+backward are timed once, in an
order rotated every round (bench.harness.timing.interleaved_seconds), so that the drift of a
shared machine hits them alike. Reported: the median over rounds of each timing, and fused /
dense per round (median, p25 and p75). Labels are uniform over min(100, max(2, N // 4)) classes,
so that small batches have positives; temperature 0.1; torch's default thread count unless
--threads. --load NAME runs one of bench.cpu_load's recipes for the whole run; its rounds all
count (the load is the point). Every row records the load average after it.

Writes small_batch_cpu_<date>_<time>.{md,csv} to --out (bench/results/local/ by default).
"""
import statistics
import time

import torch

from .harness import cli, report
from .harness.machine import load_average, machine_description
from .harness.timing import interleaved_seconds, make_step
from .implementations import TEMPERATURE, by_name, make_inputs, require_fused
from . import cpu_load

DEFAULT_SIZES = "16,32,64,128,256,512,1024,2048"
DEFAULT_DIMS = "128,768,1024"
# fused = the C++ op (not "auto", so that it stays the CPU kernel whatever is installed);
# dense = SupContrast-style PyTorch (bench/baselines.py); reference = supcon_loss's dense backend.
DEFAULT_IMPLS = "scl_kernels[cpu],dense,scl_kernels[reference]"
FUSED, DENSE = "scl_kernels[cpu]", "dense"
MAX_CLASSES = 100
PASSES = ("fwd", "fwd_bwd")

FIELDS = ("n", "d", "classes", "threads", "load_average", "others_busy", "rounds", "dropped_rounds",
          "disturbed_rounds", "calls_per_timing_fused",
          "fused_fwd_bwd_ms", "dense_fwd_bwd_ms", "ratio_fwd_bwd", "ratio_fwd_bwd_p25",
          "ratio_fwd_bwd_p75", "reference_fwd_bwd_ms", "fused_fwd_ms", "dense_fwd_ms", "ratio_fwd",
          "reference_fwd_ms", "fused_fwd_bwd_min_ms", "dense_fwd_bwd_min_ms", "ratio_fwd_bwd_min",
          "fused_loss", "dense_loss", "reference_loss")
SHORT_NAMES = {FUSED: "fused", DENSE: "dense", "scl_kernels[reference]": "reference"}


def num_classes(n):
    return min(MAX_CLASSES, max(2, n // 4))


def _quantile(values, q):
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def measure_config(n, d, impl_names, *, rounds, min_seconds, max_seconds, warmup,
                   quiet_threshold, max_wait):
    """One (N, D): {(short name, pass): [seconds per call, one per round]}, the loss of each
    implementation, {(short name, pass): calls per timing} and interleaved_seconds' info."""
    features, labels = make_inputs(n, d, torch.float32, "cpu", num_classes=num_classes(n))
    fns, losses = {}, {}
    for name in impl_names:
        impl = by_name(name)
        short = SHORT_NAMES.get(name, name)
        for backward, tag in ((False, "fwd"), (True, "fwd_bwd")):
            fns[(short, tag)] = make_step(impl.loss, features, labels, TEMPERATURE,
                                          backward=backward)
        losses[short] = float(fns[(short, "fwd_bwd")]())
    times, calls, info = interleaved_seconds(
        fns, "cpu", warmup=warmup, rounds=rounds, min_seconds=min_seconds, max_seconds=max_seconds,
        quiet_threshold=quiet_threshold, max_wait=max_wait)
    return times, losses, calls, info


def summarise(n, d, times, losses, calls, info):
    row = {"n": n, "d": d, "classes": num_classes(n), "threads": torch.get_num_threads(),
           "load_average": load_average(), "others_busy": info["others"],
           "dropped_rounds": info["dropped"],
           "disturbed_rounds": info["disturbed"],
           "rounds": len(next(iter(times.values()))),
           "calls_per_timing_fused": calls.get(("fused", "fwd_bwd"))}
    for (short, tag), seconds in times.items():
        row[f"{short}_{tag}_ms"] = statistics.median(seconds) * 1e3
        if tag == "fwd_bwd":
            row[f"{short}_{tag}_min_ms"] = min(seconds) * 1e3
    for short, loss in losses.items():
        row[f"{short}_loss"] = loss
    for tag in PASSES:
        fused, dense = times.get(("fused", tag)), times.get(("dense", tag))
        if fused and dense:
            # Same round = same conditions: the per-round ratio is the fairest comparison.
            ratios = [f / g for f, g in zip(fused, dense)]
            row[f"ratio_{tag}"] = statistics.median(ratios)
            if tag == "fwd_bwd":
                row["ratio_fwd_bwd_min"] = min(fused) / min(dense)
                row["ratio_fwd_bwd_p25"] = _quantile(ratios, 0.25)
                row["ratio_fwd_bwd_p75"] = _quantile(ratios, 0.75)
    return row


def _ms(value):
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _ratio(row, key):
    value = row.get(key)
    return "—" if value is None else f"{value:.2f}"


def write_markdown(path, rows, *, title, machine, settings):
    parts = report.markdown_header(title, machine, settings)
    parts += ["", "Times in ms: median over rounds; every round times each implementation once, "
              "in a rotated order, all in one process. fused / dense: median over rounds of the "
              "per-round ratio (p25-p75 in brackets); below 1 the fused op is faster. best: "
              "fastest timing of each, the least disturbed by other processes. rounds: counted "
              "rounds (dropped: rounds during which other processes used >= the quiet threshold "
              "of the cores, timed again); others busy: median share of all cores other processes "
              "used during the counted rounds. fused = "
              "`supcon_loss(backend=\"cpu\")`, dense = `bench.baselines.dense_supcon` "
              "(SupContrast-style), reference = `supcon_loss(backend=\"reference\")`.", ""]
    parts.append(report.markdown_table(
        ("N", "D", "classes", "fused ms", "dense ms", "fused / dense", "best fused / dense",
         "reference ms", "fused fwd ms", "dense fwd ms", "fwd fused / dense", "reference fwd ms",
         "rounds (dropped)", "others busy", "load average"),
        [(r["n"], r["d"], r["classes"], _ms(r.get("fused_fwd_bwd_ms")),
          _ms(r.get("dense_fwd_bwd_ms")),
          f"{_ratio(r, 'ratio_fwd_bwd')} ({_ratio(r, 'ratio_fwd_bwd_p25')}-"
          f"{_ratio(r, 'ratio_fwd_bwd_p75')})" if r.get("ratio_fwd_bwd") else "—",
          _ratio(r, "ratio_fwd_bwd_min"), _ms(r.get("reference_fwd_bwd_ms")),
          _ms(r.get("fused_fwd_ms")), _ms(r.get("dense_fwd_ms")), _ratio(r, "ratio_fwd"),
          _ms(r.get("reference_fwd_ms")), f"{r['rounds']} ({r['dropped_rounds']})",
          _ratio(r, "others_busy"), r["load_average"])
         for r in rows]))
    slower = [r for r in rows if (r.get("ratio_fwd_bwd") or 0) > 1]
    parts += ["", f"Target (fused fwd+bwd no slower than dense at every N, D): "
              f"{'met' if not slower else 'not met'} in this run; fused slower at "
              f"{len(slower)} of {len(rows)} configurations"
              + (": " + ", ".join(f"N={r['n']} D={r['d']}" for r in slower) if slower else "")
              + "."]
    with open(path, "w") as out:
        out.write("\n".join(parts) + "\n")


def _parse(argv):
    parser = cli.benchmark_parser(
        __doc__, sizes=DEFAULT_SIZES, dims=DEFAULT_DIMS, warmup=3, max_seconds=30.0, threads=None,
        quiet_threshold=0.2, wait_quiet=120.0, retries=1,
        helps={"max_seconds": "stop the rounds of one (N, D) after this long, once 5 rounds "
                              "are in (default %(default)s)",
               "wait_quiet": "per N, D, wait at most this long in all for quiet spells after a "
                             "disturbed round (default %(default)s)"})
    parser.add_argument("--impls", default=DEFAULT_IMPLS,
                        help="implementations (bench.implementations.by_name); the ratio needs "
                             f"{FUSED} and {DENSE}")
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=cli.positive_int, default=40,
                        help="rounds per (N, D): timings of each implementation and pass "
                             "(default %(default)s)")
    parser.add_argument("--min-seconds", type=float, default=0.01,
                        help="each timing repeats a call until it lasts this long")
    parser.add_argument("--load", choices=cpu_load.RECIPES, default=None,
                        help="run this bench.cpu_load recipe beside the whole run; no round is "
                             "dropped then (--quiet-threshold 0, --retries 0)")
    return parser.parse_args(argv)


def main(argv=None):
    args = _parse(argv)
    if args.load:
        args.quiet_threshold, args.retries = 0.0, 0
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes, dims = args.sizes, args.dims
    impl_names = args.impls.split(",")
    require_fused([by_name(name) for name in impl_names], "cpu", "python -m bench.small_batch")

    stamp = report.timestamp()
    base = report.result_stem(args.out, f"small_batch_cpu_{stamp}")
    machine = machine_description("cpu")
    settings = {
        "command": report.command_line("bench.small_batch", argv),
        "problem": "float32, single set [N, D] (contrast_mode all), labels uniform over "
                   f"min({MAX_CLASSES}, max(2, N // 4)) classes, temperature {TEMPERATURE}, "
                   "features require grad",
        "timing": f"{args.warmup} warm-up calls each, then up to {args.rounds} rounds (at most "
                  f"{args.max_seconds:g} s of timing per N, D); one timing = back-to-back calls "
                  f"lasting >= {args.min_seconds * 1e3:g} ms; rounds count when other processes "
                  f"use < {args.quiet_threshold:g} of the cores (waiting up to "
                  f"{args.wait_quiet:g} s per N, D for quiet spells)",
    }
    if args.load:
        settings["load"] = (f"bench.cpu_load {args.load} during the whole run "
                            f"({cpu_load.describe(args.load)})")
    print("\n".join(f"{k}: {v}" for k, v in {**machine, **settings}.items()), flush=True)

    def measure(n, d):
        started = time.perf_counter()
        times, losses, calls, info = measure_config(
            n, d, impl_names, rounds=args.rounds, min_seconds=args.min_seconds,
            max_seconds=args.max_seconds, warmup=args.warmup,
            quiet_threshold=args.quiet_threshold or None, max_wait=args.wait_quiet)
        r = summarise(n, d, times, losses, calls, info)
        print(f"N={n:5d} D={d:5d}: fused {_ms(r.get('fused_fwd_bwd_ms'))} ms, dense "
              f"{_ms(r.get('dense_fwd_bwd_ms'))} ms, fused/dense {_ratio(r, 'ratio_fwd_bwd')}, "
              f"reference {_ms(r.get('reference_fwd_bwd_ms'))} ms; fwd fused "
              f"{_ms(r.get('fused_fwd_ms'))} dense {_ms(r.get('dense_fwd_ms'))} "
              f"({r['rounds']} rounds, {r['dropped_rounds']} dropped, "
              f"{r['disturbed_rounds']} disturbed kept, others busy "
              f"{_ratio(r, 'others_busy')}, {time.perf_counter() - started:.1f} s)", flush=True)
        return r

    rows = []
    try:
        with cpu_load.running(args.load):
            for d in dims:
                for n in sizes:
                    rows.append(measure(n, d))
                    # Partial results survive an interrupt.
                    report.write_csv(base + ".csv", rows, FIELDS)
        # Rows that had to keep disturbed rounds get one more chance, later (often quieter).
        for i, r in enumerate(rows):
            if r["disturbed_rounds"] and args.retries:
                print(f"again (disturbed rounds kept): N={r['n']} D={r['d']}", flush=True)
                again = measure(r["n"], r["d"])
                if again["disturbed_rounds"] < r["disturbed_rounds"]:
                    rows[i] = again
                report.write_csv(base + ".csv", rows, FIELDS)
    finally:
        if rows:
            machine["load average at end"] = load_average()
            report.write_csv(base + ".csv", rows, FIELDS)
            write_markdown(base + ".md", rows, title=f"SupCon small batches, CPU, {stamp}",
                           machine=machine, settings=settings)
            print(f"wrote {base}.md, .csv", flush=True)
    if rows:
        with open(base + ".md") as markdown:
            print("\n" + markdown.read())


if __name__ == "__main__":
    main()
