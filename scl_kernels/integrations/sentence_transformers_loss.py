"""The fused SupCon loss as a sentence-transformers loss, for ``SentenceTransformerTrainer``."""
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import distributed as scl_distributed
from ..grad_cache import GradientCache
from .._types import BackendName
from .._validation import check_backend_name, check_normalize, check_temperature
from ..functional import supcon_loss

_SUPCON_CITATION = """
@inproceedings{khosla2020supervised,
    title={Supervised Contrastive Learning},
    author={Prannay Khosla and Piotr Teterwak and Chen Wang and Aaron Sarna and Yonglong Tian and Phillip Isola and Aaron Maschinot and Ce Liu and Dilip Krishnan},
    booktitle={Advances in Neural Information Processing Systems},
    year={2020},
    eprint={2004.11362},
    archivePrefix={arXiv},
    primaryClass={cs.LG}
}
"""
_GRADIENT_CACHE_CITATION = """
@misc{gao2021scaling,
    title={Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup},
    author={Luyu Gao and Yunyi Zhang and Jiawei Han and Jamie Callan},
    year={2021},
    eprint={2101.06983},
    archivePrefix={arXiv},
    primaryClass={cs.LG}
}
"""


class SupConSentenceTransformerLoss(nn.Module):
    """Supervised contrastive loss (Khosla et al. 2020) on a SentenceTransformer's embeddings,
    fused (:func:`scl_kernels.supcon_loss`: no batch x batch matrix is stored).

    Takes a data set of ``(text, label)`` rows, like ``BatchAllTripletLoss``: each text is an
    anchor whose positives are the other texts of the batch with the same integer label, and
    whose negatives are all the others. With several text columns, each column is another view
    of the row (e.g. a paraphrase), with the row's label.

    With ``mini_batch_size`` the loss uses a gradient cache
    (:class:`~scl_kernels.grad_cache.GradientCache`), as ``CachedMultipleNegativesRankingLoss``
    does: the contrastive set is the whole ``per_device_train_batch_size`` batch while the model
    only ever holds the activations of ``mini_batch_size`` texts. The forward pass embeds the
    batch in mini-batches without a graph and returns the loss; the backward pass re-embeds each
    mini-batch with a graph, replaying the random state (dropout masks) of the forward pass, and
    back-propagates the gradient of the loss with respect to the embeddings, scaled by what the
    trainer's backward hands in (gradient accumulation, mixed-precision loss scaling). The
    parameter gradients are those of the uncached loss. It costs two encoder forward passes per
    step instead of one.

    Requirements:
        1. Every text has an integer class label.
        2. A batch needs at least 2 texts of a class for them to have positives: use class-
           balanced batches (e.g. ``batch_sampler=BatchSamplers.GROUP_BY_LABEL``) or large
           batches. Anchors without a positive add nothing.

    Inputs:
        +---------------------------------------+--------+
        | Texts                                 | Labels |
        +=======================================+========+
        | single sentences                      | class  |
        +---------------------------------------+--------+
        | (sentence, view_1, ..., view_n) rows  | class  |
        +---------------------------------------+--------+

    The cached form (``mini_batch_size``) runs the model again during the backward pass, so it
    does not compose with losses that patch the model's forward for the forward pass only
    (``MatryoshkaLoss``, ``AdaptiveLayerLoss``).

    Several processes (``torchrun`` / ``accelerate launch``, DDP): with
    ``gather_across_devices`` (the default) the contrastive set is the global batch, every
    process's rows in rank order, through :func:`scl_kernels.distributed.supcon_loss`, which
    gathers the embeddings with their gradients: the loss is the global batch's, the same on
    every process, and once DDP has averaged the parameters' gradients they are those of one
    process on the global batch. ``False``: each process contrasts its own rows.

    Example::

        from datasets import Dataset
        from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
        from scl_kernels.integrations import SupConSentenceTransformerLoss

        model = SentenceTransformer("all-MiniLM-L6-v2")
        train = Dataset.from_dict({"text": ["great film", "awful plot", "loved it", "boring"],
                                   "label": [1, 0, 1, 0]})
        loss = SupConSentenceTransformerLoss(model, temperature=0.1, mini_batch_size=32)
        SentenceTransformerTrainer(model=model, train_dataset=train, loss=loss).train()
    """

    def __init__(self, model: nn.Module, temperature: float | torch.Tensor = 0.1,
                 mini_batch_size: int | None = None, *, normalize: bool = True,
                 backend: BackendName = "auto", gather_across_devices: bool = True) -> None:
        """
        Args:
            model (`SentenceTransformer`): the model whose ``sentence_embedding`` is trained.
            temperature (`float`, *optional*, defaults to 0.1): the softmax temperature
                (positive; SupCon's usual range is 0.05 - 0.5).
            mini_batch_size (`int`, *optional*): texts per encoder pass of the gradient cache;
                `None` (default) embeds the batch in one pass, with a graph.
            normalize (`bool`, *optional*, defaults to `True`): L2-normalise the embeddings
                first (cosine similarities), as SupCon does.
            backend (`str`, *optional*, defaults to `"auto"`): the SupCon backend, see
                :func:`scl_kernels.supcon_loss`.
            gather_across_devices (`bool`, *optional*, defaults to `True`): in an initialised
                ``torch.distributed`` group of several processes, contrast the global batch
                (sentence-transformers' name for the option; its own losses default to `False`,
                SupCon's contrastive set is the whole batch, as in
                :class:`~scl_kernels.integrations.SupConTrainer`). Ignored in one process.

        Raises:
            TypeError / ValueError naming the argument.
        """
        super().__init__()
        check_temperature(temperature, check_value=True)
        if not isinstance(gather_across_devices, bool):
            raise TypeError(f"gather_across_devices must be a bool, got {type(gather_across_devices).__name__}")
        if mini_batch_size is not None and (isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int)
                                            or mini_batch_size < 1):
            raise ValueError(f"mini_batch_size must be None or a positive int, got {mini_batch_size!r}")
        check_normalize(normalize)
        check_backend_name(backend)
        # "model": the name SentenceTransformerTrainer looks for to swap in the wrapped (DDP) model.
        self.model = model
        self.temperature = temperature
        self.mini_batch_size = mini_batch_size
        self.normalize = normalize
        self.backend = backend
        self.gather_across_devices = gather_across_devices

    @property
    def uses_gradient_cache(self) -> bool:
        """Whether the backward pass re-runs the model (sentence-transformers' protocol, read by
        its ``AdaptiveLayerLoss`` and ``MatryoshkaLoss``)."""
        return self.mini_batch_size is not None

    def _gathers(self) -> bool:
        """Whether this call contrasts the global batch: ``gather_across_devices`` in an
        initialised process group of several processes (read at each call: the trainer starts
        the group after the loss may have been built)."""
        return (self.gather_across_devices and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1)

    def _supcon(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self._gathers():
            # gradients_averaged: the trainer's DDP averages the parameters' gradients over the
            # processes, so this process's share of the global loss's gradient is scaled up by
            # the world size.
            return scl_distributed.supcon_loss(embeddings, labels, self.temperature,
                                               normalize=self.normalize, backend=self.backend,
                                               gradients_averaged=True)
        return supcon_loss(embeddings, labels, self.temperature, normalize=self.normalize, backend=self.backend)

    def _embed_views(self, batch: Mapping[tuple[int, str], Any]) -> torch.Tensor:
        """``[n, views, dim]`` embeddings of a (chunk of a) batch keyed ``(view, feature name)``."""
        views = sorted({view for view, _ in batch})
        return torch.stack([self.model({name: value for (view, name), value in batch.items() if view == v})
                            ["sentence_embedding"] for v in views], dim=1)

    def forward(self, sentence_features: Iterable[Mapping[str, torch.Tensor]],
                labels: torch.Tensor) -> torch.Tensor:
        """The loss of a batch.

        Args:
            sentence_features (`Iterable[dict[str, torch.Tensor]]`): the tokenized texts, one dict
                per text column (as ``SentenceTransformerTrainer`` passes them).
            labels (`torch.Tensor`): integer class labels ``[batch]``, one per row.

        Returns:
            `torch.Tensor`: the 0-dim loss, the mean over anchors that have a positive (of the
            global batch when it gathers across processes).
        """
        sentence_features = list(sentence_features)
        if not sentence_features:
            raise ValueError("sentence_features is empty: the data set needs a text column")
        if not isinstance(labels, torch.Tensor):
            raise TypeError("SupConSentenceTransformerLoss needs an integer class label per row (a "
                            f"'label' column), got labels={labels!r}")
        return self._loss_of_views(sentence_features, self._supcon, labels)

    def _loss_of_views(self, sentence_features: list[Mapping[str, torch.Tensor]],
                       loss_fn: Callable[..., torch.Tensor], *loss_args: Any) -> torch.Tensor:
        """``loss_fn(embeddings [n, views, dim], *loss_args)`` of the text columns, one view
        each, through the gradient cache when ``mini_batch_size`` is set."""
        batch = {(view, name): value for view, features in enumerate(sentence_features)
                 for name, value in features.items()}
        if self.mini_batch_size is None:
            return loss_fn(self._embed_views(batch), *loss_args)

        model = self.model
        cache = GradientCache(self._embed_views, loss_fn, self.mini_batch_size,
                              sync_context=model.no_sync if isinstance(model, DistributedDataParallel) else None)
        return cache.loss(batch, *loss_args)

    def get_config_dict(self) -> dict[str, Any]:
        """The options shown in the model card.

        Returns:
            `dict`: ``temperature``, ``mini_batch_size``, ``normalize`` and
            ``gather_across_devices``.
        """
        temperature = self.temperature
        if isinstance(temperature, torch.Tensor):
            temperature = float(temperature.detach())
        return {"temperature": temperature, "mini_batch_size": self.mini_batch_size, "normalize": self.normalize,
                "gather_across_devices": self.gather_across_devices}

    @property
    def citation(self) -> str:
        """BibTeX of SupCon (and of the gradient cache when ``mini_batch_size`` is set), for the
        model card."""
        return _SUPCON_CITATION + (_GRADIENT_CACHE_CITATION if self.mini_batch_size is not None else "")
