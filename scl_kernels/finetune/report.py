"""The results of a CE vs CE+SCL comparison: mean ± sd over seeds, paired differences per seed,
a markdown table and the JSON metrics file."""
import json
import math
import statistics
from pathlib import Path

METRICS = (("accuracy", "accuracy"), ("macro_f1", "macro-F1"))
BASELINE = "CE"
CONTRASTIVE = "CE+SCL"


def arm_name(lam):
    """``"CE"`` for ``lam == 0``, ``"CE+SCL"`` otherwise."""
    return BASELINE if lam == 0 else CONTRASTIVE


def _mean_sd(values):
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else None
    return mean, sd


def summarize(runs):
    """Aggregates runs over seeds.

    Args:
        runs: dicts with ``arm`` (``"CE"`` or ``"CE+SCL"``), ``lam``, ``seed``, ``accuracy``,
            ``macro_f1`` (fractions).

    Returns:
        A dict: ``arms``, one entry per arm in order of appearance with ``name``, ``lam``,
        ``seeds``, and ``<metric>_mean`` / ``<metric>_sd`` (sample sd, None for one seed); and
        ``paired`` (None unless both arms ran on a common seed): ``seeds``, ``<metric>_diff``
        (CE+SCL minus CE, per seed), ``<metric>_diff_mean`` / ``_sd``, and
        ``<metric>_wins`` (the seeds where CE+SCL scored higher).
    """
    by_arm = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
    arms = []
    for name, arm_runs in by_arm.items():
        entry = {"name": name, "lam": arm_runs[0]["lam"], "seeds": [r["seed"] for r in arm_runs]}
        for key, _ in METRICS:
            entry[f"{key}_mean"], entry[f"{key}_sd"] = _mean_sd([r[key] for r in arm_runs])
        arms.append(entry)
    paired = None
    baseline = {r["seed"]: r for r in by_arm.get(BASELINE, [])}
    contrastive = {r["seed"]: r for r in by_arm.get(CONTRASTIVE, [])}
    seeds = [s for s in contrastive if s in baseline]
    if seeds:
        paired = {"seeds": seeds}
        for key, _ in METRICS:
            diffs = [contrastive[s][key] - baseline[s][key] for s in seeds]
            paired[f"{key}_diff"] = diffs
            paired[f"{key}_diff_mean"], paired[f"{key}_diff_sd"] = _mean_sd(diffs)
            paired[f"{key}_wins"] = sum(d > 0 for d in diffs)
    return {"arms": arms, "paired": paired}


def _percent(mean, sd):
    text = f"{100 * mean:.1f}"
    return text if sd is None or math.isnan(sd) else f"{text} ± {100 * sd:.1f}"


def format_table(summary, *, temperature=None, runs=()):
    """The summary as markdown: one row per arm and the paired difference, then (given
    ``runs``) one row per seed."""
    lines = ["| run | " + " | ".join(f"{label} (%)" for _, label in METRICS) + " | seeds |",
             "|---|" + "---|" * len(METRICS) + "---|"]
    for arm in summary["arms"]:
        if arm["lam"] == 0:
            title = f"{arm['name']} (λ=0)"
        else:
            tau = f", τ={temperature:g}" if temperature is not None else ""
            title = f"{arm['name']} (λ={arm['lam']:g}{tau})"
        cells = [_percent(arm[f"{k}_mean"], arm[f"{k}_sd"]) for k, _ in METRICS]
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {len(arm['seeds'])} |")
    paired = summary["paired"]
    if paired:
        cells = [_percent(paired[f"{k}_diff_mean"], paired[f"{k}_diff_sd"]) for k, _ in METRICS]
        lines.append(f"| paired Δ ({CONTRASTIVE} − {BASELINE}) | " + " | ".join(cells)
                     + f" | {len(paired['seeds'])} |")
    if paired and runs:
        by_key = {(r["arm"], r["seed"]): r for r in runs}
        lines += ["", "| seed | " + " | ".join(
            f"{BASELINE} {label} | {CONTRASTIVE} {label} | Δ {label}" for _, label in METRICS) + " |",
                  "|---|" + "---|---|---|" * len(METRICS)]
        for seed in paired["seeds"]:
            cells = []
            for key, _ in METRICS:
                a, b = by_key[(BASELINE, seed)][key], by_key[(CONTRASTIVE, seed)][key]
                cells += [f"{100 * a:.1f}", f"{100 * b:.1f}", f"{100 * (b - a):+.1f}"]
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    if paired:
        n = len(paired["seeds"])
        lines += ["", f"{CONTRASTIVE} scored higher than {BASELINE} on "
                  + ", ".join(f"{paired[f'{k}_wins']} of {n} seeds ({label})" for k, label in METRICS)
                  + "."]
    return "\n".join(lines)


def write_metrics(output_dir, payload, name="metrics.json"):
    """Writes ``payload`` as indented JSON to ``output_dir / name`` (creating the directory);
    returns the path."""
    path = Path(output_dir)
    path.mkdir(parents=True, exist_ok=True)
    path = path / name
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
