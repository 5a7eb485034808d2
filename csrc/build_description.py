"""The build of scl_kernels._C, described once: its sources, compiler flags and knobs.

Both builds read this file. setup.py imports it and compiles with torch's BuildExtension (ninja);
CMakeLists.txt runs `python csrc/build_description.py cmake` and includes the CMake variables it
prints. Neither names a source file or a flag of its own.

Knobs (environment variables; CMake also takes them as -D options of the same names):
  SCL_BUILD_CUDA      auto (default: when there are CUDA sources, csrc/cuda/*.cu, torch has CUDA,
                      nvcc is found and the CuTe headers are installed), 1 (force; fails naming what
                      is missing), 0 (CPU only)
  SCL_CUDA_ARCH_LIST  compute capabilities for nvcc, default "8.0;9.0a" (the mma.sync kernels for
                      Ampere, and the wgmma + TMA kernels, which need sm_90a, for Hopper); "X.Y+PTX"
                      adds that PTX. TORCH_CUDA_ARCH_LIST (often preset in containers) is not read,
                      and is set to the same list
  SCL_CUTLASS_INCLUDE the CuTe / CUTLASS headers, default: .cutlass/include when it holds them
                      (unpacked from the wheel by python -m bench.gpu.build --prepare-headers, for
                      machines without a package index), else those of the installed nvidia-cutlass
                      wheel (pip install nvidia-cutlass==4.2.0.0; header-only, needed to build only)
  SCL_CPU_ARCH_FLAGS  extra ISA flags for every C++ file, default none: the build runs on any CPU of
                      its architecture, and the CPU kernels pick their instruction set at run time.
                      "-march=native" gives a build for the build machine's CPU only
  SCL_BUILD_TESTS     0 (default: the product's ops only), 1: also the ops the test suite needs
                      (csrc/testing: setting the test hooks; without CUDA, the CUDA backend's dry
                      run). The README's test command and CI set it; a wheel never has them
  SCL_CUDA_DEBUG_WAITS 0 (default), 1: every mbarrier wait of the sm_90a kernels traps after about a
                      second, printing the barrier, block and thread (csrc/cuda/barrier_wait.cuh),
                      where a lost arrival would hang the GPU. For finding hangs only: its printf
                      makes ptxas serialize the kernels' wgmma
  MAX_JOBS            parallel compile jobs (ninja's -j; default: the number of cores + 2)

The C++ standard is the one the installed torch asks for: no -std is given here (setup.py: torch's
BuildExtension adds it; CMakeLists.txt reads it from torch's CMake package).
"""
import glob
import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CXX_SOURCE_PATTERNS = ("csrc/*.cpp", "csrc/core/*.cpp", "csrc/cpu/*.cpp", "csrc/triton/*.cpp")
CUDA_SOURCE_PATTERNS = ("csrc/cuda/*.cu", "csrc/cuda/*.cpp")
# SCL_BUILD_TESTS=1 only: the ops that exist for the tests, never in an installed library.
TEST_SOURCE_PATTERNS = ("csrc/testing/*.cpp",)
# With the tests and without CUDA, the CUDA backend's host code is built as a dry run
# (csrc/cuda_dry_run): its ATen glue and launch choices on CPU tensors, each kernel launch
# recorded instead of made, so that bench.launch_count counts the CUDA call without a GPU and the
# tests check the glue. A library has one of the two. Its define is given to every CPU-only
# build, so that turning the tests on or off compiles only their own files.
CUDA_DRY_RUN_SOURCE_PATTERNS = ("csrc/cuda/supcon_cuda.cpp", "csrc/cuda/launch.cpp",
                                "csrc/cuda_dry_run/*.cpp")
