"""An independent float64 dense SupCon reference (and focal contrastive loss) and a
backend-vs-reference checker.

Written from the public contract (docs/MATH.md and the supcon_loss docstring), without importing
scl_kernels.backends.reference: every mask is built explicitly and every value is float64, so
autograd through it gives the exact gradient that a backend must reproduce.

``check_against_reference(backend, ...)`` is shared by the test files of every backend (cpu, cuda,
triton): it runs ``scl_kernels.supcon_loss(..., backend=backend)`` and this reference on the
same (already rounded) inputs, and compares the loss and the gradients w.r.t. features, contrast
and a tensor temperature with dtype-dependent tolerances.
"""
import ctypes
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

NORM_EPS = 1e-12


# --------------------------------------------------------------------------------------------
# The reference
# --------------------------------------------------------------------------------------------

def _unit_rows(x, normalize):
    if not normalize:
        return x
    # torch.linalg.vector_norm has a zero subgradient at 0, and clamp_min passes no gradient
    # below eps: an all-zero row gets dx = dz / eps, exactly as F.normalize does.
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return x / norms.clamp_min(NORM_EPS)


def _views_of(per_sample, views):
    """A per-sample tensor ([B] or [B, C]) repeated for the view-major rows, or None."""
    return None if per_sample is None else torch.cat([per_sample] * views)


def _layout(features, labels, contrast, contrast_labels, contrast_mode):
    """Rows, labels and masks of one call, following the public contract.

    Returns (anchor_idx, rows, row_labels, contrast_rows or None, contrast_labels or None).
    Labels are [rows] class ids or [rows, C] multi-hot (docs/MATH.md, "Multi-label positives").
    """
    if features.dim() == 3:
        b, v, d = features.shape
        # view-major: row v*B + b is view v of sample b
        rows = torch.stack([features[:, k, :] for k in range(v)], dim=0).reshape(v * b, d)
        row_labels = _views_of(labels, v)
    else:
        b, v = features.shape[0], 1
        rows = features
        row_labels = labels
    n = rows.shape[0]
    if contrast is None:
        if row_labels is None:
            # every sample is its own class: views of one sample are positives of each other
            row_labels = torch.cat([torch.arange(b)] * v)
        num_anchors = b if contrast_mode == "one" else n
        return num_anchors, rows, row_labels.to(torch.int64), None, None
    if contrast_mode != "all":
        raise ValueError("reference64: contrast_mode='one' with contrast")
    if contrast_labels is None:
        assert row_labels is None
        m = contrast.shape[0]
        assert m >= n
        row_labels = torch.arange(n)
        contrast_labels = torch.full((m,), -1, dtype=torch.int64)
        contrast_labels[:n] = torch.arange(n)
    return n, rows, row_labels.to(torch.int64), contrast, contrast_labels.to(torch.int64)


@dataclass
class RefResult:
    per_anchor: torch.Tensor          # float64 [A] (in the graph)
    loss: torch.Tensor                # reduced as asked (in the graph)
    lse: torch.Tensor                 # float64 [A] (-inf for an anchor without any column)
    num_positives: torch.Tensor       # int64 [A]
    logits: torch.Tensor = field(repr=False)    # float64 [A, C], in the graph
    allowed: torch.Tensor = field(repr=False)   # bool [A, C]: the columns A(i)
    positive: torch.Tensor = field(repr=False)  # bool [A, C]: P(i)
    anchors: torch.Tensor = field(repr=False)   # float64 [A, D] q (detached)
    columns: torch.Tensor = field(repr=False)   # float64 [C, D] z (detached)
    row_norms: torch.Tensor = field(repr=False)       # [rows] ||x|| of the flattened features
    contrast_norms: torch.Tensor = field(repr=False)  # [M] ||contrast|| or None
    single_set: bool = True
    batch: int = 0                    # B of a [B, V, D] input (N for [N, D])
    focal_gamma: float = 0.0
    weights: torch.Tensor = field(repr=False, default=None)  # float64 [A, C]: w_ij, 0 off P(i)


def pair_weights(anchor_labels, column_labels, multi_label):
    """w_ij (float64 [A, C]) before the self column and the groups: 1 for equal class ids >= 0;
    for multi-hot rows, 1 when they share a class ("any") or |Y_i & Y_j| / |Y_i | Y_j|
    ("jaccard"); 0 elsewhere, so a row without a class is nobody's positive."""
    if multi_label not in ("any", "jaccard"):
        raise ValueError(f"multi_label must be 'any' or 'jaccard', got {multi_label!r}")
    if anchor_labels.dim() == 1:
        same = (anchor_labels[:, None] == column_labels[None, :]) & (anchor_labels[:, None] >= 0)
        return same.to(torch.float64)
    assert anchor_labels.shape[1] == column_labels.shape[1], "multi-hot labels of one width"
    assert bool(((anchor_labels == 0) | (anchor_labels == 1)).all()), "multi-hot labels are 0/1"
    y_a, y_c = anchor_labels.to(torch.float64), column_labels.to(torch.float64)
    shared = y_a @ y_c.T  # |Y_i & Y_j|, exact: sums of ones
    if multi_label == "any":
        return (shared > 0).to(torch.float64)
    union = y_a.sum(1)[:, None] + y_c.sum(1)[None, :] - shared
    return torch.where(union > 0, shared / union.clamp_min(1), torch.zeros_like(shared))


