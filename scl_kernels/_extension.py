"""Loads the compiled library that registers torch.ops.scl; a library that cannot load is loud.

The package stays importable without the library (a source checkout that was never built, a
library built for another torch): the dense ``backend="reference"`` still works, the import warns
once (RuntimeWarning) with the reason, and the fused backends raise that same reason
(require_library). The reason names the loader's own error, the torch the library was built for
(read from the file without loading it: csrc/scl_ops.cpp writes it there) and the torch running.
A library built for another minor release of torch is not loaded at all: its symbols would not
resolve, or worse, resolve to changed functions.

``SCL_KERNELS_LIBRARY=/path/to/lib.so`` loads another build of the same sources (CI uses it to
test the CMake build); a path that names no file is an error at import.
"""
import importlib
import importlib.util
import mmap
import os
import re
import warnings

import torch

BUILD_INFO_MARKER = b"scl_kernels build info: torch "
BUILD_COMMAND = "pip install --no-build-isolation ."


def _library_path():
    """The library to load: SCL_KERNELS_LIBRARY's, else the package's own _C, else None."""
    override = os.environ.get("SCL_KERNELS_LIBRARY")
    if override:
        if not os.path.isfile(override):
            hint = ""
            if any(c in override for c in "*?["):
                hint = (" (the shell does not expand a glob in an assignment: write "
                        "SCL_KERNELS_LIBRARY=$(ls build/cmake/_C.*.so))")
            raise FileNotFoundError(f"SCL_KERNELS_LIBRARY={override!r} names no file{hint}; "
                                    "unset it to load the installed library")
        return os.path.abspath(override)
    spec = importlib.util.find_spec("scl_kernels._C")
    return spec.origin if spec is not None else None


def _build_info(path):
    """What the library at path says it was built for ("2.13.0, CPU only"), or None."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            start = data.find(BUILD_INFO_MARKER)
            if start < 0:
                return None
            start += len(BUILD_INFO_MARKER)
            return data[start:data.find(b"\0", start)].decode(errors="replace")
    except (OSError, ValueError):
        return None


def _minor_release(version):
    """(major, minor) of "2.13.0+cpu" or "2.13.0, CPU only"."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return match.groups() if match else None


def _load():
    """None when the library loaded, else an ImportError that says why."""
    path = _library_path()
    if path is None:
        return ImportError(f"scl_kernels._C is not built: build it with `{BUILD_COMMAND}` "
                           "(a source checkout imported without installing has no library)")
    built_for = _build_info(path)
    versions = f"built for torch {built_for or '(not recorded)'}, running torch {torch.__version__}"
    if built_for is not None and _minor_release(built_for) != _minor_release(torch.__version__):
        return ImportError(f"{path}: {versions}: rebuild it against this torch "
                           f"(`{BUILD_COMMAND}` in this environment)")
    try:
        if os.environ.get("SCL_KERNELS_LIBRARY"):
            torch.ops.load_library(path)
        else:
            importlib.import_module("scl_kernels._C")  # importing registers the ops
    except (ImportError, OSError) as error:
        # torch.ops.load_library wraps the dynamic loader's error: report the loader's own words.
        loader_error = error.__cause__ or error
        failure = ImportError(f"{path} failed to load ({versions}): {loader_error}")
        failure.__cause__ = error
        return failure
    return None


_load_error = _load()
if _load_error is not None:
    warnings.warn(f"scl_kernels' compiled library is not available, only backend='reference' "
                  f"runs: {_load_error}", RuntimeWarning, stacklevel=2)


def library_loaded() -> bool:
    return _load_error is None


def require_library() -> None:
    if _load_error is not None:
        raise RuntimeError(f"scl_kernels' compiled library is not available: {_load_error} "
                           "(backend='reference' runs without it)") from _load_error
