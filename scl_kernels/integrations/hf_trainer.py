"""A Hugging Face ``Trainer`` that fine-tunes a sequence classifier with cross-entropy plus SupCon.

The objective is Gunel et al. (ICLR 2021), ``(1 - lam) * CE + lam * SCL`` on a sentence embedding
taken from the classifier's own forward pass (:func:`~scl_kernels.integrations.sentence_embedding`),
computed by :class:`~scl_kernels.nn.SupConCrossEntropyLoss`; for a model whose
``config.problem_type`` is ``"multi_label_classification"``, ``(1 - lam) * BCE + lam * SCL`` with
multi-label positives. Optional: class-balanced batches
(:class:`~scl_kernels.sampling.ClassBalancedBatchSampler`) and a gradient cache
(:class:`~scl_kernels.grad_cache.GradientCache`) for contrastive batches larger than the encoder's
activations would allow.
"""
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils.import_utils import is_datasets_available

from .._types import MultiLabel, SclReduction, Strategy
from .._validation import MULTI_LABEL_RULES
from ..distributed import STRATEGIES
from ..grad_cache import GradientCache
from ..nn import SCL_REDUCTIONS, SupConCrossEntropyLoss, SupConMemory
from ..nn._classification_targets import MULTI_LABEL, PROBLEM_TYPES, ProblemType
from ..sampling import ClassBalancedBatchSampler
from .embeddings import EMBEDDINGS, classifier_logits, sentence_embedding

# Where a data set keeps its class labels: the Trainer's name and the two that its data collators
# rename to it.
_LABEL_COLUMNS = ("labels", "label", "label_ids")
# The cross-batch memory's file in a checkpoint folder, beside the optimizer's; "{}" is the
# process index where each process holds a memory of its own.
MEMORY_NAME = "supcon_memory.pt"
PROCESS_MEMORY_NAME = "supcon_memory_{}.pt"


