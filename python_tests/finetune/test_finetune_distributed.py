"""The fine-tuning layer across processes: SupConCrossEntropyLoss(distributed=True) with the
gradient cache, under DistributedDataParallel, SupConTrainer in a 2-process gloo job (class
labels, and a multi-label model's multi-hot ones), and the command line under torchrun, each
against one process training on the global batch.

Two ranks are spawned once for the cases (``run_rank``); each case runs on both and records
None or its traceback, and one test per case reads the records. float64 cases agree to 1e-10;
the Trainer's and the command line's (float32 transformers) to fp32 rounding."""
import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from scl_kernels.grad_cache import GradientCache
from scl_kernels.nn import SupConCrossEntropyLoss
from support import needs
from support.spawned_ranks import assert_passed_on_every_rank, join_gloo_group, mean_over_ranks, run_cases, spawn_ranks
from support.tiny_models import BatchRows, label_token_batch

pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
    needs.library,
]

WORLD = 2
SPAWN_TIMEOUT_S = 240
F64 = dict(rtol=1e-10, atol=1e-10)
F32 = dict(rtol=1e-5, atol=1e-6)
CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


def _close(actual, expected, what, tolerance=F64):
    actual, expected = actual.detach().double(), expected.detach().double()
    if actual.shape != expected.shape or not torch.allclose(actual, expected, **tolerance):
        error = (actual - expected).abs().max().item() if actual.shape == expected.shape else None
        raise AssertionError(f"{what}: shapes {tuple(actual.shape)} / {tuple(expected.shape)}, "
                             f"largest difference {error}")


def _local(tensor, sizes, rank):
    start = sum(sizes[:rank])
    return tensor[start: start + sizes[rank]]


class Encoder(nn.Module):
    """(logits, embeddings) of a batch, as a classifier's forward gives them; a dict batch
    (``{"x": ...}``) like a tokenizer's."""

    def __init__(self, dim_in=6, dim=5, classes=3):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim_in, 16), nn.Tanh(), nn.Linear(16, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, batch):
        embeddings = self.body(batch["x"] if isinstance(batch, dict) else batch)
        return self.head(embeddings), embeddings


def _data(total, seed):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(total, 6, dtype=torch.float64, generator=generator),
            torch.randint(0, 3, (total,), generator=generator))


