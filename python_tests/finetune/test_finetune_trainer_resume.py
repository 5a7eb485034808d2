"""SupConTrainer's checkpoints hold the cross-batch memory: a run resumed from a checkpoint takes
the steps of the unbroken run (losses, parameters, memory), on a tiny dropout-free RoBERTa."""
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments  # noqa: E402
from support.tiny_models import tiny_classifier  # noqa: E402

SEQ = 8
# Three batches of 4 per epoch, each with positives; a memory of 6 rows wraps within two steps,
# so the write position, not only the rows, must survive the checkpoint.
LABELS = [0, 0, 1, 1, 2, 2, 0, 1, 1, 2, 2, 0]
MEMORY_ROWS = 6


class Examples(torch.utils.data.Dataset):
    def __init__(self, labels):
        generator = torch.Generator().manual_seed(0)
        self.labels = torch.tensor(labels)
        self.input_ids = 3 + 30 * self.labels[:, None] + torch.randint(0, 30, (len(labels), SEQ),
                                                                      generator=generator)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"input_ids": self.input_ids[index], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[index]}


def trainer(output_dir, max_steps, **options):
    defaults = dict(output_dir=str(output_dir), use_cpu=True, report_to=[], disable_tqdm=True,
                    seed=0, per_device_train_batch_size=4, max_steps=max_steps, logging_steps=1,
                    learning_rate=1e-2, lr_scheduler_type="constant", warmup_steps=0,
                    save_strategy="steps", save_steps=2, supcon_memory_size=MEMORY_ROWS)
    args = SupConTrainingArguments(**{**defaults, **options})
    return SupConTrainer(model=tiny_classifier("roberta", 3), args=args,
                         train_dataset=Examples(LABELS))


def losses(trainer):
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def test_a_resumed_run_continues_the_unbroken_one(tmp_path):
    unbroken = trainer(tmp_path / "unbroken", max_steps=5)
    unbroken.train()
    checkpoint = tmp_path / "unbroken" / "checkpoint-2"  # mid-epoch, memory full and wrapped
    saved = torch.load(checkpoint / "supcon_memory.pt", weights_only=True)
    assert int(saved["filled"]) == MEMORY_ROWS and int(saved["next_slot"]) == 8 % MEMORY_ROWS

    resumed = trainer(tmp_path / "resumed", max_steps=5)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    want, got = losses(unbroken), losses(resumed)  # the resumed history starts with the saved one
    assert sorted(got) == [1, 2, 3, 4, 5]
    # Step 3 contrasts against the memory of steps 1 and 2: an empty memory gives another loss.
    assert [got[step] for step in (3, 4, 5)] == pytest.approx([want[step] for step in (3, 4, 5)],
                                                              rel=1e-6)
    for (name, p), q in zip(resumed.model.named_parameters(), unbroken.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)
    for name, buffer in unbroken.criterion.memory.state_dict().items():
        assert torch.equal(resumed.criterion.memory.state_dict()[name], buffer), name


def test_a_checkpoint_without_memory_warns_and_starts_empty(tmp_path):
    """A checkpoint saved without the memory (an earlier version's) resumes with an empty one,
    saying so, and its steps then differ from the unbroken run's."""
    unbroken = trainer(tmp_path / "unbroken", max_steps=3, save_steps=2)
    unbroken.train()
    checkpoint = tmp_path / "unbroken" / "checkpoint-2"
    os.remove(checkpoint / "supcon_memory.pt")
    resumed = trainer(tmp_path / "resumed", max_steps=3)
    with pytest.warns(UserWarning, match="empty memory"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert losses(resumed)[3] != pytest.approx(losses(unbroken)[3], rel=1e-4)


def test_memory_files_follow_the_checkpoint_options(tmp_path):
    """save_only_model checkpoints cannot be resumed and hold no memory; a run without a memory
    writes none; a checkpoint's memory of another size is refused on resume."""
    only_model = trainer(tmp_path / "only_model", max_steps=2, save_only_model=True)
    only_model.train()
    assert not (tmp_path / "only_model" / "checkpoint-2" / "supcon_memory.pt").exists()
    without = trainer(tmp_path / "without", max_steps=2, supcon_memory_size=0)
    without.train()
    assert (tmp_path / "without" / "checkpoint-2" / "optimizer.pt").exists()
    assert not (tmp_path / "without" / "checkpoint-2" / "supcon_memory.pt").exists()

    with_memory = trainer(tmp_path / "with_memory", max_steps=2)
    with_memory.train()
    larger = trainer(tmp_path / "larger", max_steps=3, supcon_memory_size=2 * MEMORY_ROWS)
    with pytest.raises(ValueError, match="supcon_memory_size"):
        larger.train(resume_from_checkpoint=str(tmp_path / "with_memory" / "checkpoint-2"))
