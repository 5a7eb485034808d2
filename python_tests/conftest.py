"""Shared fixtures of the scl_kernels test suite."""
import os
import sys
import zlib

import pytest
import torch

# Without a GPU the Triton backend runs in Triton's interpreter, which must be chosen before
# triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # reference64 importable everywhere

import scl_kernels  # noqa: E402
from scl_kernels._extension import library_loaded  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slower test (compile)")


@pytest.fixture(autouse=True)
def _restore_threads():
    """Tests that change the thread count never leak it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


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
    cast, so values are identical across dtypes up to rounding)."""
    def make(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
    return make


@pytest.fixture
def randint(gen):
    def make(low, high, shape):
        return torch.randint(low, high, shape, generator=gen)
    return make


@pytest.fixture(scope="session")
def cpu_library():
    """The compiled library must be there: the cpu backend is under test."""
    assert library_loaded(), "scl_kernels._C failed to load; build with setup.py build_ext --inplace"
    assert "cpu" in scl_kernels.available_backends("cpu")
    return True
