"""The Triton positive walk of the focal loss and of multi-hot labels
(scl_kernels/backends/triton/positive_walk.py) against a dense float64 brute force written from
the walk's definition (docs/MATH.md, "The positive walk" and section 11): every pair and its
weight built explicitly, at sizes around the interpreter's 16-wide tiles.
Runs in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set by support/backend_matrix.py
without CUDA), or on a GPU."""
import math
import os

import pytest
import torch

triton = pytest.importorskip("triton", reason="the Triton backend needs the triton package")
import triton.language as tl  # noqa: E402

from scl_kernels.backends.triton import launch, positive_walk  # noqa: E402
from support.class_words import class_words  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 (set by support/backend_matrix.py "
                                       "on machines without CUDA) or a GPU")
GAMMAS = [0.0, 0.5, 2.0]


def _pairs(m, n, anchor_class, contrast_class, self_offset):
    """[m, n] bool: the positive pairs (same class, anchor class >= 0, not the anchor itself)."""
    pairs = (anchor_class[:, None] == contrast_class[None, :]) & (anchor_class >= 0)[:, None]
    if self_offset >= 0:
        own = torch.arange(m)[:, None] + self_offset == torch.arange(n)[None, :]
        pairs &= ~own
    return pairs


def _logits(case):
    """float64 (unit q, unit z, s) of the rows exactly as the kernel reads them."""
    unit_q = case["q"].double() * case["q_inv_norm"].double()[:, None]
    unit_z = case["z"].double() * case["z_inv_norm"].double()[:, None]
    return unit_q, unit_z, unit_q @ unit_z.T * case["inv_t"]


def _multi_hot_weights(anchor_hot, contrast_hot, rule):
    """[m, n] float64 w_ij of multi-hot rows (docs/MATH.md section 11)."""
    ours, theirs = anchor_hot.double(), contrast_hot.double()
    shared = ours @ theirs.T
    if rule == "any":
        return (shared > 0).double()
    return shared / (ours.sum(1)[:, None] + theirs.sum(1)[None, :] - shared).clamp_min(1)


def _weights(case):
    """[m, n] float64 weights of the positive pairs (0 elsewhere): 1 for class ids, the rule's
    for multi-hot rows (case["rule"]), whose walked anchors are those of class >= 0."""
    m, n = case["q"].shape[0], case["z"].shape[0]
    if "rule" not in case:
        return _pairs(m, n, case["anchor_class"], case["contrast_class"],
                      case["self_offset"]).double()
    weights = _multi_hot_weights(case["anchor_hot"], case["contrast_hot"], case["rule"])
    weights[case["anchor_class"] < 0] = 0
    if case["self_offset"] >= 0:
        weights[torch.arange(m), torch.arange(m) + case["self_offset"]] = 0
    return weights


def brute_force(case, backward):
    """(loss_sum, hterm_sum, dq, dz) in float64 from the dense pair matrix."""
    unit_q, unit_z, s = _logits(case)
    weights = _weights(case)
    pairs = weights > 0
    lse = case["lse_hi"].double() + case["lse_lo"].double()
    x = torch.where(pairs, lse[:, None] - s, 0.0)
    pi = torch.exp(-x)
    u = -torch.expm1(-x)
    gamma = case["gamma"]
    u_gamma = u ** gamma  # torch: 0 ** 0 == 1
    if not backward:
        return torch.where(pairs, weights * u_gamma * x, 0.0).sum(1), None, None, None
    r = torch.where(u > 0, x / torch.where(u > 0, u, 1.0), 1.0)
    hterm = torch.where(pairs, weights * u_gamma * (1 + gamma * pi * r), 0.0)
    weights = case["grad_weight"].double()[:, None] * hterm
    return None, hterm.sum(1), -case["inv_t"] * weights @ unit_z, -case["inv_t"] * weights.T @ unit_q


