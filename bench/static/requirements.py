"""What the static machine-code tools need beyond the library, and the versions CI pins.

They read the machine code one compiler makes, and another version compiles (and spills)
differently: with triton 3.9.0 the Triton kernels spilled where 3.6.0 does not (issue 24,
2026-11). So the pins are part of a result, not only of an install."""
import importlib.util

TRITON_PIN = "triton==3.6.0"  # its wheel also brings cuobjdump and nvdisasm
CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"  # the CuTe headers of the CUDA C++ kernels
NVCC = "nvcc (on PATH or in CUDA_HOME; CI uses CUDA 13.0)"

TRITON_NEEDS = (f"Needs triton (CI pins {TRITON_PIN}: pip install {TRITON_PIN}), no GPU; another "
                "triton version compiles differently, so its spills and counts may differ.")
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
