"""The fused op's arguments have one description, its schemas (made from
csrc/core/call_arguments.h). Every Python place that must still name them is held to the schemas
here, so that any disagreement fails in this file:

- the forward, backward and plan schemas of every fused op the library registers agree;
- the fake kernels (backends/fused_ops.py) take the arguments by keyword and by position;
- the dense reference (backends/reference.py) takes the forward's arguments;
- FROM_SUPCON_LOSS below says how supcon_loss sets each op argument, and supcon_loss
  (functional.py, through Backend.run) and explain (its plan op) pass what it says;
- explain takes supcon_loss's parameters, and _docstrings.ARGUMENTS documents exactly those.
"""
import inspect
import re
import typing

import pytest
import torch

from scl_kernels import Explanation, explain, supcon_loss
from scl_kernels._docstrings import ARGUMENTS
from scl_kernels._testing import cuda_dry_run_built
from scl_kernels.backends import REGISTRY, Backend
from scl_kernels.backends.fused_ops import fused_op_names
from scl_kernels.backends.reference import supcon_reference
from support import needs

pytestmark = needs.library

THIS_FILE = "python_tests/api/test_call_arguments.py"
OP_NAMES = fused_op_names()


def schema(op_name):
    return getattr(torch.ops.scl, op_name).default._schema


def described(argument):
    """What a caller relies on of one schema argument."""
    return (argument.name, str(argument.type), argument.has_default_value(),
            argument.default_value, argument.kwarg_only)


FORWARD = [described(a) for a in schema("supcon").arguments]
REQUIRED = [a for a in FORWARD if not a[2]]
DEFAULTED = [a for a in FORWARD if a[2]]


# ------------------------------------------------------------------------------------------
# The schemas of every fused op
# ------------------------------------------------------------------------------------------

@pytest.mark.quick
def test_the_fused_ops_are_found():
    """fused_op_names (which the fakes are registered for) finds the registry's ops, and a test
    build's dry run; each comes with its backward and its plan."""
    registry_ops = {backend.op_name for backend in REGISTRY.values() if backend.op_name}
    assert registry_ops <= set(OP_NAMES)
    if cuda_dry_run_built():
        assert "supcon_cuda_dry_run" in OP_NAMES
    for name in OP_NAMES:
        assert hasattr(torch.ops.scl, f"{name}_plan"), name


@pytest.mark.quick
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_forward_and_plan_take_the_forward_s_arguments(op_name):
    assert [described(a) for a in schema(op_name).arguments] == FORWARD
    plan = schema(f"{op_name}_plan")
    assert [described(a) for a in plan.arguments] == FORWARD
    assert [str(r.type) for r in plan.returns] == ["str"]


@pytest.mark.quick
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_backward_takes_grad_loss_the_forward_s_arguments_lse_and_temperature_grad(op_name):
    """grad_loss first, lse after the forward's required arguments (the positional prefix the
    ring and the tests call with), the forward's defaulted ones in their order, and
    temperature_grad, defaulted, somewhere after lse."""
    backward = [described(a) for a in schema(f"{op_name}_backward").arguments]
    names = [a[0] for a in backward]
    temperature_grad = ("temperature_grad", "bool", True, True, False)
    assert temperature_grad in backward, backward
    assert names.index("temperature_grad") > names.index("lse")
    grad_loss = ("grad_loss", "Tensor", False, None, False)
    lse = ("lse", "Tensor", False, None, False)
    assert [a for a in backward if a != temperature_grad] == [grad_loss, *REQUIRED, lse,
                                                              *DEFAULTED]


# ------------------------------------------------------------------------------------------
# The fakes, through each op on meta tensors
# ------------------------------------------------------------------------------------------

