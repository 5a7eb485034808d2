"""Each backend's capabilities are declared once, in the registry: docs/BACKENDS.md's table is
the registry's, and the kernels agree with what the registry says of the focal loss (a backend
declared without it refuses it, quoting the plan; one declared with it plans it)."""
import pathlib

import pytest
import torch

from scl_kernels.backends import REGISTRY, available_backends, capability_table
from scl_kernels._testing import cuda_dry_run_built
from support import needs

BACKENDS_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "BACKENDS.md"


def test_the_documented_table_is_the_registrys():
    assert capability_table() in BACKENDS_PAGE.read_text(encoding="utf-8"), (
        "docs/BACKENDS.md's capability table differs from the registry's: paste "
        "scl_kernels.backends.capability_table() into it")


def _plan_ops():
    """(backend name, its plan op) for the fused backends whose kernels can plan on the CPU."""
    ops = [(name, REGISTRY[name].plan_op) for name in available_backends("cpu")
           if REGISTRY[name].op_name is not None]
    if cuda_dry_run_built():  # the CUDA C++ backend's kernels, planning on CPU tensors
        ops.append(("cuda", torch.ops.scl.supcon_cuda_dry_run_plan))
    return ops


@needs.library
@pytest.mark.parametrize("name,plan_op", _plan_ops(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_kernels_have_the_focal_walk_the_registry_declares(name, plan_op):
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    text = plan_op(x, y, None, None, torch.tensor(0.1), 12, True, 0, 1.5, True)
    expected = "none" if REGISTRY[name].focal else "no focal walk"
    assert f"cannot_run: {expected}" in text