def _grads(model):
    """The parameters' gradients, 0 for a parameter the loss does not use (the head at lam 1)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


# ------------------------------------------------------------------------------------------
# The cases (run on every rank)
# ------------------------------------------------------------------------------------------

@case
def gradient_cache_matches_uncached_and_one_process(rank, world):
    """A cached 2-rank step gives each rank the gradients of an uncached 2-rank step, and their
    average (DDP's) is the single-process gradient of the global batch's objective."""
    layouts = [([6, 6], 0.7, "mean"),   # equal batches: CE + SCL exact
               ([7, 4], 1.0, "sum"),    # unequal batches: SCL alone is exact for any sizes
               ([9, 0], 1.0, "mean")]   # a rank without examples still takes part
    for strategy in ("gather", "ring"):
        for sizes, lam, reduction in layouts:
            what = f"{strategy}, sizes {sizes}, lam {lam}, {reduction}"
            inputs, labels = _data(sum(sizes), seed=len(what))
            torch.manual_seed(0)
            initial = Encoder().double()
            single = copy.deepcopy(initial)
            reference = SupConCrossEntropyLoss(lam, 0.3, scl_reduction=reduction)
            want_loss = reference(*single(inputs), labels)
            want_loss.backward()

            criterion = SupConCrossEntropyLoss(lam, 0.3, scl_reduction=reduction,
                                               distributed=True, strategy=strategy)
            x, y = _local(inputs, sizes, rank), _local(labels, sizes, rank)
            uncached = copy.deepcopy(initial)
            loss = criterion(*uncached(x), y)
            loss.backward()
            cached = copy.deepcopy(initial)
            cached_loss = GradientCache(cached, criterion, chunk_size=2).step({"x": x}, y)
            _close(cached_loss, loss, f"{what}: cached loss")
            for got, want in zip(_grads(cached), _grads(uncached)):
                _close(got, want, f"{what}: cached vs uncached gradient on rank {rank}")
            for got, want in zip(mean_over_ranks(_grads(cached)), _grads(single)):
                _close(got, want, f"{what}: averaged cached gradient vs one process")
            # The loss: SCL is the global batch's on every rank; its mean over the ranks is the
            # single-process objective (CE is each rank's mean over equal batches).
            _close(mean_over_ranks([loss.detach()])[0], want_loss, f"{what}: mean loss over ranks")


@case
def multi_label_targets_match_one_process(rank, world):
    """BCE + multi-label SCL with distributed=True ("gather"): the loss's mean over the ranks
    and the ranks' averaged gradients are one process's on the global batch, for both rules and
    equal batches (CE's per-rank mean averages to the global one)."""
    for rule in ("any", "jaccard"):
        inputs, _ = _data(12, seed=len(rule))
        generator = torch.Generator().manual_seed(7)
        targets = (torch.rand(12, 3, generator=generator) < 0.45).double()
        torch.manual_seed(0)
        initial = Encoder().double()
        single = copy.deepcopy(initial)
        reference = SupConCrossEntropyLoss(0.6, 0.3, multi_label=rule)
        want_loss = reference(*single(inputs), targets)
        want_loss.backward()
        criterion = SupConCrossEntropyLoss(0.6, 0.3, multi_label=rule, distributed=True)
        model = copy.deepcopy(initial)
        loss = criterion(*model(_local(inputs, [6, 6], rank)), _local(targets, [6, 6], rank))
        loss.backward()
        for got, want in zip(mean_over_ranks(_grads(model)), _grads(single)):
            _close(got, want, f"{rule}: averaged gradient vs one process")
        _close(mean_over_ranks([loss.detach()])[0], want_loss, f"{rule}: mean loss over ranks")


def _count_all_reduces(model):
    """Registers a DDP communication hook (the default all-reduce) that counts its calls."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    calls = []

    def hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, hook)
    return calls


@case
def ddp_training_matches_one_process(rank, world):
    """Three SGD steps of a DDP model with the distributed objective, uncached and through the
    gradient cache (with and without DDP's no_sync around the chunks), give the parameters of
    one process training on the global batches; no_sync makes it one all-reduce per step."""
    sizes, lam, steps, chunk_size = [5, 5], 0.6, 3, 2
    batches = [_data(sum(sizes), seed=10 + step) for step in range(steps)]
    torch.manual_seed(1)
    initial = Encoder().double()
    single = copy.deepcopy(initial)
    optimiser = torch.optim.SGD(single.parameters(), lr=0.5)
    reference = SupConCrossEntropyLoss(lam, 0.3)
    for inputs, labels in batches:
        optimiser.zero_grad()
        reference(*single(inputs), labels).backward()
        optimiser.step()

    counts = {}
    for strategy, mode in (("gather", "uncached"), ("gather", "cached"), ("ring", "cached"),
                           ("gather", "cached without no_sync")):
        what = f"{strategy}, {mode}"
        model = nn.parallel.DistributedDataParallel(copy.deepcopy(initial))
        calls = _count_all_reduces(model)
        criterion = SupConCrossEntropyLoss(lam, 0.3, distributed=True, strategy=strategy)
        sync = model.no_sync if mode == "cached" else None
        cache = GradientCache(model, criterion, chunk_size, sync_context=sync)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
        for inputs, labels in batches:
            optimiser.zero_grad()
            x, y = _local(inputs, sizes, rank), _local(labels, sizes, rank)
            if mode == "uncached":
                criterion(*model(x), y).backward()
            else:
                cache.step(x, y)
            optimiser.step()
        for (name, got), want in zip(model.module.named_parameters(), single.parameters()):
            _close(got, want, f"{what}: {name} after {steps} steps")
        counts[what] = len(calls)
    per_step = counts["gather, uncached"] // steps
    assert per_step >= 1 and counts["gather, uncached"] == per_step * steps, counts
    assert counts["gather, cached"] == counts["ring, cached"] == counts["gather, uncached"], counts
    chunks = -(-sizes[rank] // chunk_size)
    assert counts["gather, cached without no_sync"] == chunks * counts["gather, uncached"], counts


@case
def ddp_gradient_cache_with_unequal_batches(rank, world):
    """With no_sync, ranks holding different numbers of chunks (7 and 3 examples: 4 and 2
    chunks; 9 and none: 5 and 1) still all-reduce once per step. SCL alone (lam = 1) is exact
    for any batch sizes; the unused classifier head needs find_unused_parameters."""
    for sizes, strategy in (([7, 3], "gather"), ([9, 0], "ring")):
        what = f"sizes {sizes}, {strategy}"
        batches = [_data(sum(sizes), seed=20 + step) for step in range(2)]
        torch.manual_seed(2)
        initial = Encoder().double()
        single = copy.deepcopy(initial)
        optimiser = torch.optim.SGD(single.parameters(), lr=0.5)
        for inputs, labels in batches:
            optimiser.zero_grad()
            SupConCrossEntropyLoss(1.0, 0.3)(*single(inputs), labels).backward()
            optimiser.step()
        model = nn.parallel.DistributedDataParallel(copy.deepcopy(initial),
                                                    find_unused_parameters=True)
        criterion = SupConCrossEntropyLoss(1.0, 0.3, distributed=True, strategy=strategy)
        cache = GradientCache(model, criterion, 2, sync_context=model.no_sync)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
        for inputs, labels in batches:
            optimiser.zero_grad()
            x, y = _local(inputs, sizes, rank), _local(labels, sizes, rank)
            cache.step({"x": x}, y)
            optimiser.step()
        for (name, got), want in zip(model.module.named_parameters(), single.parameters()):
            _close(got, want, f"{what}: {name}")


# The Trainer: a tiny random RoBERTa, 4 examples per process and step, 2 steps.

TRAINER_LABELS = [0, 0, 1, 1, 2, 1, 2, 0, 1, 2, 0, 2, 1, 0, 0, 2]
SEQ, PAD, PER_DEVICE, STEPS, LAM, TEMPERATURE, LR = 8, 1, 4, 2, 0.6, 0.3, 0.5


def _examples(labels):
    return label_token_batch(labels, seq_len=SEQ, pad_id=PAD)


def _logits_and_first_token(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                output_hidden_states=True)
    return out.logits, out.hidden_states[-1][:, 0]


def _reference_training(initial, criterion, global_batches):
    """One process, SGD on the global batches; (parameters, per-step losses)."""
    model = copy.deepcopy(initial).train()
    optimiser = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for batch in global_batches:
        optimiser.zero_grad()
        loss = criterion(*_logits_and_first_token(model, batch), batch["labels"])
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return list(model.parameters()), losses


def _train(initial, examples=None, **options):
    """Trains a copy of ``initial`` with SupConTrainer on this rank on ``examples`` (default: the
    class labels TRAINER_LABELS'): SGD at a constant rate, no clipping; (trainer, model, logged
    losses, DDP all-reduces counted)."""
    import transformers
    from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments

    class CountAllReduces(transformers.TrainerCallback):
        calls = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.calls is None:  # the DDP wrapper exists once training has begun
                self.calls = _count_all_reduces(trainer.model_wrapped)

    model = copy.deepcopy(initial)
    settings = dict(output_dir=os.path.join(os.environ["SCL_TEST_TMP"], "trainer"), use_cpu=True,
                    ddp_backend="gloo", report_to=[], save_strategy="no", logging_steps=1,
                    disable_tqdm=True, seed=0, per_device_train_batch_size=PER_DEVICE,
                    max_steps=STEPS, max_grad_norm=0.0, train_sampling_strategy="sequential",
                    scl_lambda=LAM, scl_temperature=TEMPERATURE)
    args = SupConTrainingArguments(**{**settings, **options})
    optimiser = torch.optim.SGD(model.parameters(), lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: 1.0)
    counter = CountAllReduces()
    examples = _examples(TRAINER_LABELS) if examples is None else examples
    trainer = SupConTrainer(model=model, args=args, train_dataset=BatchRows(examples),
                            optimizers=(optimiser, schedule), callbacks=[counter])
    trainer.remove_callback(transformers.PrinterCallback)
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, model, logged, len(counter.calls)


@case
def trainer_contrasts_the_global_batch(rank, world):
    """SupConTrainer under a 2-process gloo job: SCL over both processes' batches; 2 SGD steps
    equal one process's on the global batches (accelerate deals batch 2k to rank 0 and 2k+1 to
    rank 1, so step k's global batch is examples [8k, 8k + 8) in rank order), uncached and
    through the gradient cache (one all-reduce per step), with gradient accumulation; the
    opt-out contrasts each process's batch alone."""
    from scl_kernels import supcon_loss
    from support.tiny_models import tiny_classifier

    data = _examples(TRAINER_LABELS)
    step_rows = PER_DEVICE * world
    global_batches = [{k: v[s * step_rows:(s + 1) * step_rows] for k, v in data.items()}
                      for s in range(STEPS)]
    initial = tiny_classifier("roberta", 3, seed=0)
    want, want_losses = _reference_training(initial, SupConCrossEntropyLoss(LAM, TEMPERATURE),
                                            global_batches)

    counts = {}
    for chunk_size, strategy in ((None, "gather"), (3, "ring")):
        what = f"chunk size {chunk_size}, {strategy}"
        trainer, model, logged, counts[chunk_size] = _train(
            initial, gradient_cache_chunk_size=chunk_size,
            scl_distributed_strategy=strategy)
        assert trainer.args.world_size == world and trainer.criterion.distributed, what
        assert trainer.criterion.strategy == strategy, what
        for (name, got), expected in zip(model.named_parameters(), want):
            _close(got, expected, f"{what}: {name}", F32)
        # The logged loss, averaged over the processes by the Trainer, is the single-process
        # objective of each global batch.
        assert len(logged) == STEPS and all(
            abs(a - b) <= 1e-5 * abs(b) for a, b in zip(logged, want_losses)), (what, logged, want_losses)
    # The cache's chunks all-reduce once per step, as the uncached step does (no_sync).
    assert counts[3] == counts[None] > 0, counts

    # Gradient accumulation over the two global batches, through the cache: one step whose
    # gradient is that of the mean of the two global objectives, and one all-reduce.
    trainer, model, logged, accumulated_calls = _train(
        initial, gradient_cache_chunk_size=3, gradient_accumulation_steps=2, max_steps=1)
    reference = copy.deepcopy(initial).train()
    criterion = SupConCrossEntropyLoss(LAM, TEMPERATURE)
    objective = torch.stack([criterion(*_logits_and_first_token(reference, batch), batch["labels"])
                             for batch in global_batches]).mean()
    objective.backward()
    for (name, got), p in zip(model.named_parameters(), reference.parameters()):
        _close(got, p - LR * p.grad, f"gradient accumulation: {name}", F32)
    assert logged == [pytest.approx(objective.item(), rel=1e-5)], logged
    assert accumulated_calls == counts[None] // STEPS, (accumulated_calls, counts)

    # The SCL term is the global batch's: the trained model's SCL on this rank's examples
    # equals one process's SCL on both ranks' examples.
    with torch.no_grad():
        batch = global_batches[0]
        local = {k: _local(v, [PER_DEVICE] * world, rank) for k, v in batch.items()}
        parts = trainer.criterion.parts(*_logits_and_first_token(model, local), local["labels"])
        _, embeddings = _logits_and_first_token(model, batch)
        _close(parts.supcon, supcon_loss(embeddings, batch["labels"], TEMPERATURE), "global SCL", F32)

    # Opt-out: each process's batch is its own contrastive set; DDP averages the per-process
    # objectives' gradients.
    trainer, model, logged, _ = _train(initial, scl_global_batch=False, max_steps=1)
    assert not trainer.criterion.distributed
    reference = copy.deepcopy(initial).train()
    criterion = SupConCrossEntropyLoss(LAM, TEMPERATURE)
    halves = [{k: _local(v, [PER_DEVICE] * world, r) for k, v in global_batches[0].items()}
              for r in range(world)]
    losses = [criterion(*_logits_and_first_token(reference, half), half["labels"]) for half in halves]
    torch.stack(losses).mean().backward()
    for (name, got), p in zip(model.named_parameters(), reference.parameters()):
        _close(got, p - LR * p.grad, f"scl_global_batch=False: {name}", F32)
    assert abs(logged[0] - float(torch.stack(losses).mean())) <= 1e-5 * abs(logged[0])


# A multi-label model: the token ids of TRAINER_LABELS' examples, multi-hot targets of 4 classes
# with partial overlaps (where "any" and "jaccard" differ), positives across the ranks (row 3's
# classes are on rank 1 only in step 0) and a row without a class.
MULTI_HOT = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1],
                          [0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 0],
                          [1, 1, 1, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 1],
                          [0, 0, 1, 1], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]],
                         dtype=torch.float32)
