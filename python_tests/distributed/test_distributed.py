"""scl_kernels.distributed on gloo with 2 and 4 processes spawned here: loss and gradients equal
to the single-process call on the global batch (1e-10 in float64), both strategies, every layout,
unequal batches and an empty rank, DDP, and errors raised on every rank instead of a hang.

The cases live in distributed_cases.py; each world size is spawned once for all of them."""
import pytest
import torch
import torch.distributed as dist

import scl_kernels.distributed as sd
from support import distributed_cases
from support.spawned_ranks import SPAWNED_CASE_MARKS, every_rank_tests

pytestmark = [pytest.mark.quick, *SPAWNED_CASE_MARKS]

outcomes, test_case_on_every_rank = every_rank_tests(distributed_cases)


def test_needs_an_initialised_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        sd.supcon_loss(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(strategy="tree"), ValueError, "strategy must be one of"),
    (dict(gradients_averaged=1), TypeError, "gradients_averaged must be a bool"),
    (dict(reduction="avg"), ValueError, "reduction must be one of"),
])
def test_module_checks_its_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        sd.SupConLoss(**kwargs)


def test_module_registers_a_learnable_temperature():
    temperature = torch.nn.Parameter(torch.tensor(0.2))
    criterion = sd.SupConLoss(temperature, strategy="ring", gradients_averaged=True)
    assert list(criterion.parameters()) == [temperature]
    assert "strategy='ring'" in repr(criterion) and "gradients_averaged=True" in repr(criterion)


def test_import_scl_kernels_leaves_distributed_out():
    import subprocess
    import sys
    code = "import sys, scl_kernels; print('scl_kernels.distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
