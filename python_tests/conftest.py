"""Fixtures shared by every test folder; the backend matrix (the ``backend`` / ``op_backend``
arguments and ``@pytest.mark.matrix``) is the plugin support/backend_matrix.py."""
import os
import zlib

# OpenMP's idle threads spin between the many small parallel regions of a test run; when another
# job wants the cores, a spinning thread holds one that the test's own thread or the other job
# needs, and a run takes several times longer (bench/PERFORMANCE.md, "The test suite on a busy
# machine"). Passive threads sleep instead. Read once, when torch loads its OpenMP runtime: before
# torch's first import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

import scl_kernels  # noqa: E402
from scl_kernels._extension import library_loaded  # noqa: E402
from support.needs import why_library_is_missing  # noqa: E402

pytest_plugins = ["support.backend_matrix"]


@pytest.fixture(autouse=True)
def _restore_threads():
    """Tests that change the thread count never leak it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def reproducible():
    """torch.use_deterministic_algorithms(True) for the whole test, for tests that compare runs bit
    for bit: on a GPU the fused backends add partial sums with atomics unless it is set (then they
    take their atomic-free schedules), and any nondeterministic torch op on the way raises."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous, warn_only=warn_only)


@pytest.fixture
def reproducible_if():
    """torch.use_deterministic_algorithms, for a test to set as it goes; restored afterwards."""
    previous = torch.are_deterministic_algorithms_enabled()
    yield torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms(previous)


@pytest.fixture
def gen(request):
    """A torch.Generator seeded from the test's node id: reproducible and different per test."""
    seed = zlib.crc32(request.node.nodeid.encode())
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@pytest.fixture
def randn(gen):
    """randn(*shape, dtype=torch.float32) from the per-test generator (generated in float64 then
    cast, so values are identical across dtypes up to rounding). CPU tensors: backend.put()
    moves them."""
    def make(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
    return make


@pytest.fixture
def randint(gen):
    def make(low, high, shape):
        return torch.randint(low, high, shape, generator=gen)
    return make


@pytest.fixture
def cuda_randn(randn):
    """randn on the current CUDA device (the GPU tests)."""
    return lambda *shape, dtype=torch.float32, scale=1.0: randn(*shape, dtype=dtype, scale=scale).cuda()


@pytest.fixture
def cuda_randint(randint):
    return lambda low, high, shape: randint(low, high, shape).cuda()


@pytest.fixture(scope="session")
def cpu_library():
    """Tests of the cpu backend skip, saying why, when the compiled library did not load."""
    if not library_loaded():
        pytest.skip(why_library_is_missing())
    assert "cpu" in scl_kernels.available_backends("cpu")