def meta_call(layout, mean, dtype=torch.bfloat16):
    """(the forward's arguments by name, every defaulted one off its default, and the number of
    rows of the outputs)."""
    features = torch.empty(10, 4, dtype=dtype, device="meta")
    labels = torch.empty(10, dtype=torch.long, device="meta")
    groups = torch.empty(10, dtype=torch.long, device="meta")
    contrast, contrast_labels, contrast_groups, num_anchors, offset, rows = (None, None, None, 6,
                                                                               3, 6)
    if layout == "cross":
        contrast = torch.empty(7, 4, dtype=dtype, device="meta")
        contrast_labels = torch.empty(7, dtype=torch.long, device="meta")
        contrast_groups = torch.empty(7, dtype=torch.long, device="meta")
        num_anchors, offset, rows = 10, 0, 10
    return dict(features=features, labels=labels, contrast=contrast,
                contrast_labels=contrast_labels, temperature=torch.tensor(0.1, dtype=torch.float64),
                num_anchors=num_anchors, normalize=False, anchor_offset=offset, focal_gamma=0.5,
                mean=mean, groups=groups, contrast_groups=contrast_groups,
                multi_label="jaccard"), rows


def call_op(op_name, arguments, how):
    """The op called with ``arguments`` by keyword, or by position in its schema's order."""
    op = getattr(torch.ops.scl, op_name)
    names = [a.name for a in schema(op_name).arguments]
    assert set(arguments) == set(names), (
        f"scl::{op_name} takes {names}; meta_call in {THIS_FILE} passes {sorted(arguments)}")
    if how == "keyword":
        return op(**arguments)
    return op(*(arguments[name] for name in names))


@pytest.mark.quick
@pytest.mark.parametrize("how", ["keyword", "position"])
@pytest.mark.parametrize("layout", ["single", "cross"])
@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_the_fakes_take_the_arguments_by_keyword_and_by_position(op_name, mean, layout, how):
    arguments, rows = meta_call(layout, mean)
    loss, lse, num_positives = call_op(op_name, arguments, how)
    assert (loss.shape, loss.dtype) == ((() if mean else (rows,)), torch.float32)
    assert (lse.shape, lse.dtype, lse.device.type) == ((rows,), torch.float64, "meta")
    assert (num_positives.shape, num_positives.dtype) == ((rows,), torch.int64)

    backward = dict(arguments, grad_loss=torch.empty_like(loss), lse=lse, temperature_grad=False)
    grad_features, grad_contrast, grad_temperature = call_op(f"{op_name}_backward", backward, how)
    features, contrast = arguments["features"], arguments["contrast"]
    assert (grad_features.shape, grad_features.dtype) == (features.shape, features.dtype)
    expected_contrast = (0, 4) if contrast is None else contrast.shape
    assert tuple(grad_contrast.shape) == tuple(expected_contrast)
    assert (grad_temperature.shape, grad_temperature.dtype) == ((), torch.float64)


@pytest.mark.quick
@pytest.mark.parametrize("how", ["keyword", "position"])
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_the_fakes_check_each_argument_s_device_by_its_name(op_name, how):
    arguments, _ = meta_call("cross", False)
    arguments["contrast_labels"] = torch.zeros(7, dtype=torch.long)
    with pytest.raises(ValueError, match="^contrast_labels is on cpu but features is on meta$"):
        call_op(op_name, arguments, how)


@pytest.mark.quick
@pytest.mark.parametrize("op_name", OP_NAMES)
def test_the_fakes_fill_the_schema_s_defaults(op_name):
    """Called with the required arguments only, which the dispatcher passes on alone: the
    schema's mean=False gives a loss per anchor."""
    arguments, rows = meta_call("single", True)
    required = [a.name for a in schema(op_name).arguments if not a.has_default_value()]
    loss, _, _ = getattr(torch.ops.scl, op_name)(*(arguments[name] for name in required))
    assert loss.shape == (rows,)


# ------------------------------------------------------------------------------------------
# The dense reference
# ------------------------------------------------------------------------------------------

@pytest.mark.quick
def test_the_reference_takes_the_forward_s_arguments():
    """Backend.run gives the reference backend what it would give the op."""
    parameters = inspect.signature(supcon_reference).parameters.values()
    kinds = {False: inspect.Parameter.POSITIONAL_OR_KEYWORD, True: inspect.Parameter.KEYWORD_ONLY}
    assert [(p.name, p.kind, p.default) for p in parameters] == [
        (name, kinds[kwarg_only], default if has_default else inspect.Parameter.empty)
        for name, _, has_default, default, kwarg_only in FORWARD]


