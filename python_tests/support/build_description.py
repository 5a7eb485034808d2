"""csrc/build_description.py, which setup.py and CMakeLists.txt both read, loaded from its file
(csrc is no package): the tests ask it what the build asks it."""
import functools
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.cache
def build_description():
    path = os.path.join(ROOT, "csrc", "build_description.py")
    spec = importlib.util.spec_from_file_location("scl_build_description_for_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