def make_case(gen, m, n, d, n_classes, self_offset, temperature, gamma, dtype=torch.float32,
              unlabelled=0, anchor_classes=None):
    """A walk's inputs. self_offset >= 0: the anchors are rows self_offset.. of the contrast set
    (same tensor storage), with their classes; -1: a separate anchor set. The first `unlabelled`
    anchors get class -1; lse is the true log-sum-exp over every column but the anchor's own,
    split into float32 (hi, lo)."""
    z = torch.randn(n, d, generator=gen, dtype=torch.float64).to(dtype)
    contrast_class = torch.randint(0, n_classes, (n,), generator=gen)
    if self_offset >= 0:
        q = z[self_offset:self_offset + m]
        anchor_class = contrast_class[self_offset:self_offset + m].clone()
    else:
        q = torch.randn(m, d, generator=gen, dtype=torch.float64).to(dtype)
        anchor_class = torch.randint(0, n_classes, (m,), generator=gen)
    if anchor_classes is not None:
        anchor_class = anchor_classes
    anchor_class[:unlabelled] = -1
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    case = dict(q=q, z=z, q_inv_norm=(1 / q.double().norm(dim=1)).to(compute),
                z_inv_norm=(1 / z.double().norm(dim=1)).to(compute), inv_t=1 / temperature,
                self_offset=self_offset, anchor_class=anchor_class, contrast_class=contrast_class,
                gamma=gamma)
    _, _, s = _logits({**case, "lse_hi": None})
    if self_offset >= 0:
        own = torch.arange(m)[:, None] + self_offset == torch.arange(n)[None, :]
        s = s.masked_fill(own, -math.inf)
    lse = torch.logsumexp(s, dim=1)
    case["lse_hi"] = lse.to(compute)
    case["lse_lo"] = (lse - case["lse_hi"].double()).to(compute)
    grad_weight = torch.rand(m, generator=gen, dtype=torch.float64) + 0.5
    case["grad_weight"] = grad_weight.masked_fill(anchor_class < 0, 0.0).to(compute)
    return case


def run_walk(case, backward):
    put = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    grad_weight = put["grad_weight"] if backward else put["grad_weight"][:0]
    outputs = positive_walk.positive_walk(
        put["q"], put["z"], put["q_inv_norm"], put["z_inv_norm"], put["inv_t"],
        put["self_offset"], put["anchor_class"], put["contrast_class"], put["lse_hi"],
        put["lse_lo"], put["gamma"], grad_weight, put.get("anchor_words"),
        put.get("contrast_words"), put.get("rule") == "jaccard")
    return tuple(o.cpu() for o in outputs)


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer the launcher allocates starts as NaN: outputs must be written in full."""
    monkeypatch.setattr(launch, "uninitialized",
                        lambda shape, device: torch.full(shape, math.nan, device=device))


def _close(actual, expected, scale, what):
    """float32 against float64: a few ulp of each output's largest element (`scale`); the
    interpreter's errors are below 3e-7 of it."""
    assert actual.dtype == torch.float32, what
    assert torch.isfinite(actual).all(), f"{what}: not every element written"
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=2e-6 * scale, msg=what)


# (m, n, d, classes, self_offset, temperature, unlabelled): m, n, d off the 16-wide tiles; n < one
# tile; one class; anchors of class -1; the anchors a slice of the contrast set past its start.
# In the interpreter (launch.row_width) D = 21 is one resident K block and one output chunk, 40
# resident with two output chunks, 70 streamed in K steps with three.
SHAPES = {
    "single_set": (37, 37, 21, 3, 0, 0.1, 4),
    "slice_of_contrast": (20, 45, 40, 4, 10, 0.1, 2),
    "cross_small": (19, 13, 5, 3, -1, 0.5, 3),
    "one_class": (20, 20, 17, 1, 0, 0.07, 0),
    "many_classes": (33, 50, 9, 20, -1, 0.2, 1),
    "wide_rows": (18, 34, 70, 2, 0, 0.1, 1),
}


# Rows fed through tensor descriptors for every gamma; masked pointer loads differ in loading
# only, so one gamma.
FEEDING = [("descriptors", gamma) for gamma in GAMMAS] + [("pointers", 0.5)]


@pytest.mark.parametrize("feeding,gamma", FEEDING)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_walk_matches_brute_force(shape, feeding, gamma, backward, gen, poisoned, monkeypatch):
    tma = feeding == "descriptors"
    if tma and not launch.use_tma(torch.device(DEVICE)):
        pytest.skip("tensor descriptors need Hopper or later")
    monkeypatch.setattr(launch, "use_tma", lambda device: tma)
    m, n, d, classes, self_offset, temperature, unlabelled = SHAPES[shape]
    case = make_case(gen, m, n, d, classes, self_offset, temperature, gamma,
                     unlabelled=unlabelled)
    loss, hterm, dq, dz = run_walk(case, backward)
    want_loss, want_hterm, want_dq, want_dz = brute_force(case, backward)
    if not backward:
        assert hterm.numel() == dq.numel() == dz.numel() == 0
        assert loss.shape == (m,)
        assert (want_loss > 0).any(), "the case must hold positive pairs"
        _close(loss, want_loss, want_loss.abs().max(), "loss_sum")
        return
    assert loss.numel() == 0
    assert hterm.shape == (m,) and dq.shape == (m, d) and dz.shape == (n, d)
    _close(hterm, want_hterm, want_hterm.abs().max(), "hterm_sum")
    _close(dq, want_dq, want_dq.abs().max(), "dq")
    _close(dz, want_dz, want_dz.abs().max(), "dz")


