"""scl_kernels.hard_pairs on every backend that has it (cpu, triton, reference; the backend matrix
of support/backend_matrix.py) against a float64 brute force written here: one anchor at a time,
its candidates listed and their similarities taken from float64 dot products.

Awkward sizes around the tiles (the CPU kernel's 256 x 2048 blocks, Triton's 32-wide
interpreter tiles), label patterns, cross sets, ties, dtypes, meta tensors, bad inputs and the
CPU kernel's memory at N = 65,536."""
import pytest
import torch

import scl_kernels
from scl_kernels import HardPairs, hard_pairs
from scl_kernels.profiling import PeakMemory
from support.needs import library

FLOATS = [torch.float32, torch.float64, torch.bfloat16]


def _runs_hard_pairs(backend):
    """The backend cases that mine: the "cuda" backend has no hard-pair kernel, and the cpu
    backend's device-prep variant concerns scl::supcon's preparation only."""
    if backend.name == "cuda" or backend.variant:
        pytest.skip(f"{backend} has no separate hard_pairs path")


def _mine(backend, features, labels, **kw):
    _runs_hard_pairs(backend)
    result = hard_pairs(*backend.put((features, labels)), **backend.put(kw), backend=backend.name)
    return HardPairs(*(t.cpu() for t in result))


# ------------------------------------------------------------------------------------------
# The brute force
# ------------------------------------------------------------------------------------------

def _brute_force(features, labels, contrast=None, contrast_labels=None, normalize=True):
    """Per anchor: (positive candidates, negative candidates, float64 similarities to every
    candidate row), the candidates as boolean masks over the candidate rows, from the
    definition alone."""
    q = features.double()
    z = q if contrast is None else contrast.double()
    z_labels = (labels if contrast is None else contrast_labels).long()
    if normalize:
        q = q / q.norm(dim=1, keepdim=True).clamp_min(1e-12)
        z = z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)
    anchors = []
    for i in range(q.shape[0]):
        others = torch.ones(z.shape[0], dtype=torch.bool)
        if contrast is None:
            others[i] = False
        label = int(labels[i])
        positives = others & (z_labels == label) if label >= 0 else torch.zeros_like(others)
        anchors.append((positives, others & ~positives, z @ q[i]))
    return anchors


def _tolerance(features, contrast, normalize, compute_dtype):
    base = 1e-10 if compute_dtype == torch.float64 else 1e-4
    if normalize:
        return base
    rows = features.double().norm(dim=1).max()
    cols = rows if contrast is None else contrast.double().norm(dim=1).max()
    return base * max(1.0, float(rows * cols))


def _check(result, features, labels, contrast=None, contrast_labels=None, normalize=True,
           compute_dtype=torch.float32, exact=False):
    """Every anchor's two picks: -1 / NaN exactly where there is no candidate; otherwise a
    candidate of the right kind whose similarity is the returned one and the extreme, both
    within the tolerance (exact: the lowest index among the candidates that tie for the extreme,
    for data whose ties the kernels see exactly)."""
    tol = _tolerance(features, contrast, normalize, compute_dtype)
    anchors = _brute_force(features, labels, contrast, contrast_labels, normalize)
    assert all(t.shape == (features.shape[0],) for t in result)
    assert result.positive_index.dtype == result.negative_index.dtype == torch.int64
    for i, (positives, negatives, sims) in enumerate(anchors):
        for kind, candidates, index, similarity, largest in (
                ("positive", positives, result.positive_index[i], result.positive_similarity[i], False),
                ("negative", negatives, result.negative_index[i], result.negative_similarity[i], True)):
            where = f"anchor {i}, {kind}"
            if not candidates.any():
                assert index == -1 and torch.isnan(similarity), where
                continue
            assert 0 <= index < len(candidates) and candidates[index], \
                f"{where}: {int(index)} is not a {kind} candidate"
            best = float(sims[candidates].max() if largest else sims[candidates].min())
            picked = float(sims[index])
            assert abs(float(similarity) - picked) <= tol, where
            assert abs(picked - best) <= tol, f"{where}: {picked} is not the extreme {best}"
            if exact:
                # float64 matrix-vector products may differ in the last bit between equal rows
                tied = candidates & ((sims - best).abs() <= 1e-12 * max(1.0, abs(best)))
                lowest = int(tied.nonzero()[0])
                assert int(index) == lowest, where


