"""The integrations across processes, on 3 gloo ranks spawned once for every case, each against
one process computing the whole batch:

* SupConSentenceTransformerLoss and SimCSELoss under DistributedDataParallel gather the
  embeddings (scl_kernels.distributed): the global batch's loss on every rank and, once DDP has
  averaged them, its gradients, uncached and through the gradient cache, with unequal local
  batches; ``gather_across_devices=False`` contrasts each rank's rows alone.
* SupConTrainer with ``scl_embedding="mean"`` on BERT (whose pooler the mean's classifier
  skips) trains as one process on the global batches.
* SupConTrainer's checkpoints hold the cross-batch memory, one file for the global batch's,
  one per process for each process's own: a resumed run continues the unbroken one.

float32 models: the values agree to float32 rounding."""
import copy
import os
import random

import pytest
import torch
import torch.distributed as dist

from support import needs
from support.spawned_ranks import assert_passed_on_every_rank, join_gloo_group, run_cases, spawn_ranks
from support.tiny_models import BatchRows, label_token_batch, tiny_classifier, tiny_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

pytestmark = [
    pytest.mark.slow,  # 3 processes that import transformers and sentence-transformers: about a minute
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
    needs.library,
]

WORLD = 3
SPAWN_TIMEOUT_S = 300
F32 = dict(rtol=1e-4, atol=1e-6)
CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


def _close(actual, expected, what):
    actual, expected = actual.detach().double(), expected.detach().double()
    if actual.shape != expected.shape or not torch.allclose(actual, expected, **F32):
        error = (actual - expected).abs().max().item() if actual.shape == expected.shape else None
        raise AssertionError(f"{what}: shapes {tuple(actual.shape)} / {tuple(expected.shape)}, "
                             f"largest difference {error}")


def _grads(model):
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


# ------------------------------------------------------------------------------------------
# sentence-transformers losses
# ------------------------------------------------------------------------------------------

WORDS = [["good", "great", "happy", "love"], ["bad", "awful", "sad", "hate"], ["car", "road", "drive", "fast"]]
FILLER = ["the", "a", "it", "was", "very", "movie"]
ST_LABELS = [0, 1, 2, 0, 1, 2, 0, 1, 2, 1]
# Unequal local batches, in rank order: rank r holds rows [start_r, start_r + size_r).
ST_SIZES = [4, 3, 3]


