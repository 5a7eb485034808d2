"""SimCSE (Gao, Yao and Chen, EMNLP 2021) on the fused op: :func:`simcse_loss`, and
:class:`SimCSELoss` for ``SentenceTransformerTrainer``."""
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .. import distributed as scl_distributed
from .._types import BackendName
from ..functional import supcon_loss
from .sentence_transformers_loss import _GRADIENT_CACHE_CITATION, SupConSentenceTransformerLoss

_SIMCSE_CITATION = """
@inproceedings{gao2021simcse,
    title={{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
    author={Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
    booktitle={Empirical Methods in Natural Language Processing (EMNLP)},
    year={2021}
}
"""


def simcse_loss(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None = None,
                temperature: float | torch.Tensor = 0.05, *, distributed: bool = False,
                gradients_averaged: bool = False, backend: BackendName = "auto") -> torch.Tensor:
    """SimCSE's loss: the cross-entropy of anchor i's cosine similarities to every positive (and
    hard negative), divided by ``temperature``, with positive i as the target::

        loss = mean_i -log( exp(cos(a_i, p_i) / t) /
                            (sum_j exp(cos(a_i, p_j) / t) + sum_j exp(cos(a_i, n_j) / t)) )

    that is ``cross_entropy(cos_sim(a, [p; n]) / t, arange(B))``, run by the fused op's
    cross-set layout (anchors against the contrast set ``[positives; negatives]``, anchor i's
    positive its row i), so no B x 2B matrix is stored.

    Unsupervised SimCSE passes two dropout-noised encodings of the same sentences as
    ``anchors`` and ``positives``; supervised SimCSE (NLI) passes the premises, their entailed
    hypotheses and their contradictions as ``negatives``.

    Args:
        anchors, positives: ``[B, D]`` (the same dtype and device).
        negatives: ``[K, D]`` hard negatives (any K, typically B), or None.
        temperature: positive float (the paper's 0.05) or 0-dim tensor.
        distributed: the loss of the global batch of a torch.distributed job
            (:func:`scl_kernels.distributed.supcon_loss`): every rank passes its rows, anchor i's
            positive is its own positive row i, and every rank's positives and negatives are
            negatives of every anchor (the gathered negatives of the paper's multi-GPU runs).
        gradients_averaged: with ``distributed``, DistributedDataParallel will average the
            parameter gradients (see :func:`scl_kernels.distributed.supcon_loss`).
        backend: see :func:`scl_kernels.supcon_loss`.

    Returns:
        The 0-dim loss, the mean over anchors (of the global batch when ``distributed``).
    """
    contrast = positives if negatives is None else torch.cat([positives, negatives])
    if distributed:
        return scl_distributed.supcon_loss(anchors, temperature=temperature, contrast=contrast,
                                           backend=backend, gradients_averaged=gradients_averaged)
    return supcon_loss(anchors, temperature=temperature, contrast=contrast, backend=backend)