# ------------------------------------------------------------------------------------------
# Random data, awkward sizes
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(n=[1, 5, 33, 70, 300, 2100], d=[3, 40, 130], dtype=FLOATS, quick="each")
def test_single_set(backend, n, d, dtype, randn, randint):
    features = randn(n, d, dtype=dtype)
    labels = randint(0, 6, (n,))
    labels[::7] = -1
    result = _mine(backend, features, labels)
    assert result.positive_similarity.dtype == backend.computes_in(dtype)
    _check(result, features, labels, compute_dtype=backend.computes_in(dtype))


@pytest.mark.matrix(n=[1, 33, 70], m=[1, 45, 2100], normalize=[True, False],
                    dtype=[torch.float32, torch.float64], quick="each")
def test_cross_set(backend, n, m, normalize, dtype, randn, randint):
    features, contrast = randn(n, 19, dtype=dtype), randn(m, 19, dtype=dtype, scale=3.0)
    labels, contrast_labels = randint(-1, 4, (n,)), randint(-1, 4, (m,))
    result = _mine(backend, features, labels, contrast=contrast, contrast_labels=contrast_labels,
                   normalize=normalize)
    _check(result, features, labels, contrast, contrast_labels, normalize,
           compute_dtype=backend.computes_in(dtype))


@pytest.mark.matrix(n=[4, 45], normalize=[True, False])
def test_plain_dot_products(backend, n, normalize, randn, randint):
    features = randn(n, 33, scale=5.0)
    labels = randint(0, 3, (n,))
    _check(_mine(backend, features, labels, normalize=normalize), features, labels,
           normalize=normalize)


LABEL_PATTERNS = {
    "one_class": lambda n: torch.zeros(n, dtype=torch.long),  # no negatives
    "all_different": lambda n: torch.arange(n),  # no positives
    "all_no_class": lambda n: torch.full((n,), -1),  # no positives, everyone a negative
    "no_class_pairs": lambda n: torch.arange(n) % 3 - 1,  # -1 rows never pair up
    "int32": lambda n: (torch.arange(n) % 4).to(torch.int32),
}


@pytest.mark.matrix(pattern=list(LABEL_PATTERNS), n=[2, 40])
def test_label_patterns(backend, pattern, n, randn):
    features = randn(n, 9)
    labels = LABEL_PATTERNS[pattern](n)
    result = _mine(backend, features, labels)
    _check(result, features, labels)
    if pattern == "one_class":
        assert (result.negative_index == -1).all() and (result.positive_index >= 0).all()
    if pattern in ("all_different", "all_no_class"):
        assert (result.positive_index == -1).all() and (result.negative_index >= 0).all()


def test_one_row(backend, randn):
    result = _mine(backend, randn(1, 5), torch.tensor([2]))
    assert result.positive_index.tolist() == result.negative_index.tolist() == [-1]
    assert torch.isnan(result.positive_similarity).all() and torch.isnan(result.negative_similarity).all()


# ------------------------------------------------------------------------------------------
# Ties: small integer rows have exact dot products in every summation order, so duplicates tie
# exactly and the lowest index must win (also across the tiles).
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(n=[6, 70, 2100], normalize=[True, False])
def test_ties_go_to_the_lowest_index(backend, n, normalize, randint):
    distinct = randint(-3, 4, (5, 16)).float()
    distinct[:, 0] = 5  # no zero rows
    rows = torch.arange(n) % 5
    features, labels = distinct[rows], rows % 2
    result = _mine(backend, features, labels, normalize=normalize)
    _check(result, features, labels, normalize=normalize, exact=True)


def test_ties_in_a_cross_set(backend, randint):
    distinct = randint(-3, 4, (4, 8)).float()
    distinct[:, 0] = 4
    contrast = distinct[torch.arange(50) % 4]
    contrast_labels = torch.arange(50) % 2
    features, labels = distinct[[0, 1, 2, 3, 0]], torch.tensor([0, 1, 0, 1, -1])
    result = _mine(backend, features, labels, contrast=contrast, contrast_labels=contrast_labels)
    _check(result, features, labels, contrast, contrast_labels, exact=True)


