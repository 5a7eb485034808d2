"""bench.fewshot, the few-shot comparison against SetFit: a tiny run (a random 2-layer BERT saved
as a sentence-transformers folder, a tiny CSV) through the command line's code and a real SetFit
run, checking that every method trains on the same rows, that the table, JSON and plot are
written, and that --resume runs only the missing cells."""
import csv
import json
import random

import pytest

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
pytest.importorskip("setfit")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from bench import fewshot, setfit_runner  # noqa: E402
from scl_kernels.finetune import cli, training_loop  # noqa: E402
from support.tiny_models import tiny_config  # noqa: E402

WORDS = {"pos": ["good", "great", "fine", "nice"], "neg": ["bad", "awful", "poor", "sad"]}
FILLER = ["the", "movie", "was", "a", "plot", "very"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *WORDS["pos"], *WORDS["neg"]]


def _write_csv(path, count, seed):
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for i in range(count):
            label = "pos" if i % 2 == 0 else "neg"
            # Distinct texts: a row's text identifies it.
            words = rng.sample(FILLER, 3) + rng.sample(WORDS[label], 2) + [f"{i}"]
            writer.writerow([" ".join(words), label])
    return str(path)


def _save_tiny_sentence_transformer(directory):
    """A random BERT (hidden 32, 2 layers) with mean pooling, saved as a sentence-transformers
    folder: SetFit loads it as such, the command line as a Hugging Face model (+ a new head)."""
    hf_dir = directory / "hf"
    hf_dir.mkdir(parents=True)
    (hf_dir / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizer.from_pretrained(str(hf_dir))
    encoder = transformers.BertModel(tiny_config("bert", vocab_size=len(VOCAB),
                                                 max_position_embeddings=32, dropout=0.1,
                                                 pad_token_id=0))
    encoder.save_pretrained(str(hf_dir))
    tokenizer.save_pretrained(str(hf_dir))
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    body = SentenceTransformer(modules=[Transformer(str(hf_dir), max_seq_length=16),
                                        Pooling(32, "mean")])
    body.save(str(directory / "st"))
    return str(directory / "st")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("fewshot")
    return {"train": _write_csv(root / "train.csv", 40, 0), "test": _write_csv(root / "test.csv", 10, 1),
            "model": _save_tiny_sentence_transformer(root / "model")}


@pytest.fixture
def spies(monkeypatch):
    """Records (method, seed, training rows, test size) of every run, SetFit's and ours."""
    seen = []
    train_and_evaluate, run_setfit = cli.train_and_evaluate, setfit_runner.run_setfit

    def ours(model, tokenizer, train, test, *, objective, seed, **kwargs):
        seen.append((objective, seed, list(zip(train.texts, train.labels)), len(test)))
        return train_and_evaluate(model, tokenizer, train, test, objective=objective, seed=seed,
                                  **kwargs)

    def setfit(model, train, test, *, seed, **kwargs):
        seen.append((fewshot.SETFIT, seed, list(zip(train.texts, train.labels)), len(test)))
        return run_setfit(model, train, test, seed=seed, **kwargs)

    monkeypatch.setattr(cli, "train_and_evaluate", ours)
    monkeypatch.setattr(setfit_runner, "run_setfit", setfit)
    return seen


def _argv(assets, output, *extra):
    return ["--train", assets["train"], "--test", assets["test"], "--model", assets["model"],
            "--output-dir", str(output), "--ours-args",
            "--epochs 1 --batch-size 4 --max-length 16 --no-progress", *extra]


def test_tiny_comparison_same_rows_table_json_plot_and_resume(assets, tmp_path, spies, capsys):
    output = tmp_path / "out"
    options = ("--per-class", "2,3", "--methods", "ce,setfit", "--setfit-iterations", "2")
    assert fewshot.main(_argv(assets, output, *options, "--seeds", "1")) == 0
    first = json.loads((output / "results.json").read_text(encoding="utf-8"))
    assert len(first["runs"]) == 4 and len(first["cells"]) == 4
    assert (output / "fewshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --resume runs only the missing cells (seed 1) and keeps the others' results.
    called_before = len(spies)
    assert fewshot.main(_argv(assets, output, *options, "--seeds", "2", "--resume")) == 0
    assert sorted((method, seed, len(rows)) for method, seed, rows, _ in spies[called_before:]) == [
        ("ce", 1, 4), ("ce", 1, 6), ("setfit", 1, 4), ("setfit", 1, 6)]
    results = json.loads((output / "results.json").read_text(encoding="utf-8"))
    assert results["runs"][:4] == first["runs"]

    # Every method of a (K, seed) cell trained on the same rows and was scored on the same test set.
    by_cell = {}
    for method, seed, rows, test_size in spies:
        by_cell.setdefault((len(rows), seed), {})[method] = rows
        assert test_size == 10
    assert sorted(by_cell) == [(4, 0), (4, 1), (6, 0), (6, 1)]
    for cell, methods in by_cell.items():
        assert methods["ce"] == methods[fewshot.SETFIT], cell
    assert by_cell[(4, 0)]["ce"] != by_cell[(4, 1)]["ce"]  # seeds draw their own rows

    runs = {(r["method"], r["per_class"], r["seed"]): r for r in results["runs"]}
    assert set(runs) == {(m, k, s) for m in ("ce", "setfit") for k in (2, 3) for s in (0, 1)}
    for k in (2, 3):
        for s in (0, 1):
            assert runs[("ce", k, s)]["rows"] == runs[("setfit", k, s)]["rows"]
            setfit_run = runs[("setfit", k, s)]
            # Both sides of each pair, the training rows again for the head, the test rows.
            assert setfit_run["encoded_examples"] == 2 * setfit_run["pairs"] + 2 * k + 10
            for run in (runs[("ce", k, s)], setfit_run):
                assert 0.0 <= run["accuracy"] <= 1.0 and 0.0 <= run["ece"] <= 1.0
                assert run["seconds"] > 0
        assert (output / f"K{k}" / "ours" / "metrics.json").exists()
    assert len(results["cells"]) == 8 and results["wall_seconds"] > 0
    assert results["versions"]["setfit"].startswith("1.2")
    assert "--few-shot 4 --seeds 0," in results["cells"][0]["command"]
    assert [entry["per_class"] for entry in results["summary"]] == [2, 3]
    assert [arm["name"] for arm in results["summary"][0]["arms"]] == ["SetFit", "CE"]

    table = (output / "results.md").read_text(encoding="utf-8")
    assert "| method | K=2 | K=3 |" in table and "## K = 3 examples per class" in table
    paired = [line for line in table.splitlines() if "paired Δ CE − SetFit" in line]
    assert len(paired) == 2
    assert all(cell.strip()[0] in "+-" for line in paired for cell in line.split("|")[4:7])
    assert not list(output.glob("*.tmp"))

    # Without --resume an existing directory is refused; so is resuming with other options.
    capsys.readouterr()
    assert fewshot.main(_argv(assets, output, "--per-class", "2", "--seeds", "1",
                              "--methods", "ce")) == 2
    assert "exists: pass --resume" in capsys.readouterr().err
    assert fewshot.main(_argv(assets, output, "--per-class", "2", "--seeds", "1",
                              "--methods", "ce", "--resume")) == 2
    assert "made with other options (setfit_iterations: 2 there, None now)" in capsys.readouterr().err


def test_ours_args_cannot_set_what_the_benchmark_sets(assets, tmp_path, capsys):
    argv = ["--train", assets["train"], "--output-dir", str(tmp_path / "out"),
            "--ours-args", "--epochs 1 --seeds 3"]
    assert fewshot.main(argv) == 2
    error = capsys.readouterr().err
    assert "--ours-args: --seeds is set by the benchmark" in error
    assert not (tmp_path / "out").exists()


def test_unknown_method_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        fewshot.build_parser().parse_args(["--methods", "ce,setfti"])
    assert "setfti" in capsys.readouterr().err


def test_rows_the_command_line_records_must_be_rows_the_benchmark_drew():
    from scl_kernels.finetune.data import TextClassificationData
    pool = TextClassificationData([f"text {i}" for i in range(10)], [i % 2 for i in range(10)],
                                  ["a", "b"])
    drawn = pool.subset([1, 4, 6, 7])
    fewshot._check_cli_rows(pool, drawn, {"arm": "CE", "seed": 0})  # none recorded, none checked
    # Part of the drawn rows: the rest went to a validation split.
    fewshot._check_cli_rows(pool, drawn, {"arm": "CE", "seed": 0, "train_rows": [4, 7]})
    with pytest.raises(RuntimeError, match="CE seed 0 trained on rows the benchmark did not draw"):
        fewshot._check_cli_rows(pool, drawn, {"arm": "CE", "seed": 0, "train_rows": [1, 4, 5]})


def test_simcse_then_ce_trains_one_encoder_for_every_cell(assets, tmp_path, spies, capsys):
    output = tmp_path / "out"
    options = ("--per-class", "2,3", "--seeds", "2", "--methods", "ce,simcse-ce",
               "--simcse-steps", "2")
    assert fewshot.main(_argv(assets, output, *options)) == 0
    encoder = output / "simcse_encoder"
    record = json.loads((encoder / "simcse.json").read_text(encoding="utf-8"))
    assert record["steps"] == 2 and record["texts"] == 40 and record["model"] == assets["model"]
    assert (encoder / "config.json").exists() and (encoder / "tokenizer_config.json").exists()
    assert capsys.readouterr().out.count("simcse-ce: the encoder of 2 steps") == 1

    results = json.loads((output / "results.json").read_text(encoding="utf-8"))
    assert results["simcse"]["path"] == str(encoder)
    runs = {(r["method"], r["per_class"], r["seed"]): r for r in results["runs"]}
    assert set(runs) == {(m, k, s) for m in ("ce", "simcse-ce") for k in (2, 3) for s in (0, 1)}
    # The same rows for both; the SimCSE encoder's passes counted in each of its runs.
    seen = {}
    for method, seed, rows, _ in spies:
        seen.setdefault((len(rows), seed), {})[method] = rows
    assert all(methods["ce"] == list(methods.values())[-1] for methods in seen.values())
    for k in (2, 3):
        for s in (0, 1):
            ce, simcse_ce = runs[("ce", k, s)], runs[("simcse-ce", k, s)]
            assert simcse_ce["rows"] == ce["rows"]
            assert simcse_ce["encoded_examples"] == ce["encoded_examples"] + 2 * 64 * 2
            assert simcse_ce["seconds"] > record["seconds"]
        command = next(c["command"] for c in results["cells"]
                       if c["group"] == "simcse-ce" and c["per_class"] == k)
        assert "--embedding mean" in command and f"--model {encoder}" in command
        assert (output / f"K{k}" / "simcse-ce" / "metrics.json").exists()
    assert [arm["name"] for arm in results["summary"][0]["arms"]] == ["CE", "SimCSE→CE"]
    table = (output / "results.md").read_text(encoding="utf-8")
    assert "**SimCSE→CE**: CE with the options above" in table and "2 steps" in table

    # The encoder is reused on --resume; another number of steps is refused, named.
    capsys.readouterr()
    assert fewshot.main(_argv(assets, output, *options[:-1], "3", "--seeds", "3", "--resume")) == 2
    assert "holds a SimCSE encoder made with" in capsys.readouterr().err


def test_a_run_of_our_recipe_encodes_the_test_rows_once(assets, tmp_path, monkeypatch):
    """What a run of the recipe costs in encoder passes, exactly: the probe's pass over the
    training rows, the steps' batches and one evaluation of the test rows, none during
    training (bench/decisions/2026-12-02-few-shot-at-setfit-speed.md)."""
    evaluated = []
    evaluate = training_loop.evaluate

    def counting(model, tokenizer, data, options, **kwargs):
        evaluated.append(len(data))
        return evaluate(model, tokenizer, data, options, **kwargs)

    monkeypatch.setattr(training_loop, "evaluate", counting)
    output = tmp_path / "out"
    argv = ["--train", assets["train"], "--test", assets["test"], "--model", assets["model"],
            "--output-dir", str(output), "--per-class", "2", "--seeds", "1",
            "--methods", "ce,scl", "--ours-args",
            "--head-init probe --epochs 3 --batch-size 4 --max-length 16 --no-progress"]
    assert fewshot.main(argv) == 0
    runs = json.loads((output / "results.json").read_text(encoding="utf-8"))["runs"]
    assert [run["method"] for run in runs] == ["ce", "scl"]
    # 2 classes x 2 rows: the probe encodes the 4 rows, 3 epochs of one batch of 4, 10 test rows.
    assert [run["encoded_examples"] for run in runs] == [4 + 3 * 4 + 10] * 2
    assert evaluated == [10, 10]
