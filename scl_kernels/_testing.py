"""What the test suite and the benchmarks switch in the library, for tests only: the test hooks
(csrc/core/test_hooks.h), which send CPU calls down the paths a GPU takes. A library built with
SCL_BUILD_TESTS=1 (the README's test command; never an installed wheel) has the op that sets
them, and the CUDA backend's dry run where it has no CUDA kernels.

    with test_hooks(device_preparation=True):
        loss = supcon_loss(features, labels)   # prepared as on a GPU: no host reads
"""
import contextlib
import dataclasses
from typing import Iterator

import torch

from ._extension import library_loaded

NOT_A_TEST_BUILD = ("this scl_kernels library was built without the test suite's ops: rebuild "
                    "with SCL_BUILD_TESTS=1 pip install --no-build-isolation -e \".[test]\"")


@dataclasses.dataclass(frozen=True)
class TestHooks:
    """The hooks' values (csrc/core/test_hooks.h says what each does); the defaults are the
    installed library's."""
    __test__ = False  # not a pytest test class

    device_preparation: bool = False
    temperature_in_memory: bool = False
    chunk_elements: int = 0
    dry_run_skips_tiles: bool = False
    dry_run_capturing: bool = False
    cpu_capability: str = ""
    value_checks: str = ""
    symmetric_backward_walk: str = ""
    blas_missing: bool = False


_current = TestHooks()


def _has_op(name: str, dispatch_key: str = "") -> bool:
    if not library_loaded():
        return False
    if not torch._C._dispatch_has_kernel(f"scl::{name}"):
        return False
    return not dispatch_key or torch._C._dispatch_has_kernel_for_dispatch_key(
        f"scl::{name}", dispatch_key)


def test_build() -> bool:
    """Whether the loaded library was built with SCL_BUILD_TESTS=1."""
    return _has_op("_set_test_hooks")


test_build.__test__ = False


def cuda_dry_run_built() -> bool:
    """Whether the loaded library holds the CUDA host code's dry run (a test build without CUDA)."""
    return _has_op("supcon_cuda_dry_run", "CPU")


@contextlib.contextmanager
def test_hooks(**changes) -> Iterator[TestHooks]:
    """Sets the named hooks for the duration of the block (the others keep their values), then
    restores them; a RuntimeError where the library is no test build."""
    global _current
    if not test_build():
        raise RuntimeError(NOT_A_TEST_BUILD)
    previous = _current
    hooks = dataclasses.replace(previous, **changes)
    _set(hooks)
    try:
        yield hooks
    finally:
        _set(previous)


test_hooks.__test__ = False


def _set(hooks: TestHooks) -> None:
    global _current
    torch.ops.scl._set_test_hooks(*dataclasses.astuple(hooks))
    _current = hooks
