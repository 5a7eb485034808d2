"""The O(N*D) half of the Triton backend, in PyTorch: argument checks, row scales, labels, and
the positive-pair, normalisation and temperature terms (KERNEL_MATH.md sections 1 and 3). It
mirrors csrc/supcon_problem.cpp, which serves the C++ backends; the kernels add only the tiled
log-sum-exp and its gradient.

Memory is the point of this backend, so nothing here makes a full fp32 copy of the rows: every
row-wise step runs over chunks of rows (`_chunks`), and class sums have one row per distinct
label. Beyond the inputs, a call holds O(N) vectors, the fp32 gradient accumulator of the
kernels, and one chunk of temporaries.
"""
from dataclasses import dataclass

import torch

NORM_EPS = 1e-12  # as torch.nn.functional.normalize
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CHUNK_ELEMENTS = 1 << 24  # fp32 temporaries of at most 64 MiB per step


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
    q_norm: torch.Tensor    # fp32 max(||x||, eps) per row (ones without normalisation)
    z_norm: torch.Tensor
    q_scale: torch.Tensor   # fp32 1 / q_norm, as the kernels multiply
    z_scale: torch.Tensor
    anchor_class: torch.Tensor   # compact class ids (valid where the label is >= 0)
    contrast_class: torch.Tensor
    contrast_valid: torch.Tensor
    class_sums: torch.Tensor     # [classes, d] fp32 sums of unit contrast rows per class
    self_positive: torch.Tensor  # [m] anchor's own column would have been a positive
    num_positives: torch.Tensor  # [m] int64


def _chunks(rows, d):
    step = max(1, CHUNK_ELEMENTS // max(d, 1))
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def _unit(rows, norm, part):
    """fp32 unit rows of one chunk, divided as F.normalize does (a unit row of width 1 is +-1)."""
    return rows[part].float() / norm[part, None]


def _check(features, labels, contrast, contrast_labels, temperature, num_anchors, check_values):
    for name, x in (("features", features), ("contrast", contrast)):
        if x is None:
            continue
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
        if x.dim() != 2 or x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"{name} must have shape [rows >= 1, dim >= 1], got {tuple(x.shape)}")
        if x.numel() >= 2**31:  # the kernels address rows with int32 offsets
            raise ValueError(f"{name} has {x.numel()} elements; the Triton backend takes fewer "
                             "than 2^31 per tensor (split the batch, or use another backend)")
        if check_values and not bool(torch.isfinite(x).all()):
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
    for name, x in (("labels", labels), ("contrast", contrast), ("contrast_labels", contrast_labels)):
        if x is not None and x.device != features.device:
            raise ValueError(f"{name} is on {x.device} but features is on {features.device}")
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
    """Rows in a dtype the kernels read (float64 runs in float32) and their fp32 norms."""
    rows = (x if x.dtype in KERNEL_DTYPES else x.float()).contiguous()
    norm = torch.ones(rows.shape[0], dtype=torch.float32, device=rows.device)
    if normalize:
        for part in _chunks(rows.shape[0], rows.shape[1]):
            norm[part] = torch.linalg.vector_norm(rows[part].float(), dim=1).clamp_min(NORM_EPS)
    return rows, norm


def prepare(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
            check_values=True):
    """The problem of one call. ``check_values`` scans the inputs for NaN / inf (a device sync):
    forward does, backward (same inputs) does not."""
    t = _check(features, labels, contrast, contrast_labels, temperature, num_anchors, check_values)
    single_set = contrast is None
    z, z_norm = _rows(features if single_set else contrast, normalize)
    if single_set:
        m = num_anchors
        q, q_norm = z[:m], z_norm[:m]
        all_labels = labels.long()
    else:
        q, q_norm = _rows(features, normalize)
        m = q.shape[0]
        all_labels = torch.cat([labels.long(), contrast_labels.long()])
    ids = torch.unique(all_labels.clamp_min(-1), return_inverse=True)[1]
    valid = all_labels >= 0
    offset = 0 if single_set else m
    n, d = z.shape
    anchor_class, anchor_valid = ids[:m], valid[:m]
    contrast_class, contrast_valid = ids[offset:offset + n], valid[offset:offset + n]
    classes = int(ids.max()) + 1
    counts = torch.zeros(classes, dtype=torch.long, device=ids.device).index_add_(
        0, contrast_class, contrast_valid.long())
    class_sums = torch.zeros(classes, d, dtype=torch.float32, device=z.device)
    for part in _chunks(n, d):
        class_sums.index_add_(0, contrast_class[part],
                              _unit(z, z_norm, part) * contrast_valid[part, None])
    self_positive = anchor_valid if single_set else torch.zeros_like(anchor_valid)
    num_positives = torch.where(anchor_valid, counts[anchor_class] - self_positive.long(), 0)
    return Problem(single_set, normalize, 1.0 / t, m, n, d, q, z, q_norm, z_norm, 1.0 / q_norm,
                   1.0 / z_norm, anchor_class,
                   contrast_class, contrast_valid, class_sums, self_positive, num_positives)


