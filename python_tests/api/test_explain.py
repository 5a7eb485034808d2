"""The call plan (csrc/core/call_plan.h) as a table, arguments -> plan, covering each of its
branches, and scl_kernels.explain, the profiler range and the errors that show it. The fused
stages' branches are reached through the CUDA C++ backend's dry run (a test build without CUDA)
and the device's paths through the test hooks; the plan is computed, nothing is run."""
import contextlib
import pathlib

import pytest
import torch

import scl_kernels
from scl_kernels._testing import NOT_A_TEST_BUILD, cuda_dry_run_built, test_build, test_hooks
from scl_kernels.backends import triton_installed
from support import needs

pytestmark = needs.library
dry_run = pytest.mark.skipif(not cuda_dry_run_built(),
                             reason="needs the CUDA host code's dry run (a test build without CUDA)")
hooks = pytest.mark.skipif(not test_build(), reason=NOT_A_TEST_BUILD)

ROWS, DIM, CLASSES = 40, 8, 5
BACKENDS_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "BACKENDS.md"


def plan_of(op, *, rows=ROWS, dim=DIM, dtype=torch.float32, t=0.1, layout="single", mean=True,
            normalize=True, focal_gamma=0.0, anchors=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, dim, generator=g).to(dtype)
    y = torch.randint(0, CLASSES, (rows,), generator=g)
    contrast = contrast_labels = None
    if layout == "cross":
        contrast, contrast_labels = torch.randn(rows + 3, dim, generator=g).to(dtype), \
            torch.randint(0, CLASSES, (rows + 3,), generator=g)
    text = op(x, y, contrast, contrast_labels, torch.tensor(t, dtype=torch.float64),
              anchors or rows, normalize, 0, focal_gamma, mean)
    return dict(line.split(": ", 1) for line in text.splitlines())


