"""Progress of the fine-tuning loop: plain lines, not a redrawn bar, in a redirected log."""
import sys

from scl_kernels.finetune.progress import PlainProgress, progress_bar


def test_redirected_progress_prints_a_line_per_tenth(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    bar = progress_bar(40, "train", True)
    assert isinstance(bar, PlainProgress)
    for step in range(40):
        bar.set_postfix(loss=f"{step:.1f}")
        bar.update()
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("train: 4/40 (") and lines[-1].startswith("train: 40/40 (")
    assert "\r" not in "".join(lines) and lines[-1].endswith("loss=39.0)")


def test_transient_and_disabled_progress_print_nothing(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    for bar in (progress_bar(5, "eval", True, leave=False), progress_bar(5, "train", False)):
        for _ in range(5):
            bar.update()
        bar.close()
    assert capsys.readouterr().err == ""
