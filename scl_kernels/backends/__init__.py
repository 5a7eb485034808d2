"""The backend registry: every backend's name, its op, the devices it serves, what it can compute
and whether it can run here. ``available_backends``, ``backend="auto"``, the error messages, the
test matrix and the capability table of docs/BACKENDS.md (:func:`capability_table`, which a test
holds the document to) all read the table below. What adding a backend takes: docs/BACKENDS.md.
"""
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union, cast

import torch

from .._extension import library_loaded, require_library
from .._types import BackendName
from . import hard_pairs_ops  # noqa: F401  (registers the hard-pair ops' fake kernels)
from .auto_rule import CallShape, cuda_is_faster
from .fused_ops import loss_dtype, register_fakes
# Re-exported: supcon_loss's "mean" reduction is the same mean (functional.py).
from .reference import (mean_over_anchors_with_positives as mean_over_anchors_with_positives,
                        run_reference)
from .triton import (TRITON_CPU_NEEDS_INTERPRETER, TRITON_MISSING, load_triton_backend,
                     triton_installed, triton_interpreter_enabled)


# Read once, at import: the library's registrations never change, and torch.compile traces
# backend="cuda" through resolve_backend, where a dispatcher query cannot go into a graph.
_CUDA_KERNELS_BUILT = library_loaded() and torch._C._dispatch_has_kernel_for_dispatch_key(
    "scl::supcon", "CUDA")


def cuda_kernels_built() -> bool:
    """Whether the loaded library registers the CUDA C++ kernels (built with SCL_BUILD_CUDA)."""
    return _CUDA_KERNELS_BUILT


CUDA_NOT_BUILT = ("backend='cuda' needs the CUDA C++ kernels, and this scl_kernels library was built "
                  "without them: build with a CUDA build of torch, nvcc and the CuTe headers "
                  "(pip install nvidia-cutlass==4.2.0.0), then "
                  "`SCL_BUILD_CUDA=1 pip install --no-build-isolation -e .`")


