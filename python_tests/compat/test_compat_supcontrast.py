"""scl_kernels.compat.supcontrast.SupConLoss against SupContrast's own losses.py.

The oracle is SupContrast's file, unmodified (third_party/, see its README): same value and
gradients, fp64 to 1e-12, on random cases that cover multi-view, contrast_mode="one", no
labels, batches without positives, one class, negative labels, temperature / base_temperature,
same-label masks (fused) and other masks (dense, with a warning once).
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

from scl_kernels.compat import supcontrast

_ORACLE_PATH = os.path.join(os.path.dirname(__file__), "third_party", "supcontrast_losses.py")


def _load_oracle():
    spec = importlib.util.spec_from_file_location("supcontrast_losses", _ORACLE_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORACLE = _load_oracle()

COMPAT_MODULE = supcontrast  # whose supcon_loss calls the fused_calls fixture records


def make_features(seed, shape, dtype):
    """Unit rows scaled by norms in [0.7, 1.3]: SupContrast does not normalise, so neither must
    the drop-in, and rows that are not unit make that visible."""
    generator = torch.Generator().manual_seed(seed)
    rows = F.normalize(torch.randn(*shape, generator=generator, dtype=torch.float64), dim=-1)
    norms = 0.7 + 0.6 * torch.rand(*shape[:-1], 1, generator=generator, dtype=torch.float64)
    return (rows * norms).to(dtype)


def make_labels(seed, batch, kind):
    generator = torch.Generator().manual_seed(seed + 1)
    if kind is None:
        return None
    if kind == "distinct":
        return torch.randperm(batch, generator=generator)
    if kind == "negative":
        return torch.randint(-3, 2, (batch,), generator=generator)
    return torch.randint(0, kind, (batch,), generator=generator)


def value_and_grads(criterion, features, temperature=None, **inputs):
    """Loss and gradients (features, and temperature when it is a tensor) in float64."""
    features = features.clone().requires_grad_(True)
    if temperature is not None:
        criterion.temperature = temperature.clone().requires_grad_(True)
        wrt = (features, criterion.temperature)
    else:
        wrt = (features,)
    loss = criterion(features, **inputs)
    grads = torch.autograd.grad(loss, wrt)
    return (loss.detach(),) + tuple(g.detach() for g in grads)


def assert_matches_oracle(check, ours, oracle, features, dtype, temperature=None, **inputs):
    expected = value_and_grads(oracle, features, temperature, **inputs)
    assert all(torch.isfinite(e).all() for e in expected), "the oracle is not finite: a bad case"
    check(value_and_grads(ours, features, temperature, **inputs), expected, dtype,
          ["loss", "d features", "d temperature"])


# (id, shape [bsz, n_views, ...], labels, contrast_mode, temperature, base_temperature, quick)
CASES = [
    ("two-views", (16, 2, 8), 4, "all", 0.07, 0.07, False),
    ("two-views-one", (16, 2, 8), 4, "one", 0.07, 0.07, True),
    ("three-views-trailing-dims", (10, 3, 2, 3), 3, "all", 0.1, 0.07, False),
    ("three-views-one", (10, 3, 6), 3, "one", 0.2, 0.1, False),
    ("simclr-no-labels", (9, 2, 8), None, "all", 0.5, 0.07, True),
    ("simclr-no-labels-one", (9, 3, 8), None, "one", 0.5, 0.07, False),
    ("single-view-without-positives", (7, 1, 8), "distinct", "all", 0.1, 0.07, False),
    ("single-view-no-labels", (7, 1, 8), None, "all", 0.1, 0.07, False),
    ("single-view-some-singletons", (12, 1, 8), 8, "all", 0.1, 0.07, True),
    ("one-class", (6, 2, 8), 1, "all", 0.1, 0.07, False),
    ("negative-labels", (14, 2, 8), "negative", "all", 0.1, 0.07, False),
    ("larger", (48, 2, 32), 5, "all", 0.07, 0.07, False),
    ("larger-one", (48, 4, 32), 7, "one", 0.07, 0.07, False),
]


def _case_params():
    return [pytest.param(*case[1:6], id=case[0], marks=[pytest.mark.quick] if case[6] else [])
            for case in CASES]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("shape,label_kind,mode,temperature,base_temperature", _case_params())
def test_labels_match_supcontrast(assert_results_close, scl_backend, dtype, shape, label_kind,
                                  mode, temperature, base_temperature):
    features = make_features(sum(shape), shape, dtype)
    labels = make_labels(sum(shape), shape[0], label_kind)
    ours = supcontrast.SupConLoss(temperature, mode, base_temperature, backend=scl_backend)
    assert_matches_oracle(assert_results_close, ours,
                          ORACLE.SupConLoss(temperature, mode, base_temperature), features, dtype,
                          labels=labels)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("mode", ["all", "one"])
def test_learnable_temperature_matches_supcontrast(assert_results_close, scl_backend, dtype, mode):
    features = make_features(3, (12, 2, 8), dtype)
    labels = make_labels(3, 12, 3)
    temperature = torch.tensor(0.2, dtype=dtype)
    ours = supcontrast.SupConLoss(0.0, mode, 0.07, backend=scl_backend)
    assert_matches_oracle(assert_results_close, ours, ORACLE.SupConLoss(0.0, mode, 0.07), features,
                          dtype, temperature=temperature, labels=labels)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("mask_dtype", [
    pytest.param(torch.bool, id="bool", marks=pytest.mark.quick),
    pytest.param(torch.float32, id="float32"),
    pytest.param(torch.int64, id="int64"),
])
@pytest.mark.parametrize("mode", ["all", "one"])
def test_same_label_mask_runs_fused(assert_results_close, scl_backend, fused_calls, fresh_warnings,
                                    recwarn, dtype, mask_dtype, mode):
    features = make_features(5, (15, 2, 8), dtype)
    labels = make_labels(5, 15, 4)
    mask = (labels[:, None] == labels[None, :]).to(mask_dtype)
    ours = supcontrast.SupConLoss(0.1, mode, backend=scl_backend)
    assert_matches_oracle(assert_results_close, ours, ORACLE.SupConLoss(0.1, mode), features, dtype,
                          mask=mask)
    assert len(fused_calls) == 1 and fused_calls[0]["normalize"] is False
    assert not [w for w in recwarn if "same-label" in str(w.message)]


def _intransitive_mask(labels):
    """A chain 0 ~ 1 ~ 2 where 0 and 2 are not related: symmetric, reflexive, not transitive."""
    mask = torch.eye(labels.shape[0])
    mask[0, 1] = mask[1, 0] = mask[1, 2] = mask[2, 1] = 1
    return mask


def _asymmetric_mask(labels):
    mask = (labels[:, None] == labels[None, :]).float()
    mask[0, 1] = 1 - mask[0, 1]
    return mask


def _zero_diagonal_mask(labels):
    return (labels[:, None] == labels[None, :]).float().fill_diagonal_(0)


def _weighted_mask(labels):
    generator = torch.Generator().manual_seed(11)
    return torch.rand(labels.shape[0], labels.shape[0], generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("mode", ["all", "one"])
@pytest.mark.parametrize("make_mask,reason", [
    pytest.param(_weighted_mask, "values other than 0 and 1", id="weights",
                 marks=pytest.mark.quick),
    pytest.param(_asymmetric_mask, "not symmetric", id="asymmetric"),
    pytest.param(_zero_diagonal_mask, "0 on its diagonal", id="zero-diagonal"),
    pytest.param(_intransitive_mask, "not transitive", id="intransitive"),
])
def test_other_masks_run_dense_with_one_warning(assert_results_close, scl_backend, fused_calls,
                                                fresh_warnings, dtype, mode, make_mask, reason):
    features = make_features(7, (10, 2, 8), dtype)
    mask = make_mask(make_labels(7, 10, 3))
    ours = supcontrast.SupConLoss(0.1, mode, 0.07, backend=scl_backend)
    with pytest.warns(UserWarning, match=reason):
        ours(features, mask=mask)
    assert_matches_oracle(assert_results_close, ours, ORACLE.SupConLoss(0.1, mode, 0.07), features,
                          dtype, mask=mask)
    assert not fused_calls


def test_dense_warning_is_shown_once(fresh_warnings, recwarn):
    features = make_features(8, (6, 2, 4), torch.float64)
    mask = _weighted_mask(torch.zeros(6))
    criterion = supcontrast.SupConLoss(backend="reference")
    criterion(features, mask=mask)
    criterion(features, mask=_intransitive_mask(torch.zeros(6)))
    assert len([w for w in recwarn if "same-label" in str(w.message)]) == 1


@pytest.mark.quick
def test_features_are_not_normalised(cpu_library):
    """Doubling every row changes SupContrast's loss (logits scale by 4); so must ours."""
    features = make_features(9, (8, 2, 8), torch.float64)
    labels = make_labels(9, 8, 3)
    criterion = supcontrast.SupConLoss(0.1)
    assert criterion(2 * features, labels) > criterion(features, labels) + 0.1
    torch.testing.assert_close(criterion(2 * features, labels),
                               ORACLE.SupConLoss(0.1)(2 * features, labels), rtol=1e-12, atol=0)