def supcon_reference64(features, labels=None, temperature=0.1, *, contrast=None,
                       contrast_labels=None, contrast_mode="all", normalize=True,
                       reduction="mean", full=False, focal_gamma=0.0, multi_label="any",
                       groups=None, contrast_groups=None):
    """Dense float64 SupCon loss. Differentiable w.r.t. features, contrast and a tensor temperature.

    ``focal_gamma`` > 0: the focal contrastive loss (docs/MATH.md, "Focal contrastive loss"),
    l_i = (1/|P(i)|) sum_p (1 - pi_ip)^gamma (-log pi_ip) with pi_ip = exp(s_ip - LSE_i).

    Multi-label positives and known false negatives (docs/MATH.md, "Multi-label positives and
    known false negatives"): ``labels`` (and ``contrast_labels``) may be multi-hot [rows, C], the
    pair weights w_ij following ``multi_label`` (pair_weights); ``groups`` [B] (and
    ``contrast_groups`` [M] in a cross set) are integer ids, negative for none, and a pair of one
    group with w_ij = 0 leaves the denominator. The anchor's loss is the w-weighted mean over
    P(i) = {j in A(i): w_ij > 0}, of -log pi_ij (or of the focal term).

    With ``full=True`` returns a :class:`RefResult` (per-anchor loss, LSE, |P(i)|, logits).
    """
    # everything on the CPU in float64 (inputs on a GPU are copied; autograd flows back)
    x = features.to(device="cpu", dtype=torch.float64)
    c = None if contrast is None else contrast.to(device="cpu", dtype=torch.float64)
    labels = None if labels is None else labels.cpu()
    contrast_labels = None if contrast_labels is None else contrast_labels.cpu()
    if isinstance(temperature, torch.Tensor):
        t = temperature.to(device="cpu", dtype=torch.float64)
    else:
        t = float(temperature)

    num_anchors, rows, row_labels, c, c_labels = _layout(x, labels, c, contrast_labels, contrast_mode)
    row_groups = None if groups is None else _views_of(groups.cpu(), rows.shape[0] // groups.shape[0])
    if (c is not None) and ((groups is None) != (contrast_groups is None)):
        raise ValueError("reference64: a cross set takes groups and contrast_groups together")
    z = _unit_rows(rows, normalize)
    if c is None:
        cz = z
        col_labels = row_labels
        q = z[:num_anchors]
        q_labels = row_labels[:num_anchors]
        q_groups, col_groups = (None, None) if row_groups is None else (row_groups[:num_anchors],
                                                                         row_groups)
        self_mask = torch.zeros(num_anchors, cz.shape[0], dtype=torch.bool)
        idx = torch.arange(num_anchors)
        self_mask[idx, idx] = True
    else:
        cz = _unit_rows(c, normalize)
        col_labels = c_labels
        q = z
        q_labels = row_labels
        q_groups = row_groups
        col_groups = None if contrast_groups is None else contrast_groups.cpu()
        self_mask = torch.zeros(q.shape[0], cz.shape[0], dtype=torch.bool)

    logits = (q @ cz.T) / t                                                   # [A, C]
    weights = pair_weights(q_labels, col_labels, multi_label)
    allowed = ~self_mask                                                      # A(i)
    if q_groups is not None:
        same_group = (q_groups[:, None] == col_groups[None, :]) & (q_groups[:, None] >= 0)
        allowed &= ~(same_group & (weights == 0))
    positive = allowed & (weights > 0)
    weights = torch.where(positive, weights, torch.zeros_like(weights))
    num_pos = positive.sum(dim=1)
    has_col = allowed.any(dim=1)

    # LSE over allowed columns, shifted by a detached row max; rows without any column get a
    # harmless placeholder so that no NaN ever enters the graph.
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    masked = torch.where(allowed, logits, neg_inf)
    row_max = torch.where(has_col, masked.max(dim=1).values, torch.zeros((), dtype=torch.float64))
    row_max = row_max.detach()
    shifted = torch.where(allowed, logits - row_max[:, None], torch.full_like(logits, -1e300))
    exps = torch.where(allowed, torch.exp(shifted.clamp_max(700)), torch.zeros_like(logits))
    sums = exps.sum(dim=1)
    safe_sums = torch.where(has_col, sums, torch.ones_like(sums))
    lse = row_max + torch.log(safe_sums)
    lse_report = torch.where(has_col, lse, neg_inf)

    # sum_j w_ij: |P(i)| for class ids, where every weight is 1
    denom = torch.where(num_pos > 0, weights.sum(dim=1), torch.ones_like(lse))
    if focal_gamma == 0:
        pos_sum = torch.where(positive, weights * logits, torch.zeros_like(logits)).sum(dim=1)
        per_anchor = torch.where(num_pos > 0, lse - pos_sum / denom, torch.zeros_like(lse))
    else:
        focal_sum = (weights * _focal_pair_terms(logits, lse, positive, focal_gamma)).sum(dim=1)
        per_anchor = torch.where(num_pos > 0, focal_sum / denom, torch.zeros_like(lse))

    valid = (num_pos > 0)
    if reduction == "none":
        loss = per_anchor
    elif reduction == "sum":
        loss = per_anchor.sum()
    elif reduction == "mean":
        count = int(valid.sum())
        loss = per_anchor.sum() / max(count, 1)
    else:
        raise ValueError(reduction)
    if full:
        return RefResult(per_anchor, loss, lse_report.detach(), num_pos, logits, allowed, positive,
                         q.detach(), cz.detach(),
                         torch.linalg.vector_norm(rows.detach(), dim=1),
                         None if c is None else torch.linalg.vector_norm(c.detach(), dim=1),
                         c is None, features.shape[0], focal_gamma, weights)
    return loss


def _focal_pair_terms(logits, lse, positive, gamma):
    """(1 - pi)^gamma * (-log pi) per positive pair, 0 elsewhere, pi = exp(s - LSE).

    1 - pi is -expm1(log pi), exact for pi near 1. A pair with log pi = 0 (the anchor's only
    column) has the term 0 and, for gamma > 0, the derivative 0 (it is (-log pi)^(1 + gamma) to
    first order); it is held out of the graph, where u^gamma would give 0 * inf."""
    log_pi = logits - lse[:, None]
    live = positive & (log_pi < 0)
    log_pi = torch.where(live, log_pi, torch.full_like(log_pi, -1.0))
    one_minus_pi = -torch.expm1(log_pi)
    return torch.where(live, one_minus_pi ** gamma * -log_pi, torch.zeros_like(log_pi))


# --------------------------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tol:
    loss_rtol: float
    loss_atol: float   # times the loss scale 1 + |LSE_i| + max |s_ip| (see loss_scale)
    grad_rtol: float
    grad_atol: float   # times the row's gradient scale (see gradient_scales)


TOLERANCES = {
    torch.float64: Tol(1e-10, 2e-14, 1e-10, 1e-11),
    torch.float32: Tol(1e-4, 1e-5, 1e-4, 2e-5),
    # 16-bit inputs: the loss is computed in fp32 from the rounded inputs (fp32 accuracy against
    # the reference on the same rounded inputs); gradients are rounded to the input dtype.
    torch.float16: Tol(1e-4, 1e-5, 4e-3, 2e-3),
    torch.bfloat16: Tol(1e-4, 1e-5, 2e-2, 1e-2),
}


def _logit_factor(dtype, logits):
    """fp32 logits carry an absolute error ~ eps32 * |s|, which exp turns into a relative error of
    the softmax: loosen the low-precision tolerances for large |s| (small t, normalize=False).
    float64 the same from |s| ~ 500: there the exponent's rounding (eps64 times |s| for each of
    the dot product's terms, in the kernel and in the reference) reaches the 1e-10 tolerance of
    the deepest exponentials (seen: 1.7e-10 at |s| ~ 2,000, D = 44)."""
    logits = logits.detach()
    finite = logits[torch.isfinite(logits)]
    smax = float(finite.abs().max()) if finite.numel() else 0.0
    return max(1.0, smax / (500.0 if dtype == torch.float64 else 50.0))


def loss_dtype_for(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def tolerance_dtype(dtype, compute_dtype=None):
    """The dtype whose tolerances apply to a backend's results: the input's, unless the backend
    computes in a coarser one (``Backend.computes_in``: float64 inputs computed in float32)."""
    if compute_dtype is not None and (torch.finfo(compute_dtype).eps
                                      > torch.finfo(loss_dtype_for(dtype)).eps):
        return compute_dtype
    return dtype


def assert_close_elementwise(actual, expected, rtol, atol, what):
    """|actual - expected| <= rtol*|expected| + atol element-wise; atol may be a tensor."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    assert torch.isfinite(a).all(), f"{what}: non-finite values {a}"
    allowed = rtol * e.abs() + atol
    err = (a - e).abs()
    bad = err > allowed
    if bad.any():
        idx = bad.nonzero()[0].tolist()
        k = tuple(idx)
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements differ; first at {k}: got "
            f"{float(a[k])!r}, expected {float(e[k])!r}, |diff| {float(err[k]):.3e} > allowed "
            f"{float(allowed[k] if torch.is_tensor(allowed) else allowed):.3e}; "
            f"max |diff| {float(err.max()):.3e}")


def assert_scaled_close(actual, expected, rtol, atol_scale, what, floor=0.0):
    """|actual - expected| <= rtol*|expected| + atol_scale*max|expected| + floor, element-wise."""
    e = expected.detach().to(torch.float64).cpu()
    scale = float(e.abs().max()) if e.numel() else 0.0
    assert_close_elementwise(actual, expected, rtol, atol_scale * scale + floor, what)


def flush_floor(ref, t_value, dtype):
    """An absolute error every element of a gradient may carry: vectorised exps flush results
    below the compute dtype's smallest normal number to zero, so an element can miss one such
    term per column, each times |z_j| / t."""
    tiny = torch.finfo(loss_dtype_for(dtype)).tiny
    columns = ref.columns
    magnitude = float(columns.abs().max()) if columns.numel() else 1.0
    return tiny * max(columns.shape[0], 1) * max(1.0, magnitude) / t_value


def _focal_weight_sensitivity(ref):
    """|d hterm / dx| (1 + |LSE_i| + |s_ip|) per positive pair (0 elsewhere): how much the pair's
    gradient weight hterm = u^gamma (1 + gamma pi x / u) moves per unit of relative rounding of
    the two terms of x = LSE_i - s_ip (u = 1 - pi, pi = e^-x). With f = u^gamma x, hterm = f' and
    f'' = gamma u^(gamma - 2) pi ((gamma - 1) pi x - u x + 2 u); x is held at least at that
    rounding's size, where f'' of gamma < 1 would be infinite at 0."""
    gamma = ref.focal_gamma
    logits = ref.logits.detach()
    lse = torch.where(torch.isfinite(ref.lse), ref.lse, torch.zeros_like(ref.lse))[:, None]
    size = 1 + lse.abs() + logits.abs()
    x = torch.maximum(lse - logits, size * torch.finfo(torch.float64).eps)
    x = torch.where(ref.positive, x, torch.ones_like(x))
    pi, u = torch.exp(-x), -torch.expm1(-x)
    slope = gamma * u ** (gamma - 2) * pi * ((gamma - 1) * pi * x - u * x + 2 * u)
    return torch.where(ref.positive, slope.abs() * size, torch.zeros_like(x))


class TemperatureScale(NamedTuple):
    """The sizes of the terms of dLoss/dt = -(1/t) sum_ij G_ij l_ij (l = the logits), from the
    bound |G|_ij of :func:`gradient_scales`: ``bound`` = sum_ij |G|_ij |q_i| |z_j| / t^2 (every
    term at its largest), ``rounding_rss`` = ||(|G|_ij |l_ij|)||_2 / t (the root of the sum of the
    squared terms, for independent roundings of the weights; the focal loss's sensitivity to the
    rounding of x = LSE - s is an fp32 effect, kept out of it)."""
    bound: float
    rounding_rss: float


def temperature_grad_atol(scale, factor, compute_eps, weights_dtype=None):
    """The absolute error allowed in dLoss/dt: the accumulation's rounding in the compute dtype,
    plus, where the backward's products take their weights G_ij rounded to a coarser dtype (the
    GPU backends on 16-bit inputs, as FlashAttention's backward does), that rounding. The terms
    cancel (dLoss/dt is a small difference of large sums at small t), so each term's relative
    rounding of up to eps/2 is what the sum carries; those roundings are independent, and by
    Hoeffding's inequality their sum exceeds 6 (eps/2) ||terms||_2 with probability below
    2 e^-18 = 3e-8. At t = 0.02 in bfloat16 that allows tens of percent of the result: the
    temperature's gradient is only as exact as the weights' dtype there (docs/MATH.md)."""
    atol = 32 * compute_eps * factor * scale.bound
    if weights_dtype is not None and torch.finfo(weights_dtype).eps > compute_eps:
        atol += 6 * torch.finfo(weights_dtype).eps / 2 * factor * scale.rounding_rss
    return atol


def _gradient_weights_dtype(backend, dtype):
    """The dtype a named backend's backward takes its weights in (None for other names)."""
    from scl_kernels.backends import REGISTRY
    return REGISTRY[backend].gradient_weights_dtype(dtype) if backend in REGISTRY else None


def norm_without_underflow(rows):
    """Each row's 2-norm, computed on the row divided by its largest |element|: squared, elements
    below about 1e-154 underflow, and a row's bound of 1e-163 came out as 0 (a column-only row
    whose every softmax weight is near 1e-174), which left its gradient no rounding at all."""
    largest = rows.abs().amax(dim=1)
    divisor = torch.where(largest > 0, largest, torch.ones_like(largest))
    return largest * torch.linalg.vector_norm(rows / divisor[:, None], dim=1)


def gradient_scales(ref, t_value, anchor_grads, normalize):
    """Per-row magnitudes that bound the rounding error of any sane implementation.

    A backend sums terms g_i p_ij s_ij and w_i [j in P(i)] s_ij that cancel (G_ij ~ 0 when the
    softmax mass sits on the positives, and exactly 0 after the radial projection for D = 1), so
    errors scale with sum_j |G|_ij |z_j| / t rather than with the gradient itself.
    Returns (features scale [rows], contrast scale [M] or None, :class:`TemperatureScale`).
    """
    g = anchor_grads.detach().abs() * (ref.num_positives > 0)
    p = torch.where(ref.allowed, torch.exp(ref.logits.detach() - torch.where(
        torch.isfinite(ref.lse), ref.lse, torch.zeros_like(ref.lse))[:, None]), torch.zeros(()))
    # The focal loss weighs both parts by factors up to 1 + gamma: (1 - pi)^gamma <= 1 and
    # pi (-log pi) / (1 - pi) <= 1.
    w = g * (1 + ref.focal_gamma) / ref.num_positives.clamp_min(1)
    a = g[:, None] * p * (1 + ref.focal_gamma) + w[:, None] * ref.positive  # |G|_ij bound
    logits = torch.where(torch.isfinite(ref.logits.detach()), ref.logits.detach().abs(),
                         torch.zeros(()))
    rounding_rss = float(torch.linalg.vector_norm(a * logits)) / t_value
    if ref.focal_gamma:
        # hterm(x) is steep near x = 0 for gamma < 1, and x = LSE - s carries an absolute
        # rounding error of the size of its terms: that error, through hterm, moves H_i (the
        # softmax part's factor) and the positive pair's own weight.
        moved = _focal_weight_sensitivity(ref)
        per_positive = moved / ref.num_positives.clamp_min(1)[:, None]
        a = a + g[:, None] * (p * per_positive.sum(dim=1, keepdim=True) + per_positive)
    anchor_side = a @ ref.columns.abs() / t_value                          # [A, D]
    column_side = a.T @ ref.anchors.abs() / t_value                        # [C, D]

    def through_norm(bound, norms):
        scale = norm_without_underflow(bound)
        return 2 * scale / norms.clamp_min(NORM_EPS) if normalize else scale

    # dLoss/dt = -(1/t) sum_i q_i . dq_i: terms of size |q_i| |z_j| / t each, whatever s_ij is
    s = ref.anchors.abs() @ ref.columns.abs().T / t_value
    t_scale = TemperatureScale(float((a * s).sum()) / t_value, rounding_rss)
    if ref.single_set:
        rows = column_side.clone()
        rows[: anchor_side.shape[0]] += anchor_side
        return through_norm(rows, ref.row_norms), None, t_scale
    return (through_norm(anchor_side, ref.row_norms),
            through_norm(column_side, ref.contrast_norms), t_scale)


def loss_scale(ref, reduction):
    """1 + |LSE_i| + max_{p in P(i)} |s_ip| per anchor (0 without positives), reduced as the loss."""
    valid = ref.num_positives > 0
    s = torch.where(ref.positive, ref.logits.detach().abs(), torch.zeros(()))
    lse = torch.where(torch.isfinite(ref.lse), ref.lse.abs(), torch.zeros(()))
    # + 1: log of a sum carries an absolute error ~ the sum's relative error, whatever its size
    per_anchor = torch.where(valid, 1 + lse + (s.max(dim=1).values if s.shape[1] else 0),
                             torch.zeros(()))
    if reduction == "none":
        return per_anchor
    if reduction == "sum":
        return per_anchor.sum()
    return per_anchor.sum() / max(int(valid.sum()), 1)


def _rows_to_input_shape(row_scale, like, batch):
    """A per-row scale of the flattened (view-major) rows, broadcast to the input's shape."""
    if like.dim() == 3:
        b, v, _ = like.shape
        return row_scale.reshape(v, b).T.unsqueeze(-1).expand(like.shape)
    return row_scale.unsqueeze(-1).expand(like.shape)


# --------------------------------------------------------------------------------------------
# Backend vs reference
# --------------------------------------------------------------------------------------------

@dataclass
class Checked:
    loss: torch.Tensor
    ref: RefResult
    grads: dict
    ref_grads: dict


def _leaf(x):
    # detach() keeps the strides (a transposed or sliced view stays non-contiguous)
    return x.detach().requires_grad_(True)


def check_against_reference(backend, features, labels=None, temperature=0.1, *, contrast=None,
                            contrast_labels=None, contrast_mode="all", normalize=True,
                            reduction="mean", generator=None, grads=True, tol=None,
                            upstream=None, compute_dtype=None, focal_gamma=0.0, groups=None,
                            contrast_groups=None, multi_label="any"):
    """Runs supcon_loss(backend=backend) and supcon_reference64 on the same inputs and compares
    the loss and, when ``grads``, the gradients w.r.t. features, contrast (if given) and
    temperature (if it is a tensor that requires grad). ``upstream``: the gradient fed to the
    output (random by default). ``compute_dtype``: what the backend computes ``features.dtype``
    in (``Backend.computes_in``); a coarser one than the input's sets the tolerances.
    ``focal_gamma``, ``groups``, ``contrast_groups``, ``multi_label``: passed to both.
    Returns a :class:`Checked`."""
    import scl_kernels

    dtype = features.dtype
    tol_dtype = tolerance_dtype(dtype, compute_dtype)
    tol = tol or TOLERANCES[tol_dtype]
    f = _leaf(features) if grads else features.detach()
    c = None
    if contrast is not None:
        c = _leaf(contrast) if grads else contrast.detach()
    temp_grad = isinstance(temperature, torch.Tensor) and temperature.requires_grad
    t = _leaf(temperature) if temp_grad else temperature

    out = scl_kernels.supcon_loss(f, labels, t, contrast=c, contrast_labels=contrast_labels,
                                  contrast_mode=contrast_mode, normalize=normalize,
                                  reduction=reduction, backend=backend, focal_gamma=focal_gamma,
                                  groups=groups, contrast_groups=contrast_groups,
                                  multi_label=multi_label)
    # reference on the very same (already rounded) values, in float64
    f64 = _leaf(features.detach().to(device="cpu", dtype=torch.float64))
    c64 = None if contrast is None else _leaf(contrast.detach().to(device="cpu", dtype=torch.float64))
    t64 = _leaf(temperature.detach().to(device="cpu", dtype=torch.float64)) if temp_grad else (
        temperature.detach().cpu() if isinstance(temperature, torch.Tensor) else temperature)
    ref = supcon_reference64(f64, labels, t64, contrast=c64, contrast_labels=contrast_labels,
                             contrast_mode=contrast_mode, normalize=normalize,
                             reduction=reduction, full=True, focal_gamma=focal_gamma,
                             groups=groups, contrast_groups=contrast_groups,
                             multi_label=multi_label)

    assert out.dtype == loss_dtype_for(dtype), f"loss dtype {out.dtype} for {dtype} input"
    assert out.shape == ref.loss.shape, f"loss shape {tuple(out.shape)} != {tuple(ref.loss.shape)}"
    assert out.device == features.device
    factor = _logit_factor(tol_dtype, ref.logits)
    # l_i = LSE_i - mean positive logit cancels (exactly 0 when the positive is the only column):
    # its rounding error scales with the two terms, not with l_i
    loss_atol = tol.loss_atol * factor * loss_scale(ref, reduction) + 1e-300
    assert_close_elementwise(out, ref.loss, tol.loss_rtol * factor, loss_atol, "loss")
    if reduction == "none":
        # anchors without a positive carry exactly zero loss
        no_pos = ref.num_positives == 0
        assert (out.detach().cpu()[no_pos] == 0).all(), "anchors without positives must give 0"

    result = Checked(out, ref, {}, {})
    if not grads:
        return result

    if upstream is None:
        if reduction == "none":
            upstream = torch.randn(out.shape, generator=generator, dtype=torch.float64)
        else:
            upstream = torch.tensor(
                0.5 + torch.rand((), generator=generator, dtype=torch.float64).item(),
                dtype=torch.float64)
    upstream64 = upstream.to(torch.float64)

    names, inputs, ref_inputs = ["features"], [f], [f64]
    if c is not None:
        names.append("contrast"); inputs.append(c); ref_inputs.append(c64)
    if temp_grad:
        names.append("temperature"); inputs.append(t); ref_inputs.append(t64)
    got = torch.autograd.grad(out, inputs, upstream.to(out.dtype).to(out.device))
    want = torch.autograd.grad(ref.loss, ref_inputs + [ref.per_anchor], upstream64)
    anchor_grads, want = want[-1], want[:-1]
    t_value = float(t64.detach()) if isinstance(t64, torch.Tensor) else float(t64)
    f_scale, c_scale, t_scale = gradient_scales(ref, t_value, anchor_grads, normalize)
    scales = {"features": _rows_to_input_shape(f_scale, features, ref.batch)}
    if c is not None:
        scales["contrast"] = _rows_to_input_shape(c_scale, contrast, None)

    compute_eps = 2.0 ** -52 if tol_dtype == torch.float64 else 2.0 ** -23
    for name, inp, g, w in zip(names, inputs, got, want):
        assert g is not None, f"no gradient for {name}"
        assert g.dtype == inp.dtype, f"grad of {name} has dtype {g.dtype}, input {inp.dtype}"
        assert g.shape == inp.shape, f"grad of {name} has shape {tuple(g.shape)}"
        assert g.device == inp.device, f"grad of {name} is on {g.device}"
        assert torch.isfinite(g).all(), f"grad of {name} is not finite: {g}"
        # rounding of the result to the gradient's dtype, down to subnormal spacing (float16)
        # and values below the compute dtype's normal range, which lose relative precision
        fi = torch.finfo(inp.dtype)
        rtol = max(tol.grad_rtol * factor, fi.eps)
        atol = max(fi.tiny * fi.eps, flush_floor(ref, t_value, tol_dtype))
        if name == "temperature":
            atol += temperature_grad_atol(t_scale, factor, compute_eps,
                                          _gradient_weights_dtype(backend, dtype))
        else:
            atol = atol + tol.grad_atol * factor * scales[name]
        assert_close_elementwise(g, w, rtol, atol, f"grad of {name}")
        result.grads[name] = g
        result.ref_grads[name] = w
    return result


# --------------------------------------------------------------------------------------------
# The raw ops: torch.ops.scl.<op>(features, labels, contrast, contrast_labels, temperature,
# num_anchors, normalize, anchor_offset=0) -> (loss, lse, num_positives), and its backward
# --------------------------------------------------------------------------------------------

@dataclass
class OpRef:
    loss: torch.Tensor            # float64 [A]: the anchors' losses
    lse: torch.Tensor             # float64 [A] (-inf for an anchor without any column)
    num_positives: torch.Tensor   # int64 [A]
    ref: RefResult = field(repr=False)   # the whole set's reference (every row an anchor)
    block: slice = None           # the anchors' rows within ref's anchors
    grads: tuple = None           # (features, contrast or None, temperature) float64 gradients
    scales: tuple = None          # per-element scales of the features / contrast gradients, t's


def op_reference64(features, labels, contrast, contrast_labels, temperature, num_anchors,
                   normalize, anchor_offset=0, grad_loss=None, focal_gamma=0.0, groups=None,
                   contrast_groups=None, multi_label="any"):
    """The raw op's contract in float64, from :func:`supcon_reference64` of the whole set.

    Single set (contrast None): the reference with every row an anchor, restricted to the anchor
    block rows [anchor_offset, anchor_offset + num_anchors); anchor i's self column is row
    anchor_offset + i and every row is a column. With a contrast set, the feature rows are the
    anchors (anchor_offset must be 0). With ``grad_loss``, also the gradients of
    sum_i grad_loss_i * loss_i w.r.t. features ([N, D]: rows outside the block get their
    contrast-side gradient), contrast and temperature. ``groups``, ``contrast_groups``: the op's
    group ids (known false negatives) of the feature and contrast rows; ``multi_label``: the rule
    for multi-hot labels.
    """
    group_ids = {name: ids.cpu() for name, ids in (("groups", groups),
                                                   ("contrast_groups", contrast_groups))
                 if ids is not None}
    x = features.detach().to(device="cpu", dtype=torch.float64).requires_grad_(True)
    t = temperature.detach().to(device="cpu", dtype=torch.float64).requires_grad_(True)
    c = None
    if contrast is None:
        ref = supcon_reference64(x, labels.cpu(), t, normalize=normalize, reduction="none",
                                 full=True, focal_gamma=focal_gamma, multi_label=multi_label,
                                 **group_ids)
        block = slice(anchor_offset, anchor_offset + num_anchors)
        assert 0 <= anchor_offset and block.stop <= x.shape[0], "anchor block outside the rows"
    else:
        assert anchor_offset == 0, "anchor_offset must be 0 with a contrast set"
        c = contrast.detach().to(device="cpu", dtype=torch.float64).requires_grad_(True)
        ref = supcon_reference64(x, labels.cpu(), t, contrast=c,
                                 contrast_labels=contrast_labels.cpu(), normalize=normalize,
                                 reduction="none", full=True, focal_gamma=focal_gamma,
                                 multi_label=multi_label, **group_ids)
        block = slice(0, x.shape[0])
    result = OpRef(ref.per_anchor[block].detach(), ref.lse[block], ref.num_positives[block], ref,
                   block)
    if grad_loss is None:
        return result
    g = grad_loss.detach().to(device="cpu", dtype=torch.float64)
    inputs = [x, t] + ([c] if c is not None else [])
    got = torch.autograd.grad((g * ref.per_anchor[block]).sum(), inputs, allow_unused=True)
    got = [torch.zeros_like(i) if a is None else a for a, i in zip(got, inputs)]
    anchor_grads = torch.zeros(ref.per_anchor.shape, dtype=torch.float64)
    anchor_grads[block] = g
    f_scale, c_scale, t_scale = gradient_scales(ref, float(t.detach()), anchor_grads, normalize)
    result.grads = (got[0], got[2] if c is not None else None, got[1])
    result.scales = (_rows_to_input_shape(f_scale, features, None),
                     None if c is None else _rows_to_input_shape(c_scale, contrast, None), t_scale)
    return result


@functools.lru_cache(maxsize=None)
def _keep_freed_memory_in_the_heap():
    """glibc gives the top of its heap back to the OS once 128 KiB there are free: poisoned
    buffers freed at the top came back as fresh zero pages, and a whole-suite run on CI found no
    NaN after poisoning (2026-11-27). A trim threshold beyond any test's use keeps them (glibc's
    mallopt(M_TRIM_THRESHOLD); elsewhere nothing is done)."""
    try:
        ctypes.CDLL(None).mallopt(-1, 1 << 30)  # -1: M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def poison_free_memory(device):
    """Fills memory that the allocator hands out next with NaN, so that output elements a kernel
    forgets to write show up as NaN: buffers of many sizes, all alive at once and then freed
    (freed one by one, glibc would merge them into the top of the heap and return it to the OS)."""
    if torch.device(device).type == "cpu":
        _keep_freed_memory_in_the_heap()
    held = [torch.full((1 << bits,), float("nan"), dtype=torch.float64, device=device)
            for bits in range(14) for _ in range(8)]
    del held


@dataclass
class OpChecked:
    outputs: tuple        # (loss, lse, num_positives)
    grads: tuple          # (grad_features, grad_contrast, grad_temperature) or None
    ref: OpRef


def check_op_against_reference(forward_op, backward_op, args, *, anchor_offset=None,
                               compute_dtype=None, grad_loss=None, generator=None,
                               backward=True, lse_float64=True, focal_gamma=None,
                               weights_dtype=None, groups=None, contrast_groups=None,
                               multi_label=None):
    """Runs a backend's raw ops (``forward_op`` / ``backward_op``, OpOverloadPackets) on
    ``args`` = (features, labels, contrast, contrast_labels, temperature, num_anchors, normalize),
    with ``anchor_offset`` when not None, and compares every output with
    :func:`op_reference64`. Free memory is poisoned with NaN before each call, so outputs must
    be written in full. ``lse_float64``: the contract that lse is float64 for every input dtype
    (checked last, after every value). ``focal_gamma``: passed to both ops when not None.
    ``weights_dtype``: the dtype the backward's products take their weights in
    (``Backend.gradient_weights_dtype``); coarser than the compute dtype, it widens the
    temperature's tolerance. ``groups``, ``contrast_groups``: the group ids (known false
    negatives) passed to both ops and the reference when not None; ``multi_label``: the rule
    for multi-hot labels, likewise."""
    features, labels, contrast, contrast_labels, temperature, num_anchors, normalize = args
    kwargs = {} if anchor_offset is None else {"anchor_offset": anchor_offset}
    if focal_gamma is not None:
        kwargs["focal_gamma"] = focal_gamma
    if multi_label is not None:
        kwargs["multi_label"] = multi_label
    group_ids = {name: ids for name, ids in (("groups", groups), ("contrast_groups", contrast_groups))
                 if ids is not None}
    kwargs.update(group_ids)
    offset = anchor_offset or 0
    dtype = features.dtype
    tol_dtype = tolerance_dtype(dtype, compute_dtype)
    tol = TOLERANCES[tol_dtype]

    poison_free_memory(features.device)
    loss, lse, num_positives = forward_op(*args, **kwargs)
    a = num_anchors if contrast is None else features.shape[0]
    want = None
    if backward:
        if grad_loss is None:
            grad_loss = torch.randn(a, generator=generator, dtype=torch.float64)
        grad_loss = grad_loss.to(device=features.device, dtype=loss_dtype_for(dtype))
    want = op_reference64(features, labels, contrast, contrast_labels, temperature, num_anchors,
                          normalize, offset, grad_loss, focal_gamma or 0.0, **group_ids,
                          multi_label=multi_label or "any")

    for name, out in (("loss", loss), ("lse", lse), ("num_positives", num_positives)):
        assert out.shape == (a,), f"{name} has shape {tuple(out.shape)}, expected ({a},)"
        assert out.device == features.device, f"{name} is on {out.device}"
    assert loss.dtype == loss_dtype_for(dtype), f"loss dtype {loss.dtype} for {dtype} input"
    assert num_positives.dtype == torch.int64, f"num_positives dtype {num_positives.dtype}"
    assert torch.equal(num_positives.cpu(), want.num_positives), (
        f"num_positives {num_positives.tolist()} != {want.num_positives.tolist()}")
    assert torch.isfinite(loss).all(), f"loss not finite: {loss}"
    assert (loss.cpu()[want.num_positives == 0] == 0).all(), "anchors without positives must give 0"

    # float64: as the reference; float32: the accumulated rounding of fp32 dot products and
    # exps, relative to the size of the logits (1/t for unit rows)
    rtol = 1e-12 if tol_dtype == torch.float64 else 2e-6
    logits = want.ref.logits.detach()[want.block]
    finite_logits = logits[torch.isfinite(logits)]
    scale = float(finite_logits.abs().max()) if finite_logits.numel() else 1.0
    scale = max(scale, 1.0 / float(temperature)) if normalize else max(scale, 1.0)
    has_column = torch.isfinite(want.lse)
    assert torch.isfinite(lse.cpu()[has_column]).all(), f"lse not finite: {lse}"
    assert_close_elementwise(lse.cpu()[has_column], want.lse[has_column], rtol, rtol * scale, "lse")
    assert_close_elementwise(loss, want.loss, 10 * rtol, 10 * rtol * scale, "loss")

    grads = None
    if backward:
        poison_free_memory(features.device)
        grads = backward_op(grad_loss, *args, lse, **kwargs)
        grad_features, grad_contrast, grad_temperature = grads
        d = features.shape[1]
        assert grad_features.shape == features.shape and grad_features.dtype == dtype, (
            f"grad_features: {tuple(grad_features.shape)} {grad_features.dtype}")
        if contrast is None:
            assert grad_contrast.shape == (0, d), f"grad_contrast has shape {tuple(grad_contrast.shape)}"
        else:
            assert grad_contrast.shape == contrast.shape and grad_contrast.dtype == contrast.dtype
        assert grad_temperature.shape == temperature.shape, "grad_temperature shape"
        assert grad_temperature.dtype == temperature.dtype, "grad_temperature dtype"
        factor = _logit_factor(tol_dtype, want.ref.logits)
        compute_eps = 2.0 ** -52 if tol_dtype == torch.float64 else 2.0 ** -23
        f_scale, c_scale, t_scale = want.scales
        pairs = [("grad_features", grad_features, want.grads[0], f_scale, dtype)]
        if contrast is not None:
            pairs.append(("grad_contrast", grad_contrast, want.grads[1], c_scale, contrast.dtype))
        for name, got, expected, scale_, grad_dtype in pairs:
            fi = torch.finfo(grad_dtype)
            atol = max(fi.tiny * fi.eps, flush_floor(want.ref, float(temperature), tol_dtype))
            assert_close_elementwise(got, expected, max(tol.grad_rtol * factor, fi.eps),
                                     atol + tol.grad_atol * factor * scale_, name)
        fi = torch.finfo(temperature.dtype)
        assert_close_elementwise(grad_temperature, want.grads[2],
                                 max(tol.grad_rtol * factor, fi.eps),
                                 fi.tiny + temperature_grad_atol(t_scale, factor, compute_eps,
                                                                 weights_dtype),
                                 "grad_temperature")
    if lse_float64:
        assert lse.dtype == torch.float64, (
            f"lse is {lse.dtype}: the contract is float64 lse for every input dtype (the "
            f"log-sum-exp saved for backward)")
    return OpChecked((loss, lse, num_positives), grads, want)


def check_backend_against_reference(backend, kw, generator, **extra):
    """check_against_reference for a test's backend case (support/backend_matrix.BackendCase):
    supcon_loss's keyword arguments ``kw`` (features among them) on its device, the tolerances
    of the precision it computes in; ``extra``: more arguments for both sides."""
    kw = backend.put(dict(kw))
    features = kw.pop("features")
    return check_against_reference(backend.name, features, generator=generator,
                                   compute_dtype=backend.computes_in(features.dtype), **kw,
                                   **extra)