def _save_sentence_encoder(directory):
    """A tiny dropout-free BERT with a word-level vocab.txt (AutoTokenizer builds a BERT
    tokenizer from it offline)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + FILLER + [w for words in WORDS for w in words]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    transformers.BertModel(tiny_config("bert", vocab_size=len(vocab))).save_pretrained(directory)


def _sentence_encoder():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    path = os.path.join(os.environ["SCL_TEST_FOLDER"], "encoder")
    return SentenceTransformer(modules=[Transformer(path, max_seq_length=16),
                                        Pooling(tiny_config("bert").hidden_size, pooling_mode="mean")],
                               device="cpu")


def _texts(count, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS[ST_LABELS[i % len(ST_LABELS)]] + FILLER)
                     for _ in range(rng.randint(2, 6))) for i in range(count)]


def _local_rows(rows, rank):
    start = sum(ST_SIZES[:rank])
    return rows[start:start + ST_SIZES[rank]]


def _one_process_and_ddp(loss_class, columns, labels, rank, **options):
    """(loss, gradients) of one process on the whole batch and, on this rank, of the loss on its
    rows through a DDP-wrapped copy of the same model, with the gradients DDP averaged."""
    model = _sentence_encoder()
    reference = copy.deepcopy(model)
    whole = loss_class(reference, gather_across_devices=False, **options)  # every rank: the whole batch
    features = [reference.preprocess(texts) for texts in columns]
    want = whole(features, labels)
    want.backward()

    wrapped = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    local = loss_class(wrapped, **options)
    local_features = [model.preprocess(_local_rows(texts, rank)) for texts in columns]
    local_labels = None if labels is None else _local_rows(labels, rank)
    got = local(local_features, local_labels)
    got.backward()
    return (got, _grads(model)), (want, _grads(reference))


@case
def supcon_sentence_transformer_loss_contrasts_the_global_batch(rank, world):
    from scl_kernels import supcon_loss
    from scl_kernels.integrations import SupConSentenceTransformerLoss

    labels = torch.tensor(ST_LABELS)
    texts, paraphrases = _texts(len(ST_LABELS), 0), _texts(len(ST_LABELS), 1)
    for columns in ([texts], [texts, paraphrases]):
        for mini_batch_size in (None, 2):
            what = f"{len(columns)} view(s), mini_batch_size {mini_batch_size}"
            (got, grads), (want, want_grads) = _one_process_and_ddp(
                SupConSentenceTransformerLoss, columns, labels, rank, temperature=0.2,
                mini_batch_size=mini_batch_size)
            _close(got, want, f"{what}: loss")
            for index, (g, w) in enumerate(zip(grads, want_grads)):
                _close(g, w, f"{what}: gradient {index}")
    # The opt-out: this rank's rows alone.
    model = _sentence_encoder()
    loss = SupConSentenceTransformerLoss(model, temperature=0.2, gather_across_devices=False)
    local_texts, local_labels = _local_rows(texts, rank), _local_rows(labels, rank)
    with torch.no_grad():
        got = loss([model.preprocess(local_texts)], local_labels)
        embeddings = model.encode(local_texts, convert_to_tensor=True)
    _close(got, supcon_loss(embeddings, local_labels, 0.2), "gather_across_devices=False")


@case
def simcse_loss_takes_every_ranks_rows_as_negatives(rank, world):
    from scl_kernels.integrations import SimCSELoss

    count = len(ST_LABELS)
    columns = [_texts(count, 0), _texts(count, 1), _texts(count, 2)]
    for used, chunk_size in ((2, None), (3, 2)):  # pairs; triples with hard negatives, cached
        what = f"{used} columns, chunk_size {chunk_size}"
        (got, grads), (want, want_grads) = _one_process_and_ddp(
            SimCSELoss, columns[:used], None, rank, chunk_size=chunk_size)
        _close(got, want, f"{what}: loss")
        for index, (g, w) in enumerate(zip(grads, want_grads)):
            _close(g, w, f"{what}: gradient {index}")


# ------------------------------------------------------------------------------------------
# SupConTrainer
# ------------------------------------------------------------------------------------------

SEQ, PAD, PER_DEVICE, LAM, TEMPERATURE, LR = 8, 0, 2, 0.6, 0.3, 0.5
TRAINER_LABELS = [0, 1, 0, 1, 2, 2, 1, 0, 2, 1, 2, 0]  # 2 steps of a global batch of 6


def _examples(labels):
    return label_token_batch(labels, seq_len=SEQ, pad_id=PAD)


def _trainer(model, output_dir, **options):
    """SupConTrainer on this rank: SGD at a constant rate, no clipping, sequential batches
    (accelerate deals batch k * world + r to rank r)."""
    from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments

    settings = dict(output_dir=output_dir, use_cpu=True, ddp_backend="gloo", report_to=[],
                    save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                    per_device_train_batch_size=PER_DEVICE, max_steps=2, max_grad_norm=0.0,
                    train_sampling_strategy="sequential", scl_lambda=LAM,
                    scl_temperature=TEMPERATURE)
    args = SupConTrainingArguments(**{**settings, **options})
    optimiser = torch.optim.SGD(model.parameters(), lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: 1.0)
    trainer = SupConTrainer(model=model, args=args, train_dataset=BatchRows(_examples(TRAINER_LABELS)),
                            optimizers=(optimiser, schedule))
    trainer.remove_callback(transformers.PrinterCallback)
    return trainer


def _output_dir(name):
    """One folder for every rank (rank 0's), as a shared output_dir is in a real job."""
    return os.path.join(os.environ["SCL_TEST_FOLDER"], name)


@case
def trainer_with_the_mean_classifier_trains_as_one_process(rank, world):
    from scl_kernels.integrations import sentence_embedding
    from scl_kernels.integrations.embeddings import classifier_logits
    from scl_kernels.nn import SupConCrossEntropyLoss

    initial = tiny_classifier("bert", 3, seed=0, pad_token_id=PAD)
    model = copy.deepcopy(initial)
    _trainer(model, _output_dir("mean"), scl_embedding="mean").train()

    reference = copy.deepcopy(initial).train()
    optimiser = torch.optim.SGD(reference.parameters(), lr=LR)
    criterion = SupConCrossEntropyLoss(LAM, TEMPERATURE)
    data, rows = _examples(TRAINER_LABELS), PER_DEVICE * world
    for step in range(2):
        batch = {k: v[step * rows:(step + 1) * rows] for k, v in data.items()}
        outputs = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            output_hidden_states=True)
        embeddings = sentence_embedding(reference, outputs, batch["attention_mask"], "mean")
        logits = classifier_logits(reference, outputs, embeddings, "mean")
        optimiser.zero_grad()
        criterion(logits, embeddings, batch["labels"]).backward()
        optimiser.step()
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        _close(got, want, name)