def test_anchors_without_positives_get_zeros(gen, poisoned):
    """A class of one row (its only row is the anchor itself), a class absent from the contrast
    set and class -1: no pair, so zeros in every anchor output whatever their grad_weight, and
    zero rows of dz for contrast rows that no anchor pairs with."""
    contrast_class = torch.tensor([0, 1] * 10 + [2, 3, 3, 4])
    anchor_class = contrast_class.clone()
    anchor_class[21] = 5  # not a contrast class
    anchor_class[23] = -1
    case = make_case(gen, 24, 24, 18, 1, 0, 0.1, 2.0, anchor_classes=anchor_class)
    case["contrast_class"] = contrast_class
    case["grad_weight"] = torch.rand(24, generator=gen) + 0.5
    loss, *_ = run_walk(case, backward=False)
    _, hterm, dq, dz = run_walk(case, backward=True)
    want_loss = brute_force(case, backward=False)[0]
    _, want_hterm, want_dq, want_dz = brute_force(case, backward=True)
    _close(loss, want_loss, want_loss.abs().max(), "loss_sum")
    _close(hterm, want_hterm, want_hterm.abs().max(), "hterm_sum")
    _close(dq, want_dq, want_dq.abs().max(), "dq")
    _close(dz, want_dz, want_dz.abs().max(), "dz")
    without_pairs = [20, 21, 23]
    assert loss[without_pairs].eq(0).all() and hterm[without_pairs].eq(0).all()
    assert dq[without_pairs].eq(0).all()
    assert dz[[20, 22, 23]].eq(0).all() and dz[21].ne(0).all()


def make_multi_hot_case(gen, m, n, d, classes, per_row, self_offset, temperature, gamma, rule,
                        unwalked):
    """make_case's rows with multi-hot classes, about `per_row` a row: every fifth contrast row
    without a class, every sixth holding the last class (the last word's last bit where C = 64),
    the first `unwalked` anchors marked left out (class -1)."""
    walked = torch.where(torch.arange(m) < unwalked, -1, 0)
    case = make_case(gen, m, n, d, 1, self_offset, temperature, gamma, anchor_classes=walked)
    contrast_hot = torch.rand(n, classes, generator=gen) < per_row / classes
    contrast_hot[::5] = False
    contrast_hot[1::6, classes - 1] = True
    if self_offset >= 0:
        anchor_hot = contrast_hot[self_offset:self_offset + m]
    else:
        anchor_hot = torch.rand(m, classes, generator=gen) < per_row / classes
    case.update(anchor_hot=anchor_hot, contrast_hot=contrast_hot, rule=rule,
                anchor_words=class_words(anchor_hot), contrast_words=class_words(contrast_hot))
    return case


# (m, n, d, classes, classes a row, self_offset, temperature, anchors left out): two words with a
# class in each; one full word; a slice of the contrast set; few classes and many a row, so that
# most pairs share several and count under the lowest only; a cross set.
MULTI_HOT_SHAPES = {
    "two_words": (37, 37, 21, 70, 3, 0, 0.1, 4),
    "one_word": (19, 26, 5, 64, 4, -1, 0.5, 2),
    "slice_of_contrast": (20, 45, 40, 5, 2, 10, 0.1, 0),
    "shared_classes": (20, 20, 9, 3, 2, 0, 0.07, 0),
}


