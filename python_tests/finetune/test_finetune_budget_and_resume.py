"""The command line's training budget (--max-steps, the default step floor, the learning-rate
schedule), model selection on a validation split, and runs that lose nothing: results written
after every run, --resume, Ctrl-C, a non-finite loss, --seed and --save-splits."""
import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from scl_kernels.finetune import cli, training_loop  # noqa: E402
from test_finetune_cli import assets, common  # noqa: E402,F401  (the module's fixture)


def metrics_of(output):
    return json.loads((output / "metrics.json").read_text(encoding="utf-8"))


def test_step_budget_defaults_and_overrides():
    floor = training_loop.DEFAULT_MIN_STEPS
    assert training_loop.step_budget(1) == floor  # 16 examples in batches of 16
    assert training_loop.step_budget(1000) == 5 * 1000
    assert training_loop.step_budget(3, epochs=2) == 6
    assert training_loop.step_budget(3, epochs=2, max_steps=7) == 7


def test_learning_rate_warms_up_then_decays_to_zero():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    schedule = training_loop._linear_schedule(optimizer, 10, 0.2)
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert rates[2:] == sorted(rates[2:], reverse=True) and rates[-1] == pytest.approx(1 / 8)


def test_max_steps_cycles_through_epochs(assets, tmp_path):
    output = tmp_path / "out"
    assert cli.main(common(assets, output) + [
        "--max-steps", "7", "--seed", "1", "--batch-size", "8", "--objectives", "ce",
        "--no-plot", "--eval-every", "1"]) == 0
    run, = metrics_of(output)["runs"]
    assert run["seed"] == 1 and run["steps"] == 7 and run["best_step"] == 7
    assert [h["step"] for h in run["history"]] == [3, 6, 7]  # 24 examples, batches of 8
    # 7 steps of 8 examples, plus the final test pass over the 12 test rows, plus the three
    # history passes
    assert run["encoded_examples"] == 7 * 8 + 12 + 3 * 12


def test_validation_selects_the_best_checkpoint_and_stops_early(assets, tmp_path, monkeypatch):
    """Validation accuracies 0.5, 0.75, 0.5, 0.5: the checkpoint of the second check is kept
    and patience 2 stops the run at the fourth; the test score is that checkpoint's."""
    scripted = iter([0.5, 0.75, 0.5, 0.5])
    evaluate = training_loop.evaluate
    states = {}

    def fake_evaluate(model, tokenizer, data, options, *, return_embeddings=False, desc="eval"):
        metrics, vectors = evaluate(model, tokenizer, data, options,
                                    return_embeddings=return_embeddings, desc=desc)
        if desc == "validation":
            metrics["accuracy"] = next(scripted)
            states[len(states) + 1] = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            states["test"] = {k: v.clone() for k, v in model.state_dict().items()}
        return metrics, vectors

    monkeypatch.setattr(training_loop, "evaluate", fake_evaluate)
    output = tmp_path / "out"
    assert cli.main(common(assets, output) + [
        "--max-steps", "20", "--seeds", "1", "--batch-size", "8", "--objectives", "scl",
        "--no-plot", "--validation-size", "8", "--validation-every", "2", "--patience", "2",
        "--save-splits"]) == 0
    run, = metrics_of(output)["runs"]
    assert [check["step"] for check in run["validation"]] == [2, 4, 6, 8]
    assert run["steps"] == 8 and run["best_step"] == 4 and run["stopped_early"]
    assert run["train_size"] == 16 and run["validation_size"] == 8
    assert sorted(run["train_rows"] + run["validation_rows"]) == list(range(24))
    for name, tensor in states["test"].items():
        torch.testing.assert_close(tensor, states[2][name])
    assert not all(torch.equal(states["test"][k], states[4][k]) for k in states[4])
    rows = [json.loads(line) for line in
            (output / "splits" / "seed0_validation.jsonl").read_text().splitlines()]
    assert [row["row"] for row in rows] == run["validation_rows"]
    assert len((output / "splits" / "test.jsonl").read_text().splitlines()) == 12


