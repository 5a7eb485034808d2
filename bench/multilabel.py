"""Multi-label positives and known false negatives on the CPU, in one run: fused forward +
backward with multi-hot labels (both rules, C = 64 and 1,000) and with groups=, against
single-label SupCon on the same rows, beside dense PyTorch multi-label SupCon.

    python -m bench.multilabel                                  # N = 16,384, D = 128
    python -m bench.multilabel --sizes 2048 --repeats 3         # quick

The bounds asked of it: multi-label at C = 64 at most 1.10x single-label time, C = 1,000 at
most 1.5x, groups at most 1.05x. Multi-hot rows hold 1 to 3 classes drawn uniformly (repeats
collapse), single-label rows the first of them; groups are ids row // 4. One batch (float32) per
(N, D, t); one warm-up call per variant, then --repeats rounds in which each variant is timed
once, alternating, so that a busy machine slows all alike; medians over the rounds. The dense
peer (backend="reference": the whole N x N logit and weight matrices) runs up to --dense-max
rows. Writes multilabel_cpu_<date>_<time>.{md,csv} to --out (bench/results/local/ by default).
"""
import statistics

import torch

import scl_kernels

from .harness import cli
from .harness.sweep import run_sweep
from .harness.timing import make_step, median_seconds

FIELDS = ("n", "d", "temperature", "case", "classes", "ms", "supcon_ms", "ratio", "bound",
          "dense_ms")

# (case, classes, multi_label rule or None, groups, the bound asked)
CASES = (("groups of 4", None, None, True, 1.05),
         ("any", 64, "any", False, 1.10),
         ("jaccard", 64, "jaccard", False, 1.10),
         ("any", 1000, "any", False, 1.5),
         ("jaccard", 1000, "jaccard", False, 1.5))


def multi_hot(n, classes, generator):
    """[n, classes] bool, 1 to 3 classes a row."""
    picks = torch.randint(0, classes, (n, 3), generator=generator)
    keep = torch.arange(3)[None, :] < torch.randint(1, 4, (n, 1), generator=generator)
    hot = torch.zeros(n, classes, dtype=torch.bool)
    hot[torch.arange(n)[:, None].expand(n, 3)[keep], picks[keep]] = True
    return hot


def _step(features, labels, temperature, backend, rule=None, groups=None):
    return make_step(lambda f, y, t: scl_kernels.supcon_loss(
        f, y, t, groups=groups, multi_label=rule or "any", backend=backend),
        features, labels, temperature, backward=True)


def measure(n, d, temperature, repeats, dense_max):
    generator = torch.Generator().manual_seed(n * 131 + d)
    features = torch.randn(n, d, generator=generator).requires_grad_(True)
    hot = {classes: multi_hot(n, classes, generator) for classes in (64, 1000)}
    single = hot[64].float().argmax(1)
    groups = torch.arange(n) // 4
    variants = {"supcon": _step(features, single, temperature, "cpu")}
    inputs = {}
    for case, classes, rule, grouped, _ in CASES:
        labels = single if classes is None else hot[classes]
        case_groups = groups if grouped else None
        inputs[(case, classes)] = (labels, rule, case_groups)
        variants[(case, classes)] = _step(features, labels, temperature, "cpu", rule,
                                          case_groups)
    for step in variants.values():
        step()  # warm-up
    rounds = {key: [] for key in variants}
    for _ in range(repeats):
        for key, step in variants.items():
            rounds[key].append(median_seconds(step, "cpu", warmup=0, repeats=1))
    baseline = statistics.median(rounds["supcon"])
    rows = []
    for case, classes, rule, grouped, bound in CASES:
        seconds = statistics.median(rounds[(case, classes)])
        dense = None
        if n <= dense_max:
            labels, rule, case_groups = inputs[(case, classes)]
            dense = median_seconds(_step(features, labels, temperature, "reference", rule,
                                         case_groups), "cpu", warmup=1, repeats=repeats) * 1e3
        rows.append({"n": n, "d": d, "temperature": temperature, "case": case,
                     "classes": classes, "ms": seconds * 1e3, "supcon_ms": baseline * 1e3,
                     "ratio": seconds / baseline, "bound": bound, "dense_ms": dense})
    return rows


def parse_args(argv):
    parser = cli.benchmark_parser(__doc__, sizes="16384", dims="128", repeats=9, threads=None,
                                  temperatures="0.1", dense_max=4096)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    run_sweep(
        args, argv, "bench.multilabel", "multilabel_cpu",
        "Multi-label positives and known false negatives on the CPU",
        "Forward + backward, ms (median of alternating rounds); ratio: the case / single-label "
        "SupCon on the same rows; bound: the one asked; dense: backend='reference' on the same "
        "call.", FIELDS,
        ("N", "D", "t", "case", "C", "ms", "SupCon ms", "ratio", "bound", "dense ms"),
        lambda: (row for n in args.sizes for d in args.dims for temperature in args.temperatures
                 for row in measure(n, d, temperature, args.repeats, args.dense_max)))

if __name__ == "__main__":
    main()
