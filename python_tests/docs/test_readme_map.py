"""The README's map of the checkout ("Where things are") names every part of the package: each
subpackage of scl_kernels and each of its top-level modules, so that a module added or moved
cannot go unmentioned."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "scl_kernels"


def readme_map():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("```", text.index("**Where things are.**"))
    return text[start:text.index("```", start + 3)]


def package_parts():
    modules = {path.stem for path in PACKAGE_DIR.glob("*.py") if path.stem != "__init__"}
    packages = {path.parent.name for path in PACKAGE_DIR.glob("*/__init__.py")}
    return sorted(modules | packages)


def test_the_map_names_every_part_of_the_package():
    text = readme_map()
    assert "scl_kernels/functional.py" in text  # the block is the map
    missing = [part for part in package_parts() if not re.search(rf"(?<![\w.]){part}\b", text)]
    assert missing == [], f"README.md's map does not name {missing}"