@case
def trainer_checkpoints_restore_the_memory_of_every_process(rank, world):
    for global_batch in (True, False):
        memory = dict(supcon_memory_size=5, scl_global_batch=global_batch, save_strategy="steps",
                      save_steps=1)
        name = "global" if global_batch else "own"
        initial = tiny_classifier("roberta", 3, seed=0)
        unbroken = _trainer(copy.deepcopy(initial), _output_dir(f"unbroken_{name}"), **memory)
        unbroken.train()
        checkpoint = os.path.join(_output_dir(f"unbroken_{name}"), "checkpoint-1")
        files = sorted(f for f in os.listdir(checkpoint) if f.startswith("supcon_memory"))
        want_files = (["supcon_memory.pt"] if global_batch
                      else [f"supcon_memory_{r}.pt" for r in range(world)])
        assert files == want_files, (name, files)

        resumed = _trainer(copy.deepcopy(initial), _output_dir(f"resumed_{name}"), **memory)
        resumed.train(resume_from_checkpoint=checkpoint)
        for (parameter, got), want in zip(resumed.model.named_parameters(), unbroken.model.parameters()):
            _close(got, want, f"{name}: {parameter}")
        for key, buffer in unbroken.criterion.memory.state_dict().items():
            _close(resumed.criterion.memory.state_dict()[key].double(), buffer.double(), f"{name}: {key}")


# ------------------------------------------------------------------------------------------
# Spawning
# ------------------------------------------------------------------------------------------

def run_rank(rank, world, folder, names):
    """Spawned entry point: the environment torchrun gives a process (the Trainer reads it; the
    group it finds initialised needs no address), a gloo group (a file store and a 60 s
    timeout, so that a bug fails instead of hanging), then the named cases."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1", SCL_TEST_FOLDER=folder)
    torch.set_num_threads(1)
    join_gloo_group(rank, world, os.path.join(folder, 'store'))
    run_cases(CASES, names, rank, folder)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{rank: {case: None or the traceback}}, from one spawn of the ranks."""
    folder = tmp_path_factory.mktemp("integrations_distributed")
    (folder / "encoder").mkdir()
    _save_sentence_encoder(folder / "encoder")
    return spawn_ranks(run_rank, WORLD, str(folder), (WORLD, str(folder), list(CASES)),
                       SPAWN_TIMEOUT_S)


@pytest.mark.parametrize("name", list(CASES))
def test_case_on_every_rank(outcomes, name):
    assert_passed_on_every_rank(outcomes, name)
