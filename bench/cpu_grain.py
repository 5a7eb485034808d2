"""Where a second thread starts to pay for the fused CPU op: fwd+bwd on one thread against
torch's thread count, by tile work N * N * D, to choose the op's grain (kSerialWork in
csrc/core/call_plan.cpp; bench/decisions/2026-11-28-cpu-grain.md).

    python -m bench.cpu_grain                        # the default ladder, waiting for quiet spells
    SCL_KERNELS_LIBRARY=old/_C.so python -m bench.cpu_grain --sizes 64,256 --dims 16,768

Below the grain the op keeps a call on the calling thread whatever the thread count, so both
columns time the same path there: measure the grain with a library without one (or one built
with a grain of 0). One process; per (N, D) the two thread counts alternate in rotated rounds
(bench.harness.timing.interleaved_seconds), rounds disturbed by other processes dropped.
"""
import statistics

import torch

from .harness import cli, report
from .harness.machine import load_average, machine_description
from .harness.timing import interleaved_seconds, make_step
from .implementations import TEMPERATURE, by_name, make_inputs
from .small_batch import FUSED, num_classes

DEFAULT_SIZES = "32,64,128,181,256,362,512,1024"
DEFAULT_DIMS = "16,128,768"


def measure(n, d, threads, args):
    """{threads: median seconds of a fwd+bwd} and the load average after the rounds."""
    features, labels = make_inputs(n, d, torch.float32, "cpu", num_classes=num_classes(n))
    step = make_step(by_name(FUSED).loss, features, labels, TEMPERATURE, backward=True)

    def on(count):
        def run():
            torch.set_num_threads(count)
            return step()
        return run

    times, _, info = interleaved_seconds(
        {count: on(count) for count in (1, threads)}, "cpu", warmup=args.warmup,
        rounds=args.rounds, min_seconds=0.02, max_seconds=args.max_seconds,
        quiet_threshold=args.quiet_threshold or None, max_wait=args.wait_quiet)
    torch.set_num_threads(threads)
    return {count: statistics.median(t) for count, t in times.items()}, info, load_average()


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, writes_files=False, sizes=DEFAULT_SIZES,
                                  dims=DEFAULT_DIMS, warmup=2, max_seconds=10.0,
                                  quiet_threshold=0.2, wait_quiet=60.0)
    parser.add_argument("--rounds", type=cli.positive_int, default=20,
                        help="rounds per (N, D) (default %(default)s)")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    for key, value in machine_description("cpu").items():
        print(f"{key}: {value}")
    rows = []
    for d in args.dims:
        for n in args.sizes:
            medians, info, load = measure(n, d, threads, args)
            one, many = medians[1] * 1e3, medians[threads] * 1e3
            rows.append((n, d, f"{n * n * d:,}", f"{one:.3f}", f"{many:.3f}", f"{many / one:.2f}",
                         info["dropped"], report.fmt(info["others"]), load))
            print(f"N={n} D={d}: 1 thread {one:.3f} ms, {threads} threads {many:.3f} ms",
                  flush=True)
    print()
    print(report.markdown_table(
        ("N", "D", "N*N*D", "1 thread ms", f"{threads} threads ms", f"{threads} / 1",
         "dropped rounds", "others busy", "load average"), rows))


if __name__ == "__main__":
    main()
