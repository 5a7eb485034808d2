"""The focal contrastive loss's cost on the CPU: fused forward + backward with focal_gamma against
SupCon (focal_gamma = 0) on the same batch, for a few numbers of classes.

    python -m bench.focal                                        # N = 16,384, D = 128, C = 2, 10, 1000
    python -m bench.focal --sizes 2048 --classes 2 --repeats 1   # quick
    python -m bench.focal --threads 1                            # one torch thread

The focal loss adds a walk over the positive pairs, about N^2 / C of them (docs/MATH.md,
section 9), so its extra cost falls with the number of classes C. Per (N, D, C, gamma): one
batch (float32, labels uniform over C classes, temperature 0.1), one warm-up call, then the
median over --repeats timed calls of forward + backward with backend="cpu". Writes
focal_cpu_<date>_<time>.{md,csv} to --out (bench/results/local/ by default).
"""
import torch

import scl_kernels

from .harness import cli
from .harness.sweep import run_sweep
from .harness.timing import make_step, median_seconds
from .implementations import TEMPERATURE, make_inputs

FIELDS = ("n", "d", "classes", "walk_pairs", "supcon_ms", "focal_gamma", "focal_ms", "ratio")


def walk_pairs(labels):
    """Positive pairs the walk visits: sum over classes of count * (count - 1)."""
    counts = torch.bincount(labels)
    return int((counts * (counts - 1)).sum())


def measure(n, d, classes, gammas, repeats):
    features, labels = make_inputs(n, d, torch.float32, "cpu", num_classes=classes)
    times = {}
    for gamma in gammas:
        step = make_step(lambda f, y, t, g=gamma: scl_kernels.supcon_loss(
            f, y, t, focal_gamma=g, backend="cpu"), features, labels, TEMPERATURE, backward=True)
        times[gamma] = median_seconds(step, "cpu", warmup=1, repeats=repeats)
    baseline = times.get(0.0)
    return [{"n": n, "d": d, "classes": classes, "walk_pairs": walk_pairs(labels),
             "supcon_ms": None if baseline is None else baseline * 1e3, "focal_gamma": gamma,
             "focal_ms": seconds * 1e3,
             "ratio": None if baseline is None else seconds / baseline}
            for gamma, seconds in times.items() if gamma != 0.0]


def parse_args(argv):
    parser = cli.benchmark_parser(__doc__, sizes="16384", dims="128", repeats=3, threads=None)
    parser.add_argument("--classes", type=cli.int_list, default="2,10,1000",
                        help="numbers of classes, uniform labels (default %(default)s)")
    parser.add_argument("--gammas", default="0,2", type=cli.float_list,
                        help="focal_gamma values; 0 is the SupCon baseline (default %(default)s)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    gammas = sorted(set(args.gammas) | {0.0})
    run_sweep(
        args, argv, "bench.focal", "focal_cpu", "Focal contrastive loss on the CPU",
        "Forward + backward, ms (median); ratio: focal / SupCon on the same batch.", FIELDS,
        ("N", "D", "classes", "walk pairs", "SupCon ms", "gamma", "focal ms", "focal / SupCon"),
        lambda: (row for n in args.sizes for d in args.dims for classes in args.classes
                 for row in measure(n, d, classes, gammas, args.repeats)))

if __name__ == "__main__":
    main()
