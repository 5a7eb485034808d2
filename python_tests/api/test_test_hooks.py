"""scl_kernels._testing sets the test hooks by the names and defaults of the setter's schema
(csrc/core/test_hooks.h lists them once)."""
import pytest
import torch

from scl_kernels._testing import NOT_A_TEST_BUILD, hook_values, test_build, test_hooks
from support import needs

pytestmark = [needs.library, pytest.mark.skipif(not test_build(), reason=NOT_A_TEST_BUILD)]


@pytest.mark.quick
def test_the_hooks_are_the_setter_s_arguments_off_by_default():
    schema = torch.ops.scl._set_test_hooks.default._schema
    assert list(hook_values()) == [argument.name for argument in schema.arguments]
    assert {name: bool(value) for name, value in hook_values().items()} == dict.fromkeys(
        hook_values(), False)


@pytest.mark.quick
def test_a_hook_is_set_for_its_block_then_restored():
    with test_hooks(chunk_elements=7, value_checks="end_of_call") as hooks:
        assert hooks["chunk_elements"] == 7 and hook_values()["value_checks"] == "end_of_call"
    assert hook_values()["chunk_elements"] == 0 and hook_values()["value_checks"] == ""


@pytest.mark.quick
def test_an_unknown_hook_is_named():
    with pytest.raises(TypeError, match="no such test hook: no_such_hook"):
        with test_hooks(no_such_hook=True):
            pass
    assert hook_values()["device_preparation"] is False