MULTI_LABEL = "multi_label_classification"


@case
def trainer_contrasts_the_global_batch_of_a_multi_label_model(rank, world):
    """A multi_label_classification model under the 2-process job: BCE + multi-label SCL of the
    global batch ("gather"), 2 SGD steps equal to one process's on the global batches for both
    rules; the SCL term is the global batch's under the Trainer's rule, which neither this
    process's batch alone nor the other rule gives; the ring is refused at construction, and
    at the first step where the config leaves the problem to the labels."""
    from support.reference64 import supcon_reference64
    from support.tiny_models import tiny_classifier

    examples = {**_examples(TRAINER_LABELS), "labels": MULTI_HOT}
    step_rows = PER_DEVICE * world
    global_batches = [{k: v[s * step_rows:(s + 1) * step_rows] for k, v in examples.items()}
                      for s in range(STEPS)]
    initial = tiny_classifier("roberta", MULTI_HOT.shape[1], seed=0, problem_type=MULTI_LABEL)
    for rule, other_rule in (("any", "jaccard"), ("jaccard", "any")):
        reference = SupConCrossEntropyLoss(LAM, TEMPERATURE, multi_label=rule,
                                           problem_type=MULTI_LABEL)
        want, want_losses = _reference_training(initial, reference, global_batches)
        trainer, model, logged, _ = _train(initial, examples, scl_multi_label=rule)
        criterion = trainer.criterion
        assert criterion.distributed and criterion.strategy == "gather", rule
        assert (criterion.problem_type, criterion.multi_label) == (MULTI_LABEL, rule)
        for (name, got), expected in zip(model.named_parameters(), want):
            _close(got, expected, f"{rule}: {name}", F32)
        assert len(logged) == STEPS and all(
            abs(a - b) <= 1e-5 * abs(b) for a, b in zip(logged, want_losses)), (rule, logged,
                                                                               want_losses)

        # The trained model's SCL on this rank's examples is the float64 oracle's on both
        # ranks' examples under the rule; this rank's batch alone, or the other rule, is not.
        with torch.no_grad():
            batch = global_batches[0]
            local = {k: _local(v, [PER_DEVICE] * world, rank) for k, v in batch.items()}
            local_logits, local_embeddings = _logits_and_first_token(model, local)
            parts = criterion.parts(local_logits, local_embeddings, local["labels"])
            _, embeddings = _logits_and_first_token(model, batch)
            classes = batch["labels"].bool()
            want_supcon = supcon_reference64(embeddings, classes, TEMPERATURE, multi_label=rule)
            _close(parts.supcon, want_supcon, f"{rule}: global SCL", F32)
            wrong = {"this process's batch alone": supcon_reference64(
                         local_embeddings, local["labels"].bool(), TEMPERATURE, multi_label=rule),
                     f"the rule {other_rule!r}": supcon_reference64(
                         embeddings, classes, TEMPERATURE, multi_label=other_rule)}
            for what, value in wrong.items():
                assert abs(parts.supcon.item() - value.item()) > 1e-3, (rule, what, value.item())

    # The ring cannot weigh multi-hot pairs: refused by name before any process communicates.
    refusal = "scl_distributed_strategy='ring' cannot contrast the multi-hot labels"
    with pytest.raises(ValueError, match=refusal):
        _train(initial, examples, scl_distributed_strategy="ring")
    unset = tiny_classifier("roberta", MULTI_HOT.shape[1], seed=0)  # problem_type None
    with pytest.raises(ValueError, match=refusal):
        _train(unset, examples, scl_distributed_strategy="ring")


