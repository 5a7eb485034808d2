"""Builds scl_kernels._C, the library that registers torch.ops.scl.

Build knobs (environment variables, in the manner of flash-attention):
  SCL_BUILD_CUDA      auto (default: when torch has CUDA and nvcc is found), 1 (force), 0 (skip)
  SCL_CUDA_ARCH_LIST  compute capabilities for nvcc, default "9.0" (Hopper); sets TORCH_CUDA_ARCH_LIST
  SCL_CPU_ARCH_FLAGS  ISA flags for the CPU kernels, default "-march=native"; "" for a portable build
  MAX_JOBS            parallel compile jobs (read by torch's BuildExtension)
"""
import glob
import os
import shutil
import shlex

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))


def cuda_wanted():
    choice = os.environ.get("SCL_BUILD_CUDA", "auto").lower()
    if choice in ("0", "false", "no"):
        return False
    nvcc_found = shutil.which("nvcc") is not None or os.path.exists(
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    if choice in ("1", "true", "yes"):
        if torch.version.cuda is None or not nvcc_found:
            raise RuntimeError("SCL_BUILD_CUDA=1 needs a CUDA build of torch and nvcc")
        return True
    return torch.version.cuda is not None and nvcc_found


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def extension():
    cpu_flags = shlex.split(os.environ.get("SCL_CPU_ARCH_FLAGS", "-march=native"))
    # -ffp-contract=off: the kernels round a logit before subtracting its row maximum, as the
    # maximum itself was rounded; a contracted multiply-add would break that (docs/MATH.md).
    cxx = ["-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off", *cpu_flags]
    srcs = [s for d in ("csrc", "csrc/core", "csrc/cpu", "csrc/triton") for s in sources(f"{d}/*.cpp")]
    if cuda_wanted():
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", os.environ.get("SCL_CUDA_ARCH_LIST", "9.0"))
        return CUDAExtension(
            "scl_kernels._C",
            srcs + sources("csrc/cuda/*.cu") + sources("csrc/cuda/*.cpp"),
            extra_compile_args={"cxx": cxx + ["-DSCL_WITH_CUDA"],
                                "nvcc": ["-O3", "-std=c++17", "--use_fast_math", "-DSCL_WITH_CUDA"]},
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
    },
)