class SimCSELoss(SupConSentenceTransformerLoss):
    """SimCSE (Gao et al. 2021) as a sentence-transformers loss, fused (:func:`simcse_loss`).

    Inputs:
        +-------------------------------------+----------------------------------------------+
        | Texts                               | What is learnt                               |
        +=====================================+==============================================+
        | single sentences                    | unsupervised: each sentence is encoded twice |
        |                                     | (two dropout masks); its second encoding is  |
        |                                     | its positive, every other row a negative     |
        +-------------------------------------+----------------------------------------------+
        | (anchor, positive) pairs            | supervised: the other rows' positives are    |
        |                                     | negatives                                    |
        +-------------------------------------+----------------------------------------------+
        | (anchor, positive, negative)        | supervised with hard negatives (NLI          |
        | triples                             | contradictions) as extra contrast rows       |
        +-------------------------------------+----------------------------------------------+

    No labels are used. Unsupervised SimCSE needs the model in training mode with dropout (the
    trainer's default). With ``chunk_size`` the batch goes through the gradient cache
    (:class:`~scl_kernels.grad_cache.GradientCache`), as for
    :class:`SupConSentenceTransformerLoss`: every row of the ``per_device_train_batch_size``
    batch is a negative of every anchor, while the model holds the activations of
    ``chunk_size`` texts; each chunk's second pass replays its dropout masks.

    Several processes (DDP): with ``gather_across_devices`` (the default) every process's
    positives and negatives are negatives of every anchor (``simcse_loss(distributed=True)``,
    the gathered negatives of the paper's multi-GPU runs); the loss and, once DDP has averaged
    them, the gradients are those of one process on the global batch.

    Example::

        from datasets import Dataset
        from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
        from scl_kernels.integrations import SimCSELoss

        model = SentenceTransformer("all-MiniLM-L6-v2")
        train = Dataset.from_dict({"text": ["a cat sat", "stocks fell", "it rained all day"]})
        SentenceTransformerTrainer(model=model, train_dataset=train,
                                   loss=SimCSELoss(model, chunk_size=64)).train()
    """

    def __init__(self, model: nn.Module, temperature: float | torch.Tensor = 0.05,
                 chunk_size: int | None = None, *, backend: BackendName = "auto",
                 gather_across_devices: bool = True) -> None:
        """
        Args:
            model (`SentenceTransformer`): the model whose ``sentence_embedding`` is trained.
            temperature (`float`, *optional*, defaults to 0.05): the softmax temperature (the
                paper's value).
            chunk_size (`int`, *optional*): texts per encoder pass of the gradient cache;
                `None` (default) encodes the batch in one pass, with a graph.
            backend (`str`, *optional*, defaults to `"auto"`): see
                :func:`scl_kernels.supcon_loss`.
            gather_across_devices (`bool`, *optional*, defaults to `True`): in an initialised
                ``torch.distributed`` group of several processes, every process's rows are
                negatives of every anchor. Ignored in one process.

        Raises:
            TypeError / ValueError naming the argument.
        """
        try:
            super().__init__(model, temperature, chunk_size, normalize=True, backend=backend,
                             gather_across_devices=gather_across_devices)
        except ValueError as error:
            raise ValueError(str(error).replace("mini_batch_size", "chunk_size")) from None

    def _simcse(self, embeddings: torch.Tensor) -> torch.Tensor:
        views = embeddings.unbind(dim=1)
        gathers = self._gathers()
        # gradients_averaged: the trainer's DDP averages the parameters' gradients.
        return simcse_loss(views[0], views[1], views[2] if len(views) == 3 else None,
                           self.temperature, distributed=gathers, gradients_averaged=gathers,
                           backend=self.backend)

    def forward(self, sentence_features: Iterable[Mapping[str, torch.Tensor]],
                labels: torch.Tensor | None = None) -> torch.Tensor:
        """The loss of a batch.

        Args:
            sentence_features (`Iterable[dict[str, torch.Tensor]]`): the tokenized texts, one
                dict per text column (1, 2 or 3 columns).
            labels: ignored (the trainer passes None, or a label column SimCSE does not use).

        Returns:
            `torch.Tensor`: the 0-dim loss.
        """
        sentence_features = list(sentence_features)
        if not 1 <= len(sentence_features) <= 3:
            raise ValueError("SimCSELoss takes 1 text column (unsupervised), 2 (anchor, positive) "
                             f"or 3 (anchor, positive, negative), got {len(sentence_features)}")
        if len(sentence_features) == 1:  # dropout makes the two encodings two views
            sentence_features = sentence_features * 2
        return self._loss_of_views(sentence_features, self._simcse)

    def get_config_dict(self) -> dict[str, Any]:
        """The options shown in the model card: ``temperature``, ``chunk_size`` and
        ``gather_across_devices``."""
        config = super().get_config_dict()
        return {"temperature": config["temperature"], "chunk_size": config["mini_batch_size"],
                "gather_across_devices": config["gather_across_devices"]}

    @property
    def citation(self) -> str:
        """BibTeX of SimCSE (and of the gradient cache when ``chunk_size`` is set)."""
        return _SIMCSE_CITATION + (_GRADIENT_CACHE_CITATION if self.mini_batch_size is not None else "")