# ------------------------------------------------------------------------------------------
# How supcon_loss sets each op argument
# ------------------------------------------------------------------------------------------

def _rows(features):
    """[B, V, D] views flattened view-major, as supcon_loss lays them out."""
    if features.dim() == 2:
        return features
    return features.transpose(0, 1).reshape(-1, features.shape[-1])


def _views(call):
    features = call["features"]
    return 1 if features.dim() == 2 else features.shape[1]


def _row_labels(call):
    """labels per row of _rows (class ids, or multi-hot rows); without labels each sample's id,
    its index."""
    features, labels = call["features"], call["labels"]
    labels = torch.arange(features.shape[0]) if labels is None else labels
    return labels.repeat(_views(call), *([1] * (labels.dim() - 1)))


def _row_groups(call):
    """groups per row of _rows, or None."""
    return None if call["groups"] is None else call["groups"].repeat(_views(call))


def _temperature(call):
    t = call["temperature"]
    return t if isinstance(t, torch.Tensor) else torch.tensor(float(t), dtype=torch.float64)


# Each argument of scl::supcon, from supcon_loss's arguments (``call``: by name, the defaults
# filled in). A new op argument needs its entry here (test_every_op_argument_has_an_entry).
FROM_SUPCON_LOSS = {
    "features": lambda call: _rows(call["features"]),
    "labels": _row_labels,
    "contrast": lambda call: call["contrast"],
    "contrast_labels": lambda call: call["contrast_labels"],
    "temperature": _temperature,
    # contrast_mode="one": the view-0 rows, the first B of the layout; "all": every row.
    "num_anchors": lambda call: (call["features"].shape[0] if call["contrast_mode"] == "one"
                                 else _rows(call["features"]).shape[0]),
    "normalize": lambda call: call["normalize"],
    # The anchors are the first rows; only the distributed loss offsets them (global_batch).
    "anchor_offset": lambda call: 0,
    "focal_gamma": lambda call: float(call["focal_gamma"]),
    # reduction="mean" is taken inside the op; "sum" and "none" reduce the per-anchor losses.
    "mean": lambda call: call["reduction"] == "mean",
    "groups": _row_groups,
    "contrast_groups": lambda call: call["contrast_groups"],
    "multi_label": lambda call: call["multi_label"],
}


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)))


SUPCON_CALLS = {
    "views, view 0 anchors": dict(features=_randn(4, 2, 3), labels=torch.tensor([0, 1, 0, 1]),
                                  temperature=0.2, contrast_mode="one", normalize=False,
                                  focal_gamma=1, groups=torch.tensor([0, 0, -1, 1])),
    "cross set": dict(features=_randn(4, 3), labels=torch.tensor([0, 1, 2, 0]),
                      temperature=torch.tensor(0.3), contrast=_randn(5, 3),
                      contrast_labels=torch.tensor([2, 1, 0, 0, 1]), reduction="sum",
                      groups=torch.tensor([3, 1, 1, -2]),
                      contrast_groups=torch.tensor([1, 1, 0, 3, -1])),
    "views without labels": dict(features=_randn(3, 2, 3), reduction="none", focal_gamma=0.5),
    "multi-hot views": dict(features=_randn(3, 2, 3), labels=torch.tensor([[1, 0], [1, 1], [0, 0]]),
                            multi_label="jaccard"),
}


def supcon_arguments(kwargs):
    bound = inspect.signature(supcon_loss).bind(**kwargs)
    bound.apply_defaults()
    return bound.arguments


def expected_op_arguments(kwargs):
    call = supcon_arguments(kwargs)
    return {name: how(call) for name, how in FROM_SUPCON_LOSS.items()}


def assert_same(name, got, want):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, (name, got, want)
        assert torch.equal(got, want), (name, got, want)
    else:
        assert (type(got), got) == (type(want), want), name