def _positive_targets(p: Problem, part, q_unit):
    """C_{y_i} - [self] z_i for the anchors of one chunk."""
    targets = p.class_sums[p.anchor_class[part]]
    if p.single_set:
        targets -= p.self_positive[part, None] * q_unit
    return targets


def anchor_losses(p: Problem, lse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    positive_dots = torch.empty(p.m, dtype=torch.float32, device=lse.device)
    for part in _chunks(p.m, p.d):
        q_unit = _unit(p.q, p.q_norm, part)
        positive_dots[part] = (q_unit * _positive_targets(p, part, q_unit)).sum(1)
    positive_mean = positive_dots * p.inv_t / p.num_positives.clamp_min(1)
    return torch.where(p.num_positives > 0, lse - positive_mean, 0.0).to(dtype)


def effective_grads(p: Problem, grad_loss: torch.Tensor) -> torch.Tensor:
    return torch.where(p.num_positives > 0, grad_loss.float(), 0.0).contiguous()


def add_positive_grads(p: Problem, g, dq, dz):
    """Adds the positive-pair part of the gradient w.r.t. the unit rows, in place (dq may be a
    view of dz in single set)."""
    w = g / p.num_positives.clamp_min(1)
    weighted = torch.zeros_like(p.class_sums)
    for part in _chunks(p.m, p.d):
        q_unit = _unit(p.q, p.q_norm, part)
        weighted.index_add_(0, p.anchor_class[part], w[part, None] * q_unit)
        dq[part] -= (w[part, None] * p.inv_t) * _positive_targets(p, part, q_unit)
        if p.single_set:  # the anchor's own column was not a positive: give back its share
            dz[part] += (w[part, None] * p.self_positive[part, None] * p.inv_t) * q_unit
    for part in _chunks(p.n, p.d):
        dz[part] -= weighted[p.contrast_class[part]] * (p.contrast_valid[part, None] * p.inv_t)


def anchor_dot(p: Problem, rows, norm, grads) -> torch.Tensor:
    """sum_i u_i . grads_i over unit rows u: sum_ij G_ij s_ij when grads is the anchor side."""
    total = torch.zeros((), dtype=torch.float32, device=grads.device)
    for part in _chunks(grads.shape[0], p.d):
        total += (_unit(rows, norm, part) * grads[part]).sum()
    return total


def unit_backward(p: Problem, rows, norm, d_unit, dtype):
    """dx from the gradient w.r.t. unit rows, through z = x / max(||x||, eps)."""
    if not p.normalize:
        return d_unit.to(dtype)
    out = torch.empty(d_unit.shape, dtype=dtype, device=d_unit.device)
    for part in _chunks(d_unit.shape[0], p.d):
        unit, grad, divisor = _unit(rows, norm, part), d_unit[part], norm[part]
        # Below eps the divisor is a constant: no projection (as autograd of F.normalize).
        radial = torch.where(divisor > NORM_EPS, (unit * grad).sum(1), 0.0)
        out[part] = (grad - unit * radial[:, None]) / divisor[:, None]
    return out


def temperature_grad(p: Problem, dot: torch.Tensor, temperature: torch.Tensor):
    """dLoss/dt = -(1/t) sum_ij G_ij s_ij."""
    return (dot * -p.inv_t).to(temperature.dtype).reshape(temperature.shape).to(temperature.device)
