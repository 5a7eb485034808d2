"""Each Triton stage op's arguments are listed once, in csrc/triton/stage_arguments.h, from which
its schema and the C++ caller's typed<> signature and call are made (the dispatcher checks the
signature against the schema when the caller first runs, as every Triton test does); the Python
function that implements it (scl_kernels/backends/triton, registration.STAGE_OPS) is a copy. This
holds that copy to the list: the same parameters, in the same order, as the schema names them."""
import inspect
import os

import pytest
import torch

from scl_kernels.backends import triton_installed
from support import needs

pytestmark = [needs.library, pytest.mark.skipif(
    not triton_installed() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton and TRITON_INTERPRET=1 (set by support/backend_matrix.py without CUDA)")]


def _stage_ops():
    from scl_kernels.backends.triton import load_triton_backend
    load_triton_backend()
    from scl_kernels.backends.triton.registration import STAGE_OPS
    return STAGE_OPS


def _triton_stage_schemas():
    """The library's Triton ops but the fused op's own three and the host-wait question, which is
    registered on its own."""
    import scl_kernels  # noqa: F401  (loads the library)
    own = {"supcon_triton", "supcon_triton_backward", "supcon_triton_plan",
           "supcon_triton_host_may_wait"}
    names = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("scl::supcon_triton") or s.name == "scl::hard_pairs_triton"}
    return sorted(names - own)


STAGE_SCHEMAS = _triton_stage_schemas()


def test_every_triton_stage_op_has_a_python_implementation():
    assert STAGE_SCHEMAS and set(STAGE_SCHEMAS) == set(_stage_ops())


@pytest.mark.parametrize("name", STAGE_SCHEMAS)
def test_python_parameters_are_the_schema_arguments(name):
    function = _stage_ops()[name]
    schema = getattr(torch.ops.scl, name).default._schema
    assert list(inspect.signature(function).parameters) == [a.name for a in schema.arguments]


@pytest.mark.parametrize("temperature", [torch.tensor([0.1]), torch.tensor([0.1, 0.2], dtype=torch.float64),
                                         torch.tensor(0.1, dtype=torch.float64).expand(1, 1)[:0]])
def test_a_host_temperature_that_is_not_one_float64_on_the_cpu_is_refused(temperature):
    # The stage ops are public schemas: a bad host temperature must not reach its address.
    from scl_kernels.backends.triton import launch
    with pytest.raises(ValueError, match="a host temperature must be"):
        launch.temperature_of(temperature, False)
    held = launch.temperature_of(torch.tensor([0.25], dtype=torch.float64), False)
    assert held.inv_t == 4.0 and not held.in_memory