CPU_PLANS = [
    # (id, arguments, hooks, the plan's entries)
    ("single set", {}, {},
     dict(temperature="host value", forward_schedule="symmetric", backward_schedule="symmetric",
          preparation="aten", host_reads="yes", forward_finish="aten losses",
          mean="inside the op", backward_assembly="aten", value_checks="on the host",
          threads="calling thread", deterministic="no", symmetric_backward_walk="none",
          cannot_run="none")),
    ("small t", dict(t=0.001), {}, dict(forward_schedule="plain", backward_schedule="plain")),
    ("cross set", dict(layout="cross"), {}, dict(forward_schedule="plain")),
    ("some anchors", dict(anchors=ROWS // 2), {}, dict(forward_schedule="plain")),
    ("not normalised", dict(normalize=False), {}, dict(forward_schedule="plain")),
    ("float64", dict(dtype=torch.float64), {}, dict(forward_schedule="symmetric")),
    ("per anchor", dict(mean=False), {}, dict(mean="none")),
    ("focal", dict(focal_gamma=2.0), {},
     dict(forward_finish="positive walk", backward_assembly="positive walk, aten assembly")),
    ("large", dict(rows=2048, dim=64), {}, dict(threads="parallel tiles")),
    ("device preparation", {}, dict(device_preparation=True),
     dict(host_reads="no", value_checks="deferred")),
]


def test_cpu_plan_under_deterministic_algorithms(reproducible_if):
    """The CPU's symmetric forward is reproducible (no atomics): it keeps the triangle."""
    reproducible_if(True)
    plan = plan_of(torch.ops.scl.supcon_plan)
    assert (plan["forward_schedule"], plan["deterministic"]) == ("symmetric", "yes")


@pytest.mark.parametrize("arguments,hooked,expected", [c[1:] for c in CPU_PLANS],
                         ids=[c[0] for c in CPU_PLANS])
def test_cpu_plan(arguments, hooked, expected):
    if hooked and not test_build():
        pytest.skip(NOT_A_TEST_BUILD)
    with test_hooks(**hooked) if hooked else contextlib.nullcontext():
        plan = plan_of(torch.ops.scl.supcon_plan, **arguments)
    assert {k: plan[k] for k in expected} == expected


DRY_RUN_PLANS = [
    ("fused stages", {}, {}, False,
     dict(preparation="fused", host_temperature="0.1", forward_finish="fused losses and mean",
          backward_assembly="fused weights and assembly", forward_schedule="symmetric",
          symmetric_backward_walk="triangle")),
    ("fused per anchor", dict(mean=False), {}, False, dict(forward_finish="fused losses")),
    # the triangle forward adds by atomics: reproducible results take the plain one
    ("deterministic", {}, {}, True,
     dict(preparation="aten", forward_finish="fused losses", forward_schedule="plain",
          backward_schedule="symmetric", backward_assembly="aten weights, fused assembly",
          deterministic="yes", symmetric_backward_walk="full rows")),
    # the walk chosen through the test hook (SCL_CUDA_SYMMETRIC_BACKWARD, read once per process)
    ("full rows asked for", {}, dict(symmetric_backward_walk="rows"), False,
     dict(symmetric_backward_walk="full rows", deterministic="no")),
    ("triangle by st.async", {}, dict(symmetric_backward_walk="triangle-async"), False,
     dict(symmetric_backward_walk="triangle by st.async")),
    ("cross set: no symmetric walk", dict(layout="cross"), {}, False,
     dict(backward_schedule="plain", symmetric_backward_walk="none")),
    ("float64 rows", dict(dtype=torch.float64), {}, False,
     dict(preparation="aten", forward_finish="aten losses", backward_assembly="aten")),
    ("focal", dict(focal_gamma=1.0), {}, False, dict(cannot_run="no focal walk")),
    ("temperature in memory", {}, dict(temperature_in_memory=True), False,
     dict(temperature="device memory", host_temperature="unread", forward_schedule="plain",
          backward_schedule="plain")),
    ("temperature unreadable", dict(dtype=torch.float64), dict(temperature_in_memory=True), False,
     dict(temperature="host value", host_temperature="unread",
          cannot_run="temperature unreadable")),
    ("graph capture", {}, dict(dry_run_capturing=True), False,
     dict(value_checks="skipped (graph capture)")),
]


@dry_run
@pytest.mark.parametrize("arguments,hooked,deterministic,expected", [c[1:] for c in DRY_RUN_PLANS],
                         ids=[c[0] for c in DRY_RUN_PLANS])
def test_fused_stage_plan(arguments, hooked, deterministic, expected, reproducible_if):
    reproducible_if(deterministic)
    with test_hooks(**hooked):
        plan = plan_of(torch.ops.scl.supcon_cuda_dry_run_plan, **arguments)
    assert {k: plan[k] for k in expected} == expected


TRITON_GROUPS = [
    # (id, arguments, deterministic, grouped_stages)
    ("fused forward and backward", {}, False, "forward and backward"),
    # reproducible results: ATen weights, so the backward's stages go separately
    ("deterministic", {}, True, "forward"),
    ("float64 rows", dict(dtype=torch.float64), False, "none"),
    ("focal", dict(focal_gamma=1.0), False, "none"),
]


@pytest.mark.parametrize("arguments,deterministic,grouped", [c[1:] for c in TRITON_GROUPS],
                         ids=[c[0] for c in TRITON_GROUPS])
def test_triton_plan_groups_the_fused_stages(arguments, deterministic, grouped, reproducible_if):
    """Each Triton stage is a crossing into Python: where the fused stages run, the plan sends
    them as one op each way (the CUDA C++ backend's dry run, below, never groups)."""
    reproducible_if(deterministic)
    assert plan_of(torch.ops.scl.supcon_triton_plan, **arguments)["grouped_stages"] == grouped


@dry_run
def test_cuda_plan_runs_the_fused_stages_separately():
    assert plan_of(torch.ops.scl.supcon_cuda_dry_run_plan)["grouped_stages"] == "none"


def test_explain_names_the_backend_the_reason_and_the_plan():
    x, y = torch.randn(30, 6), torch.randint(0, 3, (30,))
    explanation = scl_kernels.explain(x, y, 0.2)
    assert explanation.backend == "cpu"
    assert "first fused backend" in explanation.reason
    assert explanation.plan == plan_of(torch.ops.scl.supcon_plan, rows=30, dim=6, t=0.2)
    assert explanation.plan["forward_schedule"] == "symmetric"
    assert "backend: cpu" in str(explanation)
    assert scl_kernels.explain(x, y, backend="reference") == ("reference",
                                                              "backend='reference' was asked for", {})


def test_explain_follows_the_layout_supcon_loss_builds():
    """[B, V, D] with contrast_mode="one" plans only the view-0 anchors (the plain schedule);
    reduction="sum" plans the per-anchor losses."""
    views = torch.randn(10, 2, 6)
    plan = scl_kernels.explain(views, torch.randint(0, 3, (10,)), contrast_mode="one",
                               reduction="sum").plan
    assert plan["forward_schedule"] == "plain" and plan["mean"] == "none"


def test_explain_raises_what_supcon_loss_raises():
    with pytest.raises(ValueError, match="temperature"):
        scl_kernels.explain(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), -1.0)


@hooks
@pytest.mark.skipif(not triton_installed(), reason="needs triton")
def test_explain_says_the_host_did_not_read_the_temperature():
    """A plan that cannot read t holds it unread (host_temperature: unread, never a NaN), and
    explain says so."""
    x, y = torch.randn(20, 4, dtype=torch.float64), torch.randint(0, 2, (20,))
    with test_hooks(temperature_in_memory=True):
        explanation = scl_kernels.explain(x, y, torch.tensor(0.1), backend="triton")
    assert explanation.plan["host_temperature"] == "unread"
    assert explanation.plan["cannot_run"] == "temperature unreadable"
    assert "cannot be read now" in str(explanation)


@dry_run
def test_a_refused_call_quotes_its_plan():
    args = (torch.randn(20, 4), torch.randint(0, 2, (20,)), None, None, torch.tensor(0.1), 20, True)
    with pytest.raises(NotImplementedError, match="focal_gamma=1 .*: the plan's line 'cannot_run: "
                                                  "no focal walk' refuses it; .*focal_backends.*"
                                                  "Plan: temperature: host value;.*"
                                                  "cannot_run: no focal walk"):
        torch.ops.scl.supcon_cuda_dry_run(*args, 0, 1.0, False)


@hooks
def test_a_call_without_blas_is_refused_by_its_plan():
    x, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    with test_hooks(blas_missing=True):
        assert scl_kernels.explain(x, y, backend="cpu").plan["cannot_run"] == "no BLAS"
        with pytest.raises(RuntimeError, match="multiply through BLAS: the plan's line "
                                               "'cannot_run: no BLAS' refuses it; .*"
                                               "backend='reference'.*Plan: "):
            scl_kernels.supcon_loss(x, y, backend="cpu")


@pytest.mark.parametrize("name,device,focal_gamma,line", [
    ("cuda", "cpu", 0.0, "cannot_run: no cpu kernels"),
    ("cuda", "cuda", 2.0, "cannot_run: no focal walk"),
])
def test_a_backend_refused_before_its_op_runs_quotes_the_plan_line(name, device, focal_gamma,
                                                                   line):
    """resolve_backend's refusals read as the op's: what was asked, the plan's line that refuses
    it, what to do, in one line."""
    with pytest.raises(ValueError) as refused:
        scl_kernels.backends.resolve_backend(name, torch.device(device), focal_gamma)
    message = str(refused.value)
    assert message.startswith(f"backend={name!r} on {device}")
    assert f"the plan's line '{line}' refuses it; " in message and "\n" not in message


@dry_run
@pytest.mark.parametrize("walk,sentence", [
    ("", "walks the upper triangle by cluster pairs"),
    ("rows", "walks full rows, every element stored once (SCL_CUDA_SYMMETRIC_BACKWARD=rows)"),
    ("triangle-async", "exchanging by st.async"),
])
def test_explain_says_which_symmetric_backward_walk_the_plan_takes(walk, sentence):
    with test_hooks(symmetric_backward_walk=walk):
        plan = plan_of(torch.ops.scl.supcon_cuda_dry_run_plan, dtype=torch.bfloat16)
    text = str(scl_kernels.Explanation("cuda", "the dry run's plan", plan))
    line = next(line for line in text.splitlines() if "symmetric_backward_walk: " in line)
    assert sentence in line


def test_profiles_show_the_plan():
    x = torch.randn(30, 6, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        scl_kernels.supcon_loss(x, torch.randint(0, 3, (30,))).backward()
    names = {e.name for e in prof.events()}
    assert any(n.startswith("scl::supcon_forward [temperature: host value; forward_schedule: "
                            "symmetric;") for n in names), sorted(names)[:20]
    assert any(n.startswith("scl::supcon_backward [") for n in names)


# explain in the user's words: the sentences, the compute dtype, the schedules' reasons, the dict
# the text is made from, and calls without data.

DETAIL_KEYS = {"backend", "reason", "compute_dtype", "schedule", "schedule_reason", "plan"}


def labelled(rows=ROWS, dim=DIM, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(rows, dim, generator=g).to(dtype).to(device),
            torch.randint(0, CLASSES, (rows,), generator=g).to(device))


def test_details_hold_the_backend_the_schedules_and_a_sentence_per_field():
    details = scl_kernels.explain(*labelled()).details()
    assert set(details) == DETAIL_KEYS
    assert (details["backend"], details["compute_dtype"]) == ("cpu", "float32")
    assert details["schedule"] == {"forward": "symmetric", "backward": "symmetric"}
    assert "every row an anchor" in details["schedule_reason"]["forward"]
    assert all(set(field) == {"value", "sentence"} and field["sentence"]
               for field in details["plan"].values())
    assert "by ATen ops, not a fused kernel" in details["plan"]["preparation"]["sentence"]


def test_the_text_is_made_from_the_details():
    explanation = scl_kernels.explain(*labelled(), 0.01, normalize=False)
    text, details = str(explanation), explanation.details()
    assert text.splitlines()[0] == f"backend: {details['backend']} ({details['reason']})"
    for name in ("temperature", "forward_schedule", "compute_dtype", "preparation", "cannot_run"):
        assert f"  {name}: {details['plan'][name]['sentence']}" in text.splitlines()
    assert details["schedule_reason"]["forward"] in text
    assert ": aten" not in text and "host_reads: yes" not in text  # no raw value lines


def test_every_plan_field_has_a_sentence():
    """A field CallPlan::describe() gains without a sentence in FIELD_SENTENCES (and a row in
    docs/BACKENDS.md's "Reading explain()") fails here; so does a sentence for a field gone."""
    from scl_kernels.explain import FIELD_SENTENCES
    explanation = scl_kernels.explain(*labelled())
    assert set(explanation.plan) == set(FIELD_SENTENCES)
    page = BACKENDS_PAGE.read_text()
    glossary = page[page.index("## Reading explain()"):page.index("## Adding a backend")]
    assert [name for name in FIELD_SENTENCES if f"`{name}`" not in glossary] == []


@pytest.mark.parametrize("arguments,hooked", [c[1:3] for c in CPU_PLANS],
                         ids=[c[0] for c in CPU_PLANS])
def test_every_cpu_plan_value_has_a_sentence(arguments, hooked):
    if hooked and not test_build():
        pytest.skip(NOT_A_TEST_BUILD)
    with test_hooks(**hooked) if hooked else contextlib.nullcontext():
        plan = plan_of(torch.ops.scl.supcon_plan, **arguments)
    assert scl_kernels.Explanation("cpu", "", plan).details()["plan"].keys() == plan.keys()


@dry_run
@pytest.mark.parametrize("arguments,hooked,deterministic", [c[1:4] for c in DRY_RUN_PLANS],
                         ids=[c[0] for c in DRY_RUN_PLANS])
def test_every_fused_stage_plan_value_has_a_sentence(arguments, hooked, deterministic,
                                                     reproducible_if):
    reproducible_if(deterministic)
    with test_hooks(**hooked):
        plan = plan_of(torch.ops.scl.supcon_cuda_dry_run_plan, **arguments)
    assert scl_kernels.Explanation("cuda", "", plan).details()["plan"].keys() == plan.keys()


def test_the_compute_dtype_is_shown():
    """float32 and float64 rows used to print the same plan; 16-bit rows compute in float32."""
    float32, float64, bf16 = (scl_kernels.explain(*labelled(dtype=d))
                              for d in (torch.float32, torch.float64, torch.bfloat16))
    assert (float32.details()["compute_dtype"], float64.details()["compute_dtype"]) == \
        ("float32", "float64")
    assert "  compute_dtype: computes in float64" in str(float64).splitlines()
    assert "  compute_dtype: computes in float32 (bfloat16 inputs)" in str(bf16).splitlines()


def test_a_small_temperature_names_its_reason_with_the_planner_s_floor():
    """The floor quoted is the planner's own: just above it the schedule is symmetric, just below
    it plain, for the reason quoted."""
    x, y = labelled()
    floor = float(scl_kernels.explain(x, y).plan["symmetric_temperature_floor"])
    assert 0.01 < floor < 0.1
    assert scl_kernels.explain(x, y, floor * 1.001).details()["schedule"]["forward"] == "symmetric"
    below = scl_kernels.explain(x, y, floor * 0.999).details()
    assert below["schedule"] == {"forward": "plain", "backward": "plain"}
    assert f"small temperature (t = {floor * 0.999:.3g} < {floor:.3g})" in \
        below["schedule_reason"]["forward"]
    text = str(scl_kernels.explain(x, y, 0.01))
    assert "plain schedule (every anchor against every column) instead of the symmetric one: " \
           "small temperature (t = 0.01 < " in text
    # float64 keeps the fixed shift to smaller temperatures
    assert float(scl_kernels.explain(*labelled(dtype=torch.float64)).plan[
        "symmetric_temperature_floor"]) < floor


@pytest.mark.parametrize("arguments,reason", [
    (dict(normalize=False), "normalize=False: "),
    (dict(contrast_mode="one"), "only some rows are anchors (contrast_mode='one')"),
    (dict(cross=True), "contrast rows given: a cross set"),
], ids=["not normalised", "some anchors", "contrast rows"])
def test_each_schedule_change_names_its_reason(arguments, reason):
    x, y = labelled()
    if arguments.pop("cross", False):
        arguments.update(contrast=x.flip(0), contrast_labels=y.flip(0))
    if arguments.get("contrast_mode") == "one":
        x = x.view(ROWS // 2, 2, DIM)
        y = y[: ROWS // 2]
    details = scl_kernels.explain(x, y, **arguments).details()
    assert details["schedule"]["forward"] == "plain"
    assert details["schedule_reason"]["forward"].startswith(reason)


def test_every_reason_that_holds_is_named():
    x, y = labelled(dtype=torch.bfloat16)
    details = scl_kernels.explain(x, y, 0.01, contrast=x, contrast_labels=y,
                                  normalize=False).details()
    assert details["plan"]["forward_plain_because"]["value"] == \
        "contrast rows, not normalized, small temperature"
    floor = float(details["plan"]["symmetric_temperature_floor"]["value"])
    assert [part.split(":")[0] for part in details["schedule_reason"]["forward"].split("; ")] \
        == ["contrast rows given", "normalize=False", f"small temperature (t = 0.01 < {floor:.3g})"]


def test_meta_tensors_are_planned_as_cpu_tensors_of_their_shapes():
    explanation = scl_kernels.explain(*labelled(dtype=torch.bfloat16, device="meta"), 0.01)
    assert explanation.backend == "cpu"
    assert "planned as cpu tensors of these shapes and dtypes" in explanation.reason
    assert explanation.plan == scl_kernels.explain(*labelled(dtype=torch.bfloat16), 0.01).plan


def test_fake_tensors_are_planned_as_tensors_of_their_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    expected = scl_kernels.explain(*labelled(rows=2048, dim=64), contrast_mode="all").plan
    with FakeTensorMode():
        x, y = torch.empty(2048, 64), torch.zeros(2048, dtype=torch.long)
        explanation = scl_kernels.explain(x, y)
    assert explanation.plan == expected and expected["threads"] == "parallel tiles"


def test_a_temperature_tensor_without_data_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^explain cannot plan with a meta temperature tensor, "
                                         r"which holds no value[^\n]*$"):
        scl_kernels.explain(*labelled(device="meta"), torch.tensor(0.1, device="meta"))


@dry_run
def test_a_schedule_left_for_reproducibility_says_so(reproducible_if):
    """Only the forward leaves the triangle (it adds by atomics): the backward's line stays its
    own."""
    reproducible_if(True)
    plan = plan_of(torch.ops.scl.supcon_cuda_dry_run_plan)
    details = scl_kernels.Explanation("cuda", "", plan).details()
    assert details["schedule"] == {"forward": "plain", "backward": "symmetric"}
    assert details["schedule_reason"]["forward"].startswith(
        "torch.use_deterministic_algorithms(True), and this backend's triangle forward")
    assert details["plan"]["backward_schedule"]["sentence"].startswith("symmetric schedule")