# ------------------------------------------------------------------------------------------
# Spawning
# ------------------------------------------------------------------------------------------

def run_rank(rank, world, folder, port, names):
    """Spawned entry point: the environment torchrun gives a process, a gloo group (a file store
    and a 60 s timeout, so that a bug fails instead of hanging; accelerate finds it initialised),
    then the named cases, each recorded as None or its traceback."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS="1", SCL_TEST_TMP=os.path.join(folder, f"out{rank}"))
    torch.set_num_threads(1)
    join_gloo_group(rank, world, os.path.join(folder, 'store'))
    run_cases(CASES, names, rank, folder)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _have_transformers():
    try:
        import datasets  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{rank: {case: None or the traceback}}, from one spawn of the two ranks."""
    folder = str(tmp_path_factory.mktemp("finetune_distributed"))
    names = [n for n in CASES if _have_transformers() or not n.startswith("trainer")]
    return spawn_ranks(run_rank, WORLD, folder, (WORLD, folder, _free_port(), names),
                       SPAWN_TIMEOUT_S)


@pytest.mark.parametrize("name", list(CASES))
def test_case_on_every_rank(outcomes, name):
    if name.startswith("trainer") and not _have_transformers():
        pytest.skip("the Trainer case needs transformers and datasets")
    assert_passed_on_every_rank(outcomes, name)


