"""explain: what a supcon_loss call would do, without doing it: the backend ``auto`` picks and
why, and the fused op's plan (csrc/core/call_plan.h): schedules and why, the compute dtype,
where the temperature comes from, which fused stages run and which ATen steps stand in, the value
checks, the threads. Each plan field reads as a sentence (FIELD_SENTENCES; the glossary in
docs/BACKENDS.md, "Reading explain()"); the printed text is made from the same dict as
Explanation.details()."""
import inspect
from typing import Any, Callable, Dict, NamedTuple, Optional

import torch
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

from ._docstrings import fill_arguments
from ._signatures import bind_arguments, same_parameters
from ._types import BackendName, Temperature
from .backends import auto_choice
from .functional import CheckedCall, checked_call, supcon_loss

Plan = Dict[str, str]


def _number(text: str) -> str:
    return f"{float(text):.3g}"


def _temperature(value: str, plan: Plan) -> str:
    if value == "device memory":
        return ("t stays in device memory, read by the kernels themselves: no host read, so a "
                "CUDA graph can capture the call")
    if plan["host_temperature"] == "unread":
        return "t is on the GPU and cannot be read now (see cannot_run)"
    return f"t = {_number(plan['host_temperature'])}, read once on the host: a number of the call"


def _host_temperature(value: str, plan: Plan) -> str:
    if value == "unread":
        return "the host did not read t"
    return f"the host read t = {_number(value)}"


# Why a direction takes the plain schedule (the C++ PlainBecause names).
_PLAIN_BECAUSE: Dict[str, Callable[[Plan], str]] = {
    "contrast rows": lambda plan: (
        "contrast rows given: a cross set's logits (anchors x contrast rows) are not square, so "
        "there is no S = S^T to halve"),
    "some anchors": lambda plan: (
        "only some rows are anchors (contrast_mode='one'): the logits are not square"),
    "not normalized": lambda plan: (
        "normalize=False: rows of any length, so 1/t does not bound the logits and cannot serve "
        "as the fixed shift"),
    "temperature unread": lambda plan: (
        "the temperature was not read on the host (device memory), so the fixed shift's range "
        "cannot be checked"),
    "small temperature": lambda plan: (
        f"small temperature (t = {_number(plan['host_temperature'])} < "
        f"{_number(plan['symmetric_temperature_floor'])}): with the fixed shift 1/t, "
        f"exp(s - 1/t) would underflow {plan['compute_dtype']}, so every row keeps its own "
        "running maximum"),
    "reproducible forward": lambda plan: (
        "torch.use_deterministic_algorithms(True), and this backend's triangle forward adds "
        "by atomics"),
}


def _plain_because(value: str, plan: Plan) -> str:
    if value == "none":
        return (f"one set of unit rows, every row an anchor, t above "
                f"{_number(plan['symmetric_temperature_floor'])} ({plan['compute_dtype']})")
    return "; ".join(_PLAIN_BECAUSE[name](plan) for name in value.split(", "))


def _schedule(direction: str) -> Callable[[str, Plan], str]:
    def sentence(value: str, plan: Plan) -> str:
        reasons = plan[f"{direction}_plain_because"]
        if direction == "backward" and (value, reasons) == (plan["forward_schedule"],
                                                            plan["forward_plain_because"]):
            return f"the forward's {value} schedule, for the same reasons"
        because = _plain_because(reasons, plan)
        if value == "symmetric":
            return ("symmetric schedule: S = S^T, so each pair of tiles is computed once (the "
                    f"triangle): {because}")
        return ("plain schedule (every anchor against every column) instead of the symmetric "
                f"one: {because}")
    return sentence


def _choice(sentences: Dict[str, str]) -> Callable[[str, Plan], str]:
    return lambda value, plan: sentences[value]


_TRIANGLE = ("the symmetric backward walks the upper triangle by cluster pairs, adding by atomics "
             "(sm_90a, D <= 128; full rows elsewhere)")


def _symmetric_backward_walk(value: str, plan: Plan) -> str:
    if value == "none":
        if plan["backward_schedule"] == "plain":
            return "no symmetric backward to walk (the backward is plain)"
        return "this backend's symmetric backward has one walk"
    if value == "full rows":
        why = ("torch.use_deterministic_algorithms(True): no atomics"
               if plan["deterministic"] == "yes" else "SCL_CUDA_SYMMETRIC_BACKWARD=rows")
        return f"the symmetric backward walks full rows, every element stored once ({why})"
    if value == "triangle by st.async":
        return (f"{_TRIANGLE}, the partners exchanging by st.async "
                "(SCL_CUDA_SYMMETRIC_BACKWARD=triangle-async, opt-in)")
    return _TRIANGLE


