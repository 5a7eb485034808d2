"""The library with its CUDA C++ kernels, built in place on a GPU machine that reaches no package
index (the device tool's), and the CuTe headers that build needs, prepared beforehand where an
index is reachable.

    python -m bench.gpu.build --prepare-headers     # here, before the call: fills .cutlass/include
    python -m bench.gpu.build --log build.log       # there: sm_90a, the system's c++, then checks

The headers. The build reads the CuTe / CUTLASS headers of the pinned nvidia-cutlass wheel
(csrc/build_description.py: SCL_CUTLASS_INCLUDE, else the installed wheel). A GPU machine of the
device tool reaches no index, so the headers travel with the call: `--prepare-headers` downloads
the pinned wheel and unpacks its include folder (about 27 MB) into `.cutlass/include` at the
repository's root, which .gitignore lists; the device call names `.cutlass` in its `carry`, and
the headers are found there without SCL_CUTLASS_INCLUDE. Where none are found and no index
answers within seconds, the build refuses at once in one line.

The compiler is the system's `c++`, not an inherited CXX: on the device tool's image CXX names a
wrapper whose objects crashed (SIGSEGV in std::ostream) whenever a TORCH_CHECK formatted an
integer (bench/results/gpu_h200_2026-11-26/README.md). SCL_GPU_CXX overrides. After the build a
bad argument on CUDA tensors must raise ValueError: a library built against another libstdc++
crashes there instead.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from bench.harness.report import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "csrc"))
from build_description import (CARRIED_CUTLASS_INCLUDE, CUTLASS_PIN,  # noqa: E402
                               cutlass_include)

WHEEL_INCLUDE = "cutlass_library/source/include/"
INDEX_PROBE_SECONDS = 20

# Run in a fresh interpreter after the build: the kernels are registered, and an error on CUDA
# tensors is an exception, not a crash.
_CHECK_CUDA = """
import torch, scl_kernels
assert scl_kernels.backends.cuda_kernels_built(), "no CUDA kernels registered"
x = torch.randn(6, 4, device="cuda")
try:
    torch.ops.scl.supcon(x, torch.zeros(6, dtype=torch.long, device="cuda"), None, None,
                         torch.tensor(0.1), 6, True, anchor_offset=-1)
except ValueError as error:
    print("CUDA kernels registered; a bad argument on CUDA tensors raises ValueError:",
          str(error)[:60])
else:
    raise SystemExit("anchor_offset=-1 was accepted on CUDA tensors")
"""
# The rehearsal on a machine without a GPU (bench/gpu/session.py --rehearsal): the library that is
# already built loads and runs its CPU kernel.
_CHECK_CPU = """
import torch, scl_kernels
loss = scl_kernels.supcon_loss(torch.randn(8, 4), torch.arange(8) % 2, 0.1, backend="cpu")
print("library loads; cpu backend loss", round(loss.item(), 4))
"""


def headers():
    """The CuTe headers' folder the build will use (SCL_CUTLASS_INCLUDE, else the carried
    `.cutlass/include`, else the installed wheel's), None where there are none."""
    return cutlass_include(os.environ)[0]


def index_reachable():
    """Whether pip can fetch the pinned wheel within seconds (never on the device tool's machine)."""
    with tempfile.TemporaryDirectory() as scratch:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--timeout", "5",
                 "--retries", "0", "-d", scratch, CUTLASS_PIN],
                capture_output=True, timeout=INDEX_PROBE_SECONDS)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def prepare_headers(destination=CARRIED_CUTLASS_INCLUDE):
    """Downloads the pinned wheel and unpacks its include folder into `destination`."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", scratch,
                        CUTLASS_PIN], check=True)
        [wheel] = glob.glob(os.path.join(scratch, "*.whl"))
        unpacked = os.path.join(scratch, "unpacked")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(unpacked, [n for n in archive.namelist() if n.startswith(WHEEL_INCLUDE)])
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(os.path.join(unpacked, WHEEL_INCLUDE), destination)
    return destination


def missing_headers_line():
    """One line where the build cannot have its headers, else None."""
    found, why = cutlass_include(os.environ)
    if found is not None or index_reachable():
        return None  # where an index answers, the build installs the pinned wheel itself
    return (f"refused: no CuTe headers ({why}) and no package index answers: run `python -m bench.gpu.build --prepare-headers` where one "
            "does, and carry .cutlass")


def build(log_path, arch_list):
    """Compiles the library in place; returns (ok, lines to show)."""
    env = dict(os.environ, SCL_BUILD_CUDA="1", SCL_BUILD_TESTS="1",
               SCL_CUDA_ARCH_LIST=arch_list, CXX=os.environ.get("SCL_GPU_CXX", "c++"))
    if headers() is None:  # an index answers (missing_headers_line): the wheel is installed
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", CUTLASS_PIN], check=False)
    start = time.monotonic()
    with open(log_path, "w") as log:
        done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=REPO_ROOT,
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    with open(log_path) as log:
        text = log.read().splitlines()
    if done.returncode != 0:
        return False, [f"build failed (exit {done.returncode}) after "
                       f"{time.monotonic() - start:.0f} s; its last lines:"] + text[-40:]
    summary = sorted({line.strip() for line in text if line.lstrip().startswith("scl_kernels build")})
    return True, summary + [f"built in {time.monotonic() - start:.0f} s ({arch_list})"]


def check_library(device):
    """(ok, output) of the fresh interpreter's check of the built library."""
    done = subprocess.run([sys.executable, "-c", _CHECK_CUDA if device == "cuda" else _CHECK_CPU],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--prepare-headers", action="store_true",
                        help=f"unpack {CUTLASS_PIN}'s headers into .cutlass/include and exit")
    parser.add_argument("--log", default=os.path.join(REPO_ROOT, "build", "gpu_build.log"),
                        help="the compilers' whole output (default %(default)s)")
    parser.add_argument("--arch-list", default=os.environ.get("SCL_CUDA_ARCH_LIST", "9.0a"),
                        help="SCL_CUDA_ARCH_LIST of the build (default %(default)s)")
    parser.add_argument("--check-headers", action="store_true",
                        help="say which CuTe headers a build would use, or refuse in one line "
                             "(exit 2), and exit")
    parser.add_argument("--check-only", choices=("cuda", "cpu"),
                        help="compile nothing: check the library already built (cpu: the "
                             "session's rehearsal without a GPU)")
    args = parser.parse_args(argv)
    if args.prepare_headers:
        print("CuTe headers in", prepare_headers())
        return 0
    if args.check_headers or args.check_only is None:
        refusal = missing_headers_line()
        if refusal:
            print(refusal)
            return 2
        if args.check_headers:
            print("CuTe headers:", headers() or f"none yet: the build installs {CUTLASS_PIN}")
            return 0
        os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
        ok, lines = build(args.log, args.arch_list)
        print("\n".join(lines), flush=True)
        if not ok:
            return 1
    ok, output = check_library(args.check_only or "cuda")
    print(output)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