def test_options_of_the_distributed_objective():
    criterion = SupConCrossEntropyLoss(0.5, distributed=True, strategy="ring")
    assert "distributed=True, strategy='ring'" in repr(criterion)
    with pytest.raises(ValueError, match="strategy must be one of"):
        SupConCrossEntropyLoss(0.5, distributed=True, strategy="tree")
    with pytest.raises(ValueError, match="distributed=True only"):
        SupConCrossEntropyLoss(0.5, strategy="ring")
    with pytest.raises(TypeError, match="distributed must be a bool"):
        SupConCrossEntropyLoss(0.5, distributed=1)
    # Without a process group the SCL term says what is missing.
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        criterion(torch.randn(4, 3), torch.randn(4, 5), torch.tensor([0, 1, 0, 1]))


def test_an_empty_batch_is_one_empty_chunk():
    """A rank without examples still encodes (nothing) and joins the distributed loss."""
    from scl_kernels.grad_cache import split_batch
    chunks = split_batch({"x": torch.empty(0, 6), "tag": "kept"}, 4)
    assert len(chunks) == 1 and chunks[0]["x"].shape == (0, 6) and chunks[0]["tag"] == "kept"
    assert [c.shape for c in split_batch(torch.empty(0, 6), 4)] == [(0, 6)]


