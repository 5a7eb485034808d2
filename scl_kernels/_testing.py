"""What the test suite and the benchmarks switch in the library, for tests only: the test hooks
(csrc/core/test_hooks.h), which send CPU calls down the paths a GPU takes. A library built with
SCL_BUILD_TESTS=1 (the README's test command; never an installed wheel) has the op that sets
them, and the CUDA backend's dry run where it has no CUDA kernels.

    with test_hooks(device_preparation=True):
        loss = supcon_loss(features, labels)   # prepared as on a GPU: no host reads
"""
import contextlib
import types
from typing import Any, Dict, Iterator, Mapping

import torch

from ._extension import library_loaded

NOT_A_TEST_BUILD = ("this scl_kernels library was built without the test suite's ops: rebuild "
                    "with SCL_BUILD_TESTS=1 pip install --no-build-isolation -e \".[test]\"")


# The hooks' current values by name, as last set; the op's schema holds the names and the
# installed library's values (its defaults), so that a hook is added in C++ only.
_current: Dict[str, Any] = {}


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


def hook_values() -> Mapping[str, Any]:
    """The hooks' values now, by name (a test build's library only)."""
    if not _current:
        _current.update((argument.name, argument.default_value)
                        for argument in torch.ops.scl._set_test_hooks.default._schema.arguments)
    return types.MappingProxyType(_current)


@contextlib.contextmanager
def test_hooks(**changes: Any) -> Iterator[Mapping[str, Any]]:
    """Sets the named hooks for the duration of the block (the others keep their values), then
    restores them; a RuntimeError where the library is no test build, a TypeError naming a hook
    the library does not have."""
    if not test_build():
        raise RuntimeError(NOT_A_TEST_BUILD)
    previous = dict(hook_values())
    unknown = sorted(set(changes) - set(previous))
    if unknown:
        raise TypeError(f"no such test hook: {', '.join(unknown)} (the hooks: "
                        f"{', '.join(previous)}; csrc/core/test_hooks.h)")
    hooks = {**previous, **changes}
    _set(hooks)
    try:
        yield types.MappingProxyType(hooks)
    finally:
        _set(previous)


test_hooks.__test__ = False


def _set(hooks: Dict[str, Any]) -> None:
    global _current
    torch.ops.scl._set_test_hooks(**hooks)
    _current = hooks
