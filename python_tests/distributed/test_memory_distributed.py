"""A cross-batch memory under scl_kernels.distributed on gloo with 2 processes spawned here: each
rank's loss and gradient equal the single-process loss of the global batch with the same memory,
and every rank's memory ends equal to it (the gathered batch is enqueued); "ring" is refused.

The cases live in support/memory_distributed_cases.py; the ranks are spawned once for all."""
import os

import pytest
import torch.distributed as dist

from support import memory_distributed_cases, needs
from support.spawned_ranks import assert_passed_on_every_rank, spawn_ranks

pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
    needs.library,
]

WORLD = 2
SPAWN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("memory"))
    return spawn_ranks(memory_distributed_cases.run_rank, WORLD, folder,
                       (WORLD, os.path.join(folder, "store"),
                        list(memory_distributed_cases.CASES), folder), SPAWN_TIMEOUT_S)


@pytest.mark.parametrize("name", list(memory_distributed_cases.CASES))
def test_case_on_every_rank(outcomes, name):
    assert_passed_on_every_rank(outcomes, name)