@pytest.mark.parametrize("call,error,match", [
    (lambda c, f: c(f, labels=torch.zeros(4), mask=torch.eye(4)), ValueError, "not both"),
    (lambda c, f: c(f[:, 0]), ValueError, "at least 3 dimensions"),
    (lambda c, f: c(f[:0]), ValueError, "at least one sample"),
    (lambda c, f: c(f, labels=torch.zeros(5)), ValueError, "5 entries but features has 4"),
    (lambda c, f: c(f, mask=torch.eye(5)), ValueError, r"\[bsz, bsz\] = \[4, 4\]"),
    (lambda c, f: c(f, mask=[[1.0]]), TypeError, "mask must be a tensor"),
], ids=["labels-and-mask", "two-dims", "empty", "labels-count", "mask-shape", "mask-type"])
def test_bad_calls_raise(call, error, match):
    with pytest.raises(error, match=match):
        call(supcontrast.SupConLoss(backend="reference"), torch.randn(4, 2, 3))


def test_bad_options_raise():
    with pytest.raises(ValueError, match="contrast_mode"):
        supcontrast.SupConLoss(contrast_mode="any")
    with pytest.raises(ValueError, match="base_temperature"):
        supcontrast.SupConLoss(base_temperature=0)


def test_import_scl_kernels_does_not_import_compat():
    code = "import sys, scl_kernels; assert 'scl_kernels.compat' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
