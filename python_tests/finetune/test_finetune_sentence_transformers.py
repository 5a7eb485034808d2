"""SupConSentenceTransformerLoss on a tiny random SentenceTransformer built offline: the value
against supcon_loss, the gradient cache (gradients, dropout replay, the trainer's scaling), and
training in SentenceTransformerTrainer."""
import copy
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
datasets = pytest.importorskip("datasets")

from sentence_transformers import (  # noqa: E402
    SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments)
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402

from scl_kernels import supcon_loss  # noqa: E402
from scl_kernels.integrations import SupConSentenceTransformerLoss  # noqa: E402
from support.tiny_models import TINY_SIZES, tiny_config  # noqa: E402

WORDS = [["good", "great", "happy", "love", "fine"],
         ["bad", "awful", "sad", "hate", "poor"],
         ["car", "road", "drive", "wheel", "fast"]]
FILLER = ["the", "a", "it", "was", "very", "movie", "day"]
HIDDEN = TINY_SIZES["hidden_size"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """Two saved tiny BERT encoders (no dropout / dropout 0.1) with a word-level vocab.txt, from
    which AutoTokenizer builds a BERT tokenizer offline."""
    dirs = {}
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + FILLER + [w for words in WORDS for w in words]
    for dropout in (0.0, 0.1):
        path = tmp_path_factory.mktemp(f"tiny_bert_{dropout}")
        (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
        torch.manual_seed(0)
        config = tiny_config("bert", vocab_size=len(vocab), dropout=dropout)
        transformers.BertModel(config).save_pretrained(path)
        dirs[dropout] = str(path)
    return dirs


def tiny_model(model_dirs, dropout=0.0):
    return SentenceTransformer(modules=[Transformer(model_dirs[dropout], max_seq_length=16),
                                        Pooling(HIDDEN, pooling_mode="mean")], device="cpu")


def texts_and_labels(labels, seed=0):
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS[label] + FILLER) for _ in range(rng.randint(2, 7))) for label in labels]
    return texts, torch.tensor(labels)


def features(model, *columns):
    return [model.preprocess(list(texts)) for texts in columns]


def gradients(model):
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


LABELS = [0, 1, 2, 0, 1, 2, 0, 1, 0, 2]


