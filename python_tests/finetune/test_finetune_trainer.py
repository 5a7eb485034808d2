"""SupConTrainer / SupConTrainingArguments on tiny random RoBERTa and BERT classifiers: the loss
wiring, gradient accumulation, the gradient cache, predict() and evaluate(), class-balanced
batches and bad options."""
import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from scl_kernels import supcon_loss  # noqa: E402
from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments  # noqa: E402
from scl_kernels.nn import SupConCrossEntropyLoss  # noqa: E402
from scl_kernels.sampling import ClassBalancedBatchSampler  # noqa: E402
from support.tiny_models import tiny_classifier  # noqa: E402

SEQ = 8        # tokens per example
CLASSES = 3
PAD = 1        # RoBERTa's pad id (BERT's is 0; attention_mask is what matters)


def roberta(dropout=0.0, seed=0):
    return tiny_classifier("roberta", CLASSES, seed=seed, dropout=dropout)


def bert(dropout=0.0, seed=0):
    return tiny_classifier("bert", CLASSES, seed=seed, dropout=dropout)


MODELS = {"roberta": roberta, "bert": bert}


def examples(labels, seed=0):
    """Token ids that depend on the label (learnable), padded tails of random length."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.as_tensor(labels)
    n = len(labels)
    input_ids = 3 + 30 * labels[:, None] + torch.randint(0, 30, (n, SEQ), generator=generator)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=generator)
    attention_mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, PAD)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def hf_dataset(labels, seed=0, label_column="label"):
    batch = examples(labels, seed)
    return datasets.Dataset.from_dict({"input_ids": batch["input_ids"].tolist(),
                                       "attention_mask": batch["attention_mask"].tolist(),
                                       label_column: batch["labels"].tolist()})


class ListDataset(torch.utils.data.Dataset):
    """A plain torch data set of dicts, as a user without `datasets` would write."""

    def __init__(self, labels, seed=0):
        self.batch = examples(labels, seed)

    def __len__(self):
        return len(self.batch["labels"])

    def __getitem__(self, index):
        return {key: value[index] for key, value in self.batch.items()}


def arguments(tmp_path, **options):
    defaults = dict(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
                    per_device_train_batch_size=4, per_device_eval_batch_size=5, logging_steps=1,
                    disable_tqdm=True, seed=0)
    return SupConTrainingArguments(**{**defaults, **options})


def sgd_trainer(model, args, train_dataset, lr=0.5, **kwargs):
    """A trainer whose update is exactly params -= lr * grad (constant lr, no clipping)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return SupConTrainer(model=model, args=args, train_dataset=train_dataset,
                         optimizers=(optimizer, schedule), **kwargs)


