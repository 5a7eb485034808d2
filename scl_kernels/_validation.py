"""The argument checks shared by every public entry point (supcon_loss, the nn modules, the
distributed loss and the integrations): one implementation, so the same bad input gives the same
error wherever it is passed."""
import math
from numbers import Real
from typing import Optional, Tuple, TypeGuard, cast, get_args

import torch

from ._types import ContrastMode, MultiLabel, Reduction, Temperature
from .backends import BACKENDS
from .backends.reference import temperature_value_error

CONTRAST_MODES: Tuple[str, ...] = get_args(ContrastMode)
REDUCTIONS: Tuple[str, ...] = get_args(Reduction)
MULTI_LABEL_RULES: Tuple[str, ...] = get_args(MultiLabel)

# The checks take ``object``: they are what stands between a caller's arguments and the
# declared types.


def check_contrast_mode(contrast_mode: object) -> None:
    if contrast_mode not in CONTRAST_MODES:
        raise ValueError(f"contrast_mode must be one of {CONTRAST_MODES}, got {contrast_mode!r}")


def check_normalize(normalize: object) -> None:
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")


def check_reduction(reduction: object) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def check_backend_name(backend: object) -> None:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def has_values(tensor: torch.Tensor) -> bool:
    """False for tensors whose data cannot be read on the host: meta tensors (shapes only) and
    anything seen while torch.compile traces (fake tensors)."""
    return tensor.device.type != "meta" and not torch.compiler.is_compiling()


def _is_real_number(value: object) -> TypeGuard[Real]:
    """A real number and not a bool. A float is answered first: numbers.Real's abstract-class
    check takes about a microsecond, and supcon_loss checks two numbers a call."""
    return type(value) is float or (not isinstance(value, bool) and isinstance(value, Real))


def check_temperature(temperature: object, *, check_value: bool) -> None:
    """Type and shape of a float or 0-dim tensor temperature, and with ``check_value`` its value
    (a tensor's never for meta tensors or under torch.compile).

    The loss modules check their temperature's value when built (``check_value``); a call
    leaves it to the backend, which checks it once per call where it reads it (the op's plan,
    or, for a temperature it leaves in device memory, its deferred check; the reference
    backend's own check), so that no call checks it twice and a learnable CUDA temperature is
    not read twice.
    """
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise TypeError(f"temperature must be a floating-point tensor, got {temperature.dtype}")
        if temperature.numel() != 1 or temperature.dim() != 0:
            raise ValueError(f"temperature must be a 0-dim tensor, got shape {tuple(temperature.shape)}")
        if check_value and has_values(temperature):
            value = float(temperature.detach())
            if not (math.isfinite(value) and value > 0):
                raise temperature_value_error(value)
        return
    if not _is_real_number(temperature):
        raise TypeError(f"temperature must be a float or a 0-dim tensor, got {type(temperature).__name__}")
    # Comparisons rather than math.isfinite, which torch.compile cannot trace when the float is
    # an input of the compiled function (NaN fails both). typeshed's numbers.Real declares no
    # comparisons: a real number compares as a float does.
    if check_value and not 0 < cast(float, temperature) < math.inf:
        raise temperature_value_error(float(cast(float, temperature)))


def check_non_negative(value: object, name: str) -> float:
    """value as a float: a real number, finite and >= 0; TypeError / ValueError naming it."""
    if not _is_real_number(value):
        raise TypeError(f"{name} must be a float >= 0, got {type(value).__name__}")
    # Comparisons rather than math.isfinite, which torch.compile cannot trace (NaN fails both).
    if not 0 <= cast(float, value) < math.inf:  # a Real compares as a float (see above)
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return float(value)


def check_focal_gamma(focal_gamma: object) -> float:
    """focal_gamma as a float (0 is SupCon)."""
    return check_non_negative(focal_gamma, "focal_gamma")


def check_options(temperature: object, contrast_mode: object, normalize: object,
                  reduction: object, backend: object, *, check_value: bool) -> None:
    check_contrast_mode(contrast_mode)
    check_normalize(normalize)
    check_reduction(reduction)
    check_backend_name(backend)
    check_temperature(temperature, check_value=check_value)


def check_tensor(value: object, name: str, *, floating: bool) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
    if not floating and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")


def check_same_device(value: torch.Tensor, name: str, device: torch.device) -> None:
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but features is on {device}")


def temperature_tensor(temperature: Temperature, device: torch.device) -> torch.Tensor:
    """The (already checked) temperature as a tensor the backends take."""
    if isinstance(temperature, torch.Tensor):
        if temperature.device != device and temperature.device.type != "cpu":
            raise ValueError(f"temperature is on {temperature.device} but features is on {device}")
        return temperature
    return torch.tensor(float(temperature), dtype=torch.float64)


def check_multi_label(multi_label: object) -> None:
    if multi_label not in MULTI_LABEL_RULES:
        raise ValueError(f"multi_label must be one of {MULTI_LABEL_RULES}, got {multi_label!r}")


def check_label_rows(labels: torch.Tensor, name: str) -> None:
    """Labels as class ids (an integer [rows] tensor) or multi-hot rows (a bool or integer
    [rows, C] tensor, C >= 1)."""
    if labels.dim() not in (1, 2):
        raise ValueError(f"{name} must be one-dimensional (class ids) or two-dimensional "
                         f"(multi-hot rows), got shape {tuple(labels.shape)}")
    if labels.dim() == 1 or labels.dtype != torch.bool:
        check_tensor(labels, name, floating=False)
    if labels.dim() == 2 and labels.shape[1] == 0:
        raise ValueError(f"{name} as multi-hot rows must have at least one class")


def check_inputs(features: torch.Tensor, labels: Optional[torch.Tensor],
                 groups: Optional[torch.Tensor] = None) -> None:
    """Types, devices and shapes of features and of its per-sample labels (class ids or
    multi-hot rows) and groups."""
    check_tensor(features, "features", floating=True)
    for name, per_sample in (("labels", labels), ("groups", groups)):
        if per_sample is None:
            continue
        if name == "labels":
            if not isinstance(per_sample, torch.Tensor):
                raise TypeError(f"labels must be a torch.Tensor, got {type(per_sample).__name__}")
            check_label_rows(per_sample, name)
        else:
            check_tensor(per_sample, name, floating=False)
            if per_sample.dim() != 1:
                raise ValueError(f"{name} must be one-dimensional, got shape "
                                 f"{tuple(per_sample.shape)}")
        check_same_device(per_sample, name, features.device)
        expected = features.shape[0] if features.dim() in (2, 3) else None
        if expected is not None and per_sample.shape[0] != expected:
            raise ValueError(f"{name} has {per_sample.shape[0]} entries but features has "
                             f"{expected} samples")