CUDA_DRY_RUN_DEFINES = ("SCL_CUDA_DRY_RUN",)
# -ffp-contract=off: the kernels round a logit before subtracting its row maximum, as the maximum
# itself was rounded; a contracted multiply-add would break that (docs/MATH.md).
# -g0: setuptools passes Python's own CFLAGS first, with -g; debug information doubles the compile
# time and makes the library 16 MB instead of under 1 MB, and does not change the machine code.
CXX_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-g0")
LINK_FLAGS = ("-fopenmp",)
# -Xptxas=-v: every kernel's registers and spills in the build log (CI fails on a spill).
NVCC_FLAGS = ("-O3", "--use_fast_math", "-DNDEBUG", "-Xptxas=-v")
CUDA_DEFINES = ("SCL_WITH_CUDA",)
# SCL_CUDA_DEBUG_WAITS=1: the kernels' mbarrier waits bounded (csrc/cuda/barrier_wait.cuh).
DEBUG_WAITS_FLAG = "-DSCL_CUDA_BOUNDED_WAITS"
DEFAULT_CUDA_ARCH_LIST = "8.0;9.0a"
CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"
CARRIED_CUTLASS_INCLUDE = os.path.join(ROOT, ".cutlass", "include")  # git-ignored
KNOBS = ("SCL_BUILD_CUDA", "SCL_CUDA_ARCH_LIST", "SCL_CUTLASS_INCLUDE", "SCL_CPU_ARCH_FLAGS",
         "SCL_BUILD_TESTS", "SCL_CUDA_DEBUG_WAITS")


@dataclass
class Build:
    """What to compile and how. Sources are relative to ROOT (setuptools wants them so), include
    directories absolute (ninja compiles in the build directory)."""
    cuda: bool
    cxx_sources: list
    cuda_sources: list = field(default_factory=list)
    cxx_flags: list = field(default_factory=list)
    nvcc_flags: list = field(default_factory=list)
    link_flags: list = field(default_factory=list)
    defines: list = field(default_factory=list)
    include_dirs: list = field(default_factory=list)       # every language
    cuda_include_dirs: list = field(default_factory=list)  # nvcc only
    cuda_arch_list: str = ""
    log: list = field(default_factory=list)                # the decisions, one line each


def sources(patterns):
    return [os.path.relpath(path, ROOT) for pattern in patterns
            for path in sorted(glob.glob(os.path.join(ROOT, pattern)))]


def cuda_toolkit():
    """(nvcc, None) when torch's CUDA build would find nvcc and the CUDA headers, else (None, why
    not). A CUDA torch compiles with the toolkit at cpp_extension.CUDA_HOME (CUDA_HOME / CUDA_PATH,
    else the parent of the nvcc on PATH, else /usr/local/cuda), with -I CUDA_HOME/include and
    CUDA_INC_PATH."""
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else None
    if nvcc is None or not os.path.exists(nvcc):
        return None, "nvcc is not found (set CUDA_HOME, or put nvcc on PATH)"
    include_dirs = [os.path.join(home, "include"), os.environ.get("CUDA_INC_PATH") or ""]
    if not any(os.path.exists(os.path.join(d, "cuda_runtime.h")) for d in include_dirs if d):
        return None, (f"{home}/include has no cuda_runtime.h (set CUDA_HOME to the CUDA toolkit's "
                      "root, e.g. CUDA_HOME=/usr/local/cuda)")
    return nvcc, None


def cutlass_include(knobs):
    """(directory, None) for the CuTe headers, or (None, why not)."""
    override = knobs.get("SCL_CUTLASS_INCLUDE")
    if override:
        found = os.path.exists(os.path.join(override, "cute", "tensor.hpp"))
        return (override, None) if found else (None, f"SCL_CUTLASS_INCLUDE={override} has no cute/tensor.hpp")
    # A machine that reaches no package index (a lent GPU) gets the wheel's headers carried with
    # the checkout: python -m bench.gpu.build --prepare-headers unpacks them there.
    if os.path.exists(os.path.join(CARRIED_CUTLASS_INCLUDE, "cute", "tensor.hpp")):
        return CARRIED_CUTLASS_INCLUDE, None
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.origin:
        include = os.path.join(os.path.dirname(spec.origin), "source", "include")
        if os.path.exists(os.path.join(include, "cute", "tensor.hpp")):
            return include, None
    return None, (f"the CuTe headers are not installed (pip install {CUTLASS_PIN}) and "
                  f"{CARRIED_CUTLASS_INCLUDE} holds none")


def cuda_library_includes():
    """Include directories of the CUDA libraries that torch's CUDA headers name (cusparse.h,
    cublas_v2.h, ...), when the toolkit at CUDA_HOME lacks them and torch's pip packages of
    those libraries (nvidia/cu*/include) have them."""
    import torch
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME or ""
    if os.path.exists(os.path.join(home, "include", "cusparse.h")):
        return []
    site = os.path.dirname(os.path.dirname(torch.__file__))
    return [d for d in sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "include")))
            if os.path.exists(os.path.join(d, "cusparse.h"))]


