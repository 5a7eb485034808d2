"""Each measured figure is written once, dated, and the other places link to it: a count or a time
copied into a second document goes stale there first (the README once quoted test counts that
its own command no longer printed)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DURATION = re.compile(r"\b\d+ min\b|\b\d+(\.\d+)? s\b|\bminutes\b")


def _heading_anchors(markdown):
    """GitHub's anchors of a markdown file's headings."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _paragraph_with(text, phrase):
    for paragraph in text.split("\n\n"):
        if phrase in paragraph:
            return paragraph
    raise AssertionError(f"no paragraph says {phrase!r}")


def test_readme_quotes_no_test_counts():
    """The counts of the last CI run live in bench/PERFORMANCE.md, dated; the README links there."""
    assert not re.search(r"\d[\d,]* passed|\d[\d,]* skipped", README)
    assert "bench/PERFORMANCE.md#the-test-suite-on-a-busy-machine" in README


def test_linked_sections_exist():
    for document, anchor in re.findall(r"\]\(((?:bench|docs)/[A-Z_]+\.md)#([\w\-]+)\)", README):
        assert anchor in _heading_anchors((ROOT / document).read_text()), (document, anchor)


def test_fine_tuning_demo_time_is_written_in_finetuning_only():
    """README and `scl-finetune --help` point at docs/FINETUNING.md's measured table instead of
    giving the demo's time a way of their own."""
    readme_demo = _paragraph_with(README, "Without arguments, an offline demo")
    assert "docs/FINETUNING.md#the-one-command-demo" in readme_demo
    assert not DURATION.search(readme_demo)
    pytest.importorskip("transformers")
    from scl_kernels.finetune.cli import build_parser
    epilog = build_parser().epilog
    assert "'The one-command demo'" in epilog
    assert not DURATION.search(epilog.split("Without arguments")[1].split(").")[0])
    assert "the-one-command-demo" in _heading_anchors((ROOT / "docs/FINETUNING.md").read_text())
