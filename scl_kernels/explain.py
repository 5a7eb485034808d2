"""explain: what a supcon_loss call would do, without doing it: the backend ``auto`` picks and
why, and the fused op's plan (csrc/core/call_plan.h): schedules, where the temperature comes
from, which fused stages run and which ATen steps stand in, the value checks, the threads."""
from typing import Dict, NamedTuple, Optional

import torch

from ._docstrings import fill_arguments
from ._types import BackendName, ContrastMode, Reduction, Temperature
from .backends import auto_choice
from .functional import checked_call


class Explanation(NamedTuple):
    backend: str  # the backend that runs the call
    reason: str  # why that one
    # The fused op's plan, name -> value ("forward_schedule": "symmetric", ...); empty for the
    # dense reference, which has none.
    plan: Dict[str, str]

    def __str__(self) -> str:
        lines = [f"backend: {self.backend} ({self.reason})"]
        lines += [f"  {name}: {value}" for name, value in self.plan.items()]
        return "\n".join(lines)


@fill_arguments
def explain(features: torch.Tensor, labels: Optional[torch.Tensor] = None,
            temperature: Temperature = 0.1, *, contrast: Optional[torch.Tensor] = None,
            contrast_labels: Optional[torch.Tensor] = None, contrast_mode: ContrastMode = "all",
            normalize: bool = True, focal_gamma: float = 0.0, reduction: Reduction = "mean",
            backend: BackendName = "auto") -> Explanation:
    """What ``supcon_loss`` with the same arguments would do, computed from the arguments alone
    (no loss): the backend and why, and the plan its fused op follows. A temperature is read as
    the call would read it.

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

    Returns:
        An :class:`Explanation`; ``print`` it for a summary. Its plan's ``cannot_run`` is
        ``"none"`` where the backend can compute the call; otherwise the call raises, quoting
        the plan.

    Raises:
        The errors ``supcon_loss`` raises for bad arguments or a backend that cannot run here.
    """
    call = checked_call(features, labels, temperature, contrast, contrast_labels, contrast_mode,
                        normalize, focal_gamma, reduction, backend)
    if backend == "auto":
        reason = auto_choice(features.device, call.focal_gamma, call.shape)[1]
    else:
        reason = f"backend={backend!r} was asked for"
    if call.backend.plan_op is None:
        return Explanation(call.backend.name, reason, {})
    layout = call.layout
    text = call.backend.plan_op(layout.rows, layout.labels, layout.contrast,
                                layout.contrast_labels, call.temperature, layout.num_anchors,
                                normalize, 0, call.focal_gamma, call.mean)
    plan = dict(line.split(": ", 1) for line in text.splitlines())
    return Explanation(call.backend.name, reason, plan)
