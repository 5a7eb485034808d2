"""Builds scl_kernels._C, the library that registers torch.ops.scl; the metadata is in pyproject.toml.

The sources, flags and knobs (SCL_BUILD_CUDA, SCL_CUDA_ARCH_LIST, SCL_CUTLASS_INCLUDE,
SCL_CPU_ARCH_FLAGS, MAX_JOBS) are described in csrc/build_description.py, which CMakeLists.txt
reads too.
"""
import importlib.util
import os
import re
import sys
import threading
import time

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


class TerminalProgress:
    """One line per compiled file on the terminal while the build runs, also under pip, which
    captures a build's output and shows it only with -v or on failure ("still running..." for
    minutes otherwise). The lines go to /dev/tty, never into the captured output: only when this
    process's stdout is not a terminal itself (where ninja's lines already show) and a terminal
    can be opened (not in CI or a detached job); SCL_BUILD_PROGRESS=0 turns them off.
    ``pip install -v`` still shows all of ninja's output, those lines included."""

    # ninja prints "[finished/total] command" as each step ends when its output is not a terminal.
    STEP = re.compile(r"^\[(\d+)/(\d+)\] ")
    SOURCE = re.compile(r"(?:^|\s)(\S+\.(?:cpp|cu|cc|c))(?:\s|$)")

    def __init__(self, write, root=ROOT, clock=time.monotonic):
        self.write, self.root, self.clock = write, root, clock
        self.start = clock()
        # The first line starts a line of its own: pip's "Building ... -" spinner is on the
        # terminal's current one. Later ones overwrite the spinner's character at its start.
        self.line_start = "\n"

    @classmethod
    def to_terminal(cls):
        """A TerminalProgress writing to /dev/tty, or None where it should stay quiet."""
        if os.environ.get("SCL_BUILD_PROGRESS", "1") == "0" or os.isatty(1):
            return None
        try:
            tty = open("/dev/tty", "w", buffering=1)
        except OSError:  # no controlling terminal
            return None
        return cls(tty.write)

    def _say(self, text):
        seconds = int(self.clock() - self.start)
        self.write(f"{self.line_start}scl_kernels build ({seconds // 60}:{seconds % 60:02d}): "
                   f"{text}\n")
        self.line_start = "\r"

    def begin(self):
        self._say("building the C++ extension with ninja (from scratch: 3-5 minutes on two cores; "
                  "MAX_JOBS: parallel compiles)")

    def line(self, text):
        """Reads one line of the build's output."""
        step = self.STEP.match(text)
        if step:
            source = self.SOURCE.search(text[step.end():])
            what = os.path.relpath(source.group(1), self.root) if source else "a step"
            self._say(f"[{step.group(1)}/{step.group(2)}] {what} done")
        elif text.startswith("ninja: no work to do"):
            self._say("every object file is up to date, nothing to compile")

    def end(self):
        self._say("ninja done; linking and installing")


def tee_stdout(progress, run):
    """Runs ``run()`` with file descriptor 1 (where ninja writes) passed through a pipe: every
    byte still reaches the original stdout, and each line is shown to ``progress``."""
    sys.stdout.flush()
    original = os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.close(write_end)

    def pump():
        pending, reporting = b"", True
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(original, view):]
                *lines, pending = (pending + chunk).split(b"\n")
                try:
                    for line in lines if reporting else ():
                        progress.line(line.decode(errors="replace"))
                except Exception:  # noqa: BLE001 - progress is a nicety: keep the pipe drained,
                    reporting = False  # or ninja would block on it

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        return run()
    finally:
        sys.stdout.flush()
        os.dup2(original, 1)  # closes the pipe's last write end: the reader sees its end
        reader.join()
        os.close(original)


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

    def build_extensions(self):
        progress = TerminalProgress.to_terminal()
        if progress is None:
            return super().build_extensions()
        progress.begin()
        tee_stdout(progress, super().build_extensions)
        progress.end()


if __name__ == "__main__":  # also under pip and python -m build; tests import the helpers
    setup(
        ext_modules=[extension(load_build_description())],
        cmdclass={"build_ext": BuildInPersistentDirectory},
    )
