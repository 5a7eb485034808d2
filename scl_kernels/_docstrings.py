"""The documentation of supcon_loss's arguments, written once.

Every public callable that takes these arguments (supcon_loss, SupConLoss, the distributed loss,
SupConCrossEntropyLoss) names them in its docstring with a line ``{arg:NAME}``, which
:func:`fill_arguments` replaces with the entry below, indented as that line.
"""
import re
import textwrap
from typing import Any, Callable, TypeVar

_Function = TypeVar("_Function", bound=Callable[..., Any])

# Each entry is one paragraph; fill_arguments wraps it to the docstring's indentation.
ARGUMENTS: dict[str, str] = {
    "features": """features: ``[N, D]`` rows, or ``[B, V, D]``: V views (augmentations) of B samples,
    flattened view-major (row ``v * B + b``, as SupContrast). Any floating dtype and strides.""",
    "labels": """labels: integer ``[N]`` (``[B]`` for ``[B, V, D]`` features), or ``None``: every sample
    is its own class and its other views are its positives (SimCLR / NT-Xent with V >= 2). A
    negative label means "no class": a negative for every anchor, never a positive, and no loss
    of its own. Or multi-hot ``[N, C]`` (``[B, C]``; bool, or integers 0 / 1): each row's set of
    classes, the pairs weighed by ``multi_label`` (a row without a class is "no class"). Without
    labels, ``contrast`` and a second view no anchor can have a positive: the loss is 0, and a
    UserWarning (once per process) says how to pass views.""",
    "multi_label": """multi_label: how multi-hot ``labels`` weigh a pair (unread for class ids):
    ``"any"`` (default), a pair sharing at least one class is positive with weight 1;
    ``"jaccard"``, weight ``|Y_i & Y_j| / |Y_i | Y_j|``. The anchor's loss is the weighted mean of
    its positives' ``-log p_ij`` (docs/MATH.md section 11); with one class per row both rules
    are the single-label loss. Run by the ``cpu``, ``triton``, ``cuda`` and ``reference``
    backends (docs/BACKENDS.md).""",
    "temperature": """temperature: the softmax temperature t, logits being ``z_i . z_j / t``: a positive finite
    float, or a 0-dim floating-point tensor (an ``nn.Parameter`` makes it learnable, with an
    exact gradient). A tensor's value is checked by the backend that runs the call. The fused
    GPU backends never read a GPU tensor on the host for float32 / 16-bit rows (their kernels
    read it from memory; such a call takes the plain schedule, its check is deferred like the
    NaN check, and a CUDA graph replays its current value); with float64 rows, the focal loss
    or deterministic mode they read it once per call, which a CUDA graph capture refuses.""",
    "contrast": """contrast: ``[M, D]`` rows to contrast against (cross-set mode, pytorch-metric-learning's
    ``ref_emb``: the anchors are the feature rows and no column is excluded as "self"). With
    ``labels=None`` and no ``contrast_labels``, anchor i's only positive is contrast row i and
    rows past N are negatives (CLIP, SimCSE); then ``M >= N``.""",
    "contrast_labels": """contrast_labels: integer ``[M]`` labels of ``contrast`` (multi-hot ``[M, C]`` for
    multi-hot ``labels``); required when ``labels`` is given with ``contrast``.""",
    "groups": """groups: integer ``[N]`` (``[B]`` for ``[B, V, D]`` features) group ids, or ``None``:
    known false negatives. Two rows of one group that are not a positive pair leave each other's
    denominator, neither pulled nor pushed (duplicates, passages of one source); a negative id
    means no group (docs/MATH.md section 11). With ``contrast``, ``contrast_groups`` too. Run by
    every backend.""",
    "contrast_groups": """contrast_groups: integer ``[M]`` group ids of ``contrast`` rows, compared with ``groups``;
    required when ``groups`` is given with ``contrast``.""",
    "contrast_mode": """contrast_mode: ``"all"`` (every row is an anchor, default) or ``"one"`` (only the view-0
    rows of ``[B, V, D]`` features are anchors, as in SupContrast).""",
    "normalize": """normalize: L2-normalise the rows of ``features`` and ``contrast`` first (eps 1e-12, as
    ``F.normalize``; default True); ``False`` for rows that are unit already or should keep their
    norms.""",
    "focal_gamma": """focal_gamma: ``0`` (default) for SupCon; ``gamma > 0`` for the focal contrastive loss,
    which weights each positive pair's term ``-log p_ip`` by ``(1 - p_ip)^gamma`` (p_ip the
    softmax probability of positive p for anchor i), so that pairs the model already matches well
    count less (docs/MATH.md, "Focal contrastive loss"). A finite float >= 0. It adds a walk over
    the positive pairs, about ``N^2 / classes`` of them. Which backends run it:
    docs/BACKENDS.md (``scl_kernels.backends.focal_backends()``); ``"auto"`` chooses one that
    does.""",
    "reduction": """reduction: ``"mean"`` (default) over the anchors that have a positive, 0 when none has;
    ``"sum"`` over all anchors; ``"none"`` for one value per anchor (0 for anchors without a
    positive).""",
    "backend": """backend: ``"auto"`` (default: ``"cpu"`` for CPU tensors; for CUDA ones
    ``"cuda"`` or ``"triton"`` by a size rule measured on an H100, docs/BACKENDS.md;
    ``scl_kernels.explain`` says which and why), ``"cpu"`` (fused C++), ``"triton"`` (fused
    Triton; CPU tensors only under ``TRITON_INTERPRET=1``), ``"cuda"`` (fused CUDA C++) or
    ``"reference"`` (dense PyTorch, for tests and small batches).""",
}

_WIDTH = 100
_PLACEHOLDER = re.compile(r"^( *)\{arg:(\w+)\}$", re.MULTILINE)


def fill_arguments(function: _Function) -> _Function:
    """Decorator: replaces the ``{arg:NAME}`` lines of ``function``'s docstring by ARGUMENTS."""
    def entry(match: "re.Match[str]") -> str:
        indent, name = match.groups()
        return textwrap.fill(" ".join(ARGUMENTS[name].split()), width=_WIDTH, initial_indent=indent,
                             subsequent_indent=indent + "    ")
    if function.__doc__:  # None under python -OO
        function.__doc__ = _PLACEHOLDER.sub(entry, function.__doc__)
    return function
