"""Known false negatives' cost on the CPU: fused forward + backward with groups= against SupCon
without groups on the same batch, beside the dense PyTorch form of the same loss.

    python -m bench.groups                                      # N = 16,384, D = 128
    python -m bench.groups --sizes 2048 --repeats 3             # quick
    python -m bench.groups --temperatures 0.1,0.01              # both schedules

The groups mask pairs inside the tiles (docs/MATH.md section 11): the expected cost is a pass of
two integer compares per pair of a group-holding row, against the tile's D multiply-adds per pair
(bench/decisions/2026-12-02-multi-label-pairs-plan.md). Per (N, D, t, group size): one batch
(float32, labels uniform over 100 classes, group ids row // size), one warm-up call per variant,
then --repeats rounds in which each variant is timed once, alternating, so that a busy machine
slows all alike; medians over the rounds. t = 0.1 takes the symmetric schedule, t = 0.01 the
plain one. The dense peer (backend="reference", the whole N x N logit matrix) runs up to
--dense-max rows. Writes groups_cpu_<date>_<time>.{md,csv} to --out (bench/results/local/ by
default).
"""
import statistics

import torch

import scl_kernels

from .harness import cli
from .harness.sweep import run_sweep
from .harness.timing import make_step, median_seconds
from .implementations import make_inputs

FIELDS = ("n", "d", "temperature", "group_size", "supcon_ms", "groups_ms", "ratio", "dense_ms")


def _step(features, labels, temperature, backend, group_size):
    groups = None if group_size is None else torch.arange(features.shape[0]) // group_size
    return make_step(lambda f, y, t: scl_kernels.supcon_loss(f, y, t, groups=groups,
                                                              backend=backend),
                     features, labels, temperature, backward=True)


def measure(n, d, temperature, group_sizes, repeats, dense_max):
    features, labels = make_inputs(n, d, torch.float32, "cpu", num_classes=100)
    variants = {size: _step(features, labels, temperature, "cpu", size)
                for size in (None, *group_sizes)}
    for step in variants.values():
        step()  # warm-up
    rounds = {size: [] for size in variants}
    for _ in range(repeats):
        for size, step in variants.items():
            rounds[size].append(median_seconds(step, "cpu", warmup=0, repeats=1))
    baseline = statistics.median(rounds[None])
    rows = []
    for size in group_sizes:
        seconds = statistics.median(rounds[size])
        dense = None
        if n <= dense_max:
            dense = median_seconds(_step(features, labels, temperature, "reference", size), "cpu",
                                   warmup=1, repeats=repeats) * 1e3
        rows.append({"n": n, "d": d, "temperature": temperature, "group_size": size,
                     "supcon_ms": baseline * 1e3, "groups_ms": seconds * 1e3,
                     "ratio": seconds / baseline, "dense_ms": dense})
    return rows


def parse_args(argv):
    parser = cli.benchmark_parser(__doc__, sizes="16384", dims="128", repeats=5, threads=None,
                                  temperatures="0.1", dense_max=4096)
    parser.add_argument("--group-sizes", type=cli.int_list, default="2,4,64",
                        help="rows per group, ids row // size (default %(default)s)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    run_sweep(
        args, argv, "bench.groups", "groups_cpu", "Known false negatives (groups=) on the CPU",
        "Forward + backward, ms (median of alternating rounds); ratio: with groups / without, on "
        "the same batch; dense: backend='reference' with the same groups.", FIELDS,
        ("N", "D", "t", "group size", "SupCon ms", "groups ms", "groups / SupCon", "dense ms"),
        lambda: (row for n in args.sizes for d in args.dims for temperature in args.temperatures
                 for row in measure(n, d, temperature, args.group_sizes, args.repeats,
                                    args.dense_max)))

if __name__ == "__main__":
    main()