def _check_optional_int(value: object, name: str, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be None or an int >= {minimum}, got {value!r}")


@dataclass
class SupConTrainingArguments(TrainingArguments):
    """[`~transformers.TrainingArguments`] plus the options of the supervised contrastive term.

    The training loss is ``(1 - scl_lambda) * CE + scl_lambda * SCL`` (Gunel et al., ICLR 2021),
    where SCL is the supervised contrastive loss of each training batch on the sentence
    embeddings picked by ``scl_embedding``.

    Args:
        scl_lambda (`float`, *optional*, defaults to 0.9):
            Weight of the contrastive term, in [0, 1]: 0 is plain cross-entropy, 1 plain SCL.
        scl_temperature (`float`, *optional*, defaults to 0.3):
            Temperature of the contrastive softmax (positive).
        scl_reduction (`str`, *optional*, defaults to `"mean"`):
            `"mean"`: SCL averaged over the anchors that have a positive (most re-implementations;
            ``scl_lambda`` is independent of the batch size). `"sum"`: the paper's formula, a sum
            over anchors, whose effective weight grows with the batch size.
        scl_embedding (`str`, *optional*, defaults to `"first_token"`):
            The vector SCL sees, from the last layer: `"first_token"` ([CLS] / ``<s>``, the
            paper's), `"mean"` (attention-masked mean of the tokens) or `"head"` (the
            classification head's dense + tanh, or the pooler of BERT-style models). See
            [`~scl_kernels.integrations.sentence_embedding`]. The classifier reads the same
            vector ([`~scl_kernels.integrations.classifier_logits`], as ``scl-finetune
            --embedding``): with `"mean"` its logits, in training, evaluation and ``predict()``,
            are those of its head on the mean, not of the model's forward.
        gradient_cache_chunk_size (`int`, *optional*):
            Encode each training batch in chunks of this many examples through a gradient cache:
            the contrastive set is the whole batch while the encoder holds one chunk's
            activations. Costs a second forward pass. `None` (default): off.
        samples_per_class (`int`, *optional*):
            Draw training batches with
            [`~scl_kernels.sampling.ClassBalancedBatchSampler`]: every batch holds at least this
            many examples (>= 2) of each of its classes, so every anchor has a positive. `None`
            (default): the Trainer's ordinary sampling.
        scl_global_batch (`bool`, *optional*, defaults to `True`):
            In distributed training (several processes, e.g. under `torchrun` or
            `accelerate launch`), SCL contrasts the *global* batch: the training batches of all
            processes together, ``per_device_train_batch_size * world_size`` examples, through
            [`scl_kernels.distributed.supcon_loss`]; the update then equals that of one process
            on the global batch. `False`: each process's batch is its own contrastive set.
            Ignored in a single process. A multi-label model's multi-hot labels are gathered
            with the embeddings, and the global batch's SCL weighs its pairs by
            `scl_multi_label`, as one process would (the `"gather"` strategy).
        scl_distributed_strategy (`str`, *optional*, defaults to `"gather"`):
            How the global batch is contrasted: `"gather"` (each process gathers every
            process's embeddings) or `"ring"` (they pass around the processes in blocks; less
            memory per process, more messages). The ring cannot weigh multi-hot labels: the
            Trainer refuses it for a multi-label model at construction, or, where the config has
            no ``problem_type``, at the first training step of multi-hot labels. See
            docs/DISTRIBUTED.md.
        supcon_memory_size (`int`, *optional*, defaults to 0):
            Rows of a cross-batch memory ([`~scl_kernels.nn.SupConMemory`], XBM): SCL also
            contrasts each training batch against the last this many training embeddings (under
            `scl_global_batch`, of the global batches; needs `scl_lambda` > 0 and the `"gather"`
            strategy). Each checkpoint holds the memory (``supcon_memory.pt`` beside the
            optimizer's state, one ``supcon_memory_{process}.pt`` per process when each process
            contrasts its own batch), and ``train(resume_from_checkpoint=...)`` restores it.
            0 (default): none. See docs/FINETUNING.md.
        scl_multi_label (`str`, *optional*, defaults to `"any"`):
            For a model with ``config.problem_type = "multi_label_classification"`` (multi-hot
            float labels, binary cross-entropy): how SCL weighs a pair of examples. `"any"`: a
            pair that shares a class is a positive; `"jaccard"`: weighted by the Jaccard
            similarity of their label sets (docs/MATH.md section 11); under `scl_global_batch`,
            over the pairs of the global batch. Unread for class labels.
    """

    scl_lambda: float = field(
        default=0.9, metadata={"help": "Weight of the supervised contrastive term, in [0, 1]."})
    scl_temperature: float = field(
        default=0.3, metadata={"help": "Temperature of the supervised contrastive term."})
    scl_reduction: SclReduction = field(
        default="mean", metadata={"help": "Reduction of SCL over anchors: 'mean' or 'sum' (the paper's).",
                                  "choices": list(SCL_REDUCTIONS)})
    scl_embedding: str = field(
        default="first_token", metadata={"help": "Sentence embedding SCL sees.", "choices": list(EMBEDDINGS)})
    gradient_cache_chunk_size: int | None = field(
        default=None, metadata={"help": "Examples per encoder pass of the gradient cache (None: off)."})
    samples_per_class: int | None = field(
        default=None, metadata={"help": "Class-balanced batches with this many examples per class (None: off)."})
    scl_global_batch: bool = field(
        default=True, metadata={"help": "In distributed training, SCL contrasts the batches of all "
                                        "processes together (False: each process's batch on its own)."})
    scl_distributed_strategy: Strategy = field(
        default="gather", metadata={"help": "How SCL contrasts the global batch: 'gather' or 'ring'.",
                                    "choices": list(STRATEGIES)})
    supcon_memory_size: int = field(
        default=0, metadata={"help": "Rows of a cross-batch memory of past training embeddings that "
                                     "SCL also contrasts against (0: none)."})
    scl_multi_label: MultiLabel = field(
        default="any", metadata={"help": "Multi-label models: how SCL weighs a pair of label sets, "
                                         "'any' shared class or 'jaccard'.",
                                 "choices": list(MULTI_LABEL_RULES)})

    def __post_init__(self) -> None:
        if isinstance(self.scl_lambda, bool) or not isinstance(self.scl_lambda, Real) or not (
                math.isfinite(self.scl_lambda) and 0.0 <= self.scl_lambda <= 1.0):
            raise ValueError(f"scl_lambda must be a number in [0, 1], got {self.scl_lambda!r}")
        if isinstance(self.scl_temperature, bool) or not isinstance(self.scl_temperature, Real) or not (
                math.isfinite(self.scl_temperature) and self.scl_temperature > 0):
            raise ValueError(f"scl_temperature must be a positive finite number, got {self.scl_temperature!r}")
        if self.scl_reduction not in SCL_REDUCTIONS:
            raise ValueError(f"scl_reduction must be one of {SCL_REDUCTIONS}, got {self.scl_reduction!r}")
        if self.scl_embedding not in EMBEDDINGS:
            raise ValueError(f"scl_embedding must be one of {EMBEDDINGS}, got {self.scl_embedding!r}")
        _check_optional_int(self.gradient_cache_chunk_size, "gradient_cache_chunk_size", 1)
        _check_optional_int(self.samples_per_class, "samples_per_class", 2)
        if self.samples_per_class is not None and self.per_device_train_batch_size < self.samples_per_class:
            raise ValueError(f"per_device_train_batch_size ({self.per_device_train_batch_size}) must be at "
                             f"least samples_per_class ({self.samples_per_class})")
        if not isinstance(self.scl_global_batch, bool):
            raise ValueError(f"scl_global_batch must be a bool, got {self.scl_global_batch!r}")
        if self.scl_distributed_strategy not in STRATEGIES:
            raise ValueError(f"scl_distributed_strategy must be one of {STRATEGIES}, got "
                             f"{self.scl_distributed_strategy!r}")
        _check_optional_int(self.supcon_memory_size, "supcon_memory_size", 0)
        if self.scl_multi_label not in MULTI_LABEL_RULES:
            raise ValueError(f"scl_multi_label must be one of {MULTI_LABEL_RULES}, got "
                             f"{self.scl_multi_label!r}")
        if self.supcon_memory_size and self.scl_lambda == 0:
            raise ValueError("supcon_memory_size needs scl_lambda > 0: with scl_lambda = 0 there is "
                             "no contrastive term to use the memory")
        if self.label_smoothing_factor != 0:
            raise ValueError("label_smoothing_factor is not supported with the SupCon objective "
                             f"(got {self.label_smoothing_factor}); leave it at 0")
        super().__post_init__()


def _is_hf_dataset(dataset: object) -> bool:
    if not is_datasets_available():
        return False
    import datasets
    return isinstance(dataset, datasets.Dataset)


def _dataset_labels(dataset: Any) -> list[int]:
    """The class label of every example of ``dataset``, in its index order."""
    if _is_hf_dataset(dataset):  # read the column, not every row
        for name in _LABEL_COLUMNS:
            if name in dataset.column_names:
                return list(dataset[name])
        raise ValueError(f"samples_per_class needs a label column ({' or '.join(_LABEL_COLUMNS)}) in the "
                         f"training data set, whose columns are {dataset.column_names}")
    labels = []
    for index in range(len(dataset)):
        example = dataset[index]
        column = next((n for n in _LABEL_COLUMNS if n in example), None) if hasattr(example, "keys") else None
        if column is None:
            raise ValueError("samples_per_class needs every training example to be a mapping with a "
                             f"label ({' or '.join(_LABEL_COLUMNS)}); example {index} is {type(example).__name__}")
        labels.append(int(example[column]))
    return labels


class SupConTrainer(Trainer):
    """[`~transformers.Trainer`] that fine-tunes a ``*ForSequenceClassification`` model with
    ``(1 - lam) * CE + lam * SCL`` (Gunel et al., ICLR 2021).

    Takes the arguments of [`~transformers.Trainer`]; ``args`` must be a
    [`SupConTrainingArguments`] (default: one with ``output_dir="trainer_output"``). Examples need
    labels (a ``label`` or ``labels`` column): integer classes, or, as Hugging Face's models take
    them for ``config.problem_type = "multi_label_classification"``, multi-hot float rows.

    Conventions:

    * **Contrastive set.** Each training batch (``per_device_train_batch_size`` examples) is one
      contrastive set, as in the paper. Gradient accumulation over ``k`` batches averages the
      ``k`` per-batch losses (the update equals that of the mean of the ``k`` losses); it does
      *not* enlarge the contrastive set. To contrast more examples per step, raise the batch size
      and set ``gradient_cache_chunk_size`` so that memory stays that of one chunk.
    * **Several processes.** Under ``torchrun`` / ``accelerate launch`` (DDP), SCL contrasts the
      global batch, ``per_device_train_batch_size * world_size`` examples (unless
      ``scl_global_batch=False``), while cross-entropy is each process's mean; DDP's gradient
      average then makes the update that of one process on the global batch. The gradient cache
      composes with it: each process re-encodes its own chunks, and gradients are all-reduced
      once per batch, not per chunk.
    * **Logged loss.** The training loss logged is the mean per-batch objective, whatever
      ``gradient_accumulation_steps`` is.
    * **Evaluation.** ``evaluate()`` reports the plain cross-entropy of the classifier as
      ``eval_loss`` (comparable across ``scl_lambda`` values and independent of how the
      evaluation set is batched); ``predict()`` returns the logits ``[N, num_labels]``. Hidden
      states never reach ``predict()`` or ``compute_metrics``.
    * **One sentence vector.** The classifier reads the vector SCL sees, as ``scl-finetune
      --embedding`` does: with ``scl_embedding="mean"`` its logits, in training and evaluation,
      come from its head applied to the mean over tokens
      ([`~scl_kernels.integrations.classifier_logits`]), not from the model's own forward.
    * **Checkpoints.** The cross-batch memory (``supcon_memory_size``) is saved in every
      resumable checkpoint, beside the optimizer's state, and restored by
      ``train(resume_from_checkpoint=...)``: a resumed run continues as an unbroken one would.
    * **Multi-label models.** With ``model.config.problem_type = "multi_label_classification"``
      the objective is ``(1 - lam) * BCE + lam * SCL``: binary cross-entropy with logits (the
      mean over examples and classes, as the model's own loss) and SCL with multi-label
      positives weighed by ``args.scl_multi_label``; ``eval_loss`` is the BCE. As in Hugging
      Face's models, a config without a ``problem_type`` reads it from each batch: float
      ``[N, C]`` labels are multi-label, integer ``[N]`` ones single-label. The cross-batch
      memory then keeps multi-hot rows; class-balanced batches (``samples_per_class``) need
      single labels; ``"regression"`` is refused. With several processes SCL contrasts the
      global batch's multi-hot rows through the ``"gather"`` strategy (``"ring"`` is refused).

    Attributes:
        criterion ([`~scl_kernels.nn.SupConCrossEntropyLoss`]): the training objective.

    Example:

    ```python
    args = SupConTrainingArguments(output_dir="out", per_device_train_batch_size=16,
                                   scl_lambda=0.9, scl_temperature=0.3, samples_per_class=2)
    trainer = SupConTrainer(model=model, args=args, train_dataset=train, eval_dataset=dev)
    trainer.train()
    ```
    """

    args: SupConTrainingArguments

    # transformers >= 5: the loss of compute_loss is a per-batch mean, which the Trainer must
    # divide by the number of accumulated batches (it assumes models that take **kwargs already
    # did, which doubled the loss at gradient_accumulation_steps=2).
    loss_is_scaled_for_ga = False

    def __init__(self, model: nn.Module | None = None, args: SupConTrainingArguments | None = None,
                 **kwargs: Any) -> None:
        """
        Args:
            model: the ``*ForSequenceClassification`` model (or use ``model_init``).
            args ([`SupConTrainingArguments`], *optional*): the training arguments.
            **kwargs: the other arguments of [`~transformers.Trainer`] (``train_dataset``,
                ``eval_dataset``, ``data_collator``, ``compute_metrics``, ``optimizers``, ...);
                ``compute_loss_func`` is not accepted, the loss is the SupCon objective.

        Raises:
            TypeError: ``args`` is not a [`SupConTrainingArguments`].
            ValueError: ``compute_loss_func`` given, a gradient cache asked for with DeepSpeed,
                a ``config.problem_type`` that is no classification, or a multi-label model with
                an option that needs single labels (``samples_per_class``) or with the ring
                strategy of the global batch.
        """
        if args is None:
            args = SupConTrainingArguments(output_dir="trainer_output")
        if not isinstance(args, SupConTrainingArguments):
            raise TypeError("args must be a SupConTrainingArguments (it carries the scl_* options), got "
                            f"{type(args).__name__}")
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError("SupConTrainer computes its own loss: compute_loss_func is not supported")
        super().__init__(model=model, args=args, **kwargs)
        # transformers 4.46 - 4.5x: the only switch that makes the Trainer divide a per-batch loss
        # by gradient_accumulation_steps (and not count num_items_in_batch for it).
        self.model_accepts_loss_kwargs = False
        if args.gradient_cache_chunk_size is not None and self.is_deepspeed_enabled:
            raise ValueError("gradient_cache_chunk_size is not supported with DeepSpeed, whose backward "
                             "pass also steps the optimizer")
        problem_type = self._problem_type()
        distributed = self._contrasts_global_batch()
        self._check_strategy_takes_labels(distributed, multi_hot=problem_type == MULTI_LABEL)
        self.criterion = SupConCrossEntropyLoss(
            lam=args.scl_lambda, temperature=args.scl_temperature, scl_reduction=args.scl_reduction,
            distributed=distributed,
            strategy=args.scl_distributed_strategy if distributed else "gather",
            memory=self._memory(problem_type), problem_type=problem_type,
            multi_label=args.scl_multi_label)

    def _problem_type(self) -> ProblemType | None:
        """The model's ``config.problem_type`` (None where unset: each batch's labels say), with
        the options that need single labels refused for a multi-label model."""
        problem_type: object = getattr(getattr(self.model, "config", None), "problem_type", None)
        if problem_type is None:
            return None
        if problem_type not in PROBLEM_TYPES:
            raise ValueError(f"SupConTrainer trains classifiers: model.config.problem_type must be "
                             f"None or one of {PROBLEM_TYPES}, got {problem_type!r}")
        if problem_type == MULTI_LABEL and self.args.samples_per_class is not None:
            raise ValueError("samples_per_class balances single class labels; this model's "
                             "config.problem_type is 'multi_label_classification'")
        return cast(ProblemType, problem_type)

    def _memory(self, problem_type: ProblemType | None) -> SupConMemory | None:
        """The cross-batch memory of ``args.supcon_memory_size`` rows (None for 0), of the
        model's hidden size (every ``scl_embedding`` has it), on the training device; for a
        multi-label model it keeps multi-hot rows of ``config.num_labels`` classes."""
        if not self.args.supcon_memory_size:
            return None
        config = getattr(self.model, "config", None)
        dim = getattr(config, "hidden_size", None)
        if not isinstance(dim, int):
            raise ValueError("supcon_memory_size needs the embeddings' size, read from "
                             "model.config.hidden_size, which this model does not have")
        num_classes = getattr(config, "num_labels", None) if problem_type == MULTI_LABEL else None
        return SupConMemory(self.args.supcon_memory_size, dim, num_classes=num_classes,
                            device=self.args.device)

    def _contrasts_global_batch(self) -> bool:
        """Whether SCL contrasts the batches of all processes: a distributed run (more than one
        process in an initialised process group) with ``scl_global_batch``."""
        if not self.args.scl_global_batch or self.args.world_size <= 1:
            return False
        if not (dist.is_available() and dist.is_initialized()):
            # TPU / XLA and SageMaker model parallelism run several processes without a
            # torch.distributed group that scl_kernels.distributed can use.
            raise ValueError(f"scl_global_batch needs a torch.distributed process group for its "
                             f"{self.args.world_size} processes (torchrun / accelerate launch with "
                             "DDP or FSDP); set scl_global_batch=False to contrast each process's "
                             "batch on its own")
        config = getattr(self.args, "parallelism_config", None)
        replicated = ("tp_size", "cp_size", "sp_size")  # ranks that share their examples
        if config is not None and any((getattr(config, name, None) or 1) > 1 for name in replicated):
            raise ValueError("scl_global_batch contrasts the batches of all processes of the world, "
                             "which tensor / context / sequence parallelism replicates across ranks; "
                             "set scl_global_batch=False")
        return True

    def _check_strategy_takes_labels(self, distributed: bool, multi_hot: bool) -> None:
        """Refuses the ring strategy for multi-hot labels, before any process communicates: at
        construction for a ``multi_label_classification`` model, at the first training step
        where the config has no ``problem_type`` and the labels are multi-hot rows (every
        process reads its own batch's labels, of one form in one data set)."""
        if distributed and multi_hot and self.args.scl_distributed_strategy == "ring":
            raise ValueError("scl_distributed_strategy='ring' cannot contrast the multi-hot labels "
                             "of a multi-label model (the ring's blocks do not give multi-label "
                             "pair weights, docs/DISTRIBUTED.md): use "
                             "scl_distributed_strategy='gather' (the default) or "
                             "scl_global_batch=False")

    @staticmethod
    def _pop_labels(inputs: Mapping[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
        inputs = dict(inputs)
        labels = inputs.pop("labels", None)
        if labels is None:
            raise ValueError("SupConTrainer needs labels in every batch (a 'label' or 'labels' "
                             f"column); the batch has {sorted(inputs)}")
        return inputs, labels

    def _logits_and_embeddings(self, model: nn.Module, inputs: Mapping[str, Any]
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The embeddings SCL sees and the logits of the classifier on them
        (:func:`~scl_kernels.integrations.classifier_logits`, as the command line's)."""
        kind = self.args.scl_embedding
        outputs = model(**inputs, output_hidden_states=True)
        unwrapped = self.accelerator.unwrap_model(model)
        embeddings = sentence_embedding(unwrapped, outputs, inputs.get("attention_mask"), kind)
        return classifier_logits(unwrapped, outputs, embeddings, kind), embeddings

    def _evaluation_logits(self, model: nn.Module, inputs: Mapping[str, Any]) -> torch.Tensor:
        """The logits of the classifier that training trains. Hidden states are requested only
        where it reads the mean over tokens, and never returned, so they never reach
        ``predict()``."""
        if self.args.scl_embedding == "mean":
            return self._logits_and_embeddings(model, inputs)[0]
        logits: torch.Tensor = model(**inputs).logits
        return logits

    def compute_loss(self, model: nn.Module, inputs: Mapping[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None, **kwargs: Any
                     ) -> torch.Tensor | tuple[torch.Tensor, SequenceClassifierOutput]:
        """The SupCon objective of a training batch, or the cross-entropy of an evaluation batch.

        The logits are those of the classifier on the ``scl_embedding`` vector (see
        [`SupConTrainingArguments`]), so cross-entropy and SCL train one sentence vector.

        With ``args.gradient_cache_chunk_size``, a training batch goes through the gradient cache
        (:meth:`~scl_kernels.grad_cache.GradientCache.loss`): its chunks are encoded without a
        graph here, and the Trainer's backward pass of the returned loss
        (``accelerator.backward``, after the gradient-accumulation scaling and with any
        mixed-precision loss scaling) encodes each chunk again, with the same dropout masks,
        and sends the loss's gradient into the parameters. The parameter gradients are those of
        the uncached batch; the encoder holds one chunk's activations at a time.

        Args:
            model (`nn.Module`): the (possibly wrapped) model.
            inputs (`dict[str, torch.Tensor]`): the batch, with ``labels``: integer classes, or
                multi-hot rows for a multi-label model.
            return_outputs (`bool`, *optional*, defaults to `False`): also return the logits.
            num_items_in_batch (*optional*): ignored: the objective is a per-batch mean (see the
                class docstring); accepted for the Trainer's signature.
            **kwargs: ignored, for other transformers versions' signatures.

        In distributed training with ``args.scl_global_batch`` the SCL term is the global
        batch's (every process must call this for its training batch, as the Trainer does); the
        cross-entropy term is this process's batch mean.

        Returns:
            The 0-dim loss, or ``(loss, outputs)`` with the logits alone in ``outputs``. In
            training mode the loss is ``criterion(logits, embeddings, labels)``, in evaluation
            mode the classification term alone, ``criterion.classification_loss(logits,
            labels)``: ``F.cross_entropy(logits, labels)``, or for multi-label models
            ``F.binary_cross_entropy_with_logits(logits, labels)``.

        Raises:
            ValueError: a label is no class of the logits (outside ``[0, num_labels)`` and not
                -100), naming its value and row, or a multi-hot value is neither 0 nor 1, as the
                criterion says; multi-hot labels in a training step with the ring strategy of
                the global batch (a config without a ``problem_type``).
        """
        inputs, labels = self._pop_labels(inputs)
        if model.training and self.criterion.problem_type is None:  # the labels' form says
            multi_hot = isinstance(labels, torch.Tensor) and labels.dim() == 2
            self._check_strategy_takes_labels(self.criterion.distributed, multi_hot)
        if not model.training:
            logits = self._evaluation_logits(model, inputs)
            loss = self.criterion.classification_loss(logits, labels)
        elif self.args.gradient_cache_chunk_size is None:
            logits, embeddings = self._logits_and_embeddings(model, inputs)
            loss = self.criterion(logits, embeddings, labels)
        else:
            def encode(chunk: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
                # Also called from the backward pass, outside compute_loss's autocast context.
                with self.compute_loss_context_manager():
                    return self._logits_and_embeddings(model, chunk)

            # Under DDP the chunks' re-encoding passes (in the backward pass) accumulate their
            # gradients locally and only the last chunk's backward all-reduces them: one
            # all-reduce per batch, as without the cache.
            cache = GradientCache(encode, self.criterion, self.args.gradient_cache_chunk_size,
                                  sync_context=lambda: self.accelerator.no_sync(model))
            loss, (logits, _) = cache.loss(inputs, labels, return_outputs=True)
        return (loss, SequenceClassifierOutput(logits=logits)) if return_outputs else loss

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None
                        ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """The Trainer's evaluation step; with ``scl_embedding="mean"`` and a batch without
        labels, the logits of the classifier on the mean, which the Trainer's own step (a plain
        forward of the model, whose head reads the first token) would not give.

        Returns:
            ``(loss, logits, labels)``, each None where there is none.
        """
        if self.args.scl_embedding != "mean" or inputs.get("labels") is not None:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if prediction_loss_only:
            return None, None, None
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            logits = self._evaluation_logits(model, inputs)
        return None, logits, None

    def _memory_per_process(self) -> bool:
        """Whether each process holds a memory of its own: several processes that contrast
        their own batches. One process, or SCL of the global batch (which enqueues the gathered
        batch on every process), holds one memory."""
        return self.args.world_size > 1 and not self.criterion.distributed

    def _memory_file(self, checkpoint: str) -> str:
        """This process's memory file in the folder ``checkpoint``."""
        if self._memory_per_process():
            return os.path.join(checkpoint, PROCESS_MEMORY_NAME.format(self.args.process_index))
        return os.path.join(checkpoint, MEMORY_NAME)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Saves the optimizer's and scheduler's states and the cross-batch memory.

        The memory is training state like the optimizer's: this hook receives the checkpoint
        folder, runs on every process, only where the checkpoint is resumable (not with
        ``save_only_model``), and before the Trainer pushes the checkpoint or rotates old ones,
        which ``on_save`` callbacks run after."""
        super()._save_optimizer_and_scheduler(output_dir)
        memory = self.criterion.memory
        if memory is None:
            return
        if not (self._memory_per_process() or self.args.should_save):
            return  # the saving process writes the memory every process holds
        os.makedirs(output_dir, exist_ok=True)
        torch.save(memory.state_dict(), self._memory_file(output_dir))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Loads the optimizer's and scheduler's states and the cross-batch memory, once per
        resumed run, before its first step (for every model wrapping, DeepSpeed and FSDP
        included, unlike ``_load_from_checkpoint``). A checkpoint without a memory file (saved
        by an earlier version, or without a memory) leaves the memory empty, with a warning.

        Raises:
            ValueError: the checkpoint's memory has another size or width than this run's.
        """
        super()._load_optimizer_and_scheduler(checkpoint)
        memory = self.criterion.memory
        if memory is None or checkpoint is None:
            return
        path = self._memory_file(checkpoint)
        if not os.path.isfile(path):
            warnings.warn(f"{checkpoint} holds no cross-batch memory ({os.path.basename(path)}): "
                          "the resumed run starts with an empty memory", UserWarning, stacklevel=2)
            return
        state = torch.load(path, map_location=memory.rows.device, weights_only=True)
        if state["rows"].shape != memory.rows.shape:
            raise ValueError(f"the checkpoint's cross-batch memory holds {tuple(state['rows'].shape)} "
                             f"rows x dim, this run's supcon_memory_size and model "
                             f"{tuple(memory.rows.shape)}: resume with the same supcon_memory_size")
        memory.load_state_dict(state)

    def get_train_dataloader(self) -> DataLoader[Any]:
        """The training DataLoader; class-balanced batches when ``args.samples_per_class`` is set.

        The batches then come from a
        [`~scl_kernels.sampling.ClassBalancedBatchSampler`] over the training labels, with
        ``per_device_train_batch_size`` examples and seed ``args.seed``, a new draw each epoch.
        In distributed training the accelerator deals the batches out to the processes.

        Returns:
            `torch.utils.data.DataLoader`: prepared by the accelerator.
        """
        if self.args.samples_per_class is None:
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        dataset = self.train_dataset
        # num_replicas=1: accelerator.prepare below shards the batches across processes.
        sampler = ClassBalancedBatchSampler(_dataset_labels(dataset), self._train_batch_size,
                                            self.args.samples_per_class, seed=self.args.seed,
                                            num_replicas=1, rank=0)
        collator = self.data_collator
        if _is_hf_dataset(dataset):
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        options: dict[str, Any] = {}
        if self.args.dataloader_num_workers > 0:
            options = {"persistent_workers": self.args.dataloader_persistent_workers,
                       "prefetch_factor": self.args.dataloader_prefetch_factor}
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collator,
                            num_workers=self.args.dataloader_num_workers,
                            pin_memory=self.args.dataloader_pin_memory, **options)
        prepared: DataLoader[Any] = self.accelerator.prepare(loader)
        return prepared
