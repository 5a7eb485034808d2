"""A backend's capability flag (scl_kernels.backends.Backend) held to its fused op's own plan."""
import torch


def capability_in_plan(backend, capability, refusal, labels, **extra):
    """``Backend.<capability>``, asserting that the fused op's plan of a two-row call with
    ``labels`` (and the op arguments ``extra``) says 'cannot_run: <refusal>' exactly where the
    flag is False (the dense reference has no plan)."""
    flag = getattr(backend.info, capability)
    if backend.info.plan_op is not None:
        extra = {name: backend.put(value) for name, value in extra.items()}
        plan = backend.info.plan_op(backend.put(torch.zeros(2, 3)), backend.put(labels), None,
                                    None, torch.tensor(0.1, dtype=torch.float64), 2, True,
                                    **extra)
        assert (f"cannot_run: {refusal}" in plan.splitlines()) != flag, (backend, plan)
    return flag
