"""Skip marks for tests whose dependency may be absent: they skip, saying why, instead of failing.
The README's ``python -m pytest`` runs in a venv with only torch, numpy and pytest; optional
Python packages are asked for with ``pytest.importorskip`` where they are imported."""
import pytest

from scl_kernels._extension import library_loaded, require_library
from scl_kernels._testing import NOT_A_TEST_BUILD, test_build


def why_library_is_missing():
    """The loader's reason why the compiled library did not load, or None when it did."""
    try:
        require_library()
    except RuntimeError as error:
        return str(error)
    return None


library = pytest.mark.skipif(not library_loaded(), reason=why_library_is_missing() or "")
# Tests that set the library's test hooks (scl_kernels._testing), which only a test build has.
hooks = pytest.mark.skipif(not test_build(), reason=NOT_A_TEST_BUILD)