# ------------------------------------------------------------------------------------------
# No gradient, meta tensors, the backends that have it
# ------------------------------------------------------------------------------------------

def test_inputs_that_require_grad(backend, randn, randint):
    features = randn(12, 6).requires_grad_()
    contrast = randn(9, 6).requires_grad_()
    result = _mine(backend, features, randint(0, 3, (12,)), contrast=contrast,
                   contrast_labels=randint(0, 3, (9,)))
    assert not any(t.requires_grad for t in result)


@library
@pytest.mark.parametrize("backend_name", ["auto", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_meta_tensors_give_shapes(backend_name, dtype):
    features = torch.empty(7, 4, dtype=dtype, device="meta")
    contrast = torch.empty(5, 4, dtype=dtype, device="meta")
    labels = torch.empty(7, dtype=torch.long, device="meta")
    for kw in ({}, dict(contrast=contrast, contrast_labels=torch.empty(5, dtype=torch.long,
                                                                       device="meta"))):
        result = hard_pairs(features, labels, backend=backend_name, **kw)
        assert all(t.device.type == "meta" and t.shape == (7,) for t in result)
        assert result.positive_index.dtype == result.negative_index.dtype == torch.int64
        expected = torch.float64 if dtype == torch.float64 else torch.float32
        assert result.positive_similarity.dtype == result.negative_similarity.dtype == expected


@library
def test_triton_fake_computes_in_float32():
    features = torch.empty(3, 4, dtype=torch.float64, device="meta")
    out = torch.ops.scl.hard_pairs_triton(features, torch.empty(3, dtype=torch.long, device="meta"),
                                          None, None, True)
    assert out[1].dtype == out[3].dtype == torch.float32 and out[0].shape == (3,)


def test_ops_pass_opcheck(backend, randn):
    """Schema, fake kernel and tracing of the raw op. Every anchor here has a positive and a
    negative: opcheck compares outputs without equating NaN with NaN."""
    _runs_hard_pairs(backend)
    op = backend.info.hard_pairs_op
    if op is None:
        pytest.skip(f"{backend} is dense PyTorch, no op")
    x, c = backend.put((randn(9, 5), randn(6, 5)))
    y, cy = backend.put((torch.arange(9) % 3, torch.arange(6) % 3))
    for args in ((x, y, None, None, True), (x.double(), y, c.double(), cy, False)):
        torch.library.opcheck(op, args)


def test_cuda_backend_has_no_hard_pairs():
    with pytest.raises(ValueError, match=r"backend='cuda' has no hard_pairs.*'cpu'.*'triton'"):
        hard_pairs(torch.randn(3, 2), torch.tensor([0, 1, 0]), backend="cuda")


@library
def test_auto_runs_the_cpu_kernel(randn, randint):
    features, labels = randn(20, 7), randint(0, 3, (20,))
    for auto, cpu in zip(hard_pairs(features, labels), hard_pairs(features, labels, backend="cpu")):
        assert torch.equal(auto.nan_to_num(-7.0), cpu.nan_to_num(-7.0))


@library
def test_cpu_kernel_is_deterministic_across_thread_counts(randn, randint):
    features, labels = randn(700, 24), randint(0, 3, (700,))
    torch.set_num_threads(1)
    one = hard_pairs(features, labels, backend="cpu")
    torch.set_num_threads(2)
    two = hard_pairs(features, labels, backend="cpu")
    assert all(torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0)) for a, b in zip(one, two))


# ------------------------------------------------------------------------------------------
# Bad inputs
# ------------------------------------------------------------------------------------------

