"""scl_kernels.distributed on gloo with 2 and 4 processes spawned here: loss and gradients equal
to the single-process call on the global batch (1e-10 in float64), both strategies, every layout,
unequal batches and an empty rank, DDP, and errors raised on every rank instead of a hang.

The cases live in distributed_cases.py; each world size is spawned once for all of them."""
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distributed_cases
import scl_kernels.distributed as sd
from scl_kernels._extension import library_loaded

pytestmark = [
    pytest.mark.quick,
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
    pytest.mark.skipif(not library_loaded(), reason="the fused CPU kernels are not built"),
]

WORLD_SIZES = (2, 4)
SPAWN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{world size: {rank: {case: None or the traceback}}}, spawned once per world size."""
    results = {}
    for world in WORLD_SIZES:
        folder = tmp_path_factory.mktemp(f"world{world}")
        context = mp.start_processes(
            distributed_cases.run_rank,
            args=(world, str(folder / "store"), list(distributed_cases.CASES), str(folder)),
            nprocs=world, join=False, start_method="spawn")
        for process in context.processes:
            process.join(SPAWN_TIMEOUT_S)
        alive = [p for p in context.processes if p.is_alive()]
        for process in alive:
            process.kill()
        assert not alive, f"{world} ranks did not finish within {SPAWN_TIMEOUT_S} s"
        results[world] = {}
        for rank in range(world):
            path = folder / f"rank{rank}.json"
            results[world][rank] = json.loads(path.read_text()) if path.exists() else {}
    return results


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("name", list(distributed_cases.CASES))
def test_case_on_every_rank(outcomes, world, name):
    missing = [rank for rank, cases in outcomes[world].items() if name not in cases]
    assert not missing, f"ranks {missing} stopped before this case (an earlier case failed)"
    failures = {rank: cases[name] for rank, cases in outcomes[world].items() if cases[name]}
    assert not failures, "\n".join(f"rank {rank}:\n{text}" for rank, text in failures.items())


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