def by_hand(model, batch, kind):
    """The logits and the sentence embedding, written out from the model's parts: with "mean"
    the classifier reads the mean (RoBERTa: its whole head, BERT: dropout and the linear layer,
    skipping the pooler), as the command line's does."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                output_hidden_states=True)
    last = out.hidden_states[-1]
    if kind == "first_token":
        return out.logits, last[:, 0]
    if kind == "mean":
        mask = batch["attention_mask"][:, :, None].float()
        mean = (last * mask).sum(1) / mask.sum(1)
        if isinstance(model, transformers.RobertaForSequenceClassification):
            return model.classifier.out_proj(torch.tanh(model.classifier.dense(mean))), mean
        return model.classifier(mean), mean
    if isinstance(model, transformers.RobertaForSequenceClassification):
        return out.logits, torch.tanh(model.classifier.dense(last[:, 0]))
    return out.logits, torch.tanh(model.bert.pooler.dense(last[:, 0]))


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("kind, reduction", [("first_token", "mean"), ("mean", "sum"), ("head", "mean")])
def test_training_loss_is_the_formula_on_the_chosen_embedding(tmp_path, model_name, kind, reduction):
    model = MODELS[model_name]().train()
    args = arguments(tmp_path, scl_lambda=0.6, scl_temperature=0.2, scl_reduction=reduction,
                     scl_embedding=kind)
    trainer = SupConTrainer(model=model, args=args)
    batch = examples([0, 0, 1, 1, 2, 2, 0])
    loss = trainer.compute_loss(model, batch)
    logits, embeddings = by_hand(model, batch, kind)
    labels = batch["labels"]
    want = 0.4 * F.cross_entropy(logits, labels) + 0.6 * supcon_loss(embeddings, labels, 0.2, reduction=reduction)
    torch.testing.assert_close(loss, want)
    # evaluation mode: the plain cross-entropy of the classifier
    model.eval()
    eval_loss, outputs = trainer.compute_loss(model, batch, return_outputs=True)
    torch.testing.assert_close(eval_loss, F.cross_entropy(logits, labels))
    assert outputs.hidden_states is None


def test_a_few_steps_lower_the_objective(tmp_path):
    labels = [0, 1, 2] * 8
    model = roberta()
    args = arguments(tmp_path, per_device_train_batch_size=6, max_steps=20, learning_rate=1e-2,
                     warmup_steps=0)
    train = hf_dataset(labels)
    criterion = SupConCrossEntropyLoss(lam=0.9, temperature=0.3)
    batch = examples(labels)

    def objective():
        model.eval()
        with torch.no_grad():
            return float(criterion(*by_hand(model, batch, "first_token"), batch["labels"]))

    before = objective()
    SupConTrainer(model=model, args=args, train_dataset=train).train()
    assert objective() < 0.8 * before


def _mean_of_batch_losses_update(model, batches, lr, criterion):
    """params - lr * grad of the mean of the per-batch objectives (each batch its own set)."""
    model = copy.deepcopy(model).train()
    losses = [criterion(*by_hand(model, b, "first_token"), b["labels"]) for b in batches]
    torch.stack(losses).mean().backward()
    with torch.no_grad():
        return [p - lr * p.grad for p in model.parameters()], float(torch.stack(losses).mean())


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_gradient_accumulation_averages_the_per_batch_objectives(tmp_path, chunk_size):
    labels = [0, 0, 1, 1, 2, 1, 2, 0]           # two batches of 4, each with positives
    model = roberta()
    initial = copy.deepcopy(model)
    args = arguments(tmp_path, gradient_accumulation_steps=2, max_steps=1, max_grad_norm=0.0,
                     train_sampling_strategy="sequential", gradient_cache_chunk_size=chunk_size)
    trainer = sgd_trainer(model, args, ListDataset(labels), lr=0.5)
    trainer.train()
    batch = examples(labels)
    halves = [{k: v[:4] for k, v in batch.items()}, {k: v[4:] for k, v in batch.items()}]
    want, want_loss = _mean_of_batch_losses_update(initial, halves, 0.5, trainer.criterion)
    for got, expected in zip(model.parameters(), want):
        torch.testing.assert_close(got.detach(), expected, rtol=1e-5, atol=1e-6)
    # the logged loss is the mean of the two batches' objectives, not twice it
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged == [pytest.approx(want_loss, rel=1e-5)]
    # accumulation does not enlarge the contrastive set: one batch of 8 is another update
    whole, _ = _mean_of_batch_losses_update(initial, [batch], 0.5, trainer.criterion)
    assert not all(torch.allclose(g, w, atol=1e-6) for g, w in zip(model.parameters(), whole))


def test_accumulated_cross_entropy_is_one_large_batch(tmp_path):
    """With lam = 0 the objective is a plain mean: accumulating two batches of 4 is one batch of
    8, as with the Trainer's own loss (the accumulation scaling is right)."""
    labels = [0, 0, 1, 1, 2, 1, 2, 0]
    results = []
    for accumulation, batch_size in ((2, 4), (1, 8)):
        model = roberta()
        args = arguments(tmp_path, gradient_accumulation_steps=accumulation, max_steps=1,
                         max_grad_norm=0.0, train_sampling_strategy="sequential",
                         per_device_train_batch_size=batch_size, scl_lambda=0.0)
        sgd_trainer(model, args, ListDataset(labels), lr=0.5).train()
        results.append([p.detach().clone() for p in model.parameters()])
    for accumulated, whole in zip(*results):
        torch.testing.assert_close(accumulated, whole, rtol=1e-5, atol=1e-6)