@pytest.mark.parametrize("mini_batch_size", [None, 3])
def test_value_is_supcon_of_the_encoded_embeddings(model_dirs, mini_batch_size):
    model = tiny_model(model_dirs)
    texts, labels = texts_and_labels(LABELS)
    loss_fn = SupConSentenceTransformerLoss(model, temperature=0.2, mini_batch_size=mini_batch_size)
    model.eval()
    with torch.no_grad():
        loss = loss_fn(features(model, texts), labels)
    embeddings = model.encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(loss, supcon_loss(embeddings, labels, 0.2), rtol=1e-5, atol=1e-6)
    # two text columns are two views of each row
    others, _ = texts_and_labels(LABELS, seed=1)
    with torch.no_grad():
        loss = loss_fn(features(model, texts, others), labels)
    views = torch.stack([embeddings, model.encode(others, convert_to_tensor=True)], dim=1)
    torch.testing.assert_close(loss, supcon_loss(views, labels, 0.2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mini_batch_size", [1, 3, 64])
def test_cached_gradients_equal_uncached(model_dirs, mini_batch_size):
    texts, labels = texts_and_labels(LABELS)
    results = []
    for size in (None, mini_batch_size):
        model = tiny_model(model_dirs)
        loss = SupConSentenceTransformerLoss(model, mini_batch_size=size)(features(model, texts), labels)
        (0.5 * loss).backward()  # the trainer's scaling (accumulation, fp16) must reach the cache
        results.append((loss.detach(), gradients(model)))
    (plain_loss, plain), (cached_loss, cached) = results
    torch.testing.assert_close(cached_loss, plain_loss)
    assert len(cached) == len(plain) > 0
    for got, want in zip(cached, plain):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_cached_backward_replays_dropout(model_dirs):
    texts, labels = texts_and_labels(LABELS)
    model = tiny_model(model_dirs, dropout=0.1).train()
    reference = copy.deepcopy(model)
    torch.manual_seed(7)
    loss = SupConSentenceTransformerLoss(model, mini_batch_size=4)(features(model, texts), labels)
    torch.manual_seed(123)  # the backward pass must not depend on the state the forward left
    loss.backward()

    def chunked(seed):
        reference.zero_grad()
        torch.manual_seed(seed)
        padded = features(reference, texts)[0]  # chunks of the batch as padded for the loss
        parts = [reference({k: v[i:i + 4] if torch.is_tensor(v) else v for k, v in padded.items()})
                 ["sentence_embedding"] for i in range(0, len(texts), 4)]
        want = supcon_loss(torch.cat(parts), labels, 0.1)
        want.backward()
        return want.detach(), gradients(reference)

    want_loss, want = chunked(7)
    torch.testing.assert_close(loss.detach(), want_loss)
    for got, expected in zip(gradients(model), want):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    _, other = chunked(8)
    assert not all(torch.allclose(g, o, atol=1e-6) for g, o in zip(gradients(model), other))


def trainer_arguments(tmp_path, **options):
    defaults = dict(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
                    per_device_train_batch_size=6, logging_steps=1, disable_tqdm=True, seed=0)
    return SentenceTransformerTrainingArguments(**{**defaults, **options})


def train_set(labels):
    texts, labels = texts_and_labels(labels)
    return datasets.Dataset.from_dict({"text": texts, "label": labels.tolist()})


@pytest.mark.parametrize("mini_batch_size", [None, 2])
def test_training_in_sentence_transformer_trainer_lowers_the_loss(model_dirs, tmp_path, mini_batch_size):
    labels = [0, 1, 2] * 8
    model = tiny_model(model_dirs, dropout=0.1)
    loss_fn = SupConSentenceTransformerLoss(model, mini_batch_size=mini_batch_size)
    texts, label_tensor = texts_and_labels(labels)

    def full_batch_loss():
        model.eval()
        with torch.no_grad():
            return float(loss_fn(features(model, texts), label_tensor))

    before = full_batch_loss()
    args = trainer_arguments(tmp_path, max_steps=12, learning_rate=1e-2, warmup_steps=0,
                             gradient_accumulation_steps=2)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_set(labels), loss=loss_fn)
    trainer.train()
    assert full_batch_loss() < 0.85 * before
    assert "loss:SupConSentenceTransformerLoss" in model.model_card_data.tags


def test_cached_update_in_the_trainer_equals_uncached(model_dirs, tmp_path):
    labels = [0, 1, 2, 0, 1, 2, 2, 1, 0, 0, 1, 2]
    updated = []
    for size in (None, 4):
        model = tiny_model(model_dirs)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        args = trainer_arguments(tmp_path, max_steps=1, gradient_accumulation_steps=2, max_grad_norm=0.0)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_set(labels),
                                             loss=SupConSentenceTransformerLoss(model, mini_batch_size=size),
                                             optimizers=(optimizer, schedule))
        trainer.train()
        logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        updated.append((logged, [p.detach().clone() for p in model.parameters()]))
    (plain_logged, plain), (cached_logged, cached) = updated
    assert cached_logged == pytest.approx(plain_logged, rel=1e-5)
    initial = list(tiny_model(model_dirs).parameters())
    assert not all(torch.equal(p, q) for p, q in zip(plain, initial))
    for got, want in zip(cached, plain):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_config_and_citation(model_dirs):
    model = tiny_model(model_dirs)
    loss_fn = SupConSentenceTransformerLoss(model, temperature=0.05)
    assert loss_fn.get_config_dict() == {"temperature": 0.05, "mini_batch_size": None, "normalize": True,
                                         "gather_across_devices": True}
    assert "khosla2020supervised" in loss_fn.citation and "gao2021scaling" not in loss_fn.citation
    assert not loss_fn.uses_gradient_cache
    cached = SupConSentenceTransformerLoss(model, mini_batch_size=8)
    assert "gao2021scaling" in cached.citation and cached.uses_gradient_cache


@pytest.mark.parametrize("options, error, match", [
    ({"temperature": 0.0}, ValueError, "temperature"), ({"temperature": "0.1"}, TypeError, "temperature"),
    ({"mini_batch_size": 0}, ValueError, "mini_batch_size"), ({"mini_batch_size": 2.0}, ValueError, "mini_batch_size"),
    ({"normalize": 1}, TypeError, "normalize"), ({"backend": "gpu"}, ValueError, "backend"),
    ({"gather_across_devices": 1}, TypeError, "gather_across_devices")])
def test_bad_arguments_raise(model_dirs, options, error, match):
    with pytest.raises(error, match=match):
        SupConSentenceTransformerLoss(tiny_model(model_dirs), **options)


def test_missing_labels_raise(model_dirs):
    model = tiny_model(model_dirs)
    texts, _ = texts_and_labels([0, 1])
    with pytest.raises(TypeError, match="label"):
        SupConSentenceTransformerLoss(model)(features(model, texts), None)
