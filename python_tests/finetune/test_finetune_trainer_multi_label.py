"""SupConTrainer on tiny random multi-label classifiers (``config.problem_type =
"multi_label_classification"``, Hugging Face's float multi-hot labels): the training loss and its
parameter gradients are (1 - lam) * BCE + lam * multi-label SCL computed independently (the
float64 oracle), evaluation reports the BCE, a few steps of train() move the encoder, the problem
type is read from the labels where the config has none, and the options that need single labels
are refused."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments  # noqa: E402
from support.reference64 import supcon_reference64  # noqa: E402
from support.tiny_models import tiny_classifier  # noqa: E402

MULTI = "multi_label_classification"
CLASSES = 4
SEQ = 8
PAD = 1  # RoBERTa's
# Label sets with partial overlaps (where "any" and "jaccard" differ) and a row without a class.
LABEL_SETS = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1],
                           [0, 0, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.float32)


def multi_label_model(problem_type=MULTI, seed=0):
    return tiny_classifier("roberta", CLASSES, seed=seed, problem_type=problem_type)


def examples(targets, seed=0):
    """Token ids drawn around each row's lowest class (learnable), padded tails of random
    length, and the float multi-hot targets."""
    generator = torch.Generator().manual_seed(seed)
    n = targets.shape[0]
    input_ids = 3 + 20 * targets.argmax(1)[:, None] + torch.randint(0, 20, (n, SEQ), generator=generator)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=generator)
    attention_mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    return {"input_ids": input_ids.masked_fill(attention_mask == 0, PAD),
            "attention_mask": attention_mask, "labels": targets}


def hf_dataset(targets, seed=0):
    """A data set as Hugging Face's multi-label examples come: a column of float lists."""
    batch = examples(targets, seed)
    return datasets.Dataset.from_dict({key: value.tolist() for key, value in batch.items()})


def arguments(tmp_path, **options):
    defaults = dict(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no",
                    per_device_train_batch_size=8, per_device_eval_batch_size=16, logging_steps=1,
                    disable_tqdm=True, seed=0)
    return SupConTrainingArguments(**{**defaults, **options})


def independent_objective(model, batch, lam, temperature, rule):
    """(1 - lam) * BCEWithLogitsLoss + lam * multi-label SCL (float64 oracle) on the model's
    logits and first-token vectors, and the BCE alone."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                output_hidden_states=True)
    targets = batch["labels"]
    bce = torch.nn.BCEWithLogitsLoss()(out.logits, targets)
    scl = supcon_reference64(out.hidden_states[-1][:, 0], targets.bool(), temperature,
                             multi_label=rule)
    return (1 - lam) * bce + lam * scl, bce


def parameter_gradients(model, loss):
    parameters = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, parameters, allow_unused=True, materialize_grads=True)


@pytest.mark.parametrize("rule", ["any", "jaccard"])
def test_training_loss_and_gradients_are_bce_plus_multi_label_scl(tmp_path, rule):
    model = multi_label_model().train()
    args = arguments(tmp_path, scl_lambda=0.6, scl_temperature=0.2, scl_multi_label=rule)
    trainer = SupConTrainer(model=model, args=args)
    batch = examples(LABEL_SETS)

    loss = trainer.compute_loss(model, batch)
    want, bce = independent_objective(model, batch, 0.6, 0.2, rule)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    got_grads = parameter_gradients(model, loss)
    want_grads = parameter_gradients(model, want)
    for got, expected in zip(got_grads, want_grads):
        torch.testing.assert_close(got.double(), expected.double(), rtol=1e-4, atol=1e-6)
    encoder_grad = model.roberta.embeddings.word_embeddings.weight
    assert got_grads[[p is encoder_grad for p in model.parameters()].index(True)].abs().sum() > 0

    model.eval()  # evaluation: the classifier's BCE alone
    eval_loss = trainer.compute_loss(model, batch)
    torch.testing.assert_close(eval_loss, bce.detach(), rtol=1e-6, atol=1e-7)


def test_the_rules_give_different_objectives(tmp_path):
    model = multi_label_model().train()
    batch = examples(LABEL_SETS)
    losses = [SupConTrainer(model=model, args=arguments(tmp_path, scl_multi_label=rule)
                            ).compute_loss(model, batch) for rule in ("any", "jaccard")]
    assert not torch.isclose(*losses)


def test_a_config_without_problem_type_reads_float_labels_as_multi_label(tmp_path):
    """Hugging Face's models do the same: float labels are multi-label, integer ones classes."""
    model = multi_label_model(problem_type=None).train()
    trainer = SupConTrainer(model=model, args=arguments(tmp_path, scl_lambda=0.3))
    batch = examples(LABEL_SETS)
    want, _ = independent_objective(model, batch, 0.3, 0.3, "any")
    torch.testing.assert_close(trainer.compute_loss(model, batch).double(), want,
                               rtol=1e-5, atol=1e-6)


def test_gradient_cache_gives_the_uncached_loss(tmp_path):
    model = multi_label_model().train()
    batch = examples(LABEL_SETS)
    losses = [SupConTrainer(model=model, args=arguments(tmp_path, gradient_cache_chunk_size=chunk)
                            ).compute_loss(model, batch) for chunk in (None, 3)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)


def test_a_few_steps_of_train_move_the_encoder_and_evaluate_reports_bce(tmp_path):
    model = multi_label_model()
    before = model.roberta.embeddings.word_embeddings.weight.detach().clone()
    train = hf_dataset(torch.cat([LABEL_SETS, LABEL_SETS.flip(0)]))
    args = arguments(tmp_path, max_steps=3, learning_rate=1e-2, warmup_steps=0)
    trainer = SupConTrainer(model=model, args=args, train_dataset=train,
                            eval_dataset=hf_dataset(LABEL_SETS, seed=1))
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3 and all(torch.isfinite(torch.tensor(logged)))
    assert not torch.equal(model.roberta.embeddings.word_embeddings.weight, before)

    metrics = trainer.evaluate()
    model.eval()
    with torch.no_grad():
        _, bce = independent_objective(model, examples(LABEL_SETS, seed=1), 0.9, 0.3, "any")
    assert metrics["eval_loss"] == pytest.approx(float(bce), rel=1e-5)


def test_a_memory_keeps_multi_hot_rows(tmp_path):
    model = multi_label_model().train()
    trainer = SupConTrainer(model=model, args=arguments(tmp_path, supcon_memory_size=16))
    assert trainer.criterion.memory.num_classes == CLASSES
    trainer.compute_loss(model, examples(LABEL_SETS))
    _, stored = trainer.criterion.memory.contrast()
    assert torch.equal(stored, LABEL_SETS.bool())


def test_options_that_need_single_labels_are_refused(tmp_path):
    with pytest.raises(ValueError, match="samples_per_class balances single class labels"):
        SupConTrainer(model=multi_label_model(), args=arguments(tmp_path, samples_per_class=2))
    with pytest.raises(ValueError, match="problem_type must be None or one of"):
        SupConTrainer(model=multi_label_model(problem_type="regression"), args=arguments(tmp_path))
    with pytest.raises(ValueError, match="scl_multi_label must be one of"):
        arguments(tmp_path, scl_multi_label="all")
