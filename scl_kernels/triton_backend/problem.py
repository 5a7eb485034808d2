"""The O(N*D) half of the Triton backend, in PyTorch: argument checks, row scales, labels, and
the positive-pair, normalisation and temperature terms (KERNEL_MATH.md sections 1 and 3). It
mirrors csrc/supcon_problem.cpp, which serves the C++ backends; the kernels add only the tiled
log-sum-exp and its gradient."""
from dataclasses import dataclass

import torch

NORM_EPS = 1e-12  # as torch.nn.functional.normalize
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class Problem:
    single_set: bool        # contrast is the features; anchor i's self column is i
    normalize: bool
    inv_t: float
    m: int
    n: int
    d: int
    q: torch.Tensor         # raw anchor rows as the kernels read them (contiguous)
    z: torch.Tensor         # raw contrast rows
    q_scale: torch.Tensor   # fp32 1 / max(||x||, eps) per row (ones without normalisation)
    z_scale: torch.Tensor
    q_unit: torch.Tensor    # fp32 normalised rows, for the O(N*D) terms
    z_unit: torch.Tensor
    anchor_class: torch.Tensor
    contrast_class: torch.Tensor
    contrast_valid: torch.Tensor
    class_sums: torch.Tensor    # [n_classes_bound, d] sums of unit contrast rows per class
    self_positive: torch.Tensor  # [m] anchor's own column would have been a positive
    num_positives: torch.Tensor  # [m] int64


def _check(features, labels, contrast, contrast_labels, temperature, num_anchors):
    for name, x in (("features", features), ("contrast", contrast)):
        if x is None:
            continue
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
        if x.dim() != 2 or x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"{name} must have shape [rows >= 1, dim >= 1], got {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or inf")
    for name, y, rows in (("labels", labels, features), ("contrast_labels", contrast_labels, contrast)):
        if y is None:
            continue
        if y.is_floating_point() or y.dtype == torch.bool or y.is_complex():
            raise TypeError(f"{name} must be an integer tensor, got {y.dtype}")
        if y.dim() != 1 or y.shape[0] != rows.shape[0]:
            raise ValueError(f"{name} must have shape [{rows.shape[0]}], got {tuple(y.shape)}")
    if (contrast is None) != (contrast_labels is None):
        raise ValueError("contrast and contrast_labels must be given together")
    if contrast is not None and contrast.shape[1] != features.shape[1]:
        raise ValueError(f"contrast has dimension {contrast.shape[1]} but features has {features.shape[1]}")
    limit = features.shape[0]
    if contrast is None and not 1 <= num_anchors <= limit:
        raise ValueError(f"num_anchors must lie in [1, {limit}], got {num_anchors}")
    if contrast is not None and num_anchors != limit:
        raise ValueError("num_anchors must equal the number of feature rows with a contrast set")
    t = float(temperature)
    if not (t > 0 and t != float("inf")):
        raise ValueError(f"temperature must be positive and finite, got {t}")
    return t


def _rows(x, normalize):
    """Rows in a dtype the kernels read (float64 runs in float32) with their fp32 scales."""
    rows = (x if x.dtype in KERNEL_DTYPES else x.float()).contiguous()
    if not normalize:
        return rows, torch.ones(rows.shape[0], dtype=torch.float32, device=rows.device), rows.float()
    norm = torch.linalg.vector_norm(rows.float(), dim=1).clamp_min(NORM_EPS)
    # Divided, as F.normalize does, so that a unit row is exactly what the reference sees.
    return rows, 1.0 / norm, rows.float() / norm[:, None]


def _group_ids(labels):
    """Per row, the sorted position of the first row with the same label: a class id that needs
    no data-dependent output size (unlike torch.unique)."""
    ordered, order = torch.sort(labels, stable=True)
    positions = torch.arange(labels.numel(), device=labels.device)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    leader = torch.cummax(torch.where(starts, positions, torch.zeros_like(positions)), dim=0).values
    return torch.empty_like(leader).scatter_(0, order, leader)


