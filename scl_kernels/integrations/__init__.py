"""Training integrations: the Hugging Face Trainer (:class:`SupConTrainer`,
:class:`SupConTrainingArguments`), sentence-transformers (:class:`SupConSentenceTransformerLoss`,
:class:`SimCSELoss`)
and the pooling and classifier they share (:func:`sentence_embedding`,
:func:`classifier_logits`).

They need the optional dependencies: ``pip install --no-build-isolation -e ".[finetune]"`` in the
checkout. ``import
scl_kernels`` never imports this package, and its names load on first use::

    from scl_kernels.integrations import SupConTrainer, SupConTrainingArguments

The torch-only pieces live in the library: :class:`scl_kernels.nn.SupConCrossEntropyLoss`,
:class:`scl_kernels.GradientCache` and :class:`scl_kernels.ClassBalancedBatchSampler`.
"""
import importlib
from typing import Any

_EXPORTS = {
    "EMBEDDINGS": "embeddings",
    "classification_head": "embeddings",
    "classifier_logits": "embeddings",
    "sentence_embedding": "embeddings",
    "SupConTrainer": "hf_trainer",
    "SupConTrainingArguments": "hf_trainer",
    "SupConSentenceTransformerLoss": "sentence_transformers_loss",
    "SimCSELoss": "simcse_loss",
}
# The package is installed from a checkout (it is on no package index), so the hint names the
# command that works there rather than "pip install scl_kernels[finetune]".
INSTALL_FINETUNE_EXTRA = 'pip install --no-build-isolation -e ".[finetune]" in the scl_kernels checkout'
_INSTALL_HINT = f"the training integrations need their optional dependencies: {INSTALL_FINETUNE_EXTRA}"

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] in ("transformers", "sentence_transformers", "accelerate"):
            raise ImportError(f"{_INSTALL_HINT} ({error.name} is missing)") from error
        raise
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
