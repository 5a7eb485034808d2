"""Which vector of a Hugging Face sequence classifier the contrastive term sees."""
from typing import Any

import torch
from torch import nn

EMBEDDINGS = ("first_token", "mean", "head")


# outputs: Any, a transformers ModelOutput, whose type would import transformers with the
# command line (scl_kernels.finetune imports this module).
def sentence_embedding(model: nn.Module, outputs: Any, attention_mask: torch.Tensor | None = None,
                       kind: str = "first_token") -> torch.Tensor:
    """The ``[N, hidden]`` sentence embedding for the contrastive term.

    Args:
        model: the ``*ForSequenceClassification`` model that produced ``outputs``.
        outputs: its output, from a forward called with ``output_hidden_states=True``.
        attention_mask: ``[N, L]`` mask of real tokens (needed by ``"mean"`` when padded).
        kind: which vector (all from the last layer):

            * ``"first_token"`` (default): the first token's hidden state ([CLS] / ``<s>``), as
              Gunel et al. RoBERTa has no pooler, so this is the paper's embedding there.
            * ``"mean"``: the mean of the real tokens' hidden states (sentence-transformers'
              pooling).
            * ``"head"``: the classification head's hidden layer on the first token: dense +
              tanh of RoBERTa-style heads (``classifier.dense``), DistilBERT's
              ``pre_classifier`` + ReLU, or the base model's pooler (dense + tanh) in BERT-style
              models. Computed without the head's dropout.

    Returns:
        A tensor in the model's dtype, with a graph when ``outputs`` has one.

    Raises:
        ValueError: the outputs have no hidden states, ``kind`` is unknown, or ``"head"`` is
            asked of a model with neither head.
    """
    if kind not in EMBEDDINGS:
        raise ValueError(f"kind must be one of {EMBEDDINGS}, got {kind!r}")
    hidden_states = getattr(outputs, "hidden_states", None)
    if not hidden_states:
        raise ValueError("the model outputs have no hidden states: call the model with "
                         "output_hidden_states=True")
    last: torch.Tensor = hidden_states[-1]
    if kind == "first_token":
        return last[:, 0]
    if kind == "mean":
        if attention_mask is None:
            return last.mean(dim=1)
        mask = attention_mask.unsqueeze(-1).to(last.dtype)
        return (last * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    head_dense = getattr(getattr(model, "classifier", None), "dense", None)
    if head_dense is not None:
        return torch.tanh(head_dense(last[:, 0]))
    pre_classifier = getattr(model, "pre_classifier", None)
    if pre_classifier is not None:  # DistilBERT's head: dense + ReLU
        return torch.relu(pre_classifier(last[:, 0]))
    pooler = getattr(getattr(model, "base_model", None), "pooler", None)
    if pooler is not None:
        pooled: torch.Tensor = pooler(last)
        return pooled
    raise ValueError(f"{type(model).__name__} has no classification head with a hidden layer "
                     "(RoBERTa's classifier.dense, DistilBERT's pre_classifier) and no pooler "
                     "(BERT-style): use kind='first_token' or 'mean'")


class _FirstTokenHead(torch.nn.Module):
    """A head that reads token 0 of ``[B, T, H]`` hidden states (RoBERTa's
    ``RobertaClassificationHead``, BERT's pooler path), fed one embedding per example."""

    def __init__(self, read_sequence: nn.Module) -> None:
        super().__init__()
        self.read_sequence = read_sequence

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.read_sequence(embeddings.unsqueeze(1))
        return logits


class _BertHead(torch.nn.Module):
    """BERT's logits from a pooled vector: ``classifier(dropout(pooled))``."""

    def __init__(self, dropout: nn.Module, classifier: nn.Module, pooler: nn.Module | None = None) -> None:
        super().__init__()
        self.dropout, self.classifier, self.pooler = dropout, classifier, pooler

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        pooled = embeddings if self.pooler is None else self.pooler(embeddings.unsqueeze(1))
        logits: torch.Tensor = self.classifier(self.dropout(pooled))
        return logits


class _RobertaOutput(torch.nn.Module):
    """RoBERTa's logits from the head's dense + tanh vector: ``out_proj(dropout(x))``."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head: Any = head  # a RobertaClassificationHead, read by its attributes' names

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head.out_proj(self.head.dropout(embeddings))
        return logits


def classification_head(model: nn.Module, kind: str = "first_token") -> nn.Module:
    """The part of ``model`` that maps the ``kind`` embedding of :func:`sentence_embedding` to
    logits, as a module sharing the model's parameters (for
    :class:`~scl_kernels.nn.CoreTuningLoss`, whose classifier sees mixed embeddings, and for a
    classifier that reads the mean over tokens).

    * RoBERTa-style heads (``classifier.dense`` and ``classifier.out_proj``):
      ``"first_token"`` and ``"mean"`` -> the head itself on ``embeddings.unsqueeze(1)`` (its
      dense + tanh, dropout and ``out_proj``); ``"head"`` (its dense + tanh) -> dropout and
      ``out_proj``.
    * BERT-style models (a base-model pooler, ``dropout`` and a linear ``classifier``):
      ``"first_token"`` -> pooler, dropout, classifier; ``"head"`` (the pooler's output) and
      ``"mean"`` -> dropout, classifier. A mean-pooled sentence encoder (sentence-transformers'
      models) was never trained through its pooler: the classifier reads the mean directly.

    For ``"first_token"`` and ``"head"`` the module reproduces the model's own logits; for
    ``"mean"`` it is a different classifier from the model's forward (see
    :func:`classifier_logits`).

    Raises:
        ValueError: ``kind`` is unknown, or the model has neither head.
    """
    if kind not in EMBEDDINGS:
        raise ValueError(f"kind must be one of {EMBEDDINGS}, got {kind!r}")
    classifier = getattr(model, "classifier", None)
    if (isinstance(classifier, nn.Module) and getattr(classifier, "dense", None) is not None
            and getattr(classifier, "out_proj", None) is not None):
        return _RobertaOutput(classifier) if kind == "head" else _FirstTokenHead(classifier)
    pooler = getattr(getattr(model, "base_model", None), "pooler", None)
    dropout = getattr(model, "dropout", None)
    if isinstance(classifier, torch.nn.Linear) and pooler is not None and dropout is not None:
        return _BertHead(dropout, classifier, pooler if kind == "first_token" else None)
    raise ValueError(f"{type(model).__name__} has neither a RoBERTa-style classification head "
                     "(classifier.dense, classifier.out_proj) nor BERT's pooler + dropout + "
                     "linear classifier")


def classifier_logits(model: nn.Module, outputs: Any, embeddings: torch.Tensor | None,
                      kind: str = "first_token") -> torch.Tensor:
    """The logits a fine-tuned classifier predicts with when the sentence vector is ``kind``:
    the model's own (``outputs.logits``, read from the first token) for ``"first_token"`` and
    ``"head"``, and its head applied to the mean over tokens (``embeddings``, from
    :func:`sentence_embedding`) for ``"mean"``, so that the cross-entropy and the contrastive
    term train one sentence vector."""
    if kind == "mean":
        mean_logits: torch.Tensor = classification_head(model, "mean")(embeddings)
        return mean_logits
    logits: torch.Tensor = outputs.logits
    return logits
