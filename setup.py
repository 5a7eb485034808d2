"""Builds scl_kernels._C, the library that registers torch.ops.scl.

Build knobs (environment variables, in the manner of flash-attention):
  SCL_BUILD_CUDA      auto (default: when there are CUDA sources, csrc/cuda/*.cu, torch has CUDA and
                      nvcc is found), 1 (force; fails when any of the three is missing), 0 (skip)
  SCL_CUDA_ARCH_LIST  compute capabilities for nvcc, default "8.0;9.0a" (the mma.sync kernels for
                      Ampere, and the wgmma + TMA kernels, which need sm_90a, for Hopper); "X.Y+PTX"
                      adds that PTX. Given to nvcc as explicit -gencode flags; TORCH_CUDA_ARCH_LIST
                      (often preset in containers) is not read, and is set to the same list
  SCL_CUTLASS_INCLUDE the CuTe / CUTLASS headers, default: those of the installed nvidia-cutlass
                      wheel (pip install nvidia-cutlass==4.2.0.0; header-only, needed to build only)
  SCL_CPU_ARCH_FLAGS  ISA flags for the CPU kernels, default "-march=native"; "" for a portable build
  MAX_JOBS            parallel compile jobs (read by torch's BuildExtension)

The C++ standard is the one the installed torch asks for: no -std is passed here, so torch's
BuildExtension adds its own default to both the host compiler's and nvcc's flags (-std=c++20 for
torch 2.13 / 2.14, whose headers need it from 2.14 on; -std=c++17 for older releases). The CMake
build reads the same requirement from torch's CMake package (CMakeLists.txt).
"""
import glob
import importlib.util
import os
import re
import shlex
import sys

from setuptools import find_packages, setup
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def log(message):
    print(f"scl_kernels setup.py: {message}", file=sys.stderr)


def cuda_toolkit():
    """(nvcc, None) when torch's CUDA build would find nvcc and the CUDA headers, else (None, why
    not). A CUDA torch compiles with the toolkit at cpp_extension.CUDA_HOME (CUDA_HOME / CUDA_PATH,
    else the parent of the nvcc on PATH, else /usr/local/cuda), with -I CUDA_HOME/include and
    CUDA_INC_PATH."""
    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    if nvcc is None or not os.path.exists(nvcc):
        return None, "nvcc is not found (set CUDA_HOME, or put nvcc on PATH)"
    include_dirs = [os.path.join(home, "include"), os.environ.get("CUDA_INC_PATH") or ""]
    if not any(os.path.exists(os.path.join(d, "cuda_runtime.h")) for d in include_dirs if d):
        return None, (f"{home}/include has no cuda_runtime.h (set CUDA_HOME to the CUDA toolkit's "
                      "root, e.g. CUDA_HOME=/usr/local/cuda)")
    return nvcc, None


CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"


def cutlass_include():
    """(directory, None) for the CuTe headers, or (None, why not)."""
    override = os.environ.get("SCL_CUTLASS_INCLUDE")
    if override:
        found = os.path.exists(os.path.join(override, "cute", "tensor.hpp"))
        return (override, None) if found else (None, f"SCL_CUTLASS_INCLUDE={override} has no cute/tensor.hpp")
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.origin:
        include = os.path.join(os.path.dirname(spec.origin), "source", "include")
        if os.path.exists(os.path.join(include, "cute", "tensor.hpp")):
            return include, None
    return None, f"the CuTe headers are not installed (pip install {CUTLASS_PIN})"


def cuda_library_includes():
    """Include directories of the CUDA libraries that torch's CUDA headers name (cusparse.h,
    cublas_v2.h, ...), when the toolkit at CUDA_HOME lacks them and torch's pip packages of
    those libraries (nvidia/cu*/include) have them."""
    home = cpp_extension.CUDA_HOME or ""
    if os.path.exists(os.path.join(home, "include", "cusparse.h")):
        return []
    site = os.path.dirname(os.path.dirname(torch.__file__))
    return [d for d in sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")))
            if os.path.exists(os.path.join(d, "cusparse.h"))]


def cuda_arch_flags(arch_list):
    """nvcc's -gencode flags for "8.0;9.0a"-style lists (";" or " " apart, "+PTX" adds the PTX).
    Given explicitly, not left to torch: torch drops its own architecture flags whenever any nvcc
    flag contains the letters "arch", an include path under a directory named "research" too."""
    flags = []
    for arch in arch_list.replace(" ", ";").split(";"):
        if not arch:
            continue
        m = re.fullmatch(r"(\d+)\.(\d+[af]?)(\+PTX)?", arch)
        if not m:
            raise RuntimeError(f"SCL_CUDA_ARCH_LIST: {arch!r} is not a compute capability such as "
                               "8.0, 9.0a or 8.6+PTX")
        number = m.group(1) + m.group(2)
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if m.group(3):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    if not flags:
        raise RuntimeError("SCL_CUDA_ARCH_LIST is empty")
    return list(dict.fromkeys(flags))


