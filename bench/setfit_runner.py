"""One SetFit run (Tunstall et al. 2022; the ``setfit`` package, 1.2) for bench.fewshot: a
sentence-transformers body tuned on contrastive pairs of the training examples, then a
logistic-regression head, scored on the test set like the fine-tuning CLI's runs.

SetFit's own defaults are kept (batch 16, one epoch over its "oversampling" pairs, body learning
rate 2e-5, cosine-similarity loss, scikit-learn's LogisticRegression head); only the maximum
length is set, to the CLI's 64 tokens, so both see the same text.
"""
import tempfile
import time
from dataclasses import dataclass

import torch

from scl_kernels.finetune.calibration import expected_calibration_error

SETFIT_BATCH_SIZE = 16
SETFIT_EPOCHS = 1


@dataclass
class SetFitResult:
    """What one SetFit run measured.

    Attributes:
        accuracy, macro_f1, ece: on the test set (fractions; ECE over the largest probability of
            the head's ``predict_proba``, 15 bins, as the CLI's runs).
        seconds: wall time: loading the model, training the body and the head, predicting.
        encoded_examples: examples passed through the encoder: both sides of every training
            pair, the training examples again for the head, and the test examples.
        pairs: the contrastive pairs SetFit trained the body on.
    """
    accuracy: float
    macro_f1: float
    ece: float
    seconds: float
    encoded_examples: int
    pairs: int


class _EncodedExamples:
    """Counts the rows of every batch that enters a module (the body's first module, the
    transformer), in training and in prediction alike."""

    def __init__(self, module):
        self.count = 0
        self._handle = module.register_forward_pre_hook(self._seen)

    def _seen(self, module, args):
        self.count += int(args[0]["input_ids"].shape[0])

    def remove(self):
        self._handle.remove()


def run_setfit(model_path, train, test, *, seed, max_length=64, num_iterations=None,
               progress=False):
    """Trains SetFit from the sentence-transformers folder ``model_path`` on ``train`` and scores
    it on ``test``.

    Args:
        model_path: a local sentence-transformers model folder (modules.json beside the weights).
        train, test: :class:`~scl_kernels.finetune.data.TextClassificationData`.
        seed: SetFit's seed (pair sampling, the body's dropout and batch order).
        max_length: tokens per text.
        num_iterations: SetFit's ``num_iterations`` (pairs per example, replacing its
            oversampling); None keeps SetFit's default.
        progress: show SetFit's progress bars.

    Returns:
        A :class:`SetFitResult`.
    """
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments
    from sklearn.metrics import f1_score

    started = time.perf_counter()
    model = SetFitModel.from_pretrained(model_path)
    model.model_body.max_seq_length = max_length
    counter = _EncodedExamples(model.model_body[0])
    try:
        # Whatever the trainer underneath writes to its output_dir goes to a throw-away folder,
        # not the working directory.
        with tempfile.TemporaryDirectory(prefix="setfit_") as scratch:
            arguments = TrainingArguments(
                output_dir=scratch, batch_size=SETFIT_BATCH_SIZE, num_epochs=SETFIT_EPOCHS,
                num_iterations=num_iterations, max_length=max_length, seed=seed,
                report_to="none", save_strategy="no", show_progress_bar=progress)
            trainer = Trainer(model=model, args=arguments,
                              train_dataset=Dataset.from_dict({"text": list(train.texts),
                                                               "label": list(train.labels)}))
            trainer.train()
            pairs = len(trainer.st_trainer.train_dataset)
        probabilities = torch.as_tensor(model.predict_proba(list(test.texts), as_numpy=True),
                                        dtype=torch.float64)
    finally:
        counter.remove()
    top = probabilities.max(dim=1)
    # The head's columns follow its classes_, the training labels in sorted order.
    classes = torch.as_tensor(model.model_head.classes_)
    predictions = classes[top.indices]
    labels = torch.tensor(test.labels)
    correct = predictions == labels
    return SetFitResult(
        accuracy=correct.double().mean().item(),
        macro_f1=float(f1_score(test.labels, predictions.tolist(), average="macro",
                                labels=list(range(len(test.label_names))), zero_division=0)),
        ece=expected_calibration_error(top.values, correct),
        seconds=time.perf_counter() - started,
        encoded_examples=counter.count,
        pairs=pairs)