# One sentence per field of CallPlan::describe(), given the field's value and the whole plan.
FIELD_SENTENCES: Dict[str, Callable[[str, Plan], str]] = {
    "temperature": _temperature,
    "host_temperature": _host_temperature,
    "forward_schedule": _schedule("forward"),
    "backward_schedule": _schedule("backward"),
    "forward_plain_because": _plain_because,
    "backward_plain_because": _plain_because,
    "symmetric_temperature_floor": lambda value, plan: (
        f"the symmetric schedule needs t above {_number(value)} in {plan['compute_dtype']}, "
        "where exp(s - 1/t) stays a normal number"),
    "rows_dtype": lambda value, plan: f"the rows are {value}",
    "compute_dtype": lambda value, plan: (
        f"computes in {value}" + ("" if value == plan["rows_dtype"]
                                  else f" ({plan['rows_dtype']} inputs)")),
    "preparation": _choice({
        "fused": "rows prepared (normalised, labels turned into class ids and class sums) by "
                 "the backend's fused kernel",
        "aten": "rows prepared (normalised, labels turned into class ids and class sums) by "
                "ATen ops, not a fused kernel"}),
    "host_reads": _choice({
        "yes": "the preparation reads values on the host (unique, bincount), as on the CPU",
        "no": "the preparation reads nothing on the host (sort-based class ids), as on a GPU"}),
    "forward_finish": _choice({
        "positive walk": "the forward's losses come from the backend's walk over the positive "
                         "pairs (the focal loss, or multi-hot labels' pair weights)",
        "fused losses": "the per-anchor losses come from a fused kernel",
        "fused losses and mean": "the per-anchor losses and their mean come from a fused kernel "
                                 "(the mean adds by atomics)",
        "aten losses": "the per-anchor losses come from ATen ops, not a fused kernel"}),
    "multi_label": _choice({
        "none": "labels are class ids",
        "any": "multi-hot labels: a pair sharing a class is positive, with weight 1",
        "jaccard": "multi-hot labels: a pair sharing a class is positive, weighed by the "
                   "Jaccard index of the two rows' classes"}),
    "mean": _choice({
        "inside the op": "the mean over the anchors with positives is taken inside the op",
        "none": "the op returns the per-anchor losses (reduction is not 'mean')"}),
    "backward_assembly": _choice({
        "positive walk, aten assembly": "the backward's positive part comes from the walk, the "
                                        "row gradients are assembled by ATen ops",
        "fused weights and assembly": "the backward's weights and the row gradients come from "
                                      "fused kernels",
        "aten weights, fused assembly": "the backward's weights come from ATen ops (reproducible "
                                        "sums), the row gradients from a fused kernel",
        "aten": "the backward's weights and row gradients come from ATen ops, not fused kernels"}),
    "grouped_stages": _choice({
        "forward and backward": "the fused stages go to the backend as one op each way",
        "forward": "the forward's fused stages go to the backend as one op; the backward's one "
                   "by one",
        "backward": "the backward's fused stages go to the backend as one op; the forward's one "
                    "by one",
        "none": "each fused stage goes to the backend on its own"}),
    "value_checks": _choice({
        "on the host": "NaN / inf in the rows raise from this call (checked on the host)",
        "deferred": "NaN / inf in the rows are checked on the device and raise from a later "
                    "call (the verdict is read without a wait)",
        "skipped (graph capture)": "no NaN / inf checks: a CUDA graph is being captured, and a "
                                   "replay would not repeat them"}),
    "threads": _choice({
        "parallel tiles": "the tile kernels use torch's threads (work past the grain); the rest "
                          "runs on the calling thread",
        "calling thread": "everything runs on the calling thread (work below the grain, or "
                          "already inside a parallel region)"}),
    "deterministic": _choice({
        "yes": "torch.use_deterministic_algorithms(True): no atomics anywhere",
        "no": "reproducible results not asked for: the fastest paths, atomics included"}),
    "symmetric_backward_walk": _symmetric_backward_walk,
    "cannot_run": _choice({
        "none": "the backend can compute the call",
        "no BLAS": "cannot run: this PyTorch build exports no BLAS, which the tiles multiply "
                   "through; the call raises",
        "too many elements": "cannot run: a rows tensor holds more elements than this backend's "
                             "kernels address (2^31 - 1); the call raises",
        "no focal walk": "cannot run: focal_gamma > 0 and this backend's kernels have no walk "
                         "over the positive pairs; the call raises",
        "no group mask": "cannot run: groups given and this backend's tiles have no group mask; "
                         "the call raises",
        "no pair weights": "cannot run: multi-hot labels given and this backend's walk has no "
                           "pair weights; the call raises",
        "temperature unreadable": "cannot run: a GPU temperature cannot be read while a CUDA "
                                  "graph is captured; the call raises"}),
}

# Fields the text leaves to the sentence of another (the temperature's, the schedules', the
# compute dtype's); details() keeps them all.
_FOLDED = ("host_temperature", "forward_plain_because", "backward_plain_because",
           "symmetric_temperature_floor", "rows_dtype")


