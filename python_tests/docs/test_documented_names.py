"""Every name of the package and every ``python -m`` module that README.md and docs/ mention
exists, so the documents cannot drift from the code unnoticed."""
import importlib
import importlib.util
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Optional dependencies whose absence makes a documented name unresolvable here, not wrong.
OPTIONAL = ("transformers", "sentence_transformers", "accelerate", "datasets", "sklearn",
            "matplotlib", "tqdm", "triton", "pytorch_metric_learning")


def _mentions(pattern):
    found = set()
    for document in DOCUMENTS:
        for match in re.finditer(pattern, document.read_text(encoding="utf-8")):
            found.add((document.relative_to(REPO).as_posix(), match.group(1).rstrip(".")))
    return sorted(found)


def _resolve(dotted):
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        module_name = ".".join(parts[:split])
        try:
            target = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and error.name.split(".")[0] in OPTIONAL:
                pytest.skip(f"{dotted} needs {error.name}, not installed here")
            if not module_name.startswith(error.name or "\0"):  # a dependency, not this name
                raise
            continue  # no such module: the rest of the name may be attributes
        for attribute in parts[split:]:
            try:
                target = getattr(target, attribute)
            except ImportError as error:  # a lazily loaded name whose optional dependency is absent
                cause = error.__cause__
                if isinstance(cause, ModuleNotFoundError) and (cause.name or "").split(".")[0] in OPTIONAL:
                    pytest.skip(f"{dotted} needs {cause.name}, not installed here")
                raise
        return target
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("document, name", _mentions(r"\b(scl_kernels(?:\.\w+)+)"))
def test_documented_package_name_exists(document, name):
    try:
        _resolve(name)
    except (AttributeError, ModuleNotFoundError) as error:
        pytest.fail(f"{document} mentions {name}, which does not exist ({error})")


def _command_module_exists(module):
    """Whether ``python -m module`` finds something to run. The benchmarks are looked up as files:
    finding a submodule imports its packages, and the tests import nothing of bench."""
    if module.split(".")[0] != "bench":
        return importlib.util.find_spec(module) is not None
    path = REPO.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


@pytest.mark.parametrize("document, module", _mentions(r"python3? -m ((?:scl_kernels|bench)(?:\.\w+)*)"))
def test_documented_command_module_exists(document, module):
    assert _command_module_exists(module), f"{document} runs `python -m {module}`, which does not exist"
