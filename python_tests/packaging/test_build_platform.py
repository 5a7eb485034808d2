"""The build refuses a platform it is not made for with one line saying what to do, before
anything compiles (csrc/build_description.py, which setup.py and CMakeLists.txt both read)."""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _build_description():
    path = os.path.join(ROOT, "csrc", "build_description.py")
    spec = importlib.util.spec_from_file_location("scl_build_description_for_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("platform", ["darwin", "win32", "cygwin"])
def test_other_platforms_are_refused_naming_what_to_do(platform):
    with pytest.raises(RuntimeError, match=f"Linux only .*{platform}.*WSL2"):
        _build_description().require_linux(platform)


def test_linux_builds():
    _build_description().require_linux("linux")