class Explanation(NamedTuple):
    backend: str  # the backend that runs the call
    reason: str  # why that one
    # The fused op's plan, name -> value ("forward_schedule": "symmetric", ...); empty for the
    # dense reference, which has none.
    plan: Plan

    def details(self) -> Dict[str, Any]:
        """The explanation for tools: backend, reason, compute_dtype, schedule and
        schedule_reason ({"forward": ..., "backward": ...}), and plan: each field's value and
        sentence. Without a fused plan (the reference), compute_dtype and the schedules are
        None."""
        plan = {name: {"value": value, "sentence": FIELD_SENTENCES[name](value, self.plan)}
                for name, value in self.plan.items()}
        fused = bool(plan)
        return {
            "backend": self.backend,
            "reason": self.reason,
            "compute_dtype": self.plan["compute_dtype"] if fused else None,
            "schedule": {direction: self.plan[f"{direction}_schedule"] if fused else None
                         for direction in ("forward", "backward")},
            "schedule_reason": {
                direction: plan[f"{direction}_plain_because"]["sentence"] if fused else None
                for direction in ("forward", "backward")},
            "plan": plan,
        }

    def __str__(self) -> str:
        details = self.details()
        lines = [f"backend: {details['backend']} ({details['reason']})"]
        lines += [f"  {name}: {field['sentence']}" for name, field in details["plan"].items()
                  if name not in _FOLDED]
        return "\n".join(lines)


def _holds_data(t: Optional[torch.Tensor]) -> bool:
    return t is None or not (t.is_meta or is_fake(t))


def _stand_in(t: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    # One element seen in t's shape: the plan reads shapes, dtypes and devices, never values.
    return None if t is None else torch.empty((), dtype=t.dtype, device=device).expand(t.shape)


_SUPCON_LOSS = inspect.signature(supcon_loss)


@fill_arguments
@same_parameters(supcon_loss)
def explain(*args: Any, **kwargs: Any) -> Explanation:
    """What ``supcon_loss`` with the same arguments would do, computed from the arguments alone
    (no loss): the backend and why, and the plan its fused op follows. A temperature is read as
    the call would read it. Meta and fake tensors are planned as tensors of their shapes and
    dtypes on the device they stand for (meta: the CPU, which ``auto`` picks for them).

    Args:
        {arg:features}
        {arg:labels}
        {arg:temperature}
        {arg:contrast}
        {arg:contrast_labels}
        {arg:contrast_mode}
        {arg:normalize}
        {arg:focal_gamma}
        {arg:reduction}
        {arg:backend}
        {arg:groups}
        {arg:contrast_groups}
        {arg:multi_label}

    Returns:
        An :class:`Explanation`; ``print`` it for the plan in sentences, or take
        ``.details()`` for a dict. Its plan's ``cannot_run`` is ``"none"`` where the backend can
        compute the call; otherwise the call raises, quoting the plan.

    Raises:
        The errors ``supcon_loss`` raises for bad arguments or a backend that cannot run here;
        a ValueError for a meta or fake temperature tensor, whose value the plan needs.
    """
    arguments = bind_arguments(_SUPCON_LOSS, args, kwargs)
    return _explain(checked_call(**arguments), **arguments)


def _explain(call: CheckedCall, *, temperature: Temperature, normalize: bool,
             backend: BackendName, multi_label: str, **_others: object) -> Explanation:
    """explain's answer for the checked ``call``, with ``temperature`` and ``backend`` as they
    were given (the call holds the temperature as a tensor and the backend resolved)."""
    device = call.layout.rows.device
    if backend == "auto":
        reason = auto_choice(device, call.focal_gamma, call.shape,
                             call.layout.groups is not None, call.layout.labels.dim() == 2)[1]
    else:
        reason = f"backend={backend!r} was asked for"
    if call.backend.plan_op is None:
        return Explanation(call.backend.name, reason, {})
    if isinstance(temperature, torch.Tensor) and not _holds_data(temperature):
        raise ValueError(f"explain cannot plan with a {temperature.device.type} temperature "
                         "tensor, which holds no value (the plan reads it): pass the temperature "
                         "as a float or a real tensor")
    layout = call.layout
    tensors = dict(features=layout.rows, labels=layout.labels, contrast=layout.contrast,
                   contrast_labels=layout.contrast_labels, groups=layout.groups,
                   contrast_groups=layout.contrast_groups)
    without_data = not all(_holds_data(x) for x in tensors.values())
    if device.type == "meta":
        device = torch.device("cpu")
    if without_data:
        reason += f"; planned as {device.type} tensors of these shapes and dtypes"
    # Under a fake tensor mode the plan op would meet fake tensors; it gets real ones.
    with unset_fake_temporarily():
        if without_data:
            tensors = {name: _stand_in(x, device) for name, x in tensors.items()}
        t = call.temperature
        if not _holds_data(t):  # a float temperature, made into a tensor under the fake mode
            t = torch.tensor(float(temperature), dtype=torch.float64)
        # The arguments that supcon_loss passes the forward op (functional.py), by name.
        text = call.backend.plan_op(**tensors, temperature=t, num_anchors=layout.num_anchors,
                                    normalize=normalize, focal_gamma=call.focal_gamma,
                                    mean=call.mean, multi_label=multi_label)
    plan = dict(line.split(": ", 1) for line in text.splitlines())
    return Explanation(call.backend.name, reason, plan)