def torch_system_include_flags():
    """-isystem for torch's C++ headers, which torch's BuildExtension names with -I (CMake's torch
    target already makes them system headers): a directory given both ways counts as a system one,
    and GCC leaves the warnings inside it to torch, whose own build silences them
    (torch.__config__.show(): -Wno-unknown-pragmas, -Wno-psabi). Without this, every per-ISA file
    of csrc/cpu reported ATen's `#pragma unroll` (meant for nvcc and clang; 69 lines) and two
    -Wpsabi notes (AVX vectors returned across ISA targets inside ATen's vector types, whose
    namespace is per ISA, so no call crosses). Our own sources keep every warning of -Wall."""
    from torch.utils import cpp_extension
    # Joined, one flag per directory: CMake drops repeated options, a second "-isystem" too.
    return [f"-isystem{path}" for path in cpp_extension.include_paths()]


def cuda_arch_flags(arch_list):
    """nvcc's -gencode flags for "8.0;9.0a"-style lists (";" or " " apart, "+PTX" adds the PTX).
    setup.py gives them explicitly rather than leaving them to torch: torch drops its own
    architecture flags whenever any nvcc flag contains the letters "arch", an include path under
    a directory named "research" too."""
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


def cuda_wanted(knobs, cuda_sources, log):
    import torch
    choice = (knobs.get("SCL_BUILD_CUDA") or "auto").strip().lower()
    if choice in ("0", "false", "no", "off"):
        log.append("SCL_BUILD_CUDA=0: building the CPU extension")
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
        _, why_not = cutlass_include(knobs)
        if why_not:
            missing.append(why_not)
    if choice != "auto":
        if missing:
            raise RuntimeError("SCL_BUILD_CUDA=1 cannot build the CUDA extension: " + "; ".join(missing))
        log.append(f"SCL_BUILD_CUDA=1: building the CUDA extension with {nvcc}")
        return True
    if missing:
        log.append("SCL_BUILD_CUDA=auto: building the CPU extension, as " + "; ".join(missing))
        return False
    log.append(f"SCL_BUILD_CUDA=auto: building the CUDA extension with {nvcc}")
    return True


def switched_on(knobs, name):
    """A 0 / 1 knob whose default is 0."""
    choice = (knobs.get(name) or "0").strip().lower()
    if choice in ("0", "false", "no", "off"):
        return False
    if choice not in ("1", "true", "yes", "on"):
        raise RuntimeError(f"{name}={choice!r}: expected 0 or 1")
    return True


def tests_wanted(knobs, log):
    if not switched_on(knobs, "SCL_BUILD_TESTS"):
        return False
    log.append("SCL_BUILD_TESTS=1: with the test suite's ops (csrc/testing)")
    return True


def require_linux(platform=sys.platform):
    """Only Linux is built and tested (GCC's flags, OpenMP, the profiling's /proc): refuse
    elsewhere before anything compiles, with what to do, rather than fail on a compiler flag."""
    if not platform.startswith("linux"):
        raise RuntimeError(f"scl_kernels builds on Linux only (this is {platform!r}): on macOS or "
                           "Windows, build it in a Linux container, a Linux VM or WSL2")


