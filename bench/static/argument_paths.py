"""How many files one argument of the op crosses on its way to each backend's kernels.

The rule: a file counts when its code names the value (an identifier, a schema string, a struct
field; comments and docstrings do not count), among the files a call passes through for that
backend; the dispatcher's routing files count whatever they name. A value goes by several names
on its way (the temperature is ``temperature``, ``inv_t``, ``Temperature``, ...): give them all.

    python -m bench.static.argument_paths temperature inv_t Temperature KernelTemperature
    python -m bench.static.argument_paths --rev a199647 focal_gamma gamma

It reads the working tree, or the files of a commit through git (``--rev``), so that two commits
are counted by the same rule in one run.
"""
import argparse
import fnmatch
import io
import pathlib
import re
import subprocess
import tokenize
from typing import Dict, List, Optional, Sequence, Tuple

# The files every call passes through: the Python front, the C++ core and its autograd.
_FRONT = ("scl_kernels/functional.py", "scl_kernels/_validation.py",
          "scl_kernels/backends/__init__.py", "csrc/supcon_autograd.h", "csrc/core/*")
# The dispatcher's routing files, counted on every path that crosses them.
_ROUTING = ("csrc/scl_ops.cpp", "csrc/autograd.cpp")
PATHS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    # backend: (its own files, its routing files)
    "cpu": (("csrc/cpu/*",), ()),
    "triton": (("csrc/triton/*", "scl_kernels/backends/triton/*.py"),
               ("scl_kernels/backends/triton/registration.py",)),
    "cuda": (("csrc/cuda/*",), ()),
}


_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(_ROOT), *args], check=True, capture_output=True,
                          text=True).stdout


def _files(rev: Optional[str]) -> List[str]:
    if rev is not None:
        return _git("ls-tree", "-r", "--name-only", rev).split()
    return [str(p.relative_to(_ROOT)) for p in _ROOT.rglob("*") if p.is_file()]


def _read(rev: Optional[str], path: str) -> str:
    if rev is not None:
        return _git("show", f"{rev}:{path}")
    return (_ROOT / path).read_text()


def _code(path: str, text: str) -> str:
    """The text without its comments (and, in Python, its docstrings)."""
    if path.endswith(".py"):
        kept: List[str] = []
        previous = tokenize.NEWLINE
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            statement_start = previous in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT,
                                           tokenize.DEDENT)
            previous = token.type
            if token.type == tokenize.COMMENT:
                continue
            if token.type == tokenize.STRING and statement_start:
                continue  # a docstring, or a string standing alone as a statement
            kept.append(token.string)
        return " ".join(kept)
    without_blocks = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", without_blocks)


def names_in(path: str, text: str, names: Sequence[str]) -> List[str]:
    """Which of ``names`` the code of the file names, as whole words."""
    code = _code(path, text)
    return [name for name in names if re.search(rf"\b{re.escape(name)}\b", code)]


def count(names: Sequence[str], rev: Optional[str] = None
          ) -> Dict[str, List[Tuple[str, List[str]]]]:
    """Per backend, the files on its path that name the value, with the names each uses: the
    files of commit ``rev``, or of the working tree."""
    files = _files(rev)
    found: Dict[str, List[Tuple[str, List[str]]]] = {}
    for backend, (own, routing) in PATHS.items():
        patterns = (*_FRONT, *own)
        on_path = {f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns)}
        rows = []
        for path in sorted(on_path | set(_ROUTING) | set(routing)):
            named = names_in(path, _read(rev, path), names)
            if named or path in _ROUTING or path in routing:
                rows.append((path, named))
        found[backend] = rows
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", help="the names the value goes by")
    parser.add_argument("--rev", help="the commit whose files are read (default: the working "
                        "tree)")
    args = parser.parse_args()
    for backend, rows in count(args.names, args.rev).items():
        print(f"{backend}: {len(rows)} files ({args.rev or 'working tree'})")
        for path, named in rows:
            print(f"  {path}: {', '.join(named) if named else '(routing)'}")


if __name__ == "__main__":
    main()
