"""What the static machine-code tools need beyond the library, and the versions CI pins.

They read the machine code one compiler makes, and another version compiles (and spills)
differently: with triton 3.9.0 some tiles spilled where 3.6.0 does not (2026-11), so
the Triton launcher leaves out, per release, the tiles that release spills, and CI checks the
oldest and the newest release the supported torch versions bring. The instruction counts and the
predicted times still differ between releases: the pins are part of a result."""
import importlib.util
import os
import sys

from bench.harness.report import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "csrc"))
from build_description import CUTLASS_PIN, cutlass_include  # noqa: E402  (the build's own lookup)

TRITON_PIN = "triton==3.6.0"  # its wheel also brings cuobjdump and nvdisasm
TRITON_NEWEST_CHECKED = "triton==3.9.0"
NVCC = "nvcc (on PATH or in CUDA_HOME; CI uses CUDA 13.0)"

TRITON_NEEDS = (f"Needs triton 3.6 to 3.9, no GPU: pip install {TRITON_PIN} (CI runs it with "
                f"{TRITON_PIN} and {TRITON_NEWEST_CHECKED}; each release compiles differently, so "
                "the counts and predicted times differ, and a newer one may spill).")
CUDA_NEEDS = (f"The CUDA C++ kernels need {NVCC} and the CuTe headers (pip install "
              f"{CUTLASS_PIN}, or SCL_CUTLASS_INCLUDE=DIR); without them they are not checked, "
              "and the report says why.")
CUOBJDUMP = (f"Their machine code is read with the cuobjdump of triton's wheel (CI pins "
             f"{TRITON_PIN}).")


def missing_triton(tool):
    """The one-line reason ``tool`` cannot run here, or None when triton is installed."""
    if importlib.util.find_spec("triton") is None:
        return f"{tool}: triton is not installed. {TRITON_NEEDS}"
    return None
