"""The cross-batch memory in the fine-tuning objectives, the command line and the Hugging Face
Trainer: its size and dim come from the options and the model, it fills as training goes, and
options that cannot use it are refused with one-line errors."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from scl_kernels.finetune import cli  # noqa: E402
from scl_kernels.finetune.data import InputError  # noqa: E402
from scl_kernels.finetune.objectives import ObjectiveOptions, build_criterion, describe  # noqa: E402
from support.tiny_models import tiny_classifier  # noqa: E402

CRITERION = dict(embedding="first_token", total_steps=10, seed=0)


def test_scl_gets_a_memory_of_the_models_hidden_size():
    model = tiny_classifier("bert", 2)
    options = ObjectiveOptions(memory_size=48)
    criterion = build_criterion("scl", options, model=model, **CRITERION)
    assert criterion.memory.size == 48 and criterion.memory.dim == model.config.hidden_size
    assert len(criterion.memory) == 0
    assert "memory 48" in describe("scl", options)
    assert build_criterion("scl", ObjectiveOptions(), model=model, **CRITERION).memory is None


@pytest.mark.parametrize("objective", ["ce", "core", "focal", "dice", "mixed-ce"])
def test_objectives_without_scl_refuse_a_memory(objective):
    with pytest.raises(InputError, match=f"applies to the objectives scl only, not '{objective}'"):
        build_criterion(objective, ObjectiveOptions(memory_size=8), model=tiny_classifier("bert", 2),
                        **CRITERION)


@pytest.mark.parametrize("extra, message", [
    (["--memory-size", "-1"], "--memory-size must be >= 0, got -1"),
    (["--memory-size", "64", "--objectives", "ce,scl"],
     "--memory-size applies to --objectives scl with --scl-strategy gather only"),
    (["--memory-size", "64", "--objectives", "scl", "--scl-strategy", "ring"],
     "--memory-size applies to --objectives scl with --scl-strategy gather only"),
])
def test_command_line_refuses_bad_memory_options(capsys, extra, message):
    assert cli.main(extra) == 2  # checked before any data or model is loaded
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def _trainer(tmp_path, **options):
    pytest.importorskip("datasets")
    from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments
    args = SupConTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                   save_strategy="no", per_device_train_batch_size=4,
                                   disable_tqdm=True, seed=0, **options)
    generator = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 1, 2] * 4)
    input_ids = 3 + 30 * labels[:, None] + torch.randint(0, 30, (12, 8), generator=generator)
    import datasets
    train = datasets.Dataset.from_dict({"input_ids": input_ids.tolist(),
                                        "attention_mask": torch.ones(12, 8).long().tolist(),
                                        "label": labels.tolist()})
    return SupConTrainer(model=tiny_classifier("roberta", 3), args=args, train_dataset=train)


def test_trainer_fills_its_memory_while_training(tmp_path):
    trainer = _trainer(tmp_path, supcon_memory_size=10, max_steps=2, gradient_cache_chunk_size=3)
    memory = trainer.criterion.memory
    assert memory.dim == trainer.model.config.hidden_size and len(memory) == 0
    result = trainer.train()
    assert len(memory) == 8  # two batches of 4 through the gradient cache, each enqueued once
    assert 0 < result.training_loss < float("inf")


@pytest.mark.parametrize("options, match", [
    (dict(supcon_memory_size=-1), "supcon_memory_size must be None or an int >= 0"),
    (dict(supcon_memory_size=8, scl_lambda=0.0), "supcon_memory_size needs scl_lambda > 0"),
])
def test_trainer_refuses_bad_memory_options(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, **options)