def _bad_inputs():
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    c, cy = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 2])
    return [
        ("features_type", dict(features=x.tolist(), labels=y), TypeError, "features must be a torch.Tensor"),
        ("features_int", dict(features=y.view(4, 1), labels=y), TypeError, "features must be a floating"),
        ("features_3d", dict(features=x.view(4, 3, 1), labels=y), ValueError, r"features must have shape \[N, D\]"),
        ("features_empty", dict(features=x[:, :0], labels=y), ValueError, "features must have at least one"),
        ("labels_none", dict(features=x, labels=None), TypeError, "labels must be a torch.Tensor"),
        ("labels_float", dict(features=x, labels=y.float()), TypeError, "labels must be an integer"),
        ("labels_length", dict(features=x, labels=y[:3]), ValueError, "labels has 3 entries"),
        ("labels_multi_hot", dict(features=x, labels=torch.ones(4, 2, dtype=torch.bool)),
         ValueError, r"labels must be class ids of shape \[N\]"),
        ("features_nan", dict(features=x.clone().index_fill_(0, torch.tensor([2]), float("nan")),
                              labels=y), ValueError, "features contains NaN or inf"),
        ("contrast_inf", dict(features=x, labels=y, contrast=c.clone().fill_(float("inf")),
                              contrast_labels=cy), ValueError, "contrast contains NaN or inf"),
        ("contrast_dim", dict(features=x, labels=y, contrast=c[:, :2], contrast_labels=cy),
         ValueError, "contrast has dimension 2"),
        ("contrast_dtype", dict(features=x, labels=y, contrast=c.double(), contrast_labels=cy),
         TypeError, "contrast has dtype"),
        ("contrast_labels_missing", dict(features=x, labels=y, contrast=c), ValueError,
         "contrast_labels is required"),
        ("contrast_labels_alone", dict(features=x, labels=y, contrast_labels=cy), ValueError,
         "contrast_labels given without contrast"),
        ("contrast_labels_length", dict(features=x, labels=y, contrast=c, contrast_labels=cy[:4]),
         ValueError, r"contrast_labels must have shape \[5\]"),
        ("normalize", dict(features=x, labels=y, normalize=1), TypeError, "normalize must be a bool"),
        ("backend", dict(features=x, labels=y, backend="gpu"), ValueError, "backend must be one of"),
    ]


@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda case: case[0])
def test_bad_inputs(case):
    _, kw, error, match = case
    kw.setdefault("backend", "reference")
    with pytest.raises(error, match=match):
        hard_pairs(kw.pop("features"), kw.pop("labels"), **kw)


@pytest.mark.parametrize("name", ["features", "contrast"])
def test_values_are_checked_on_every_backend(backend, name, randn):
    x, c = randn(6, 4), randn(5, 4)
    {"features": x, "contrast": c}[name][1, 2] = float("nan")
    with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
        _mine(backend, x, torch.arange(6) % 2, contrast=c, contrast_labels=torch.arange(5) % 2)


@library
def test_the_op_checks_shapes_itself():
    with pytest.raises(ValueError, match=r"labels must have shape \[4\]"):
        torch.ops.scl.hard_pairs(torch.randn(4, 3), torch.zeros(3, dtype=torch.long), None, None, True)
    with pytest.raises(ValueError, match="contrast and contrast_labels must be given together"):
        torch.ops.scl.hard_pairs(torch.randn(4, 3), torch.zeros(4, dtype=torch.long),
                                 torch.randn(2, 3), None, True)


# ------------------------------------------------------------------------------------------
# Memory: one GEMM pass, never an N x N matrix
# ------------------------------------------------------------------------------------------

@library
@pytest.mark.slow
def test_cpu_memory_at_65536_rows(randn, randint):
    n, d = 65536, 128
    features, labels = randn(n, d), randint(0, 1000, (n,))
    with PeakMemory("cpu") as peak:
        result = hard_pairs(features, labels, backend="cpu")
    assert peak.peak_bytes < 2**30, f"{peak.peak_bytes / 2**20:.0f} MiB"  # dense: 16 GiB
    sample = torch.arange(0, n, 4099)
    sims = torch.nn.functional.normalize(features[sample].double()) @ \
        torch.nn.functional.normalize(features.double()).T
    for row, i in enumerate(sample.tolist()):
        negatives = (labels != labels[i]) | (labels < 0)
        best = sims[row].masked_fill(~negatives, float("-inf")).max()
        assert abs(float(sims[row, result.negative_index[i]]) - float(best)) <= 1e-4
