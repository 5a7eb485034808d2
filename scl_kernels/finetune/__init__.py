"""Fine-tuning Hugging Face encoders with cross-entropy plus the supervised contrastive term.

This subpackage needs the optional dependencies: ``pip install "scl_kernels[finetune]"``.
``import scl_kernels`` never imports it. Its names load on first use::

    from scl_kernels.finetune import SupConTrainer, SupConTrainingArguments

The torch-only pieces live in the main package: :class:`scl_kernels.nn.SupConCrossEntropyLoss`,
:class:`scl_kernels.grad_cache.GradientCache` and
:class:`scl_kernels.sampling.ClassBalancedBatchSampler`.
"""
import importlib

_EXPORTS = {
    "EMBEDDINGS": "embeddings",
    "sentence_embedding": "embeddings",
    "SupConTrainer": "trainer",
    "SupConTrainingArguments": "trainer",
    "SupConSentenceTransformerLoss": "sentence_transformers_loss",
}
_INSTALL_HINT = 'the fine-tuning layer needs its optional dependencies: pip install "scl_kernels[finetune]"'

__all__ = sorted(_EXPORTS)


def __getattr__(name):
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


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