def describe(knobs=None):
    """The build for these knob values (default: the environment's)."""
    require_linux()
    knobs = {name: os.environ.get(name) for name in KNOBS} if knobs is None else knobs
    log = []
    tests = tests_wanted(knobs, log)
    debug_waits = switched_on(knobs, "SCL_CUDA_DEBUG_WAITS")
    cpu_arch_flags = shlex.split(knobs.get("SCL_CPU_ARCH_FLAGS") or "")
    log.append(f"CPU ISA flags: {' '.join(cpu_arch_flags) or 'none (portable; SCL_CPU_ARCH_FLAGS adds some)'}")
    cuda_sources = sources(CUDA_SOURCE_PATTERNS)
    build = Build(cuda=cuda_wanted(knobs, [s for s in cuda_sources if s.endswith(".cu")], log),
                  cxx_sources=sources(CXX_SOURCE_PATTERNS),
                  cxx_flags=[*CXX_FLAGS, *cpu_arch_flags, *torch_system_include_flags()],
                  link_flags=list(LINK_FLAGS), include_dirs=[os.path.join(ROOT, "csrc")], log=log)
    if build.cuda:
        build.cuda_sources = cuda_sources
        build.cuda_arch_list = (knobs.get("SCL_CUDA_ARCH_LIST") or "").strip() or DEFAULT_CUDA_ARCH_LIST
        cuda_arch_flags(build.cuda_arch_list)  # rejects a malformed list before anything compiles
        build.nvcc_flags = list(NVCC_FLAGS)
        if debug_waits:
            build.nvcc_flags.append(DEBUG_WAITS_FLAG)
            log.append("SCL_CUDA_DEBUG_WAITS=1: every mbarrier wait traps after about a second (a debug build)")
        build.defines = list(CUDA_DEFINES)
        build.include_dirs += cuda_library_includes()
        build.cuda_include_dirs = [cutlass_include(knobs)[0]]
        log.append(f"CUDA architectures: {build.cuda_arch_list}; CuTe headers: {build.cuda_include_dirs[0]}")
    else:
        build.defines = list(CUDA_DRY_RUN_DEFINES)
        if tests:
            build.cxx_sources += sources(CUDA_DRY_RUN_SOURCE_PATTERNS)
            log.append("the CUDA backend's host code as a dry run (launches recorded, not made)")
    if tests:
        build.cxx_sources += sources(TEST_SOURCE_PATTERNS)
    return build


def cmake_script(build):
    """The build as CMake variables (absolute paths), with its decisions as STATUS messages."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    def escaped(text):  # inside a CMake quoted argument
        return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")

    def cmake_string(text):
        return f'"{escaped(text)}"'

    def cmake_list(items):
        return '"' + ";".join(escaped(str(i)).replace(";", "\\;") for i in items) + '"'

    def absolute(paths):
        return [p if os.path.isabs(p) else os.path.join(ROOT, p) for p in paths]

    variables = {
        "SCL_WITH_CUDA": ["ON" if build.cuda else "OFF"],
        "SCL_CXX_SOURCES": absolute(build.cxx_sources),
        "SCL_CUDA_SOURCES": absolute(build.cuda_sources),
        "SCL_CXX_FLAGS": build.cxx_flags,
        # nvcc gets what torch's CUDAExtension gives it (its COMMON_NVCC_FLAGS: the __CUDA_NO_HALF*
        # defines, --expt-relaxed-constexpr), then ours.
        "SCL_NVCC_FLAGS": [*COMMON_NVCC_FLAGS, *build.nvcc_flags] if build.cuda else [],
        "SCL_LINK_FLAGS": build.link_flags,
        "SCL_DEFINES": build.defines,
        "SCL_INCLUDE_DIRS": build.include_dirs,
        "SCL_CUDA_INCLUDE_DIRS": build.cuda_include_dirs,
        "SCL_CUDA_ARCH_LIST": [build.cuda_arch_list],
        # Directories whose contents (files added or removed) make CMake run this file again.
        "SCL_SOURCE_DIRS": sorted({os.path.dirname(p) for p in
                                   absolute(CXX_SOURCE_PATTERNS + CUDA_SOURCE_PATTERNS
                                            + CUDA_DRY_RUN_SOURCE_PATTERNS
                                            + TEST_SOURCE_PATTERNS)}),
    }
    lines = [f"message(STATUS {cmake_string('scl_kernels: ' + line)})" for line in build.log]
    lines += [f"set({name} {cmake_list(values)})" for name, values in variables.items()]
    return "\n".join(lines) + "\n"


def main(argv):
    """`cmake [NAME=VALUE ...]`: prints the build as a CMake script; NAME=VALUE pairs (knobs given
    to CMake with -D) override the environment's knobs. `knobs`: their names, as a CMake list."""
    if argv == ["knobs"]:
        sys.stdout.write(";".join(KNOBS))
        return
    if not argv or argv[0] != "cmake":
        sys.exit(f"usage: {os.path.basename(__file__)} cmake [KNOB=VALUE ...] | knobs; "
                 f"knobs: {', '.join(KNOBS)}")
    knobs = {name: os.environ.get(name) for name in KNOBS}
    for pair in argv[1:]:
        name, _, value = pair.partition("=")
        if name not in KNOBS:
            sys.exit(f"{name!r} is not a knob; knobs: {', '.join(KNOBS)}")
        knobs[name] = value
    try:
        sys.stdout.write(cmake_script(describe(knobs)))
    except RuntimeError as error:
        sys.exit(f"scl_kernels: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
