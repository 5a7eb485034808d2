"""What no tracked file says: numbers of an issue tracker the repository does not have ("issue N",
"task N", "(#N)"), which a reader cannot follow, and paths of the machine a result was made on
(a scratch folder, a home directory, an absolute site-packages), which name nothing on another.
Every file git tracks or would add (``git ls-files --cached --others --exclude-standard``) is
read, the benchmarks' results and decisions included; binary files are skipped. Another
project's numbers stay where the project is named before them ("sentence-transformers #2732",
"triton PR #667")."""
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# "issue 38", "Issue #12", "task 45", "tickets 3": but not a GPU's instruction issue ("issue 1,876
# of 2,048 cycles", "host issue 1.81 ms", "issue 1318 cycles").
TRACKER_WORD = re.compile(r"\b(?:issue|task|ticket)s?\s+#?\d{1,4}\b(?![.,]\d)(?!\s+cycles)",
                          re.IGNORECASE)
# "(#40)": a bare number in parentheses, as a tracker's own links read.
TRACKER_PARENTHESISED = re.compile(r"\(#\d{1,5}\)")
# "#40" anywhere else: flagged unless a project's name comes before it (the word before, or the
# word before "PR" / "issue"), so "see #40" and "PR #40" are ours, "sentence-transformers #2732"
# another project's.
BARE_NUMBER = re.compile(r"(?<![\w&/#])#\d{1,5}\b")
NOT_A_PROJECT = {"", "issue", "issues", "task", "tasks", "ticket", "tickets", "pr", "prs", "pull",
                 "request", "see", "in", "at", "fixes", "fixed", "closes", "closed", "resolves",
                 "per", "from", "of", "and", "or", "by", "cf", "also", "the", "a", "an", "to"}
# A scratch folder or a home directory of the machine (/tmp/x, /work/x, /root/x, /home/x, ...),
# or an absolute path into an environment's site-packages.
MACHINE_PATH = re.compile(r"(?<![\w.~$}\-])/(?:tmp|work|root|home|Users|mnt|scratch)/[\w.\-]"
                          r"|(?:/[\w.+\-]+)+/(?:site|dist)-packages/"
                          r"|\b[A-Za-z]:\\+Users\\+")

# The files allowed to say these, and why. Kept to this one: a finding is fixed, not listed.
ALLOWED = {"python_tests/docs/test_text_hygiene.py": "its planted examples"}


def _previous_word(text):
    words = re.findall(r"[\w.\-/]+", text)
    return words[-1].lower() if words else ""


def _bare_number_is_ours(line, start):
    before = line[:start]
    word = _previous_word(before)
    if word in ("pr", "prs", "issue", "issues", "pull", "request"):
        before = before[:before.lower().rstrip().rfind(word)]
        word = _previous_word(before)
    return word in NOT_A_PROJECT


def findings(text):
    """(line number, what) for each tracker number and machine path in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in (TRACKER_WORD, TRACKER_PARENTHESISED, MACHINE_PATH):
            found += [(number, match.group(0)) for match in pattern.finditer(line)]
        found += [(number, match.group(0)) for match in BARE_NUMBER.finditer(line)
                  if _bare_number_is_ours(line, match.start())
                  and not TRACKER_PARENTHESISED.match(line, match.start() - 1)]
    return found


def tracked_text_files():
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=REPO, capture_output=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an sdist): nothing lists the tracked files")
    for name in listed.decode().split("\0"):
        path = REPO / name
        if not name or name in ALLOWED or not path.is_file():  # is_file: not deleted, not a link
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary: an image, a compiled file
        yield name, data.decode("utf-8", errors="replace")


@pytest.mark.parametrize("planted, expected", [
    ("Measured for issue 38, item 6.", "issue 38"),
    ("(Issue #12's rule)", "Issue #12"),
    ("as task 45 asks", "task 45"),
    ("the launchers (#40) are faster", "(#40)"),
    ("see #40 for the rule", "#40"),
    ("python -m bench.x --out /tmp/cg/res/run1", "/tmp/c"),
    ("built in /work/main/build", "/work/m"),
    ("model: /home/u/gt/model", "/home/u"),
    ("from /opt/conda/lib/python3.11/site-packages/torch",
     "/opt/conda/lib/python3.11/site-packages/"),
])
def test_a_planted_example_is_found(planted, expected):
    assert expected in [what for _, what in findings(planted)]


@pytest.mark.parametrize("text", [
    "sentence-transformers #2732 fixed the cache",
    "triton PR #667 changed the launcher",
    "the tile's issue 1,876 -> 1,372 of 2,048 tensor cycles",
    "host issue 1.81 -> 1.68 ms; issue 1318 cycles",
    'assert "docs/FINETUNING.md #1" in blocks',
    "work=${TMPDIR:-/tmp}/scl-ci.XXXXXX",
    "CUDA_HOME=/usr/local/cuda; TRITON = \"/site-packages/triton\"",
    "docs/MATH.md#9-focal-contrastive-loss and the colour #1f77b4",
    "issue-slot model; issues slots",
])
def test_what_is_not_a_finding(text):
    assert findings(text) == []


def test_no_tracked_file_cites_a_tracker_number_or_a_machine_path():
    found = [f"{name}:{number}: {what}" for name, text in tracked_text_files()
             for number, what in findings(text) if what not in ALLOWED.get(name, ())]
    assert found == [], ("tracker numbers or machine paths in tracked files (say what is meant, "
                         "or give a path relative to the checkout):\n" + "\n".join(found))