# ------------------------------------------------------------------------------------------
# The command line under torchrun
# ------------------------------------------------------------------------------------------

CLI_WORDS = {"pos": ["good", "great", "fine", "nice"], "neg": ["bad", "awful", "poor", "sad"]}
CLI_FILLER = ["the", "movie", "was", "a", "plot", "very"]


def _cli_assets(root):
    """A CSV of 24 + 12 short texts and a tiny dropout-free BERT with a word-level tokenizer."""
    import csv
    import random

    import transformers
    from support.tiny_models import tiny_classifier

    for name, count, seed in (("train", 24, 0), ("test", 12, 1)):
        rng = random.Random(seed)
        with open(root / f"{name}.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(("text", "label"))
            for i in range(count):
                label = "pos" if i % 2 == 0 else "neg"
                words = rng.sample(CLI_FILLER, 3) + rng.sample(CLI_WORDS[label], 2)
                rng.shuffle(words)
                writer.writerow((" ".join(words), label))
    model_dir = root / "bert"
    model_dir.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CLI_FILLER, *CLI_WORDS["pos"],
             *CLI_WORDS["neg"]]
    (model_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    transformers.BertTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(model_dir))
    tiny_classifier("bert", 2, vocab_size=len(vocab), max_position_embeddings=32,
                    pad_token_id=0).save_pretrained(str(model_dir))


def test_command_line_under_torchrun_trains_as_one_process(tmp_path):
    """``torchrun --nproc_per_node 2 -m scl_kernels.finetune``: each step's batch of 8 split
    into 4 + 4, SCL over all 8 (ring strategy, through the gradient cache in chunks of 3): the
    per-epoch training losses of both runs (CE, CE+SCL) are those of the one-process command,
    and only rank 0 writes the outputs."""
    from support.cli_processes import run_in_one_and_two_processes

    pytest.importorskip("transformers")
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    _cli_assets(tmp_path)
    options = ["--train", str(tmp_path / "train.csv"), "--test", str(tmp_path / "test.csv"),
               "--model", str(tmp_path / "bert"), "--max-length", "16", "--no-progress",
               "--no-plot", "--seeds", "1", "--epochs", "2", "--batch-size", "8",
               "--chunk-size", "3", "--scl-strategy", "ring", "--lr", "1e-3", "--eval-every", "1"]
    metrics = run_in_one_and_two_processes(options, tmp_path)
    histories = {name: [(run["arm"], [h[key] for h in run["history"] for key in
                                      ("train_loss", "train_cross_entropy", "train_supcon")])
                        for run in metrics[name]["runs"]] for name in metrics}
    assert all(len(history) == 2 * 3 for _, history in histories["one"])  # epochs 1 and 2
    assert [arm for arm, _ in histories["two"]] == ["CE", "CE+SCL"]
    for (arm, two), (_, one) in zip(histories["two"], histories["one"]):
        assert two == pytest.approx(one, rel=1e-5), arm


@pytest.mark.parametrize("option, value", [("scl_distributed_strategy", "tree"),
                                           ("scl_global_batch", "yes")])
def test_bad_distributed_trainer_options_raise(tmp_path, option, value):
    pytest.importorskip("transformers")
    from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments
    with pytest.raises(ValueError, match=option):
        SupConTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **{option: value})
    # A single process: the options are accepted and SCL stays this process's batch's.
    args = SupConTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                   scl_distributed_strategy="ring")
    from support.tiny_models import tiny_classifier
    assert not SupConTrainer(model=tiny_classifier("roberta", 3), args=args).criterion.distributed