def cuda_wanted(cuda_sources):
    choice = os.environ.get("SCL_BUILD_CUDA", "auto").strip().lower() or "auto"
    if choice in ("0", "false", "no", "off"):
        log("SCL_BUILD_CUDA=0: building the CPU extension")
        return False
    if choice not in ("auto", "1", "true", "yes", "on"):
        raise RuntimeError(f"SCL_BUILD_CUDA={choice!r}: expected auto, 1 or 0")
    missing = []
    if not cuda_sources:
        missing.append("there are no CUDA sources (csrc/cuda/*.cu)")
    nvcc = None
    if torch.version.cuda is None:
        missing.append(f"torch {torch.__version__} is not a CUDA build")
    else:
        nvcc, why_not = cuda_toolkit()
        if why_not:
            missing.append(why_not)
    if cuda_sources:
        _, why_not = cutlass_include()
        if why_not:
            missing.append(why_not)
    if choice != "auto":
        if missing:
            raise RuntimeError("SCL_BUILD_CUDA=1 cannot build the CUDA extension: " + "; ".join(missing))
        log(f"SCL_BUILD_CUDA=1: building the CUDA extension with {nvcc}")
        return True
    if missing:
        log("SCL_BUILD_CUDA=auto: building the CPU extension, as " + "; ".join(missing))
        return False
    log(f"SCL_BUILD_CUDA=auto: building the CUDA extension with {nvcc}")
    return True


def extension():
    # No -std anywhere: BuildExtension adds the standard of the torch being built against.
    cpu_flags = shlex.split(os.environ.get("SCL_CPU_ARCH_FLAGS", "-march=native"))
    # -ffp-contract=off: the kernels round a logit before subtracting its row maximum, as the
    # maximum itself was rounded; a contracted multiply-add would break that (docs/MATH.md).
    cxx = ["-O3", "-fopenmp", "-ffp-contract=off", *cpu_flags]
    srcs = [s for d in ("csrc", "csrc/core", "csrc/cpu", "csrc/triton") for s in sources(f"{d}/*.cpp")]
    cuda_sources = sources("csrc/cuda/*.cu")
    if cuda_wanted(cuda_sources):
        arch_list = os.environ.get("SCL_CUDA_ARCH_LIST", "").strip() or "8.0;9.0a"
        gencode = cuda_arch_flags(arch_list)
        if os.environ.get("TORCH_CUDA_ARCH_LIST", arch_list) != arch_list:
            log(f"TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']} is not used: "
                f"SCL_CUDA_ARCH_LIST decides ({arch_list})")
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
        log(f"CUDA architectures: {arch_list} ({' '.join(gencode)})")
        cutlass, _ = cutlass_include()
        library_includes = cuda_library_includes()
        # -Xptxas=-v: every kernel's registers and spills in the build log (CI fails on a spill).
        nvcc = ["-O3", "--use_fast_math", "-DNDEBUG", "-DSCL_WITH_CUDA", "-Xptxas=-v",
                f"-I{os.path.join(ROOT, 'csrc')}", f"-I{cutlass}"] + [f"-I{d}" for d in library_includes] + gencode
        return CUDAExtension(
            "scl_kernels._C",
            srcs + cuda_sources + sources("csrc/cuda/*.cpp"),
            include_dirs=library_includes,
            extra_compile_args={"cxx": cxx + ["-DSCL_WITH_CUDA"], "nvcc": nvcc},
            extra_link_args=["-fopenmp"],
        )
    return CppExtension("scl_kernels._C", srcs, extra_compile_args=cxx, extra_link_args=["-fopenmp"])


setup(
    name="scl_kernels",
    version="0.1.0",
    description="Fused, memory-frugal supervised contrastive (SupCon) loss for PyTorch",
    packages=find_packages(include=["scl_kernels", "scl_kernels.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch>=2.4"],
    extras_require={
        "test": ["pytest", "numpy"],
        "bench": ["pytest-benchmark", "pytorch-metric-learning", "matplotlib", "psutil"],
        # scl_kernels.finetune: the Trainer and sentence-transformers integrations and the CLI.
        # Building the CUDA backend (header-only; not needed at run time).
        "cuda": [CUTLASS_PIN],
        "finetune": ["transformers>=4.46", "accelerate>=1.1", "sentence-transformers>=3.0",
                     "datasets", "scikit-learn", "matplotlib", "tqdm"],
    },
    entry_points={"console_scripts": ["scl-finetune = scl_kernels.finetune.cli:main"]},
)
