"""The conformance suite, known false negatives (``groups=``, docs/MATH.md section 11): every
backend whose tiles have the group mask against the float64 reference, on every layout, awkward
sizes, both schedules, fp32 / fp64 / bf16, the focal loss and a learnable temperature; the
backends without it refuse the call, quoting the plan."""
import dataclasses

import pytest
import torch

import scl_kernels
from scl_kernels.nn import SupConMemory
from support.layouts import LAYOUTS, make_layout
from support.reference64 import check_against_reference

FLOATS = [torch.float32, torch.float64]


def _has_group_mask(backend):
    """Backend.groups, held to the fused op's own plan."""
    if backend.info.plan_op is not None:
        rows, ids = backend.put(torch.zeros(2, 3)), backend.put(torch.zeros(2, dtype=torch.long))
        plan = backend.info.plan_op(rows, ids, None, None, torch.tensor(0.1, dtype=torch.float64),
                                    2, True, groups=ids)
        refused = "cannot_run: no group mask" in plan.splitlines()
        assert refused != backend.info.groups, (backend, plan)
    return backend.info.groups


def _needs_group_mask(backend):
    if not _has_group_mask(backend):
        pytest.skip(f"{backend}'s tiles have no group mask (test_backends_without_it_refuse)")


def _with_groups(kw, randint, group_count):
    """kw with group ids for its samples and contrast rows: some negative (no group), the rest
    drawn from ``group_count`` ids, so that groups hold positives and non-positives alike."""
    kw = dict(kw)
    kw["groups"] = randint(-1, group_count, (kw["features"].shape[0],))
    if kw["contrast"] is not None:
        kw["contrast_groups"] = randint(-1, group_count, (kw["contrast"].shape[0],))
    return kw


def _run(backend, kw, gen, **extra):
    kw = backend.put(dict(kw))
    features = kw.pop("features")
    return check_against_reference(backend.name, features, generator=gen,
                                   compute_dtype=backend.computes_in(features.dtype), **kw,
                                   **extra)


# 0.02 takes the running-max ("plain") path in fp32; 0.1 the symmetric one for single-set "all".
@pytest.mark.matrix(layout=LAYOUTS, dtype=FLOATS, temperature=[0.02, 0.1], quick="each")
def test_layouts(backend, layout, dtype, temperature, randn, randint, gen):
    _needs_group_mask(backend)
    kw = _with_groups(make_layout(layout, randn, randint, dtype=dtype, n=45, d=37), randint, 6)
    res = _run(backend, kw, gen, temperature=temperature)
    # The groups took pairs out: the loss is not the one without them.
    assert not torch.equal(res.ref.allowed, ~torch.eye(*res.ref.allowed.shape, dtype=torch.bool)
                           if res.ref.single_set else torch.ones_like(res.ref.allowed))


@pytest.mark.matrix(n=[1, 2, 7, 130, 300], d=[1, 64], temperature=[0.02, 0.1])
def test_awkward_shapes(backend, n, d, temperature, randn, randint, gen):
    _needs_group_mask(backend)
    kw = _with_groups(make_layout("single_all", randn, randint, n=n, d=d), randint, max(1, n // 4))
    _run(backend, kw, gen, temperature=torch.tensor(temperature, requires_grad=True),
         reduction="none")


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"],
                    focal_gamma=[0.5, 2.0])
def test_focal_loss(backend, layout, focal_gamma, randn, randint, gen):
    _needs_group_mask(backend)
    if not backend.info.runs(focal_gamma):
        pytest.skip(f"{backend} does not implement focal_gamma (Backend.focal)")
    kw = _with_groups(make_layout(layout, randn, randint, n=40, d=9), randint, 5)
    _run(backend, kw, gen, temperature=0.1, focal_gamma=focal_gamma)


@pytest.mark.matrix(layout=["single_all", "cross_labels"], temperature=[0.02, 0.1])
def test_half_precision(backend, layout, temperature, randn, randint, gen):
    _needs_group_mask(backend)
    kw = _with_groups(make_layout(layout, randn, randint, dtype=torch.bfloat16, n=45, d=37),
                      randint, 6)
    _run(backend, kw, gen, temperature=temperature)


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
    _run(backend, kw, gen, temperature=0.1, reduction="none")


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"],
                    temperature=[0.02, 0.1])
def test_groups_without_a_pair_change_nothing(backend, layout, temperature, randn, randint):
    """No group, or a group per sample (views of one sample are positives): the loss and the
    gradients of the call without groups, bit for bit."""
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
    for groups in (no_group, own_group):
        for want, got in zip(without, loss_and_grad(**groups)):
            assert torch.equal(want, got)


def test_backends_without_it_refuse(backend, randn):
    """supcon_loss refuses before the op runs; the op itself refuses too, quoting its plan."""
    if _has_group_mask(backend):
        pytest.skip(f"{backend} has the group mask (test_layouts)")
    features = backend.put(randn(6, 4))
    labels, groups = backend.put(torch.tensor([0, 0, 1, 1, 2, 2])), backend.put(torch.zeros(6).long())
    with pytest.raises(ValueError, match="with groups: the plan's line 'cannot_run: no group "
                                         r"mask' refuses it.*\['cpu', 'reference'\]"):
        scl_kernels.supcon_loss(features, labels, groups=groups, backend=backend.name)
    with pytest.raises(NotImplementedError, match="groups=.*'cannot_run: no group mask' refuses "
                                                  "it.*cpu and reference backends have it"):
        backend.forward_op(features, labels, None, None, torch.tensor(0.1, dtype=torch.float64),
                           6, True, groups=groups)


def test_auto_takes_a_backend_that_masks_groups(monkeypatch, randn):
    from scl_kernels import backends
    assert backends.auto_backend("cpu", groups=True) == "cpu"
    monkeypatch.setitem(backends.REGISTRY, "cpu",
                        dataclasses.replace(backends.REGISTRY["cpu"], groups=False))
    name, why = backends.auto_choice("cpu", groups=True)
    assert backends.REGISTRY[name].groups and "cpu: no group mask" in why
    with pytest.warns(UserWarning, match="cpu: no group mask.*dense O\\(N\^2\\) 'reference'"):
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
    """nn.SupConLoss passes groups to supcon_loss; with a memory, whose rows have no group ids,
    it refuses them."""
    features, labels = randn(8, 5), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, -1, -1])
    loss = scl_kernels.SupConLoss(temperature=0.2, backend="cpu")
    assert torch.equal(loss(features, labels, groups=groups),
                       scl_kernels.supcon_loss(features, labels, 0.2, groups=groups,
                                               backend="cpu"))
    with_memory = scl_kernels.SupConLoss(memory=SupConMemory(16, 5), backend="cpu")
    with pytest.raises(ValueError, match="groups= cannot be combined with a memory"):
        with_memory(features, labels, groups=groups)
