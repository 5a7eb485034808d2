"""The conformance suite, known false negatives (``groups=``, docs/MATH.md section 11): every
backend whose tiles have the group mask against the float64 reference, on every layout, awkward
sizes, both schedules, fp32 / fp64 / bf16, the focal loss and a learnable temperature; the
backends without it refuse the call, quoting the plan."""
import dataclasses

import pytest
import torch

import scl_kernels
from support.capability_plans import capability_in_plan
from support.layouts import LAYOUTS, make_layout, with_groups
from support.reference64 import check_backend_against_reference

FLOATS = [torch.float32, torch.float64]


def _has_group_mask(backend):
    return capability_in_plan(backend, "groups", "no group mask",
                              torch.zeros(2, dtype=torch.long),
                              groups=torch.zeros(2, dtype=torch.long))


def _needs_group_mask(backend):
    if not _has_group_mask(backend):
        pytest.skip(f"{backend}'s tiles have no group mask (test_backends_without_it_refuse)")


# 0.02 takes the running-max ("plain") path in fp32; 0.1 the symmetric one for single-set "all".
@pytest.mark.matrix(layout=LAYOUTS, dtype=FLOATS, temperature=[0.02, 0.1], quick="each")
def test_layouts(backend, layout, dtype, temperature, randn, randint, gen):
    _needs_group_mask(backend)
    kw = with_groups(make_layout(layout, randn, randint, dtype=dtype, n=45, d=37), randint, 6)
    res = check_backend_against_reference(backend, kw, gen, temperature=temperature)
    # The groups took pairs out: the loss is not the one without them.
    assert not torch.equal(res.ref.allowed, ~torch.eye(*res.ref.allowed.shape, dtype=torch.bool)
                           if res.ref.single_set else torch.ones_like(res.ref.allowed))


@pytest.mark.matrix(n=[1, 2, 7, 130, 300], d=[1, 64], temperature=[0.02, 0.1])
def test_awkward_shapes(backend, n, d, temperature, randn, randint, gen):
    _needs_group_mask(backend)
    kw = with_groups(make_layout("single_all", randn, randint, n=n, d=d), randint, max(1, n // 4))
    check_backend_against_reference(backend, kw, gen, temperature=torch.tensor(temperature, requires_grad=True),
         reduction="none")


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"],
                    focal_gamma=[0.5, 2.0])
def test_focal_loss(backend, layout, focal_gamma, randn, randint, gen):
    _needs_group_mask(backend)
    if not backend.info.runs(focal_gamma):
        pytest.skip(f"{backend} does not implement focal_gamma (Backend.focal)")
    kw = with_groups(make_layout(layout, randn, randint, n=40, d=9), randint, 5)
    check_backend_against_reference(backend, kw, gen, temperature=0.1, focal_gamma=focal_gamma)


@pytest.mark.matrix(layout=["single_all", "cross_labels"], temperature=[0.02, 0.1],
                    dtype=[torch.bfloat16])
def test_half_precision(backend, layout, temperature, dtype, randn, randint, gen):
    _needs_group_mask(backend)
    kw = with_groups(make_layout(layout, randn, randint, dtype=dtype, n=45, d=37), randint, 6)
    check_backend_against_reference(backend, kw, gen, temperature=temperature)


@pytest.mark.matrix(layout=["single_all", "multiview_all", "cross_labels"])
def test_one_group_for_all(backend, layout, randn, randint, gen):
    """Every row in one group: each anchor's denominator is its positives; an anchor without
    positives has no column left, no loss, and finite gradients."""
    _needs_group_mask(backend)
    kw = make_layout(layout, randn, randint, n=30, d=8, classes=6)
    kw["labels"] = torch.where(randint(0, 5, kw["labels"].shape) == 0, -1, kw["labels"])
    kw["groups"] = torch.zeros(kw["features"].shape[0], dtype=torch.long)
    if kw["contrast"] is not None:
        kw["contrast_groups"] = torch.zeros(kw["contrast"].shape[0], dtype=torch.long)
    check_backend_against_reference(backend, kw, gen, temperature=0.1, reduction="none")


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"],
                    temperature=[0.02, 0.1])
def test_groups_without_a_pair_change_nothing(backend, layout, temperature, randn, randint):
    """No group, or a group per sample (views of one sample are positives): the loss and the
    gradients of the call without groups, bit for bit where both calls are prepared alike (a
    call with groups is prepared by ATen steps, whose norms may round apart from the fused
    preparation's: then to float32 rounding)."""
    _needs_group_mask(backend)
    kw = backend.put(make_layout(layout, randn, randint, n=33, d=7))
    samples = kw["features"].shape[0]
    contrast_rows = None if kw["contrast"] is None else kw["contrast"].shape[0]

    def loss_and_grad(**groups):
        features = kw["features"].detach().requires_grad_(True)
        loss = scl_kernels.supcon_loss(**dict(kw, features=features), temperature=temperature,
                                       backend=backend.name, **backend.put(groups))
        return loss, torch.autograd.grad(loss, features)[0]

    without = loss_and_grad()
    no_group = dict(groups=torch.full((samples,), -1))
    own_group = dict(groups=torch.arange(samples))
    if contrast_rows is not None:
        no_group["contrast_groups"] = torch.full((contrast_rows,), -5)
        own_group = dict(groups=torch.full((samples,), 1),
                         contrast_groups=torch.full((contrast_rows,), 2))
    fused = scl_kernels.explain(**kw, temperature=temperature,
                                backend=backend.name).plan.get("preparation") == "fused"
    for groups in (no_group, own_group):
        for want, got in zip(without, loss_and_grad(**groups)):
            if fused:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(want, got)


