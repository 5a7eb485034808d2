"""Every Python block of README.md and docs/ works as written.

A block runs whole, on the CPU, unless the line before it marks it as a fragment:
``<!-- fragment: model, batch, labels -->`` names what the reader brings (a model, data, a process
group). A fragment's imports still run, and every name it uses must be imported, defined in it,
a builtin, or named in its marker: a missing import fails here before a reader finds it.
"""
import ast
import builtins
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!-- fragment: ([^>]*?) -->\n)?```python\n(.*?)```", re.DOTALL)
OPTIONAL = ("transformers", "sentence_transformers", "accelerate", "datasets", "sklearn",
            "matplotlib", "tqdm", "triton", "pytorch_metric_learning")


def _blocks():
    found = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(2)) + 1
            given = None if match.group(1) is None else {n.strip() for n in match.group(1).split(",")}
            found.append(pytest.param(match.group(2), given,
                                      id=f"{document.relative_to(REPO).as_posix()}:{line}"))
    return found


def _free_names(tree):
    """Names the block reads but never binds (imports, assignments, defs, arguments, loops)."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound - set(dir(builtins))


def _missing_optional_module(error):
    """The optional package whose absence caused ``error`` (the integrations re-raise it as an
    ImportError that says how to install it), or None."""
    while error is not None:
        name = getattr(error, "name", None)
        if name and name.split(".")[0] in OPTIONAL:
            return name
        error = error.__cause__
    return None


def _run_imports(tree):
    imports = ast.Module([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], [])
    exec(compile(imports, "<imports>", "exec"), {})


@pytest.mark.parametrize("source, given", _blocks())
def test_documented_block_runs(source, given, tmp_path, monkeypatch):
    tree = ast.parse(source)
    monkeypatch.chdir(tmp_path)
    try:
        if given is None:
            exec(compile(tree, "<block>", "exec"), {"__name__": "__snippet__"})
            return
        _run_imports(tree)
    except ImportError as error:
        missing = _missing_optional_module(error)
        if missing:
            pytest.skip(f"needs {missing}, not installed here")
        raise
    missing = _free_names(tree) - given
    assert not missing, f"the fragment uses {sorted(missing)} without importing or naming them"
