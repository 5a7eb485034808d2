"""The "Predicting with a saved model" block of docs/FINETUNING.md (and any copy of it in
README.md, found by the same marker), run as written on a folder that ``scl-finetune
--save-models`` wrote: it must reproduce the run's own test scores, so the documented way to
predict cannot drift from the way the command line scored."""
import ast
import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sklearn")

from scl_kernels.finetune import cli  # noqa: E402
from scl_kernels.finetune.calibration import expected_calibration_error  # noqa: E402
from test_finetune_cli import save_tiny_model, sentences, write_csv  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- fragment: a folder written by scl-finetune --save-models -->"


def documented_blocks():
    """``{document: block}`` for every block after the marker; docs/FINETUNING.md must have one."""
    blocks = {}
    for document in ("docs/FINETUNING.md", "README.md"):
        text = (REPO / document).read_text(encoding="utf-8")
        for number, match in enumerate(re.finditer(re.escape(MARKER) + r"\n```python\n(.*?)```",
                                                   text, re.DOTALL)):
            blocks[f"{document} #{number + 1}"] = match.group(1)
    assert "docs/FINETUNING.md #1" in blocks, f"docs/FINETUNING.md has no Python block after {MARKER}"
    return blocks


def with_texts(source, name):
    """The block with its ``texts = [...]`` replaced by the variable ``name``."""
    tree = ast.parse(source)
    assignments = [node for node in tree.body if isinstance(node, ast.Assign)
                   and [getattr(target, "id", None) for target in node.targets] == ["texts"]]
    assert len(assignments) == 1, "the block must set its example sentences as texts = [...]"
    assignments[0].value = ast.Name(name, ast.Load())
    return compile(ast.fix_missing_locations(tree), "<FINETUNING.md block>", "exec")


@pytest.mark.parametrize("embedding", ["mean", "first_token"])
def test_the_documented_snippet_predicts_as_the_run_scored(embedding, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the block reads the default --output-dir, scl_finetune_output
    test_rows = sentences(12, 1)
    argv = ["--train", write_csv(tmp_path / "train.csv", sentences(24, 0)),
            "--test", write_csv(tmp_path / "test.csv", test_rows),
            "--model", save_tiny_model(tmp_path / "bert", "bert"), "--embedding", embedding,
            "--max-length", "16", "--max-steps", "3", "--seeds", "1", "--no-progress", "--no-plot",
            "--save-models"]
    assert cli.main(argv) == 0
    metrics = json.loads(Path("scl_finetune_output/metrics.json").read_text(encoding="utf-8"))
    scored = next(run for run in metrics["runs"] if run["arm"] == "CE+SCL" and run["seed"] == 0)
    capsys.readouterr()

    gold = [label for _, label in test_rows]
    for document, block in documented_blocks().items():
        namespace = {"test_texts": [text for text, _ in test_rows]}
        exec(with_texts(block, "test_texts"), namespace)
        printed = capsys.readouterr().out.splitlines()
        predicted = [line.split(" (")[0] for line in printed]
        assert len(printed) == len(test_rows) and set(predicted) <= {"neg", "pos"}, (document, printed)
        assert all(line.endswith(f"): {text}") for line, (text, _) in zip(printed, test_rows)), document
        accuracy = sum(p == g for p, g in zip(predicted, gold)) / len(gold)
        assert accuracy == scored["accuracy"], document
        # The confidences too: ECE over them is the run's, to float32 rounding.
        correct = torch.tensor([p == g for p, g in zip(predicted, gold)])
        confidences = namespace["probabilities"].max(dim=-1).values
        assert expected_calibration_error(confidences, correct) == pytest.approx(
            scored["ece"], abs=1e-5), document