def test_backends_without_it_refuse(backend, randn):
    """supcon_loss refuses before the op runs; the op itself refuses too, quoting its plan."""
    if _has_group_mask(backend):
        pytest.skip(f"{backend} has the group mask (test_layouts)")
    features = backend.put(randn(6, 4))
    labels, groups = backend.put(torch.tensor([0, 0, 1, 1, 2, 2])), backend.put(torch.zeros(6).long())
    with pytest.raises(ValueError, match="with groups: the plan's line 'cannot_run: no group "
                                         r"mask' refuses it.*\['cpu', 'triton', 'cuda', "
                                         r"'reference'\]"):
        scl_kernels.supcon_loss(features, labels, groups=groups, backend=backend.name)
    with pytest.raises(NotImplementedError, match="groups=.*'cannot_run: no group mask' refuses "
                                                  "it.*group_backends\\(\\) lists"):
        backend.forward_op(features, labels, None, None, torch.tensor(0.1, dtype=torch.float64),
                           6, True, groups=groups)


def test_auto_takes_a_backend_that_masks_groups(monkeypatch, randn):
    from scl_kernels import backends
    assert backends.auto_backend("cpu", groups=True) == "cpu"
    for name in ("cpu", "triton"):  # triton serves CPU tensors under the tests' interpreter
        monkeypatch.setitem(backends.REGISTRY, name,
                            dataclasses.replace(backends.REGISTRY[name], groups=False))
    name, why = backends.auto_choice("cpu", groups=True)
    assert backends.REGISTRY[name].groups and "cpu: no group mask" in why
    with pytest.warns(UserWarning, match=r"cpu: no group mask.*dense O\(N\^2\) 'reference'"):
        scl_kernels.supcon_loss(randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2]),
                                groups=torch.zeros(6).long())


@pytest.mark.parametrize("kw, error, message", [
    (dict(groups=torch.zeros(5, dtype=torch.long)), ValueError, "groups has 5 entries but "
                                                                 "features has 6 samples"),
    (dict(groups=torch.zeros(6)), TypeError, "groups must be an integer tensor"),
    (dict(groups=torch.zeros(6, 1, dtype=torch.long)), ValueError, "groups must be "
                                                                   "one-dimensional"),
    (dict(contrast_groups=torch.zeros(3, dtype=torch.long)), ValueError,
     "contrast_groups given without contrast"),
    (dict(contrast=torch.randn(3, 4), contrast_labels=torch.zeros(3, dtype=torch.long),
          groups=torch.zeros(6, dtype=torch.long)), ValueError,
     "groups and contrast_groups must be given together"),
    (dict(contrast=torch.randn(3, 4), contrast_labels=torch.zeros(3, dtype=torch.long),
          groups=torch.zeros(6, dtype=torch.long), contrast_groups=torch.zeros(4).long()),
     ValueError, r"contrast_groups must have shape \[3\]"),
])
@pytest.mark.parametrize("backend_name", ["cpu", "reference"])
def test_bad_groups_name_the_argument(kw, error, message, backend_name):
    with pytest.raises(error, match=message):
        scl_kernels.supcon_loss(torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2]), **kw,
                                backend=backend_name)


def test_the_op_checks_groups_itself():
    """The op's own checks, for its callers that are not supcon_loss."""
    rows, labels = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    t = torch.tensor(0.1, dtype=torch.float64)
    with pytest.raises(ValueError, match="groups has 3 entries but features has 4 rows"):
        torch.ops.scl.supcon(rows, labels, None, None, t, 4, True, groups=torch.zeros(3).long())
    with pytest.raises(ValueError, match="contrast_groups given without contrast"):
        torch.ops.scl.supcon(rows, labels, None, None, t, 4, True,
                             contrast_groups=torch.zeros(4).long())


def test_the_module_takes_groups(randn):
    """nn.SupConLoss passes groups to supcon_loss (with a memory too: api/test_memory_groups.py)."""
    features, labels = randn(8, 5), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, -1, -1])
    loss = scl_kernels.SupConLoss(temperature=0.2, backend="cpu")
    assert torch.equal(loss(features, labels, groups=groups),
                       scl_kernels.supcon_loss(features, labels, 0.2, groups=groups,
                                               backend="cpu"))
