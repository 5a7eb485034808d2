"""Paired differences between few-shot comparisons run with other options of our command line:
each variant (a bench.fewshot output folder made with other --ours-args) against a baseline
folder, one method at one K, seed by seed. A seed fixes the training rows, so the pairs train on
the same rows; the rows' fingerprints are checked.

    python -m bench.fewshot_ablation --per-class 8 --method scl \\
        --baseline bench/results/fewshot_2026-11-26 \\
        --variant "classifier on the first token=bench/results/fewshot_2026-11-26/ablation_first_token" \\
        [--variant NAME=DIR ...] [--out FILE.md]

Prints (and with --out writes) a markdown table: per row, the folder's --ours-args, the seeds
both ran, accuracy and ECE (mean ± sd), seconds per run, and the paired difference from the
baseline with the number of seeds on which the variant's accuracy was higher.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.fewshot import METHODS, RESULTS_JSON, _finite, _mean_sd, _percent
from bench.harness.cli import positive_int


def _variant(text):
    name, separator, folder = text.rpartition("=")  # a name may hold "=" (γ=1)
    if not separator or not name.strip() or not folder.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name.strip(), folder.strip()


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m bench.fewshot_ablation",
                                     description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--baseline", required=True, metavar="DIR",
                        help="a bench.fewshot output folder")
    parser.add_argument("--variant", type=_variant, action="append", required=True,
                        metavar="NAME=DIR", help="a variant's name and folder (repeatable)")
    parser.add_argument("--per-class", type=positive_int, required=True, metavar="K")
    parser.add_argument("--method", default="scl", choices=sorted(METHODS),
                        help="the method compared (default %(default)s)")
    parser.add_argument("--out", metavar="FILE", help="also write the table here")
    return parser


def runs_of(folder, method, k):
    """{seed: run} of ``method`` at ``k`` in a bench.fewshot folder's results.json (finished
    runs only), and the folder's --ours-args."""
    path = Path(folder) / RESULTS_JSON
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: pass a bench.fewshot output folder")
    payload = json.loads(path.read_text(encoding="utf-8"))
    runs = {r["seed"]: r for r in payload["runs"] if r["method"] == method
            and r["per_class"] == k and _finite(r.get("accuracy"))}
    return runs, payload["config"]["ours_args"]


def _summary(values, signed=False):
    return _percent(*_mean_sd(values), signed=signed)


def ablation_table(baseline, variants, method, k):
    """The markdown table (a list of lines) of ``variants`` [(name, folder)] against
    ``baseline`` (a folder)."""
    base_runs, base_args = runs_of(baseline, method, k)
    if not base_runs:
        raise ValueError(f"{baseline} has no finished {method} run at K = {k}")
    lines = [f"{METHODS[method]} at K = {k} per class; paired Δ: the variant minus the baseline "
             "on the same seed (same training rows).", "",
             "| variant | our options | seeds | accuracy (%) | ECE (%) | seconds | Δ accuracy | "
             "Δ ECE | accuracy higher on |", "|---|---|---|---|---|---|---|---|---|"]

    def row(name, args, runs, paired):
        seeds = sorted(runs)
        seconds = statistics.fmean(runs[s]["seconds"] for s in seeds)
        cells = [name, f"`{args or '(defaults)'}`", str(len(seeds)),
                 *(_summary([runs[s][key] for s in seeds]) for key in ("accuracy", "ece")),
                 f"{seconds:.0f}"]
        if paired:
            wins = sum(runs[s]["accuracy"] > base_runs[s]["accuracy"] for s in seeds)
            cells += [_summary([runs[s][key] - base_runs[s][key] for s in seeds], signed=True)
                      for key in ("accuracy", "ece")] + [f"{wins} of {len(seeds)}"]
        else:
            cells += ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")

    row("baseline", base_args, base_runs, paired=False)
    for name, folder in variants:
        runs, args = runs_of(folder, method, k)
        shared = {seed: runs[seed] for seed in runs if seed in base_runs}
        if not shared:
            raise ValueError(f"{folder} shares no finished {method} seed at K = {k} with the "
                             "baseline")
        for seed, run in shared.items():
            if run.get("rows") != base_runs[seed].get("rows"):
                raise ValueError(f"{folder}: seed {seed} trained on other rows than the baseline "
                                 "(another data set or few-shot draw): not a paired comparison")
        row(name, args, shared, paired=True)
    return lines


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        lines = ablation_table(args.baseline, args.variant, args.method, args.per_class)
    except (OSError, ValueError) as error:
        print(f"bench.fewshot_ablation: error: {error}", file=sys.stderr)
        return 2
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
