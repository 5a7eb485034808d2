"""Builds scl_kernels._C, the library that registers torch.ops.scl; the metadata is in pyproject.toml.

The sources, flags and knobs (SCL_BUILD_CUDA, SCL_CUDA_ARCH_LIST, SCL_CUTLASS_INCLUDE,
SCL_CPU_ARCH_FLAGS, MAX_JOBS) are described in csrc/build_description.py, which CMakeLists.txt
reads too.
"""
import importlib.util
import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
import torch

ROOT = os.path.dirname(os.path.abspath(__file__))


def load_build_description():
    path = os.path.join(ROOT, "csrc", "build_description.py")
    spec = importlib.util.spec_from_file_location("scl_build_description", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def extension(description):
    build = description.describe()
    for line in build.log:
        print(f"scl_kernels build: {line}", file=sys.stderr)
    defines = [f"-D{d}" for d in build.defines]
    if not build.cuda:
        return CppExtension("scl_kernels._C", build.cxx_sources, include_dirs=build.include_dirs,
                            extra_compile_args=build.cxx_flags + defines,
                            extra_link_args=build.link_flags)
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST", build.cuda_arch_list)
    if previous != build.cuda_arch_list:
        print(f"scl_kernels build: TORCH_CUDA_ARCH_LIST={previous} is not used: SCL_CUDA_ARCH_LIST "
              f"decides ({build.cuda_arch_list})", file=sys.stderr)
    os.environ["TORCH_CUDA_ARCH_LIST"] = build.cuda_arch_list
    nvcc = (build.nvcc_flags + defines + [f"-I{d}" for d in build.cuda_include_dirs]
            + description.cuda_arch_flags(build.cuda_arch_list))
    return CUDAExtension("scl_kernels._C", build.cxx_sources + build.cuda_sources,
                         include_dirs=build.include_dirs,
                         extra_compile_args={"cxx": build.cxx_flags + defines, "nvcc": nvcc},
                         extra_link_args=build.link_flags)


class BuildInPersistentDirectory(BuildExtension):
    """Keeps the object files in build/ext-<python>-torch<version>-<cpu|cuda> under the source tree,
    also for editable installs (setuptools gives those a fresh temporary directory), and always
    hands the build to ninja, which recompiles only what changed: reinstalling with other extras
    relinks in seconds. One directory per torch, so a library is never linked from objects
    compiled against another torch's headers."""

    def finalize_options(self):
        super().finalize_options()
        cuda = "cuda" if any(s.endswith(".cu") for e in self.extensions for s in e.sources) else "cpu"
        tag = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}-{cuda}"
        self.build_temp = os.path.join(ROOT, "build", f"ext-{tag}")
        self.force = True


setup(
    ext_modules=[extension(load_build_description())],
    cmdclass={"build_ext": BuildInPersistentDirectory},
)