@pytest.mark.quick
def test_every_op_argument_has_an_entry():
    names = [a[0] for a in FORWARD]
    missing = [name for name in names if name not in FROM_SUPCON_LOSS]
    assert not missing, (
        f"scl::supcon takes {missing}, which FROM_SUPCON_LOSS in {THIS_FILE} does not map: add "
        "how supcon_loss sets each there; unless the schema's default serves every call, pass it "
        "in scl_kernels/functional.py (supcon_loss's backend.run) and scl_kernels/explain.py "
        "(the plan op's call); take it in scl_kernels/backends/reference.py (supcon_reference)")
    gone = [name for name in FROM_SUPCON_LOSS if name not in names]
    assert not gone, (f"scl::supcon no longer takes {gone}: remove them from FROM_SUPCON_LOSS in "
                      f"{THIS_FILE}, scl_kernels/functional.py and scl_kernels/explain.py")


@pytest.mark.quick
@pytest.mark.parametrize("backend_name", ["cpu", "reference"])
@pytest.mark.parametrize("case", SUPCON_CALLS)
def test_supcon_loss_passes_the_op_arguments_the_table_says(monkeypatch, case, backend_name):
    passed = []
    run = Backend.run

    def spy(self, *args, **kwargs):
        passed.append(inspect.signature(supcon_reference).bind(*args, **kwargs).arguments)
        return run(self, *args, **kwargs)
    monkeypatch.setattr(Backend, "run", spy)
    supcon_loss(**SUPCON_CALLS[case], backend=backend_name)
    [arguments] = passed
    for argument in schema("supcon").arguments:
        assert argument.name in arguments or argument.has_default_value(), argument.name
        got = arguments.get(argument.name, argument.default_value)
        assert_same(argument.name, got, expected_op_arguments(SUPCON_CALLS[case])[argument.name])


@pytest.mark.quick
@pytest.mark.parametrize("case", SUPCON_CALLS)
def test_explain_plans_the_op_arguments_the_table_says(case):
    text = torch.ops.scl.supcon_plan(**expected_op_arguments(SUPCON_CALLS[case]))
    plan = dict(line.split(": ", 1) for line in text.splitlines())
    assert explain(**SUPCON_CALLS[case], backend="cpu").plan == plan


# ------------------------------------------------------------------------------------------
# supcon_loss's parameters: explain's, and their documentation
# ------------------------------------------------------------------------------------------

@pytest.mark.quick
def test_explain_takes_supcon_loss_s_parameters():
    assert inspect.signature(explain).parameters == inspect.signature(supcon_loss).parameters
    hints = typing.get_type_hints(explain)
    assert hints.pop("return") is Explanation
    loss_hints = typing.get_type_hints(supcon_loss)
    assert loss_hints.pop("return") is torch.Tensor
    assert hints == loss_hints


@pytest.mark.quick
@pytest.mark.parametrize("function", [supcon_loss, explain])
def test_supcon_loss_and_explain_refuse_the_same_bad_calls(function):
    x, y = _randn(4, 3), torch.tensor([0, 1, 0, 1])
    with pytest.raises(TypeError, match="temprature"):
        function(x, y, temprature=0.1)
    with pytest.raises(TypeError, match="positional"):
        function(x, y, 0.1, None)
    with pytest.raises(TypeError, match="multiple values.*labels"):
        function(x, y, labels=y)


@pytest.mark.quick
def test_every_parameter_is_documented_once():
    parameters = set(inspect.signature(supcon_loss).parameters)
    assert not parameters - set(ARGUMENTS), "add their entries to scl_kernels/_docstrings.py"
    assert not set(ARGUMENTS) - parameters, "remove their entries from scl_kernels/_docstrings.py"


@pytest.mark.quick
@pytest.mark.parametrize("function", [supcon_loss, explain])
def test_the_docstring_describes_each_parameter_in_order(function):
    if function.__doc__ is None:
        pytest.skip("docstrings are stripped (python -OO)")
    arguments = function.__doc__.split("Args:\n", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^ {8}(\w+): ", arguments, re.MULTILINE) == list(
        inspect.signature(function).parameters)
