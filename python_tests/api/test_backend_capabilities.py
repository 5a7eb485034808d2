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


def _table_rows(text, heading):
    """The first column of the first Markdown table after ``heading``."""
    after = text[text.index(heading):]
    rows = [line for line in after.splitlines() if line.startswith("|")]
    table = []
    for line in after[after.index(rows[0]):].splitlines():
        if not line.startswith("|"):
            break
        table.append(line.split("|")[1].strip())
    return table[2:]  # past the header and its rule


def test_every_backend_is_named_where_adding_one_says():
    """docs/BACKENDS.md, "Adding a backend", items 7 and 8: the hand-written places that name
    every backend."""
    from scl_kernels import _docstrings
    from scl_kernels.compat import pml, supcontrast

    root = BACKENDS_PAGE.parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    status = (root / "docs" / "STATUS.md").read_text(encoding="utf-8")
    compat = (root / "docs" / "COMPAT.md").read_text(encoding="utf-8")
    names = [f"`{name}`" for name in REGISTRY]
    assert _table_rows(readme, "## Backends") == names
    assert _table_rows(status, "# Status of each backend") == names
    described = {"scl_kernels/_docstrings.py": _docstrings.ARGUMENTS["backend"],
                 "scl_kernels/compat/supcontrast.py": supcontrast.SupConLoss.__init__.__doc__,
                 "scl_kernels/compat/pml.py": pml.SupConLoss.__init__.__doc__,
                 "docs/COMPAT.md": compat}
    missing = [f"{place} does not name {name!r}" for place, text in described.items()
               for name in REGISTRY if f'"{name}"' not in text]
    assert missing == []
