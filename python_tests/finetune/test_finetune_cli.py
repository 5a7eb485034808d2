"""The fine-tuning command line (python -m scl_kernels.finetune): end-to-end runs on a tiny CSV
with tiny random BERT / RoBERTa models saved offline, its outputs, the results table, and its
one-line errors for bad input."""
import csv
import json
import os
import random
import subprocess
import sys

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from scl_kernels.finetune import cli, report  # noqa: E402
from support.tiny_models import tiny_classifier  # noqa: E402

WORDS = {"pos": ["good", "great", "fine", "nice"], "neg": ["bad", "awful", "poor", "sad"]}
FILLER = ["the", "movie", "was", "a", "plot", "very"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *WORDS["pos"], *WORDS["neg"]]


def sentences(count, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = "pos" if i % 2 == 0 else "neg"
        words = rng.sample(FILLER, 3) + rng.sample(WORDS[label], 2)
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def write_csv(path, rows, columns=("text", "label")):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)
    return str(path)


def save_tiny_model(directory, kind):
    """A random 2-layer, hidden-32 classifier and a word-level tokenizer built offline."""
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizer.from_pretrained(str(directory))
    # RoBERTa's position ids start after the padding id: room for the text + 2.
    positions = {"bert": 32, "roberta": 34}[kind]
    extra = {"type_vocab_size": 2} if kind == "roberta" else {}
    model = tiny_classifier(kind, 2, vocab_size=len(VOCAB), max_position_embeddings=positions,
                            dropout=0.1, pad_token_id=0, **extra)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune_cli")
    return {"train": write_csv(root / "train.csv", sentences(24, 0)),
            "test": write_csv(root / "test.csv", sentences(12, 1)),
            "bert": save_tiny_model(root / "bert", "bert"),
            "roberta": save_tiny_model(root / "roberta", "roberta"),
            "root": root}


def common(assets, output_dir, model="bert"):
    return ["--train", assets["train"], "--test", assets["test"], "--model", assets[model],
            "--max-length", "16", "--no-progress", "--output-dir", str(output_dir)]


def test_end_to_end_two_seeds(assets, tmp_path, capsys):
    output = tmp_path / "out"
    status = cli.main(common(assets, output) + ["--epochs", "1", "--seeds", "2", "--batch-size", "8",
                                                "--eval-every", "1"])
    assert status == 0
    stdout = capsys.readouterr().out
    assert "| CE (λ=0) |" in stdout and "| CE+SCL (λ=0.9, τ=0.3) |" in stdout
    assert "| paired Δ (CE+SCL − CE) |" in stdout
    metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    assert [(r["arm"], r["seed"]) for r in metrics["runs"]] == [
        ("CE", 0), ("CE+SCL", 0), ("CE", 1), ("CE+SCL", 1)]
    for run in metrics["runs"]:
        assert 0.0 <= run["accuracy"] <= 1.0 and 0.0 <= run["macro_f1"] <= 1.0
        assert 0.0 <= run["ece"] <= 1.0 and run["history"][-1]["ece"] == run["ece"]
        assert run["train_size"] == 24 and [h["epoch"] for h in run["history"]] == [1]
    assert [a["name"] for a in metrics["summary"]["arms"]] == ["CE", "CE+SCL"]
    assert [p["seeds"] for p in metrics["summary"]["paired"]] == [[0, 1]]
    assert metrics["options"]["objectives"] == ["ce", "scl"]
    assert metrics["data"]["label_names"] == ["neg", "pos"] and metrics["data"]["test_size"] == 12
    assert metrics["options"]["lam"] == 0.9 and metrics["environment"]["device"] == "cpu"
    results = (output / "results.md").read_text(encoding="utf-8")
    assert "paired Δ" in results
    assert report.ECE_EXPLAINED in stdout and report.ECE_EXPLAINED in results
    assert "in 15 equal-width bins of their largest softmax probability" in report.ECE_EXPLAINED
    assert (output / "tsne.png").read_bytes().startswith(b"\x89PNG")


def test_same_seed_same_result(assets, tmp_path):
    """A run is reproducible for its seed (the head, the batches, the dropout masks)."""
    for output in "ab":
        assert cli.main(common(assets, tmp_path / output) + [
            "--epochs", "2", "--seeds", "5,", "--runs", "scl", "--batch-size", "8", "--no-plot",
            "--eval-every", "2"]) == 0
    first, second = (json.loads((tmp_path / d / "metrics.json").read_text())["runs"][0] for d in "ab")
    assert first["history"][0]["train_loss"] == second["history"][0]["train_loss"]
    assert first["accuracy"] == second["accuracy"] and first["seed"] == 5