@pytest.mark.parametrize("gamma", [0.0, 2.0])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("shape", MULTI_HOT_SHAPES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_multi_hot_walk_matches_brute_force(shape, rule, gamma, backward, gen, poisoned):
    m, n, d, classes, per_row, self_offset, temperature, unwalked = MULTI_HOT_SHAPES[shape]
    case = make_multi_hot_case(gen, m, n, d, classes, per_row, self_offset, temperature, gamma,
                               rule, unwalked)
    weights = _weights(case)
    assert (weights > 0).any() and (rule == "any" or ((weights > 0) & (weights < 1)).any())
    loss, hterm, dq, dz = run_walk(case, backward)
    want_loss, want_hterm, want_dq, want_dz = brute_force(case, backward)
    if not backward:
        assert loss.shape == (m,)
        _close(loss, want_loss, want_loss.abs().max(), "loss_sum")
        return
    assert hterm.shape == (m,) and dq.shape == (m, d) and dz.shape == (n, d)
    _close(hterm, want_hterm, want_hterm.abs().max(), "hterm_sum")
    _close(dq, want_dq, want_dq.abs().max(), "dq")
    _close(dz, want_dz, want_dz.abs().max(), "dz")


@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("shape", MULTI_HOT_SHAPES)
def test_multi_hot_positives_are_the_walks_pairs(shape, rule, gen):
    """|P(i)| and W_i (positive_walk.multi_label_positives) for every anchor: the pairs' count
    exactly, the weights' float64 sum to rounding."""
    m, n, d, classes, per_row, self_offset, temperature, _ = MULTI_HOT_SHAPES[shape]
    case = make_multi_hot_case(gen, m, n, d, classes, per_row, self_offset, temperature, 0.0,
                               rule, 0)
    weights = _weights(case)
    positives, weight_sum = positive_walk.multi_label_positives(
        case["anchor_words"].to(DEVICE), case["contrast_words"].to(DEVICE), self_offset,
        rule == "jaccard")
    assert positives.dtype == torch.int64 and weight_sum.dtype == torch.float64
    assert torch.equal(positives.cpu(), (weights > 0).sum(1))
    torch.testing.assert_close(weight_sum.cpu(), weights.sum(1), rtol=1e-14, atol=0.0)


def test_multi_hot_rows_without_entries_get_zeros(gen, poisoned):
    """No anchor holds a class (or none is walked): zeros from both steps, no kernel launched
    on an empty side."""
    case = make_multi_hot_case(gen, 6, 6, 4, 3, 1, 0, 0.1, 0.5, "any", 0)
    case["anchor_words"] = case["contrast_words"] = torch.zeros(6, 1, dtype=torch.int64)
    case["anchor_hot"] = case["contrast_hot"] = torch.zeros(6, 3, dtype=torch.bool)
    loss, *_ = run_walk(case, backward=False)
    _, hterm, dq, dz = run_walk(case, backward=True)
    assert not loss.any() and not hterm.any() and not dq.any() and not dz.any()
    positives, weight_sum = positive_walk.multi_label_positives(
        case["anchor_words"].to(DEVICE), case["contrast_words"].to(DEVICE), 0, False)
    assert not positives.any() and not weight_sum.any()


def test_popcount_counts_every_bit_of_an_int32():
    """positive_walk._popcount on halves with the sign bit set too (arithmetic shifts)."""
    values = [0, 1, -1, -2**31, 2**31 - 1, 0x55555555, -0x55555556, 123456789, -987654321]
    x = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    out = torch.empty(len(values), dtype=torch.int32, device=DEVICE)
    _popcount_kernel[(1,)](x, out, len(values), BLOCK=16)
    assert out.cpu().tolist() == [bin(v & (2**32 - 1)).count("1") for v in values]


@triton.jit
def _popcount_kernel(x_ptr, out_ptr, count, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < count, other=0)
    tl.store(out_ptr + offsets, positive_walk._popcount(x), mask=offsets < count)


@triton.jit
def _one_minus_pi_kernel(x_ptr, u_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    tl.store(u_ptr + offsets, positive_walk._one_minus_pi(x, tl.exp(-x)))


def test_one_minus_pi_is_accurate_for_small_x():
    """u = 1 - e^-x to a few float32 ulp across the series / subtraction switch, where
    1 - exp(-x) in float32 keeps no correct digit below x ~ 1e-7."""
    x = torch.cat([torch.logspace(-12, 1.5, 250, dtype=torch.float64),
                   torch.tensor([positive_walk.SERIES_BELOW.value] * 3) * torch.tensor(
                       [1 - 2**-20, 1.0, 1 + 2**-20], dtype=torch.float64),
                   torch.zeros(3, dtype=torch.float64)]).float()
    u = torch.empty_like(x)
    _one_minus_pi_kernel[(1,)](x.to(DEVICE), u_out := u.to(DEVICE), BLOCK=256)
    want = -torch.expm1(-x.double())
    torch.testing.assert_close(u_out.cpu().double(), want, rtol=4 * 2.0**-24, atol=0.0)