def test_results_are_written_after_every_run_and_resume_finishes_the_table(
        assets, tmp_path, monkeypatch, capsys):
    output = tmp_path / "out"
    arguments = common(assets, output) + ["--max-steps", "2", "--seeds", "2", "--batch-size", "8",
                                          "--no-plot"]
    train = training_loop.train_and_evaluate
    calls = []

    def interrupted_after_three(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(kwargs["objective"])
        return train(*args, **kwargs)

    monkeypatch.setattr(cli, "train_and_evaluate", interrupted_after_three)
    with pytest.raises(KeyboardInterrupt):
        cli.main(arguments)
    assert "interrupted: 3 finished runs kept" in capsys.readouterr().out
    interrupted = metrics_of(output)
    assert [(r["arm"], r["seed"]) for r in interrupted["runs"]] == [
        ("CE", 0), ("CE+SCL", 0), ("CE", 1)]
    assert "| CE (λ=0) |" in (output / "results.md").read_text(encoding="utf-8")

    monkeypatch.setattr(cli, "train_and_evaluate", train)
    assert cli.main(arguments + ["--resume"]) == 0
    assert "resuming: 3 runs already in" in capsys.readouterr().out
    resumed = metrics_of(output)
    assert [(r["arm"], r["seed"]) for r in resumed["runs"]] == [
        ("CE", 0), ("CE+SCL", 0), ("CE", 1), ("CE+SCL", 1)]
    first_command = ("command", "created", "seconds", "environment")
    assert [resumed[key] for key in first_command] == [interrupted[key] for key in first_command]
    assert [entry["added_runs"] for entry in resumed["resumes"]] == [[["scl", 1]]]
    assert resumed["resumes"][0]["command"].endswith(" --resume")
    # Nothing left to run: the record stays as it was; the resume is appended to "resumes".
    assert cli.main(arguments + ["--resume"]) == 0
    again = metrics_of(output)
    assert {key: value for key, value in again.items() if key != "resumes"} == {
        key: value for key, value in resumed.items() if key != "resumes"}
    assert again["resumes"][0] == resumed["resumes"][0]
    assert again["resumes"][1]["added_runs"] == []
    whole = tmp_path / "whole"
    assert cli.main(common(assets, whole) + arguments[len(common(assets, output)):]) == 0
    assert [r["accuracy"] for r in metrics_of(whole)["runs"]] == [r["accuracy"] for r in resumed["runs"]]
    assert [a["accuracy_mean"] for a in metrics_of(whole)["summary"]["arms"]] == [
        a["accuracy_mean"] for a in resumed["summary"]["arms"]]


def test_resume_refuses_a_directory_made_with_other_options(assets, tmp_path, capsys):
    output = tmp_path / "out"
    arguments = common(assets, output) + ["--max-steps", "1", "--seeds", "1", "--batch-size", "8",
                                          "--no-plot", "--objectives", "ce"]
    assert cli.main(arguments) == 0
    assert cli.main(arguments + ["--resume", "--lr", "0.001"]) == 2
    error = capsys.readouterr().err
    assert "--resume:" in error and "--lr 0.0001 there, 0.001 now" in error
    (output / "metrics.json").write_text("{", encoding="utf-8")
    assert cli.main(arguments + ["--resume"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_non_finite_loss_fails_its_run_and_the_others_go_on(assets, tmp_path, monkeypatch, capsys):
    build = training_loop.build_criterion

    def poisoned(objective, *args, **kwargs):
        criterion = build(objective, *args, **kwargs)
        if objective != "scl":
            return criterion

        def nan_loss(logits, embeddings, labels):
            return criterion(logits, embeddings, labels) * float("nan")
        return nan_loss

    monkeypatch.setattr(training_loop, "build_criterion", poisoned)
    output = tmp_path / "out"
    assert cli.main(common(assets, output) + ["--max-steps", "2", "--seeds", "1",
                                              "--batch-size", "8", "--no-plot"]) == 0
    stdout = capsys.readouterr().out
    assert "CE+SCL  seed 0: FAILED: CE+SCL seed 0: the loss is nan at step 1 of 2 (objective scl)" in stdout
    ce, scl = metrics_of(output)["runs"]
    assert "failed" not in ce and "at step 1" in scl["failed"] and "accuracy" not in scl
    results = (output / "results.md").read_text(encoding="utf-8")
    assert "Failed runs (left out above):" in results and "| CE (λ=0) |" in results


def test_paired_differences_carry_their_sign(assets, tmp_path):
    from scl_kernels.finetune import report

    runs = [{"arm": arm, "title": arm, "seed": s, "accuracy": a, "macro_f1": a, "ece": 0.1}
            for arm, s, a in (("A", 0, 0.8), ("A", 1, 0.8), ("B", 0, 0.9), ("B", 1, 0.92))]
    assert "| paired Δ (B − A) | +11.0 ± 1.4 |" in report.format_table(report.summarize(runs))


def test_mean_embedding_is_the_default_for_a_mean_pooled_sentence_encoder(tmp_path):
    folder = tmp_path / "encoder"
    (folder / "1_Pooling").mkdir(parents=True)
    assert training_loop.default_embedding(folder) == "first_token"
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    assert training_loop.default_embedding(folder) == "mean"
