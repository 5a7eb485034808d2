"""The build refuses a platform it is not made for with one line saying what to do, before
anything compiles (csrc/build_description.py, which setup.py and CMakeLists.txt both read)."""
import pytest

from support.build_description import build_description


@pytest.mark.parametrize("platform", ["darwin", "win32", "cygwin"])
def test_other_platforms_are_refused_naming_what_to_do(platform):
    with pytest.raises(RuntimeError, match=f"Linux only .*{platform}.*WSL2"):
        build_description().require_linux(platform)


def test_linux_builds():
    build_description().require_linux("linux")
