"""The results of a comparison of objectives: mean ± sd over seeds, paired differences per seed
against the first objective, a markdown table and the JSON metrics file."""
import json
import math
import os
import statistics
from pathlib import Path

from .calibration import ECE_BINS

# (key, label, whether higher is better)
METRICS = (("accuracy", "accuracy", True), ("macro_f1", "macro-F1", True), ("ece", "ECE", False))
# Under every table: a reader meets the ECE column here, not in the docs.
ECE_EXPLAINED = (f"ECE: expected calibration error, how far the model's confidence is from its "
                 f"accuracy: the test predictions in {ECE_BINS} equal-width bins of their largest "
                 "softmax probability, the bins' |accuracy − mean confidence| weighted by their "
                 "share of the predictions (lower is better).")


def _mean_sd(values):
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else None
    return mean, sd


def summarize(runs):
    """Aggregates runs over seeds.

    Args:
        runs: dicts with ``arm`` (the objective's name in the results, e.g. ``"CE+SCL"``),
            ``title`` (the arm with its settings), ``seed`` and the metrics ``accuracy``,
            ``macro_f1``, ``ece`` (fractions).

    Returns:
        A dict: ``arms``, one entry per arm in order of appearance with ``name``, ``title``,
        ``seeds``, and ``<metric>_mean`` / ``<metric>_sd`` (sample sd, None for one seed); and
        ``paired``, one entry per later arm that shares a seed with the first (the baseline),
        or None when there is none: ``arm``, ``baseline``, ``seeds``, ``<metric>_diff`` (arm
        minus baseline, per seed), ``<metric>_diff_mean`` / ``_sd``, and ``<metric>_wins`` (the
        seeds where the arm did better: higher accuracy and macro-F1, lower ECE).
    """
    by_arm = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
    arms = []
    for name, arm_runs in by_arm.items():
        entry = {"name": name, "title": arm_runs[0]["title"], "seeds": [r["seed"] for r in arm_runs]}
        for key, _, _ in METRICS:
            entry[f"{key}_mean"], entry[f"{key}_sd"] = _mean_sd([r[key] for r in arm_runs])
        arms.append(entry)
    names = list(by_arm)
    paired = []
    if names:
        baseline = {r["seed"]: r for r in by_arm[names[0]]}
        for name in names[1:]:
            arm = {r["seed"]: r for r in by_arm[name]}
            seeds = [s for s in arm if s in baseline]
            if not seeds:
                continue
            entry = {"arm": name, "baseline": names[0], "seeds": seeds}
            for key, _, higher in METRICS:
                diffs = [arm[s][key] - baseline[s][key] for s in seeds]
                entry[f"{key}_diff"] = diffs
                entry[f"{key}_diff_mean"], entry[f"{key}_diff_sd"] = _mean_sd(diffs)
                entry[f"{key}_wins"] = sum((d > 0) if higher else (d < 0) for d in diffs)
            paired.append(entry)
    return {"arms": arms, "paired": paired or None}


def _percent(mean, sd, signed=False):
    text = f"{100 * mean:+.1f}" if signed else f"{100 * mean:.1f}"
    return text if sd is None or math.isnan(sd) else f"{text} ± {100 * sd:.1f}"


def _wins_sentence(entry):
    n = len(entry["seeds"])
    better = [f"{entry[f'{key}_wins']} of {n} seeds ({label})" for key, label, higher in METRICS if higher]
    lower = [f"{entry[f'{key}_wins']} of {n} seeds" for key, _, higher in METRICS if not higher]
    return (f"{entry['arm']} scored higher than {entry['baseline']} on " + ", ".join(better)
            + "".join(f"; its ECE was lower on {text}" for text in lower) + ".")


def format_table(summary, *, runs=()):
    """The summary as markdown: one row per arm and one per paired difference with the first
    arm, a line saying what ECE is, then (given ``runs``) one row per seed."""
    lines = ["| run | " + " | ".join(f"{label} (%)" for _, label, _ in METRICS) + " | seeds |",
             "|---|" + "---|" * len(METRICS) + "---|"]
    for arm in summary["arms"]:
        cells = [_percent(arm[f"{k}_mean"], arm[f"{k}_sd"]) for k, _, _ in METRICS]
        lines.append(f"| {arm['title']} | " + " | ".join(cells) + f" | {len(arm['seeds'])} |")
    paired = summary["paired"] or []
    for entry in paired:
        cells = [_percent(entry[f"{k}_diff_mean"], entry[f"{k}_diff_sd"], signed=True)
                 for k, _, _ in METRICS]
        lines.append(f"| paired Δ ({entry['arm']} − {entry['baseline']}) | " + " | ".join(cells)
                     + f" | {len(entry['seeds'])} |")
    lines += ["", ECE_EXPLAINED]
    if paired and runs:
        baseline = paired[0]["baseline"]
        others = [entry["arm"] for entry in paired]
        seeds = [s for s in paired[0]["seeds"] if all(s in e["seeds"] for e in paired)]
        header = []
        for _, label, _ in METRICS:
            header += [f"{arm} {label}" for arm in (baseline, *others)]
            header += [f"Δ {arm} {label}" if len(others) > 1 else f"Δ {label}" for arm in others]
        lines += ["", "| seed | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
        by_key = {(r["arm"], r["seed"]): r for r in runs}
        for seed in seeds:
            cells = []
            for key, _, _ in METRICS:
                base = by_key[(baseline, seed)][key]
                values = [by_key[(arm, seed)][key] for arm in others]
                cells += [f"{100 * v:.1f}" for v in (base, *values)]
                cells += [f"{100 * (v - base):+.1f}" for v in values]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    if paired:
        lines += [""] + [_wins_sentence(entry) for entry in paired]
    return "\n".join(lines)


def write_text(path, text):
    """Writes ``text`` to ``path`` atomically (a temporary file in the same directory, then a
    rename): a reader, or a crash, never sees half a file. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
    return path


def write_metrics(output_dir, payload, name="metrics.json"):
    """Writes ``payload`` as indented JSON to ``output_dir / name`` (atomically, creating the
    directory); returns the path."""
    return write_text(Path(output_dir) / name,
                      json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
