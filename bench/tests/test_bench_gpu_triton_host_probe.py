"""bench/gpu/triton_host_probe.py without a GPU: the whole CPU run, which writes its report and
leaves the rule undecided; the classifier of the host time by part on synthetic pstats rows; the
rule's three verdicts on synthetic numbers. The GPU session runs it for real."""
import json

import pytest

from bench.gpu import triton_host_probe as probe
from support import needs

TRITON = "/site-packages/triton"
BACKEND = "/repo/scl_kernels/backends/triton"


def row(own, callers=None):
    """A pstats entry: (primitive calls, calls, own s, cumulative s, callers)."""
    return (1, 1, own, own, callers or {})


def test_host_time_by_part():
    jit_run = (f"{TRITON}/runtime/jit.py", 600, "run")
    launcher = (f"{TRITON}/backends/nvidia/driver.py", 700, "__call__")
    handle = (f"{BACKEND}/handles.py", 45, "launch")
    tile_launch = (f"{BACKEND}/launch.py", 540, "grad_symmetric")
    stage = (f"{BACKEND}/anchor_weights.py", 60, "anchor_weights")
    op_call = ("/site-packages/torch/_ops.py", 1200, "__call__")
    front_end = ("/repo/scl_kernels/functional.py", 142, "supcon_loss")
    empty = ("~", 0, "<built-in method torch.empty>")
    table = {
        jit_run: row(4.0),
        launcher: row(1.0),
        handle: row(2.0),
        tile_launch: row(3.0),
        ("~", 0, "<built-in method __triton_launcher.launch>"): row(
            5.0, {launcher: (9, 9, 5.0, 5.0)}),
        ("~", 0, "<built-in method cuda_utils.fill_tma_descriptor>"): row(0.5),
        stage: row(6.0),
        op_call: row(0.25),
        front_end: row(0.75),
        # A built-in's own time goes to its callers' parts: the launchers', the stage's, and
        # from anywhere else (and whatever no caller accounts for) to C++.
        empty: row(10.0, {tile_launch: (1, 1, 1.0, 1.0), stage: (2, 2, 2.0, 2.0),
                          front_end: (1, 1, 3.0, 3.0)}),
        ("~", 0, "<method 'run_backward' of 'torch._C._EngineBase' objects>"): row(
            20.0, {("/site-packages/torch/autograd/graph.py", 800, "_engine_run_backward"):
                   (1, 1, 20.0, 40.0)}),
    }
    parts = probe.host_time_by_part(table, TRITON, BACKEND)
    assert parts == {
        probe.LAUNCH_PYTHON: 4.0 + 1.0 + 2.0 + 3.0 + 1.0,
        probe.LAUNCH_DRIVER: 5.0 + 0.5,
        probe.STAGE_OPS: 6.0 + 2.0,
        probe.CPP: 3.0 + 4.0 + 20.0,
        probe.OTHER_PYTHON: 0.25 + 0.75,
    }
    assert sum(parts.values()) == pytest.approx(sum(entry[2] for entry in table.values()))
    assert probe.backward_seen(table, BACKEND)
    assert not probe.backward_seen({jit_run: row(1.0), tile_launch: row(1.0)}, BACKEND)
    # Without triton installed nothing is Triton's package; the backend's files still count.
    assert probe.part_of_function(jit_run, None, BACKEND) == probe.OTHER_PYTHON
    assert probe.part_of_function(tile_launch, None, BACKEND) == probe.LAUNCH_PYTHON
    # A folder whose name merely starts like triton's is not triton's.
    assert probe.part_of_function(("/site-packages/triton_extra/x.py", 1, "f"), TRITON,
                                  BACKEND) == probe.OTHER_PYTHON

    top = probe.top_functions(table, TRITON, BACKEND, count=3)
    assert [(name, part) for name, _, _, _, _, part in top] == [
        ("<method 'run_backward' of 'torch._C._EngineBase' objects>", probe.CPP),
        # 7 of its 10 s: called from the front end, or from no profiled caller
        ("<built-in method torch.empty>", probe.CPP),
        ("anchor_weights", probe.STAGE_OPS)]


@pytest.mark.parametrize("share, ratio, verdict, says", [
    (0.62, 3.0, probe.BUILD, "62%"),
    (0.50, 1.2, probe.BUILD, "50%"),
    (0.62, 1.15, probe.NOT_WORTH_IT, "hidden behind the GPU"),
    (0.18, 3.0, probe.NOT_WORTH_IT, "look at C++ called from elsewhere"),
    (0.49, 3.0, probe.NOT_DECIDED, "between 25% and 50%"),
    (0.25, 3.0, probe.NOT_DECIDED, "between 25% and 50%"),
    (None, 3.0, probe.NOT_DECIDED, "backward's thread"),
    (0.62, None, probe.NOT_DECIDED, "no GPU"),
])
def test_rule_verdicts(share, ratio, verdict, says):
    got, why = probe.triton_host_verdict(share, ratio, probe.CPP)
    assert got == verdict and says in why