def prepare(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize):
    t = _check(features, labels, contrast, contrast_labels, temperature, num_anchors)
    single_set = contrast is None
    z, z_scale, z_unit = _rows(features if single_set else contrast, normalize)
    if single_set:
        m = num_anchors
        q, q_scale, q_unit = z[:m], z_scale[:m], z_unit[:m]
        all_labels = labels.long()
    else:
        q, q_scale, q_unit = _rows(features, normalize)
        m = q.shape[0]
        all_labels = torch.cat([labels.long(), contrast_labels.long()])
    ids = _group_ids(all_labels.clamp_min(-1))
    valid = all_labels >= 0
    offset = 0 if single_set else m
    n = z.shape[0]
    anchor_class, anchor_valid = ids[:m], valid[:m]
    contrast_class, contrast_valid = ids[offset:offset + n], valid[offset:offset + n]
    bound = ids.numel()
    counts = torch.zeros(bound, dtype=torch.long, device=ids.device).index_add_(
        0, contrast_class, contrast_valid.long())
    class_sums = torch.zeros(bound, z.shape[1], dtype=torch.float32, device=z.device).index_add_(
        0, contrast_class, z_unit * contrast_valid[:, None])
    self_positive = anchor_valid if single_set else torch.zeros_like(anchor_valid)
    num_positives = torch.where(anchor_valid, counts[anchor_class] - self_positive.long(), 0)
    return Problem(single_set, normalize, 1.0 / t, m, n, z.shape[1], q, z, q_scale, z_scale,
                   q_unit, z_unit, anchor_class, contrast_class, contrast_valid, class_sums,
                   self_positive, num_positives)


def anchor_losses(p: Problem, lse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    targets = p.class_sums[p.anchor_class]
    if p.single_set:
        targets = targets - p.self_positive[:, None] * p.q_unit
    positive_mean = (p.q_unit * targets).sum(1) * p.inv_t / p.num_positives.clamp_min(1)
    loss = torch.where(p.num_positives > 0, lse - positive_mean, 0.0)
    return loss.to(dtype)


def effective_grads(p: Problem, grad_loss: torch.Tensor) -> torch.Tensor:
    return torch.where(p.num_positives > 0, grad_loss.float(), 0.0).contiguous()


def add_positive_grads(p: Problem, g, dq, dz):
    """Adds the positive-pair part of the gradient w.r.t. the unit rows, in place."""
    w = (g / p.num_positives.clamp_min(1))[:, None]
    targets = p.class_sums[p.anchor_class]
    if p.single_set:
        targets = targets - p.self_positive[:, None] * p.q_unit
    dq.sub_(w * targets, alpha=p.inv_t)
    weighted = torch.zeros_like(p.class_sums).index_add_(0, p.anchor_class, w * p.q_unit)
    dz.sub_(weighted[p.contrast_class] * p.contrast_valid[:, None], alpha=p.inv_t)
    if p.single_set:
        dz[: p.m].add_(w * p.self_positive[:, None] * p.q_unit, alpha=p.inv_t)


def unit_backward(p: Problem, unit, scale, d_unit, dtype):
    """dx from the gradient w.r.t. unit rows, through z = x / max(||x||, eps)."""
    if not p.normalize:
        return d_unit.to(dtype)
    # Below eps the divisor is a constant: no projection (as autograd of F.normalize).
    radial = torch.where(scale < 1.0 / NORM_EPS, (unit * d_unit).sum(1), 0.0)
    return ((d_unit - unit * radial[:, None]) * scale[:, None]).to(dtype)


def temperature_grad(p: Problem, anchor_dot: torch.Tensor, temperature: torch.Tensor):
    """dLoss/dt = -(1/t) sum_ij G_ij s_ij, with anchor_dot = sum_i q_i . dq_i (anchor side)."""
    return (anchor_dot * -p.inv_t).to(temperature.dtype).reshape(temperature.shape).to(temperature.device)