def test_gradient_cache_roberta_head_embedding(assets, tmp_path):
    """--chunk-size below --batch-size: the gradient cache, on a RoBERTa with the head's
    dense+tanh as the embedding, few-shot and label noise."""
    output = tmp_path / "out"
    status = cli.main(common(assets, output, "roberta") + [
        "--epochs", "2", "--seeds", "1", "--batch-size", "12", "--chunk-size", "5",
        "--embedding", "head", "--few-shot", "16", "--label-noise", "0.25", "--scl-reduction", "sum",
        "--sampler", "random", "--eval-every", "2"])
    assert status == 0
    metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    assert [r["train_size"] for r in metrics["runs"]] == [16, 16]
    assert [r["labels_flipped"] for r in metrics["runs"]] == [4, 4]
    for run in metrics["runs"]:
        assert [h["epoch"] for h in run["history"]] == [2]
        assert run["history"][0]["train_supcon"] > 0


def test_help_is_fast_and_imports_no_transformers():
    out = subprocess.run([sys.executable, "-m", "scl_kernels.finetune", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--chunk-size" in out.stdout and "(default: 0.9)" in out.stdout
    code = ("import sys; from scl_kernels.finetune import cli; cli.build_parser().parse_args([]); "
            "print('transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def expect_error(capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scl-finetune: error: ") and "Traceback" not in err, err
    assert message in err, err


def test_missing_file(assets, tmp_path, capsys):
    argv = common(assets, tmp_path)
    argv[1] = str(tmp_path / "nope.csv")
    expect_error(capsys, argv, f"no such file: {tmp_path / 'nope.csv'}")


def test_bad_column_lists_the_columns(assets, tmp_path, capsys):
    expect_error(capsys, common(assets, tmp_path) + ["--text-column", "sentence"],
                 "has no column 'sentence' (--text-column); its columns are: text, label")


def test_unknown_model_path(assets, tmp_path, capsys):
    argv = common(assets, tmp_path)
    argv[5] = str(tmp_path / "no_model")
    expect_error(capsys, argv, f"no such model directory: {tmp_path / 'no_model'}")
    (tmp_path / "empty_model").mkdir()
    argv[5] = str(tmp_path / "empty_model")
    expect_error(capsys, argv, "is not a Hugging Face model directory: it has no config.json; "
                               "expected what save_pretrained writes: config.json, the weights")


def test_model_folder_without_weights_or_tokenizer(assets, tmp_path, capsys):
    """Each message is one whole line saying what the folder lacks (transformers' own run over
    several lines, and a folder without tokenizer files loads a tokenizer of 5 tokens)."""
    argv = common(assets, tmp_path / "out")
    weights_only = tmp_path / "weights_only"
    transformers.AutoModelForSequenceClassification.from_pretrained(assets["bert"]).save_pretrained(
        str(weights_only))
    capsys.readouterr()  # transformers' progress bars
    argv[5] = str(weights_only)
    expect_error(capsys, argv, f"{weights_only} has no tokenizer: expected one of tokenizer_config.json")
    unknown_config = tmp_path / "unknown_config"
    unknown_config.mkdir()
    (unknown_config / "config.json").write_text("{}", encoding="utf-8")
    (unknown_config / "vocab.txt").write_text("\n".join(VOCAB), encoding="utf-8")
    argv[5] = str(unknown_config)
    expect_error(capsys, argv, f"cannot load the model in {unknown_config}: expected what "
                               "save_pretrained writes: config.json, the weights (model.safetensors")


def test_hub_name_offline(assets, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    argv = common(assets, tmp_path)
    argv[5] = "nobody-here/no-such-model-xyz"
    expect_error(capsys, argv, "HF_HUB_OFFLINE is set")


def test_label_that_appears_once(assets, tmp_path, capsys):
    rows = sentences(10, 0) + [("the movie was sad and poor", "unsure")]
    path = write_csv(tmp_path / "once.csv", rows)
    argv = common(assets, tmp_path)
    argv[1], argv[3] = path, path
    expect_error(capsys, argv, "label 'unsure' appears once in the training data")


def test_few_shot_larger_than_available(assets, tmp_path, capsys):
    expect_error(capsys, common(assets, tmp_path) + ["--few-shot", "100"],
                 "--few-shot 100 is larger than the 24 training examples available")
    expect_error(capsys, common(assets, tmp_path) + ["--few-shot", "1"],
                 "--few-shot 1 is smaller than the number of classes (2)")


@pytest.mark.parametrize("extra, message", [
    (["--lam", "0"], "--lam must be in (0, 1]"),
    (["--objectives", "ce,crossentropy"], "unknown objective 'crossentropy'; choose from ce, scl"),
    (["--objectives", "ce,ce"], "names an objective twice"),
    (["--objectives", ","], "--objectives needs at least one of"),
    (["--runs", "both", "--objectives", "ce"], "--runs is the older form of --objectives"),
    (["--epochs", "2", "--max-steps", "5"], "pass --epochs or --max-steps, not both"),
    (["--max-steps", "0"], "--max-steps must be positive"),
    (["--warmup-ratio", "1"], "--warmup-ratio must be in [0, 1)"),
    (["--patience", "2"], "--patience needs a validation set: pass --validation-size N"),
    (["--validation-size", "1"], "--validation-size 1 is smaller than the number of classes (2)"),
    (["--validation-size", "22"], "--validation-size 22 holds out 11 examples of class 'neg'"),
    (["--objectives", "focal", "--focal-gamma", "-1"], "--focal-gamma must be >= 0"),
    (["--objectives", "mixed-ce", "--mixed-ce-final-weight", "2"], "--mixed-ce-final-weight must be in"),
    (["--label-smoothing", "1"], "--label-smoothing must be in [0, 1)"),
    (["--objectives", "core", "--mixup-alpha", "0"], "--mixup-alpha must be positive"),
    (["--temperature", "0"], "--temperature must be positive"),
    (["--label-noise", "1"], "--label-noise must be in [0, 1)"),
    (["--batch-size", "0"], "--batch-size must be positive"),
    (["--samples-per-class", "9", "--batch-size", "8"], "--samples-per-class must be between 2"),
    (["--device", "nonsense"], "is not a torch device"),
])
def test_bad_options(assets, tmp_path, capsys, extra, message):
    expect_error(capsys, common(assets, tmp_path) + extra, message)


@pytest.mark.parametrize("seeds, message", [
    ("0,0", "expected at least one seed, distinct and >= 0, got '0,0'"),
    ("0", "a count of seeds must be at least 1, got '0' (seed 0 alone: --seed 0)"),
])
def test_bad_seeds_is_a_one_line_usage_error(capsys, seeds, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--seeds", seeds])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err  # no usage text above it
    assert err == f"scl-finetune: error: argument --seeds: {message} (see scl-finetune --help)\n"


def test_missing_transformers_names_the_install_that_works(monkeypatch):
    from scl_kernels.finetune.training_loop import import_transformers

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(cli.InputError, match='needs transformers: pip install --no-build-isolation '
                                             '-e ".\\[finetune\\]" in the scl_kernels checkout'):
        import_transformers()


def test_the_demo_trains_its_own_budget_unless_one_is_given():
    parse = cli.build_parser().parse_args
    assert cli._max_steps(parse([])) == cli.DEMO_MAX_STEPS == 40
    assert cli._max_steps(parse(["--epochs", "3"])) is None
    assert cli._max_steps(parse(["--max-steps", "7"])) == 7
    assert cli._max_steps(parse(["--train", "my.csv"])) is None  # the default budget


def test_an_earlier_run_is_kept_unless_overwrite_is_passed(assets, tmp_path, capsys):
    output = tmp_path / "out"
    argv = common(assets, output) + ["--max-steps", "1", "--seeds", "1", "--objectives", "ce"]
    assert cli.main(argv + ["--save-splits"]) == 0
    first = (output / "metrics.json").read_bytes()
    capsys.readouterr()
    expect_error(capsys, argv, f"--output-dir {output} holds an earlier run's results (metrics.json, "
                               "results.md, tsne.png, splits/): pass --overwrite to replace them, "
                               "--resume to add to them, or another --output-dir")
    assert (output / "metrics.json").read_bytes() == first
    expect_error(capsys, argv + ["--overwrite", "--resume"], "pass --overwrite or --resume, not both")
    # A mistyped input stops before --overwrite deletes anything.
    mistyped = argv + ["--overwrite"]
    mistyped[1] = str(tmp_path / "missing.csv")
    expect_error(capsys, mistyped, "no such file")
    assert (output / "metrics.json").read_bytes() == first
    assert cli.main(argv + ["--overwrite", "--no-plot"]) == 0
    assert "--overwrite: removed the earlier run's metrics.json, results.md, tsne.png, splits/" in (
        capsys.readouterr().out)
    assert sorted(path.name for path in output.iterdir()) == ["metrics.json", "results.md"]
    assert "--overwrite" in json.loads((output / "metrics.json").read_text())["command"]


def test_an_output_dir_that_cannot_be_written_stops_before_anything_loads(assets, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder", encoding="utf-8")
    argv = common(assets, a_file)
    argv[1] = str(tmp_path / "missing.csv")  # the output folder is checked before the data loads
    expect_error(capsys, argv, f"--output-dir {a_file} is a file, not a folder")
    argv[-1] = str(a_file / "out")
    expect_error(capsys, argv, f"cannot create --output-dir {a_file / 'out'}: {a_file} is a file, "
                               "not a folder")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_dir_in_a_read_only_place(assets, capsys):
    # /proc refuses new entries even to root, for whom a chmod'ed folder stays writable.
    argv = common(assets, "/proc/scl_finetune_output")
    expect_error(capsys, argv, "cannot write --output-dir /proc/scl_finetune_output: /proc: ")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes in a read-only folder")
def test_an_output_dir_under_a_read_only_folder(assets, tmp_path, capsys):
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        expect_error(capsys, common(assets, read_only / "out"),
                     f"cannot write --output-dir {read_only / 'out'}: {read_only}: Permission denied")
    finally:
        read_only.chmod(0o755)


def test_report_means_sds_and_paired_differences():
    runs = [{"arm": "CE", "title": "CE (λ=0)", "seed": s, "accuracy": a, "macro_f1": f, "ece": e}
            for s, a, f, e in ((0, 0.80, 0.70, 0.10), (1, 0.90, 0.80, 0.05), (2, 0.70, 0.60, 0.12))]
    runs += [{"arm": "CE+SCL", "title": "CE+SCL (λ=0.5, τ=0.3)", "seed": s, "accuracy": a,
              "macro_f1": f, "ece": e}
             for s, a, f, e in ((0, 0.85, 0.70, 0.08), (1, 0.88, 0.82, 0.06), (2, 0.74, 0.66, 0.02))]
    runs += [{"arm": "Focal", "title": "Focal (γ=2)", "seed": s, "accuracy": a, "macro_f1": f,
              "ece": e} for s, a, f, e in ((0, 0.81, 0.71, 0.03), (1, 0.91, 0.79, 0.04))]
    summary = report.summarize(runs)
    ce, scl, focal = summary["arms"]
    assert ce["accuracy_mean"] == pytest.approx(0.8) and ce["accuracy_sd"] == pytest.approx(0.1)
    paired, paired_focal = summary["paired"]
    assert paired["arm"] == "CE+SCL" and paired["baseline"] == "CE"
    assert paired["accuracy_diff"] == pytest.approx([0.05, -0.02, 0.04])
    assert paired["accuracy_diff_mean"] == pytest.approx(0.07 / 3)
    assert paired["accuracy_wins"] == 2 and paired["macro_f1_wins"] == 2
    assert paired["ece_wins"] == 2  # lower is better: seeds 0 and 2
    assert paired_focal["seeds"] == [0, 1] and paired_focal["ece_wins"] == 2
    table = report.format_table(summary, runs=runs)
    assert "| CE (λ=0) | 80.0 ± 10.0 | 70.0 ± 10.0 | 9.0 ± 3.6 | 3 |" in table
    assert "| CE+SCL (λ=0.5, τ=0.3) |" in table and "| paired Δ (Focal − CE) |" in table
    assert "| seed | CE accuracy | CE+SCL accuracy | Focal accuracy | Δ CE+SCL accuracy |" in table
    assert "| 1 | 90.0 | 88.0 | 91.0 | -2.0 | +1.0 |" in table  # seeds every arm ran
    assert "\n| 2 | " not in table
    assert "CE+SCL scored higher than CE on 2 of 3 seeds (accuracy)" in table
    assert "its ECE was lower on 2 of 3 seeds" in table
    two_arms = report.format_table(report.summarize(runs[:6]), runs=runs[:6])
    assert "| 1 | 90.0 | 88.0 | -2.0 |" in two_arms
    single = report.summarize(runs[:1])
    assert single["paired"] is None
    assert "| CE (λ=0) | 80.0 | 70.0 | 10.0 | 1 |" in report.format_table(single)


def test_abbreviated_option_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--epoch", "1"])
    assert exit_info.value.code == 2 and "--epoch" in capsys.readouterr().err


def test_one_epoch_is_singular():
    assert cli._count(1, "epoch") == "1 epoch" and cli._count(3, "epoch") == "3 epochs"


def _has_focal_supcon():
    import inspect

    import scl_kernels
    return "focal_gamma" in inspect.signature(scl_kernels.supcon_loss).parameters


def _core_available():
    import scl_kernels
    return hasattr(scl_kernels, "hard_pairs") and _has_focal_supcon()


@pytest.mark.parametrize("model", ["bert", "roberta"])
def test_every_objective_on_the_same_seed(assets, tmp_path, capsys, model):
    """Each objective name trains and is reported (core, and the focal SupCon of scl, once
    hard_pairs and supcon_loss(focal_gamma=) are merged); the first objective is the baseline
    of every paired row."""
    objectives = ["ce", "scl", "focal", "dice", "mixed-ce"] + (["core"] if _core_available() else [])
    focal = ["--focal-contrastive-gamma", "0.5"] if _has_focal_supcon() else []
    output = tmp_path / "out"
    status = cli.main(common(assets, output, model) + [
        "--epochs", "1", "--seeds", "3,", "--batch-size", "8", "--no-plot", "--eval-every", "1",
        "--objectives", ",".join(objectives), "--label-smoothing", "0.1", *focal])
    assert status == 0
    stdout = capsys.readouterr().out
    metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    names = [cli.OBJECTIVES[name] for name in objectives]
    assert [run["arm"] for run in metrics["runs"]] == names
    assert [run["objective"] for run in metrics["runs"]] == objectives
    for run in metrics["runs"]:
        assert run["seed"] == 3 and 0.0 <= run["ece"] <= 1.0
        history = run["history"][0]
        assert history["train_cross_entropy"] > 0 and history["train_supcon"] > 0
    assert [p["arm"] for p in metrics["summary"]["paired"]] == names[1:]
    scl_gamma = ", γ=0.5" if focal else ""
    for title in ("CE (λ=0, smoothing 0.1)", f"CE+SCL (λ=0.9, τ=0.3{scl_gamma}, smoothing 0.1)",
                  "Focal (γ=2)", "Dice (α=1, smoothing 1)", "MixedCE (gold weight 1→0.5, linear)"):
        assert f"| {title} |" in stdout
    assert "| paired Δ (MixedCE − CE) |" in stdout
    if "core" in objectives:
        assert "| Core (λ=0.3, τ=0.3, γ=0.5, mixup α=1, smoothing 0.1) |" in stdout


def test_runs_still_selects_the_objectives(assets, tmp_path):
    assert cli.main(common(assets, tmp_path / "out") + [
        "--epochs", "1", "--seeds", "1", "--batch-size", "8", "--no-plot", "--runs", "ce"]) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text(encoding="utf-8"))
    assert [run["arm"] for run in metrics["runs"]] == ["CE"]
    assert metrics["options"]["objectives"] == ["ce"]


def test_objectives_share_examples_heads_batches_and_dropout(assets, tmp_path):
    """Focal loss with gamma 0 is cross-entropy: its run then repeats the CE run of the same
    seed (same training set, head initialisation, batches and dropout masks), up to rounding."""
    output = tmp_path / "out"
    assert cli.main(common(assets, output) + [
        "--epochs", "2", "--seeds", "2,", "--batch-size", "8", "--no-plot", "--sampler", "random",
        "--objectives", "ce,focal", "--focal-gamma", "0", "--eval-every", "1"]) == 0
    ce, focal = json.loads((output / "metrics.json").read_text(encoding="utf-8"))["runs"]
    assert (ce["arm"], focal["arm"]) == ("CE", "Focal")
    for key in ("train_loss", "train_cross_entropy", "train_supcon", "accuracy", "ece"):
        assert [h[key] for h in focal["history"]] == pytest.approx([h[key] for h in ce["history"]],
                                                                   rel=1e-4, abs=1e-6), key