def test_predict_and_evaluate_see_plain_logits(tmp_path):
    labels = [0, 1, 2, 0, 1, 2, 1]
    model = roberta()
    seen = []

    def compute_metrics(prediction):
        seen.append(prediction.predictions)
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    args = arguments(tmp_path)
    trainer = SupConTrainer(model=model, args=args, eval_dataset=hf_dataset(labels),
                            compute_metrics=compute_metrics)
    prediction = trainer.predict(hf_dataset(labels))
    assert prediction.predictions.shape == (len(labels), CLASSES)
    batch = examples(labels)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(torch.as_tensor(prediction.predictions), logits, rtol=1e-5, atol=1e-6)
    assert prediction.metrics["test_loss"] == pytest.approx(float(F.cross_entropy(logits, batch["labels"])), rel=1e-5)
    metrics = trainer.evaluate()
    assert "eval_accuracy" in metrics and seen[-1].shape == (len(labels), CLASSES)


def test_an_evaluation_label_that_is_no_class_names_its_value_row_and_the_class_count(tmp_path):
    model = roberta()
    trainer = SupConTrainer(model=model, args=arguments(tmp_path))
    batch = examples([0, 1, 2, 0, 1])
    batch["labels"][3] = CLASSES
    model.eval()
    with pytest.raises(ValueError) as raised:
        trainer.compute_loss(model, batch)
    assert str(raised.value) == ("labels must lie in [0, 3) or equal the ignore index -100 "
                                 "(logits has 3 classes), got label 3 at row 3")


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_predict_without_labels_reads_the_mean(tmp_path, model_name):
    """With scl_embedding="mean", predict() returns the logits of the classifier on the mean,
    the one the training loss trained, with labels (through compute_loss) and without (the
    Trainer's own step would call the model's forward, whose head reads the first token)."""
    labels = [0, 1, 2, 0, 1, 2, 1]
    model = MODELS[model_name]()
    trainer = SupConTrainer(model=model, args=arguments(tmp_path, scl_embedding="mean"))
    batch = examples(labels)
    with torch.no_grad():
        want, _ = by_hand(model.eval(), batch, "mean")
        first_token, _ = by_hand(model, batch, "first_token")
    assert not torch.allclose(want, first_token, atol=1e-3)
    labelled = hf_dataset(labels)
    for dataset in (labelled, labelled.remove_columns("label")):
        prediction = trainer.predict(dataset)
        torch.testing.assert_close(torch.as_tensor(prediction.predictions), want, rtol=1e-5, atol=1e-6)
    assert prediction.label_ids is None


