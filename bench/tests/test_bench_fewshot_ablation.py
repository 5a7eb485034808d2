"""bench.fewshot_ablation: the paired table of bench.fewshot folders made with other options,
on hand-made results.json files."""
import json

import pytest

from bench import fewshot_ablation


def _folder(root, name, ours_args, accuracies, rows="abc", ece=0.2):
    folder = root / name
    folder.mkdir()
    runs = [{"method": "scl", "per_class": 8, "seed": seed, "accuracy": accuracy, "ece": ece,
             "seconds": 10.0, "rows": f"{rows}{seed}"} for seed, accuracy in enumerate(accuracies)]
    runs.append({"method": "ce", "per_class": 8, "seed": 0, "accuracy": 0.1, "ece": 0.5,
                 "seconds": 1.0, "rows": "x"})  # another method: left out
    (folder / "results.json").write_text(json.dumps(
        {"config": {"ours_args": ours_args}, "runs": runs}), encoding="utf-8")
    return str(folder)


def test_variants_are_paired_by_seed_and_signed(tmp_path, capsys):
    base = _folder(tmp_path, "base", "--head-init probe", [0.70, 0.60, 0.80])
    worse = _folder(tmp_path, "worse", "--epochs 5", [0.65, 0.62], ece=0.1)
    out = tmp_path / "table.md"
    assert fewshot_ablation.main(["--per-class", "8", "--baseline", base, "--variant",
                                  f"γ=1 five steps={worse}", "--out", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("CE+SCL at K = 8 per class")
    assert lines[4] == ("| baseline | `--head-init probe` | 3 | 70.0 ± 10.0 | 20.0 ± 0.0 | 10 "
                        "|  |  |  |")
    # Seeds 0 and 1 only: -5 and +2 points; ECE 10 points lower; higher on 1 of 2.
    assert lines[5] == ("| γ=1 five steps | `--epochs 5` | 2 | 63.5 ± 2.1 | 10.0 ± 0.0 | 10 | "
                        "-1.5 ± 4.9 | -10.0 ± 0.0 | 1 of 2 |")
    assert capsys.readouterr().out.splitlines() == lines


def test_other_rows_or_missing_folders_are_errors(tmp_path, capsys):
    base = _folder(tmp_path, "base", "", [0.7, 0.6])
    other = _folder(tmp_path, "other", "", [0.7, 0.6], rows="zzz")
    assert fewshot_ablation.main(["--per-class", "8", "--baseline", base,
                                  "--variant", f"v={other}"]) == 2
    assert "seed 0 trained on other rows than the baseline" in capsys.readouterr().err
    assert fewshot_ablation.main(["--per-class", "8", "--baseline", base,
                                  "--variant", f"v={tmp_path / 'none'}"]) == 2
    assert "results.json does not exist" in capsys.readouterr().err
    assert fewshot_ablation.main(["--per-class", "16", "--baseline", base,
                                  "--variant", f"v={other}"]) == 2
    assert "no finished scl run at K = 16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fewshot_ablation.build_parser().parse_args(["--per-class", "8", "--baseline", base,
                                                    "--variant", "no-folder"])