@dataclass(frozen=True)
class Backend:
    name: str
    device_types: Tuple[str, ...]  # the devices it serves
    # The fused op's name in torch.ops.scl (its backward is <op>_backward); None: dense PyTorch.
    op_name: Optional[str]
    # Whether this installation can run it on a device of a served type (library built,
    # packages installed, Triton's interpreter for CPU tensors).
    installed: Callable[[torch.device], bool]
    prepare: Callable[[], None] = lambda: None  # loads what the op needs before its first call
    float64_kernels: bool = True  # False: float64 inputs are computed in float32
    # Whether backend="auto" may choose it for any call it can run. False: only for the call
    # shapes that auto_rule.py rules (measured faster on hardware); always selectable by name.
    auto_eligible: bool = True
    # Its hard-pair mining op in torch.ops.scl (scl_kernels.hard_pairs); None: it has none
    # (the dense reference has its own, backends/hard_pairs_reference.py).
    hard_pairs_op_name: Optional[str] = None
    # Whether it runs the focal contrastive loss (focal_gamma > 0: its kernels supply the positive
    # walk, csrc/core/tile_kernels.h). backend="auto" never picks one that cannot run the call.
    focal: bool = True
    # Whether its tiles mask the pairs that groups= takes out of the denominator (known false
    # negatives, docs/MATH.md section 11). backend="auto" never picks one that cannot run the call.
    groups: bool = False
    # Whether its positive walk weighs the pairs of multi-hot labels (multi-label positives,
    # docs/MATH.md section 11). backend="auto" never picks one that cannot run the call.
    multi_label: bool = False
    # Whether the backward's tile products take the weights G_ij (dLoss/dlogit) rounded to the
    # input dtype when it is 16-bit, as FlashAttention's backward does: the tensor-core kernels.
    # The gradients keep the input dtype's precision; dLoss/dt, a small difference of large sums
    # at small t, carries that rounding (docs/MATH.md, "Precision").
    low_precision_gradient_weights: bool = False

    def available(self, device: Union[torch.device, str]) -> bool:
        if not isinstance(device, torch.device):  # supcon_loss asks on every call, with a device
            device = torch.device(device)
        return device.type in self.device_types and self.installed(device)

    @property
    def forward_op(self) -> Optional[Callable[..., Any]]:
        """The fused op (an OpOverloadPacket), ready to call; None for the dense reference."""
        return self._op("")

    @property
    def backward_op(self) -> Optional[Callable[..., Any]]:
        return self._op("_backward")

    @property
    def plan_op(self) -> Optional[Callable[..., Any]]:
        """The op that describes what a call of the fused op would do (csrc/core/call_plan.h)."""
        return self._op("_plan")

    def _op(self, suffix: str) -> Optional[Callable[..., Any]]:
        if self.op_name is None:
            return None
        return _scl_op(self, self.op_name + suffix)

    @property
    def hard_pairs_op(self) -> Optional[Callable[..., Any]]:
        if self.hard_pairs_op_name is None:
            return None
        return _scl_op(self, self.hard_pairs_op_name)

    def computes_in(self, dtype: torch.dtype) -> torch.dtype:
        """The precision this backend really computes in for an input dtype."""
        return loss_dtype(dtype) if self.float64_kernels else torch.float32

    def gradient_weights_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the backward's tile products take their weights G_ij in, for an input dtype."""
        if self.low_precision_gradient_weights and dtype in (torch.float16, torch.bfloat16):
            return dtype
        return self.computes_in(dtype)

    def cannot_run(self, focal_gamma: float, groups: bool = False,
                   multi_label: bool = False) -> Optional[str]:
        """The plan's ``cannot_run`` for a call with this focal_gamma, with or without groups
        and multi-hot labels, that its kernels cannot compute (csrc/core/call_plan.cpp), or
        None."""
        if focal_gamma > 0 and not self.focal:
            return "no focal walk"
        if groups and not self.groups:
            return "no group mask"
        if multi_label and not self.multi_label:
            return "no pair weights"
        return None

    def runs(self, focal_gamma: float, groups: bool = False, multi_label: bool = False) -> bool:
        """Whether its kernels compute a call with this focal_gamma, with or without groups and
        multi-hot labels."""
        return self.cannot_run(focal_gamma, groups, multi_label) is None

    def run(self, *args: Any, **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        """(per-anchor loss, |P(i)|) for the fused op's arguments, passed as the op takes them:
        by position in its schema's order (csrc/core/call_arguments.h) or by name; by position
        is the cheaper (torch parses an op's keywords about 5 us slower a call). The reference
        takes the same (backends/reference.py). With ``mean`` the loss is their mean over the anchors
        with positives (0-dim), taken inside the fused ops."""
        if self.op_name is None:
            return run_reference(*args, **kwargs)
        loss, _lse, num_positives = _scl_op(self, self.op_name)(*args, **kwargs)
        return loss, num_positives


def _scl_op(backend: Backend, name: str) -> Callable[..., Any]:
    """torch.ops.scl.<name>, after ``backend`` loaded what it needs."""
    backend.prepare()
    op: Callable[..., Any] = getattr(torch.ops.scl, name)
    return op


REGISTRY: Dict[str, Backend] = {backend.name: backend for backend in (
    # fused C++ kernels: BLAS tiles, vectorised exp, symmetric schedule
    Backend("cpu", ("cpu",), "supcon", lambda device: library_loaded(),
            hard_pairs_op_name="hard_pairs", groups=True, multi_label=True),
    # fused Triton kernels (CPU tensors in Triton's interpreter, for tests)
    Backend("triton", ("cuda", "cpu"), "supcon_triton",
            lambda device: library_loaded() and triton_installed()
            and (device.type == "cuda" or triton_interpreter_enabled()),
            prepare=load_triton_backend, float64_kernels=False,
            hard_pairs_op_name="hard_pairs_triton", low_precision_gradient_weights=True,
            groups=True, multi_label=True),
    # fused CUDA C++ kernels (CuTe: mma.sync on sm_80, wgmma + TMA on sm_90a), registered for
    # scl::supcon's CUDA key. auto takes them only by the size rule measured on an H100
    # (auto_rule.py): a call whose shape it rules, on sm_90, never one with multi-hot labels.
    # No focal loss (no walk over its per-pair terms yet); multi-hot labels by ATen ops on the
    # device (sums over class subsets, or class overlaps in blocks of pairs), beside the tiles.
    Backend("cuda", ("cuda",), "supcon", lambda device: cuda_kernels_built(),
            float64_kernels=False, auto_eligible=False, focal=False,
            low_precision_gradient_weights=True, groups=True, multi_label=True),
    # dense PyTorch: the whole N x N logit matrix, for tests and tiny batches
    Backend("reference", ("cpu", "cuda", "meta"), None, lambda device: True, groups=True,
            multi_label=True),
)}
BACKENDS: Tuple[str, ...] = ("auto", *REGISTRY)
register_fakes()


def get_backend(name: str) -> Backend:
    if name not in REGISTRY:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    return REGISTRY[name]


def available_backends(device: Union[torch.device, str] = "cpu") -> List[str]:
    """The backends that can run tensors of ``device`` in this installation, best first."""
    return [name for name, backend in REGISTRY.items() if backend.available(device)]


def _fused(backend: Backend) -> bool:
    return backend.op_name is not None


_warned_dense_devices: Set[str] = set()


def auto_choice(device: Union[torch.device, str], focal_gamma: float = 0.0,
                shape: Optional[CallShape] = None, groups: bool = False,
                multi_label: bool = False) -> Tuple[str, str]:
    """(the backend ``backend="auto"`` runs on ``device`` in this installation, why). The rule:
    "cuda" where the call's ``shape`` is one that the CUDA C++ kernels were measured to run
    faster (auto_rule.py), else the first fused backend that may be chosen automatically, can
    run there and computes ``focal_gamma``, ``groups`` and ``multi_label`` (multi-hot labels),
    else "reference". Without a shape
    (what a device runs by default), never an opt-in backend ("cuda")."""
    device = torch.device(device)
    if device.type == "meta":
        # Shapes only: every fused op's fake kernel serves meta tensors, no kernel runs.
        if library_loaded():
            return "cpu", "meta tensors: the fused op's fake kernel gives the shapes"
        return "reference", "meta tensors, and the library is not loaded"
    cuda = REGISTRY["cuda"]
    # Never for multi-hot labels: its positives are ATen ops beside the tiles (2-10x the
    # single-label step predicted, bench/decisions/2026-12-02-multi-label-pairs-plan.md), where
    # Triton walks them in its tiles.
    if (shape is not None and not multi_label and cuda.runs(focal_gamma, groups, multi_label)
            and cuda.available(device)
            and cuda_is_faster(device, shape)):
        return cuda.name, ("the size rule (scl_kernels/backends/auto_rule.py): the CUDA C++ "
                           "kernels measured faster for this shape on sm_90")
    passed_over: List[str] = []
    for backend in REGISTRY.values():
        if not (_fused(backend) and backend.auto_eligible):
            continue
        if backend.runs(focal_gamma, groups, multi_label) and backend.available(device):
            why = f"the first fused backend that runs {device.type} tensors here"
            if passed_over:
                why += f" (not {', '.join(passed_over)})"
            return backend.name, why
        if device.type in backend.device_types:
            cannot = backend.cannot_run(focal_gamma, groups, multi_label)
            passed_over.append(f"{backend.name}: "
                               + (cannot or "not available in this installation"))
    return "reference", (f"no fused backend can run this call on {device.type}"
                         + (f" ({'; '.join(passed_over)})" if passed_over else ""))


def auto_backend(device: Union[torch.device, str], focal_gamma: float = 0.0,
                 shape: Optional[CallShape] = None, groups: bool = False,
                 multi_label: bool = False) -> str:
    """The name of the backend that ``backend="auto"`` runs (auto_choice says why)."""
    return auto_choice(device, focal_gamma, shape, groups, multi_label)[0]


def focal_backends() -> List[str]:
    """The names of the backends that compute focal_gamma > 0."""
    return [name for name, backend in REGISTRY.items() if backend.focal]


def group_backends() -> List[str]:
    """The names of the backends that compute calls with groups (known false negatives)."""
    return [name for name, backend in REGISTRY.items() if backend.groups]


def multi_label_backends() -> List[str]:
    """The names of the backends that compute calls with multi-hot labels."""
    return [name for name, backend in REGISTRY.items() if backend.multi_label]


def capability_table() -> str:
    """The registry's capabilities as the Markdown table of docs/BACKENDS.md."""
    def yes(flag: object) -> str:
        return "yes" if flag else "no"
    rows = ["| backend | devices | fused op | focal loss | groups | multi-hot labels | "
            "hard pairs | float64 computed in | 16-bit gradient weights | chosen by `auto` |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for backend in REGISTRY.values():
        op = f"`scl::{backend.op_name}`" if backend.op_name else "none (dense PyTorch)"
        auto = ("yes" if backend.auto_eligible else "by the size rule only") if backend.op_name \
            else "when no fused backend can run"
        rows.append(f"| `{backend.name}` | {', '.join(backend.device_types)} | {op} | "
                    f"{yes(backend.focal)} | {yes(backend.groups)} | {yes(backend.multi_label)} | "
                    f"{yes(backend.hard_pairs_op_name or not backend.op_name)} | "
                    f"{'float64' if backend.float64_kernels else 'float32'} | "
                    f"{yes(backend.low_precision_gradient_weights)} | {auto} |")
    return "\n".join(rows)


def why_not_fused(name: str, device: Union[torch.device, str]) -> Optional[str]:
    """Why ``supcon_loss(backend=name)`` would run no fused kernel on ``device`` in this
    installation (None: it runs one). Programs that time or compare "fused" against dense PyTorch
    ask this first, so that they never label the dense reference fused: "auto" falling back to
    it (the library failed to load, triton is absent), or a named fused backend that cannot run
    here. The reason is the one ``backend=<that name>`` would raise (the loader's error, ...)."""
    device = torch.device(device)
    if name == "reference":
        return "backend='reference' is dense PyTorch, not a fused kernel"
    if name == "auto":
        if auto_backend(device) != "reference":
            return None
        candidates = [b.name for b in REGISTRY.values()
                      if _fused(b) and b.auto_eligible and device.type in b.device_types]
        if not candidates:
            return f"no fused backend is written for {device.type} tensors"
    else:
        candidates = [name]
    reasons: List[str] = []
    for candidate in candidates:
        try:
            resolve_backend(candidate, device)
        except (RuntimeError, ValueError) as error:
            if str(error) not in reasons:
                reasons.append(str(error))
        else:
            return None
    return "; ".join(reasons)


def require_fused(name: str, device: Union[torch.device, str], program: str) -> BackendName:
    """The backend ``supcon_loss(backend=name)`` runs on ``device`` ("auto" resolved), or
    SystemExit with one line, ``<program>: ...: <reason>``, where that is no fused kernel
    (why_not_fused). For command-line programs that report a "fused" result."""
    why = why_not_fused(name, device)
    if why is not None:
        raise SystemExit(f"{program}: no fused backend runs backend={name!r} on "
                         f"{torch.device(device)}, and dense PyTorch is not reported as fused: "
                         f"{why}")
    # A name that resolves here is one of the registry's (python_tests/api/test_type_hints.py
    # holds BackendName to it).
    return cast(BackendName, auto_backend(device) if name == "auto" else name)


def _auto(device: torch.device, focal_gamma: float = 0.0,
          shape: Optional[CallShape] = None, groups: bool = False,
          multi_label: bool = False) -> Backend:
    name, why = auto_choice(device, focal_gamma, shape, groups, multi_label)
    if name != "reference" or device.type == "meta":
        return REGISTRY[name]
    if not all(b.runs(focal_gamma, groups, multi_label) for b in REGISTRY.values() if _fused(b)
               and b.auto_eligible and device.type in b.device_types):
        # The call's own arguments: warned for each call, as each may differ.
        warnings.warn(f"scl_kernels: {why}; backend='auto' uses the dense O(N^2) 'reference' "
                      "backend", stacklevel=4)
    elif device.type not in _warned_dense_devices:
        _warned_dense_devices.add(device.type)
        serving = [b.name for b in REGISTRY.values()
                   if _fused(b) and b.auto_eligible and device.type in b.device_types]
        why = (f"backends {serving} serve {device.type} but cannot run in this installation "
               f"({'build the extension, install triton' if serving else 'none is written for it'})")
        warnings.warn(f"scl_kernels: no fused backend for {device.type} tensors ({why}); "
                      "backend='auto' uses the dense O(N^2) 'reference' backend", stacklevel=4)
    return REGISTRY["reference"]


def refusal(asked: str, plan_line: str, remedy: str) -> str:
    """A refused call's one line: what was asked, the plan's line that refuses it and what to do,
    worded as the fused op's own refusals (require_runnable, csrc/core/call_plan.cpp)."""
    return f"{asked}: the plan's line '{plan_line}' refuses it; {remedy}"


def resolve_backend(name: str, device: torch.device, focal_gamma: float = 0.0,
                    shape: Optional[CallShape] = None, groups: bool = False,
                    multi_label: bool = False) -> Backend:
    """The backend that runs ``name`` on ``device`` (with ``focal_gamma``, already checked, and
    with or without ``groups`` and multi-hot labels; auto reads the call's ``shape`` where
    given), or an error that says why none can, in one line that quotes the plan's
    ``cannot_run`` (:func:`refusal`): a ValueError, or the loader's RuntimeError where the
    library is not loaded."""
    if name == "auto":
        return _auto(device, focal_gamma, shape, groups, multi_label)
    backend = get_backend(name)
    asked = f"backend={name!r} on {device}"
    if not backend.runs(focal_gamma):
        raise ValueError(refusal(f"{asked} with focal_gamma={focal_gamma}",
                                 "cannot_run: no focal walk",
                                 f"it does not implement the focal contrastive loss; backends "
                                 f"that do: {focal_backends()}"))
    if not backend.runs(0.0, groups):
        raise ValueError(refusal(f"{asked} with groups", "cannot_run: no group mask",
                                 f"its tiles have no group mask (known false negatives); "
                                 f"backends that have it: {group_backends()}"))
    if not backend.runs(0.0, False, multi_label):
        raise ValueError(refusal(f"{asked} with multi-hot labels", "cannot_run: no pair weights",
                                 f"its positive walk has no pair weights (multi-label "
                                 f"positives); backends that have them: "
                                 f"{multi_label_backends()}"))
    if device.type not in backend.device_types:
        raise ValueError(refusal(asked, f"cannot_run: no {device.type} kernels",
                                 f"it runs on {' and '.join(backend.device_types)} tensors, "
                                 f"but features is on {device}; available there: "
                                 f"{available_backends(device)}"))
    if not backend.available(device):
        if _fused(backend) and not library_loaded():
            try:
                require_library()
            except RuntimeError as error:
                raise RuntimeError(refusal(asked, "cannot_run: library not loaded",
                                           str(error))) from error
        if name == "triton" and not triton_installed():
            raise ValueError(refusal(asked, "cannot_run: no triton package", TRITON_MISSING))
        if name == "triton":
            raise ValueError(refusal(asked, "cannot_run: cpu tensors without the interpreter",
                                     TRITON_CPU_NEEDS_INTERPRETER))
        if name == "cuda":
            raise ValueError(refusal(asked, "cannot_run: no CUDA kernels built", CUDA_NOT_BUILT))
        raise ValueError(refusal(asked, "cannot_run: not in this installation",
                                 f"it cannot run {device.type} tensors here; available there: "
                                 f"{available_backends(device)}"))
    return backend