@needs.library
def test_cpu_run_writes_its_report(tmp_path, capsys):
    payload = probe.main(["--device", "cpu", "--backends", "cpu", "--sizes", "256", "--dims",
                          "16", "--out", str(tmp_path)])
    [r] = payload["rows"]
    assert (r["backend"], r["n"], r["d"]) == ("cpu", 256, 16)
    assert r["graph_ms"] is None and r["graphed_back_to_back_ms"] is None
    host = r["host"]
    assert host["profiled_steps"] == probe.PROFILED_STEPS
    assert len(host["top"]) == probe.TOP_FUNCTIONS and host["launch_share"] == 0
    assert sum(host["parts_ms_per_step"].values()) == pytest.approx(host["profiled_ms_per_step"])
    assert payload["verdict"] == probe.NOT_DECIDED

    rule = [line for line in capsys.readouterr().out.splitlines() if "triton host rule" in line]
    assert all(line.startswith("triton host rule") for line in rule)
    assert [line for line in rule if line.startswith("triton host rule:")] == [rule[-1]]
    assert rule[-1] == "triton host rule: not decided (no GPU)"

    names = sorted(path.name for path in tmp_path.iterdir())
    assert [name.rsplit(".", 1)[1] for name in names] == ["json", "md"]
    assert all(name.startswith("triton_host_probe_cpu_") for name in names)
    saved = json.loads((tmp_path / names[0]).read_text())
    assert saved["rule_lines"] == rule and saved["rule"]["build_at_launch_share"] == 0.5
    text = (tmp_path / names[1]).read_text()
    assert "| cpu | 256 | 16 |" in text and "triton host rule: not decided (no GPU)" in text
    table = [line for line in text.splitlines() if line.startswith("| cpu |")]
    cells = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert len(table) == 1 and cells.count("—") == 4  # graph, graph b2b, graphed, ratio


def stand_in_row(backend, n, d, dtype, device, steps):
    """A GPU row as probe_backend makes it, with the numbers of the H100's Triton step."""
    launch = {"triton": 1.0, "cuda": 0.0}[backend]
    parts = dict.fromkeys(probe.PARTS, 0.0)
    parts.update({probe.LAUNCH_PYTHON: launch, probe.CPP: 0.6})
    return {"backend": backend, "n": n, "d": d, "wall_ms": 1.762, "issue_ms": 1.682,
            "back_to_back_ms": 1.70, "graph_ms": 0.559, "graph_back_to_back_ms": 0.524,
            "graph_error": None, "graphed_back_to_back_ms": 0.55, "graphed_error": None,
            "busy_ms": 0.524, "kernels": 26, "seconds": 1.0,
            "host": {"profiled_steps": probe.PROFILED_STEPS, "profiled_ms_per_step": launch + 0.6,
                     "parts_ms_per_step": parts, "launch_share": launch / (launch + 0.6),
                     "backward_seen": True,
                     "top": [("launch", "launch.py:1", 50, 0.05, 0.05, probe.LAUNCH_PYTHON)]}}


def test_the_rule_is_printed_as_soon_as_the_triton_row_is_in(tmp_path, capsys, monkeypatch):
    """On a GPU (stand-in rows, no GPU needed): the rule's lines follow the Triton row before the
    next backend runs, read that row, and the report is already written."""
    monkeypatch.setattr(probe, "probe_backend", stand_in_row)
    monkeypatch.setattr(probe.scl_kernels.backends, "why_not_fused", lambda name, device: None)
    monkeypatch.setattr(probe, "machine_description", lambda device: {"GPU": "stand-in"})
    payload = probe.main(["--out", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    first = [line.split(" ", 1)[0] for line in out]
    assert first[:5] == ["triton", "triton", "triton", "triton", "cuda"]
    assert out[1].startswith("triton host rule (written 2026-12-01")
    assert out[2].startswith("triton host rule input: N = 16384, D = 128: launch path 62.5%")
    assert out[3].startswith("triton host rule: build it (the launch path takes 62%")
    assert payload["verdict"] == probe.BUILD and len(payload["rows"]) == 2
    [report] = tmp_path.glob("*.md")
    assert "- triton host rule: build it" in report.read_text()
