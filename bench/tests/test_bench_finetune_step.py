"""Smoke test of bench/finetune_step.py: one tiny training step in process, the memory cap in a
subprocess, and the rules that decide which configurations run."""
import math

import pytest

pytest.importorskip("transformers")

from bench import finetune_step  # noqa: E402


def _step_task(chunk_size, loss):
    return {"kind": "step", "model": "tiny-bert", "loss": loss, "n": 16, "seq_len": 8,
            "chunk_size": chunk_size, "repeats": 1, "repeat_below_s": 60.0, "budget_gb": 8.0,
            "seed": 0, "threads": 1}


@pytest.mark.parametrize("chunk_size", [0, 4])
@pytest.mark.parametrize("loss", ["scl_kernels", "dense"])
def test_tiny_step_runs_in_process(chunk_size, loss):
    result = finetune_step.run_task(_step_task(chunk_size, loss), cap=False)
    assert result["status"] == "ok"
    assert len(result["step_times_s"]) == 2  # a short first step is followed by --repeats more
    assert result["step_s"] > 0 and math.isfinite(result["loss_value"])
    assert result["peak_rss_gb"] >= result["loaded_rss_gb"] > 0


def test_memory_cap_turns_running_out_into_a_status():
    # Dense SupCon needs ~1.7 GB at N = 8,192 (its N x N buffers): more than a 1 GB process.
    result = finetune_step._run_isolated(
        {"kind": "loss", "loss": "dense", "d": 8, "sizes": [64, 8192], "budget_gb": 1.0,
         "seed": 0, "threads": 1}, timeout=120, nice=0)
    assert result["status"] == "ok", result
    small, large = result["rows"]
    assert small["status"] == "ok" and small["loss_alone_mb"] >= 0
    assert large["status"] == "out of memory at budget 1 GB"


def test_prediction_extrapolates_the_encoder_and_adds_the_loss():
    # Encoder 1 s + 0.01 s per example; the loss alone measured at every N.
    loss_seconds = {64: 0.1, 128: 0.2, 256: 5.0}
    measured = [(n, 1 + 0.01 * n + loss_seconds[n]) for n in (64, 128)]
    assert finetune_step.predict_seconds(256, measured, loss_seconds) == pytest.approx(
        1 + 2.56 + 5.0)
    assert finetune_step.predict_seconds(256, measured[:1], {}) == pytest.approx(
        (1 + 0.64 + 0.1) * 4)
    assert finetune_step.predict_seconds(256, [], {}) is None


def test_merge_settings_unites_the_runs():
    def settings(models, losses, chunks, seq_len=32, budget=8.0):
        return {"budget_gb": budget, "models": models, "losses": losses, "chunk_sizes": chunks,
                "model_specs": {m: {"seq_len": seq_len} for m in models},
                "describe": {"command": "c", "date": "d", "grid": "g"}}

    merged = finetune_step._merge_settings({"settings": settings(["minilm"], ["dense"], [0])},
                                           settings(["minilm"], ["scl_kernels"], [64]))
    assert merged["losses"] == ["dense", "scl_kernels"] and merged["chunk_sizes"] == [0, 64]
    with pytest.raises(ValueError, match="sequence length"):
        finetune_step._merge_settings({"settings": settings(["minilm"], ["dense"], [0])},
                                      settings(["minilm"], ["dense"], [0], seq_len=16))


def test_reasons_not_to_run():
    def reason(n, history, loss_alone=None, limit=100.0):
        return finetune_step.reason_not_to_run(n, history, loss_alone, {}, budget_gb=8,
                                               time_limit=limit)

    ok = {"n": 64, "status": "ok", "step_s": 10.0, "peak_rss_gb": 0.6, "loaded_rss_gb": 0.5}
    assert reason(128, [ok]) is None
    assert reason(1024, [ok]) == "skipped: predicted 160 s > 100 s"
    # Predicted to run out (0.5 GB more per 64 examples: 8.5 GB at 1,024): runs despite its
    # predicted time, to show where the setup runs out.
    hungry = {**ok, "peak_rss_gb": 1.0}
    assert finetune_step.predict_peak_gb(1024, [hungry]) == pytest.approx(0.5 + 0.5 * 16)
    assert reason(1024, [hungry]) is None
    ran_out = {"n": 128, "status": "out of memory at budget 8 GB"}
    assert reason(256, [ok, ran_out]) == "out of memory at budget 8 GB (not run: N = 128 ran out)"
    assert reason(128, [ok], {"status": "out of memory at budget 8 GB"}).endswith(
        "(not run: the SupCon term alone ran out)")
    assert reason(512, [ok, {"n": 256, "status": "skipped: predicted 200 s > 100 s"}]).startswith(
        "skipped: N = 256 was skipped")