def _save_tokenizer_and_classifier(directory, architecture):
    """A tiny dropout-free classifier with a word-level BERT tokenizer, as the command line loads
    them from a folder."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "great", "bad", "awful", "the",
             "film", "was", "very"]
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizer.from_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    tiny_classifier(architecture, 2, vocab_size=len(words), max_position_embeddings=34,
                    pad_token_id=0).save_pretrained(str(directory))
    return tokenizer


@pytest.mark.parametrize("architecture", ["bert", "roberta"])
@pytest.mark.parametrize("kind", ["first_token", "mean", "head"])
def test_training_loss_is_the_command_lines(tmp_path, architecture, kind):
    """One training batch of the same model: the Trainer's loss is the one the command line
    (scl-finetune's training loop, objective scl) logs for its first step."""
    pytest.importorskip("sklearn")  # the command line's evaluation
    from scl_kernels.finetune.data import TextClassificationData
    from scl_kernels.finetune.objectives import ObjectiveOptions
    from scl_kernels.finetune.training_loop import TrainingOptions, load_model, train_and_evaluate

    tokenizer = _save_tokenizer_and_classifier(tmp_path / "model", architecture)
    texts = ["good film", "the film was great", "very good", "great great film",
             "bad film", "the film was awful", "very bad", "awful bad film"]
    labels = [1, 1, 1, 1, 0, 0, 0, 0]
    data = TextClassificationData(texts, labels, ["negative", "positive"])
    # One step over one batch of every example: the logged loss is that batch's, in any order.
    options = TrainingOptions(embedding=kind, batch_size=len(texts), max_steps=1, eval_every=1,
                              max_length=16, progress=False)
    run = train_and_evaluate(str(tmp_path / "model"), tokenizer, data, data, objective="scl",
                             seed=0, options=options,
                             objective_options=ObjectiveOptions(lam=0.6, temperature=0.2))
    model = load_model(str(tmp_path / "model"), 2).train()
    trainer = SupConTrainer(model=model, args=arguments(tmp_path, scl_lambda=0.6,
                                                        scl_temperature=0.2, scl_embedding=kind))
    batch = dict(tokenizer(texts, truncation=True, max_length=16, padding=True, return_tensors="pt"))
    loss = trainer.compute_loss(model, {**batch, "labels": torch.tensor(labels)})
    assert float(loss.detach()) == pytest.approx(run.history[0]["train_loss"], rel=1e-5)


class Recorder(transformers.TrainerCallback):
    """The RNG state and parameters at the start of the first step, the gradients before its
    optimizer step."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0 and not hasattr(self, "rng"):
            self.rng = torch.get_rng_state()
            self.model = copy.deepcopy(model)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not hasattr(self, "grads"):
            self.grads = [p.grad.clone() for p in model.parameters()]


def first_step(tmp_path, model, labels, loss_scale=None, **options):
    """Trains one step on ``labels`` as one batch; ``loss_scale`` makes the accelerator's
    backward scale the loss, as a mixed-precision gradient scaler does."""
    recorder = Recorder()
    args = arguments(tmp_path, per_device_train_batch_size=len(labels), max_steps=1, max_grad_norm=0.0,
                     train_sampling_strategy="sequential", **options)
    trainer = sgd_trainer(model, args, ListDataset(labels), callbacks=[recorder])
    if loss_scale is not None:
        trainer.accelerator.backward = lambda loss, **kwargs: (loss * loss_scale).backward()
    trainer.train()
    return recorder, trainer


LABELS = [0, 0, 1, 1, 2, 2, 1, 0]


@pytest.mark.parametrize("model_name, kind", [("roberta", "first_token"), ("bert", "head"), ("roberta", "mean")])
def test_gradient_cache_gives_the_uncached_gradients(tmp_path, model_name, kind):
    plain, _ = first_step(tmp_path, MODELS[model_name](), LABELS, scl_embedding=kind)
    cached, trainer = first_step(tmp_path, MODELS[model_name](), LABELS, scl_embedding=kind,
                                 gradient_cache_chunk_size=3)
    for got, want in zip(cached.grads, plain.grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    batch = examples(LABELS)
    with torch.no_grad():
        want_loss = trainer.criterion(*by_hand(plain.model.train(), batch, kind), batch["labels"])
    assert logged == [pytest.approx(float(want_loss), rel=1e-5)]


def test_gradient_cache_goes_through_the_accelerators_backward(tmp_path):
    """A loss scale in accelerator.backward (what fp16's gradient scaler does; on the CPU
    accelerate has none) reaches the parameters through the cache; bf16 autocast runs."""
    plain, _ = first_step(tmp_path, roberta(), LABELS)
    scaled, _ = first_step(tmp_path, roberta(), LABELS, loss_scale=1024.0, gradient_cache_chunk_size=3)
    for got, want in zip(scaled.grads, plain.grads):
        torch.testing.assert_close(got, 1024.0 * want, rtol=1e-4, atol=1e-3)
    # bf16 autocast: the same step up to bf16 rounding (chunks round differently)
    plain, _ = first_step(tmp_path, roberta(), LABELS, bf16=True)
    cached, _ = first_step(tmp_path, roberta(), LABELS, bf16=True, gradient_cache_chunk_size=3)
    plain, cached = torch.cat([g.flatten() for g in plain.grads]), torch.cat([g.flatten() for g in cached.grads])
    assert (cached - plain).norm() < 2e-3 * plain.norm()


def test_gradient_cache_replays_dropout(tmp_path):
    recorder, trainer = first_step(tmp_path, roberta(dropout=0.1), LABELS, gradient_cache_chunk_size=3)
    batch = examples(LABELS)

    def chunked_gradients(rng_state):
        model = copy.deepcopy(recorder.model).train()
        torch.set_rng_state(rng_state)
        parts = [by_hand(model, {k: v[i:i + 3] for k, v in batch.items()}, "first_token")
                 for i in range(0, len(LABELS), 3)]
        loss = trainer.criterion(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                                 batch["labels"])
        loss.backward()
        return [p.grad for p in model.parameters()]

    for got, want in zip(recorder.grads, chunked_gradients(recorder.rng)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    # the masks matter: another random state gives other gradients
    other = chunked_gradients(torch.Generator().manual_seed(123).get_state())
    assert not all(torch.allclose(g, o, atol=1e-6) for g, o in zip(recorder.grads, other))


@pytest.mark.parametrize("data", ["datasets", "torch"])
def test_samples_per_class_gives_class_balanced_batches(tmp_path, data):
    labels = [0] * 9 + [1] * 4 + [2] * 3
    train = hf_dataset(labels) if data == "datasets" else ListDataset(labels)
    args = arguments(tmp_path, per_device_train_batch_size=6, samples_per_class=2, max_steps=2)
    trainer = SupConTrainer(model=roberta(), args=args, train_dataset=train)
    loader = trainer.get_train_dataloader()
    assert isinstance(loader.batch_sampler, ClassBalancedBatchSampler)
    batches = list(loader)
    assert len(batches) == len(labels) // 6
    for batch in batches:
        counts = torch.bincount(batch["labels"], minlength=CLASSES)
        assert counts.tolist() == [2, 2, 2]
    trainer.train()
    assert trainer.state.global_step == 2


@pytest.mark.parametrize("option, value", [
    ("scl_lambda", 1.5), ("scl_lambda", -0.1), ("scl_lambda", "0.5"), ("scl_temperature", 0.0),
    ("scl_temperature", float("inf")), ("scl_reduction", "none"), ("scl_embedding", "cls"),
    ("gradient_cache_chunk_size", 0), ("gradient_cache_chunk_size", 2.5), ("samples_per_class", 1),
    ("samples_per_class", 8), ("label_smoothing_factor", 0.1)])
def test_bad_options_raise(tmp_path, option, value):
    name = "samples_per_class" if option == "samples_per_class" else option
    with pytest.raises(ValueError, match=name):
        arguments(tmp_path, **{option: value})


def test_bad_trainer_use_raises(tmp_path):
    plain = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(TypeError, match="SupConTrainingArguments"):
        SupConTrainer(model=roberta(), args=plain)
    with pytest.raises(ValueError, match="compute_loss_func"):
        SupConTrainer(model=roberta(), args=arguments(tmp_path), compute_loss_func=lambda *a, **k: 0)
    trainer = SupConTrainer(model=roberta(), args=arguments(tmp_path))
    batch = examples([0, 1])
    del batch["labels"]
    with pytest.raises(ValueError, match="labels"):
        trainer.compute_loss(trainer.model, batch)
    unlabeled = datasets.Dataset.from_dict({"input_ids": [[5, 6]] * 4, "attention_mask": [[1, 1]] * 4})
    trainer = SupConTrainer(model=roberta(), args=arguments(tmp_path, samples_per_class=2),
                            train_dataset=unlabeled)
    with pytest.raises(ValueError, match="label column"):
        trainer.get_train_dataloader()


def test_importing_the_packages_leaves_transformers_out():
    """The trainer loads on first use of its name (as at the top of this file), not before."""
    code = ("import sys, scl_kernels, scl_kernels.finetune; "
            "loaded = {'transformers', 'datasets', 'accelerate'} & set(sys.modules); "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)
