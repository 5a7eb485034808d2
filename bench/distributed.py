"""Distributed SupCon on gloo (CPU): time and peak memory per rank of scl_kernels.distributed
(strategy "gather" and "ring") against the dense PyTorch SupCon on the all-gathered batch and
pytorch-metric-learning's DistributedLossWrapper.

    python -m bench.distributed                   # 2 and 4 ranks; N global 2,048 .. 16,384; D 128
    python -m bench.distributed --worlds 2 --sizes 4096 --methods gather,ring,dense
    python -m bench.distributed --quick           # smoke test: 2 ranks, N 256, D 16, seconds

Every rank holds N_global / world rows of one global batch (float32 [N_global, D] drawn from one
seed, labels uniform over max(2, N_global // 8) classes, t = 0.1) and runs forward + backward of
the global loss. Methods (``METHODS``):

- ``gather``: ``scl_kernels.distributed.supcon_loss(strategy="gather", backend="cpu")``;
- ``ring``: the same with ``strategy="ring"``;
- ``dense``: ``torch.distributed.nn.functional.all_gather`` of the local rows (its backward returns
  each rank the summed gradient of its rows), then the SupContrast-style dense SupCon of
  ``bench.baselines.dense_supcon`` restricted to this rank's anchors: an [N_local, N_global] logit
  matrix and float masks of that size per rank (``dense_local_anchors``); the global mean comes
  from an all-reduce of (sum of the local anchors' losses, anchors with a positive). It is the
  per-rank split a careful user writes, not the naive N_global x N_global matrix on every rank
  (that is what ``pml`` does);
- ``pml``: ``DistributedLossWrapper(losses.SupConLoss(temperature=0.1))`` (efficient=False, its
  default): every rank all-gathers the embeddings without gradient, puts its own first and
  computes the whole N_global x N_global loss; the gradient reaches only its own rows, and it is
  the global loss's (that rank computes every term its rows appear in). It returns world x the
  loss, so that DDP's average of the parameter gradients is the global loss's gradient: the
  values reported are divided by the world size, the gradients compared after the same division;
- ``pml_efficient``: the same with ``efficient=True``: this rank's anchors against the gathered
  set (N_local x N_global), mean over its own anchors (x world). Its value is a per-rank mean, not
  the global loss, and its gradient misses what a rank's rows get as columns of the other ranks'
  anchors (the gathered rows carry no gradient): an approximation, timed for reference;
- ``single``: for scale, ``scl_kernels.supcon_loss`` of the whole batch in one process (world
  size 1, all cores), i.e. the same machine without distributing.

Each (world, N, method) runs in fresh processes (``torch.multiprocessing``, forkserver), one per
rank, each with ``--threads`` torch threads (default: the cores divided by the world size, at
least 1) under a memory cap (``bench.finetune_step.cap_memory``, RLIMIT_AS, ``--budget-gb`` split
evenly over the ranks). Per rank: ``--warmup`` steps, the first one's loss and gradient kept for
the checks, then timed steps, each between two barriers (``dist.barrier``; wall clock from the
first barrier's return to the second's), until ``--repeats`` steps or, past 3 steps,
``--max-seconds`` (the decision is all-reduced, so every rank runs the same steps). Reported:
the median over steps of the slowest rank's time, and the peak memory of the timed steps above
what the rank held before them (``bench.harness.memory.PeakMemory``: the RSS high-water mark, VmHWM,
reset through /proc/self/clear_refs, after malloc_trim), the largest over ranks. A configuration
that runs out of memory under the cap, crashes or passes ``--time-limit`` becomes a row with
that status; one whose time predicted from a smaller N of the same method (x N^2) passes the time
limit, or whose smaller N ran out of memory, is not run.

On a shared machine: before each configuration the driver waits for other processes to use
less than ``--quiet-threshold`` of the cores (at most ``--wait-quiet`` seconds in all); each row
records the share other processes used during its timed steps (/proc/stat's busy time minus the
ranks' own CPU time), and a row above the threshold is measured once more at the end, the less
disturbed of the two kept.

Checks: the loss of every method against a single-process ``scl_kernels.supcon_loss`` of the
whole global batch (computed by the driver), and each rank's gradient of its rows against that
reference's gradient rows (relative max-abs error; pml's divided by the world size).

Writes distributed_gloo_cpu_<date>.{txt,json} (``--quick``: ``..._quick.{txt,json}``) to --out
(bench/results/local/ by default); the JSON after every configuration.
"""
import datetime
import functools
import importlib.util
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import tempfile
import time
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .harness import cli, report
from .harness.machine import load_average, machine_description
from .harness.memory import PeakMemory
from .harness.other_processes import cpu_jiffies, wait_until_quiet

METHODS = ("gather", "ring", "dense", "pml", "pml_efficient", "single")
SINGLE = "single"  # one process, the whole batch: what the machine does without distributing
DENSE = "dense"
TEMPERATURE = 0.1
DEFAULT_WORLDS = "2,4"
DEFAULT_SIZES = "2048,8192,16384"
GIB, MIB = 2**30, 2**20
# Gradients are compared only up to this many global rows (the driver loads every rank's rows
# and recomputes the single-process reference's, which costs time and memory).
MAX_CHECKED_N = 16384


def num_classes(n_global):
    return max(2, n_global // 8)


def global_batch(n_global, d, seed):
    """The whole batch, the same on every rank and in the driver: [N, D] float32, labels."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n_global, d, generator=generator)
    labels = torch.randint(0, num_classes(n_global), (n_global,), generator=generator)
    return features, labels


def local_rows(n_global, world, rank):
    """(first row, rows) of ``rank``'s share: the global batch split as evenly as it goes."""
    base, extra = divmod(n_global, world)
    return rank * base + min(rank, extra), base + (rank < extra)


# ----------------------------------------------------------------------------------------------
# The losses: (local features, local labels, temperature) -> global loss on every rank


def dense_local_anchors(local, labels, temperature):
    """Dense PyTorch SupCon of the global batch, this rank's anchors only.

    The rows are gathered with ``torch.distributed.nn.functional.all_gather`` (its backward sums
    every rank's gradient of a row and returns it to the row's owner), then the lines of
    ``bench.baselines.dense_supcon`` run on an [N_local, N_global] logit matrix: L2-normalised
    rows, the row max subtracted, float masks for "not self" and "positive", anchors without a
    positive left out of the mean. The objective of this rank is (sum of its anchors' losses) /
    (anchors with a positive, all ranks), whose sum over ranks is the global loss, so each rank
    gets exactly the global loss's gradient for its rows; the value returned is the global loss.
    """
    from torch.distributed.nn.functional import all_gather as all_gather_with_grad

    # torch 2.13 calls it deprecated in favour of a private module; it is what users call.
    warnings.filterwarnings("ignore", message=".*nn.functional.all_gather is deprecated")
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = torch.cat(all_gather_with_grad(local))
    all_labels = [torch.empty_like(labels) for _ in range(world)]
    dist.all_gather(all_labels, labels.contiguous())
    all_labels = torch.cat(all_labels)
    n, total = local.shape[0], rows.shape[0]
    offset = rank * n  # all_gather needs the same rows on every rank
    z = F.normalize(rows, dim=1)
    anchors = z[offset:offset + n]
    logits = anchors @ z.T / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    not_self = torch.ones(n, total, dtype=z.dtype)
    not_self[:, offset:offset + n].fill_diagonal_(0)
    same_class = (labels[:, None] == all_labels[None, :]) & (labels[:, None] >= 0)
    positives = same_class.to(z.dtype) * not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(dim=1, keepdim=True))
    num_positives = positives.sum(dim=1)
    mean_log_prob_pos = (positives * log_prob).sum(dim=1) / num_positives.clamp_min(1)
    has_positive = num_positives > 0
    local_sum = -mean_log_prob_pos[has_positive].sum()
    totals = torch.stack([local_sum.detach().double(), has_positive.sum().double()])
    dist.all_reduce(totals)
    share = local_sum / totals[1].clamp_min(1)
    value = (totals[0] / totals[1].clamp_min(1)).to(share.dtype)
    return share + (value - share).detach()


@functools.lru_cache(maxsize=None)
def _pml_wrapper(temperature, efficient):
    from pytorch_metric_learning import losses
    from pytorch_metric_learning.utils.distributed import DistributedLossWrapper
    return DistributedLossWrapper(losses.SupConLoss(temperature=temperature), efficient=efficient)


def pml_loss(local, labels, temperature, *, efficient):
    return _pml_wrapper(temperature, efficient)(local, labels)


def ours(local, labels, temperature, *, strategy):
    from scl_kernels.distributed import supcon_loss
    return supcon_loss(local, labels, temperature, backend="cpu", strategy=strategy)


def single_process(features, labels, temperature):
    import scl_kernels
    return scl_kernels.supcon_loss(features, labels, temperature, backend="cpu")


def loss_function(method):
    """(local, labels, temperature) -> loss tensor, and the factor the loss and gradient carry
    relative to the global loss's (pml multiplies by the world size)."""
    return {
        "gather": (functools.partial(ours, strategy="gather"), 1),
        "ring": (functools.partial(ours, strategy="ring"), 1),
        "dense": (dense_local_anchors, 1),
        "pml": (functools.partial(pml_loss, efficient=False), "world"),
        "pml_efficient": (functools.partial(pml_loss, efficient=True), "world"),
        "single": (single_process, 1),
    }[method]


def method_requires(method):
    return "pytorch_metric_learning" if method.startswith("pml") else None


# ----------------------------------------------------------------------------------------------
# Inside a rank


def _own_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _jiffies():
    """(busy, total) jiffies of all cores so far (/proc/stat), or None."""
    try:
        return cpu_jiffies()
    except (OSError, ValueError, IndexError):
        return None


def _rank_main(rank, task):
    """One rank of one configuration; writes ``rank<r>.json`` into ``task["dir"]``."""
    from .finetune_step import cap_memory, is_out_of_memory, out_of_memory_status
    from scl_kernels.profiling import process_status_bytes

    out_path = os.path.join(task["dir"], f"rank{rank}.json")
    result = {"rank": rank, "status": "started"}
    world, method = task["world"], task["method"]
    budget = task["budget_gb"] / world
    torch.set_num_threads(task["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method="file://" + os.path.join(task["dir"], "rendezvous"),
                            timeout=datetime.timedelta(seconds=task["collective_timeout"]))
    try:
        features, labels = global_batch(task["n"], task["d"], task["seed"])
        first, count = local_rows(task["n"], world, rank)
        local = features[first:first + count].clone().requires_grad_()
        local_labels = labels[first:first + count].clone()
        del features, labels
        loss_fn, _ = loss_function(method)
        result["loaded_rss_mb"] = process_status_bytes("VmRSS") / MIB
        if not cap_memory(budget * GIB):
            raise MemoryError("over the budget before the first step")

        def step():
            local.grad = None
            loss = loss_fn(local, local_labels, TEMPERATURE)
            loss.backward()
            return float(loss.detach())

        for i in range(task["warmup"]):
            value = step()
            if i == 0:
                result["loss"] = value
                if task["save_grad"]:
                    torch.save(local.grad.clone(), os.path.join(task["dir"], f"grad{rank}.pt"))
        times, spent = [], 0.0
        dist.barrier()
        cpu_before, jiffies_before = _own_cpu_seconds(), _jiffies()
        with PeakMemory("cpu") as peak:
            while len(times) < task["repeats"] and (len(times) < 3 or spent < task["max_seconds"]):
                dist.barrier()
                start = time.perf_counter()
                step()
                dist.barrier()
                elapsed = time.perf_counter() - start
                # The slowest rank's time decides for every rank whether to go on.
                slowest = torch.tensor([elapsed], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                spent += float(slowest)
                times.append(elapsed)
        jiffies_after = _jiffies()
        result.update(cpu_s=_own_cpu_seconds() - cpu_before,
                      jiffies=None if None in (jiffies_before, jiffies_after)
                      else [after - before for after, before in zip(jiffies_after, jiffies_before)])
        result.update(status="ok", times=times, peak_mb=peak.peak_bytes / MIB,
                      process_hwm_mb=process_status_bytes("VmHWM") / MIB)
    except Exception as error:  # one configuration must not end the run
        if is_out_of_memory(error):
            status = out_of_memory_status(task["budget_gb"]) + f" ({budget:g} GB per rank)"
        else:
            status = f"error: {type(error).__name__}: {error}".splitlines()[0][:300]
        result["status"] = status
        report.write_json(out_path, result)
        traceback.print_exc()
        # The other ranks may wait in a collective for this one: end the whole configuration.
        os._exit(3)
    report.write_json(out_path, result)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# The driver


def _start_method():
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def run_configuration(task, time_limit):
    """Runs one (world, N, method) in ``task["world"]`` fresh processes; returns their results
    ([per-rank dict]) and a status for the configuration."""
    started = time.monotonic()
    context = torch.multiprocessing.start_processes(
        _rank_main, args=(task,), nprocs=task["world"], join=False,
        start_method=_start_method())
    status = None
    while True:
        try:
            if context.join(timeout=1.0, grace_period=5.0):
                break
        except Exception as error:  # a rank failed: join ended the others
            status = f"failed: {str(error).strip().splitlines()[0][:200]}"
            break
        if time.monotonic() - started > time_limit:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join()
            status = f"timed out after {time_limit:g} s"
            break
    results = []
    for rank in range(task["world"]):
        path = os.path.join(task["dir"], f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as file:
                results.append(json.load(file))
    failed = [r["status"] for r in results if r["status"] not in ("ok", "started")]
    if failed:
        # A rank's own account beats join's, and running out of memory beats the errors it
        # causes on the other ranks (gloo: "Connection closed by peer").
        failed.sort(key=lambda status: not status.startswith("out of memory"))
        status = failed[0]
    elif status is None and len(results) < task["world"]:
        status = "failed: a rank wrote no result"
    return results, status or "ok", time.monotonic() - started


def reference_loss_and_grad(n, d, seed, check_grad):
    """Single-process scl_kernels.supcon_loss of the whole batch (the fused CPU op)."""
    import scl_kernels
    features, labels = global_batch(n, d, seed)
    features.requires_grad_()
    loss = scl_kernels.supcon_loss(features, labels, TEMPERATURE, backend="cpu")
    if not check_grad:
        return float(loss.detach()), None
    loss.backward()
    return float(loss.detach()), features.grad


def _relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def summarise(task, results, status, seconds, reference):
    """One table row: times, memory, checks."""
    world, n = task["world"], task["n"]
    row = {"world": world, "n_global": n, "n_local": local_rows(n, world, 0)[1], "d": task["d"],
           "classes": num_classes(n), "method": task["method"], "threads_per_rank":
           task["threads"], "status": status, "wall_s": seconds}
    ok = [r for r in results if r["status"] == "ok"]
    if status != "ok" or len(ok) != world:
        return row
    steps = min(len(r["times"]) for r in ok)
    slowest = [max(r["times"][i] for r in ok) for i in range(steps)]
    row.update(steps=steps, step_ms=statistics.median(slowest) * 1e3,
               step_min_ms=min(slowest) * 1e3,
               fastest_rank_ms=statistics.median(
                   [min(r["times"][i] for r in ok) for i in range(steps)]) * 1e3,
               peak_mb=max(r["peak_mb"] for r in ok),
               peak_mb_min_rank=min(r["peak_mb"] for r in ok),
               process_hwm_mb=max(r["process_hwm_mb"] for r in ok),
               loaded_rss_mb=max(r["loaded_rss_mb"] for r in ok))
    # Share of all cores that other processes used during the timed steps: /proc/stat's busy
    # time (rank 0's view) minus every rank's own CPU time (bench.measure.OthersCpu, per job).
    jiffies = ok[0].get("jiffies")
    if jiffies and jiffies[1] > 0:
        tick = os.sysconf("SC_CLK_TCK")
        others = jiffies[0] / tick - sum(r["cpu_s"] for r in ok)
        row["others_busy"] = max(0.0, others / (jiffies[1] / tick))
    _, factor = loss_function(task["method"])
    scale = world if factor == "world" else 1
    values = [r["loss"] / scale for r in ok]
    row["loss"] = values[0]
    row["loss_same_on_every_rank"] = max(values) - min(values) <= 1e-6 * max(1.0, abs(values[0]))
    ref_loss, ref_grad = reference
    row["loss_rel_diff"] = max(_relative(v, ref_loss) for v in values)
    if ref_grad is not None:
        errors = []
        for rank in range(world):
            path = os.path.join(task["dir"], f"grad{rank}.pt")
            if not os.path.exists(path):
                break
            grad = torch.load(path) / scale
            first, count = local_rows(n, world, rank)
            want = ref_grad[first:first + count]
            errors.append(float((grad - want).abs().max() / want.abs().max().clamp_min(1e-30)))
        if len(errors) == world:
            row["grad_rel_err"] = max(errors)
    return row


def add_ratios(rows):
    """time and memory of each row against dense's at the same world size and N."""
    dense = {(r["world"], r["n_global"]): r for r in rows
             if r["method"] == DENSE and r["status"] == "ok"}
    for r in rows:
        r.pop("time_vs_dense", None)
        r.pop("memory_vs_dense", None)
        base = dense.get((r["world"], r["n_global"]))
        if r["status"] == "ok" and base is not None:
            r["time_vs_dense"] = r["step_ms"] / base["step_ms"]
            r["memory_vs_dense"] = r["peak_mb"] / base["peak_mb"] if base["peak_mb"] else None


def skip_reason(method, world, n, rows, args):
    """Why (method, world, N) is not run, from the rows of smaller N, or None."""
    requires = method_requires(method)
    if requires and importlib.util.find_spec(requires) is None:
        return f"not installed ({requires})"
    smaller = sorted((r for r in rows if r["method"] == method and r["world"] == world
                      and r["n_global"] < n), key=lambda r: r["n_global"])
    for r in smaller:
        if r["status"].startswith("out of memory"):
            return f"not run: out of memory at N = {r['n_global']}"
        if r["status"].startswith("timed out") or r["status"].startswith("not run: predicted"):
            return f"not run: N = {r['n_global']} already over the time limit"
    done = [r for r in smaller if r["status"] == "ok"]
    if done:
        last = done[-1]
        predicted = last["step_ms"] / 1e3 * (n / last["n_global"]) ** 2
        steps = args.warmup + min(args.repeats, 3)
        if predicted * steps > args.time_limit:
            return (f"not run: predicted {predicted:.0f} s per step x {steps} steps > "
                    f"{args.time_limit:g} s")
    return None


def _fmt_ms(value):
    if value is None:
        return "—"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _fmt(value, digits=2):
    return "—" if value is None else f"{value:.{digits}f}"


def _fmt_err(value):
    return "—" if value is None else f"{value:.1e}"


def table(rows):
    order = {m: i for i, m in enumerate(METHODS)}
    rows = sorted(rows, key=lambda r: (r["world"], r["n_global"], order[r["method"]]))
    return report.markdown_table(
        ("ranks", "N global", "N local", "method", "step ms (median, slowest rank)", "best ms",
         "peak MB per rank (max)", "time / dense", "memory / dense", "loss", "loss rel. diff",
         "grad rel. err", "steps", "others busy", "status"),
        [(r["world"], r["n_global"], r["n_local"], r["method"], _fmt_ms(r.get("step_ms")),
          _fmt_ms(r.get("step_min_ms")), _fmt(r.get("peak_mb"), 1), _fmt(r.get("time_vs_dense")),
          _fmt(r.get("memory_vs_dense"), 3), _fmt(r.get("loss"), 5),
          _fmt_err(r.get("loss_rel_diff")),
          _fmt_err(r.get("grad_rel_err")), r.get("steps", "—"), _fmt(r.get("others_busy")),
          r["status"]) for r in rows])


def write_outputs(base, rows, machine, settings):
    report.write_json(base + ".json", {"machine": machine, "settings": settings, "rows": rows})
    parts = report.markdown_header(f"Distributed SupCon on gloo (CPU), {machine['date'][:10]}",
                                   machine, settings)
    parts += ["", "step ms: median over the timed steps of the slowest rank's wall time of one "
              "forward + backward (between two barriers); best: the fastest such step. peak MB: "
              "RSS high-water mark of the timed steps above what the rank held before them "
              "(inputs, torch, gloo), the largest over ranks. time / memory vs dense: the same "
              "world size and N. loss: the global loss (pml's divided by the world size); loss "
              "rel. diff and grad rel. err: against a single-process scl_kernels.supcon_loss of "
              "the whole batch (max over ranks; grad: max-abs error over max-abs of the rank's "
              "reference rows; pml's gradient divided by the world size). others busy: share of "
              "all cores that processes other than the ranks used during the timed steps "
              "(/proc/stat); above ~0.1 the row was disturbed.", ""]
    parts.append(table(rows))
    with open(base + ".txt", "w") as out:
        out.write("\n".join(parts) + "\n")


def _parse(argv):
    parser = cli.benchmark_parser(
        __doc__, sizes=None, repeats=None, warmup=1, max_seconds=20.0, threads=None,
        quiet_threshold=0.1, wait_quiet=120.0, retries=1, seed=0,
        helps={"sizes": f"N global, comma-separated (default {DEFAULT_SIZES}; --quick 256)",
               "repeats": "timed steps, at most (default 5; --quick 2)",
               "warmup": "untimed steps first (default %(default)s)",
               "threads": "torch threads per rank (default: cores // world size, at least 1)",
               "quiet_threshold": "a row during whose timed steps other processes used at least "
                                  "this share of all cores is measured once more at the end, and "
                                  "the less disturbed of the two kept; before each configuration "
                                  "the run waits for other processes to use less than this; 0: "
                                  "neither (default %(default)s)"})
    parser.add_argument("--worlds", type=cli.int_list,
                        help=f"world sizes, comma-separated (default {DEFAULT_WORLDS}; --quick 2)")
    parser.add_argument("--dim", "-d", type=cli.positive_int,
                        help="D (default 128; --quick 16)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--time-limit", type=float, default=120.0,
                        help="seconds per configuration, start-up included; a longer one is "
                             "killed, and one predicted longer is not run")
    parser.add_argument("--budget-gb", type=float, default=12.0,
                        help="memory cap of one configuration, split evenly over its ranks "
                             "(RLIMIT_AS per rank)")
    parser.add_argument("--no-grad-check", action="store_true",
                        help="skip the gradient comparison with the single-process reference")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: by default 2 ranks, N = 256, D = 16, 2 timed steps, "
                             "every method, at most 60 s and 4 GB per configuration")
    args = parser.parse_args(argv)
    defaults = (([2], [256], 16, 2) if args.quick
                else (cli.int_list(DEFAULT_WORLDS), cli.int_list(DEFAULT_SIZES), 128, 5))
    for name, value in zip(("worlds", "sizes", "dim", "repeats"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.time_limit, args.budget_gb = min(args.time_limit, 60.0), min(args.budget_gb, 4.0)
        args.wait_quiet, args.retries = 0.0, 0
    return args


def main(argv=None):
    args = _parse(argv)
    worlds, sizes = args.worlds, args.sizes
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; known: {METHODS}")
    uneven = [(n, w) for n in sizes for w in worlds if n % w]
    if uneven:  # the dense peer's all_gather needs the same rows on every rank
        raise SystemExit(f"N global must be a multiple of the world size: {uneven}")
    # Every row is checked against the single-process fused op, and gather, ring and single run it.
    from scl_kernels.backends import require_fused
    require_fused("cpu", "cpu", "python -m bench.distributed")
    date = datetime.date.today().isoformat()
    base = report.result_stem(args.out, f"distributed_gloo_cpu_{date}"
                              + ("_quick" if args.quick else ""))
    cores = os.cpu_count() or 1
    machine = machine_description("cpu")
    machine["CPU"] = f"{machine['CPU'].split(',')[0]}, {cores} cores"
    if len(worlds) and max(worlds) > cores:
        machine["note"] = (f"{max(worlds)} ranks share {cores} cores: those rows measure the "
                           "ranks' contention for the cores, not scaling")
    settings = {
        "command": report.command_line("bench.distributed", argv),
        "problem": f"float32 [N_global, {args.dim}] split evenly over the ranks, labels uniform "
                   f"over max(2, N_global // 8) classes, t = {TEMPERATURE}, forward + backward",
        "processes": f"{_start_method()} start, one fresh process per rank and configuration, "
                     f"gloo over a file rendezvous; torch threads per rank: "
                     f"{args.threads or 'cores // world, at least 1'}",
        "timing": f"{args.warmup} warm-up step(s), then up to {args.repeats} timed steps (after 3, "
                  f"only while under {args.max_seconds:g} s of timing), each between barriers",
        "limits": f"memory cap {args.budget_gb:g} GB per configuration, split over its ranks "
                  f"(RLIMIT_AS); {args.time_limit:g} s per configuration",
        "shared machine": f"before each configuration, wait for other processes to use < "
                          f"{args.quiet_threshold:g} of the cores (at most {args.wait_quiet:g} s "
                          f"in all); rows disturbed beyond that measured "
                          + ("once more at the end, the less disturbed kept" if args.retries
                             else "once"),
    }
    print("\n".join(f"{k}: {v}" for k, v in {**machine, **settings}.items()), flush=True)
    if _start_method() == "forkserver":
        preload = ["torch", "scl_kernels.distributed"]
        if importlib.util.find_spec("pytorch_metric_learning") is not None:
            preload.append("pytorch_metric_learning.losses")
        multiprocessing.set_forkserver_preload(preload)

    rows, references = [], {}
    scratch = tempfile.mkdtemp(prefix="scl_bench_distributed_")
    waited = 0.0

    def measure(world, method, n, *, skip=True):
        nonlocal waited
        row_dir = tempfile.mkdtemp(prefix=f"w{world}_n{n}_{method}_", dir=scratch)
        check_grad = references[n][1] is not None
        task = {"world": world, "n": n, "d": args.dim, "method": method, "seed": args.seed,
                "warmup": max(1, args.warmup), "repeats": args.repeats,
                "max_seconds": args.max_seconds, "budget_gb": args.budget_gb,
                "threads": args.threads or max(1, cores // world), "save_grad": check_grad,
                "dir": row_dir, "collective_timeout": args.time_limit + 60}
        reason = skip_reason(method, world, n, rows, args) if skip else None
        if reason:
            row = summarise(task, [], reason, 0.0, references[n])
        else:
            if args.quiet_threshold and waited < args.wait_quiet:
                started = time.perf_counter()
                wait_until_quiet(args.quiet_threshold, args.wait_quiet - waited, sample=0.5)
                waited += time.perf_counter() - started
            results, status, seconds = run_configuration(task, args.time_limit)
            row = summarise(task, results, status, seconds, references[n])
        shutil.rmtree(row_dir, ignore_errors=True)
        print(f"ranks={world} N={n:6d} {method:14s} {row['status']:10s} step "
              f"{_fmt_ms(row.get('step_ms'))} ms, peak {_fmt(row.get('peak_mb'), 1)} "
              f"MB/rank, loss {_fmt(row.get('loss'), 5)} (rel. diff "
              f"{_fmt_err(row.get('loss_rel_diff'))}, grad {_fmt_err(row.get('grad_rel_err'))}), "
              f"others busy {_fmt(row.get('others_busy'))}, {row['wall_s']:.1f} s", flush=True)
        return row

    def disturbed(row):
        return (args.quiet_threshold and row.get("others_busy") is not None
                and row["others_busy"] >= args.quiet_threshold)

    try:
        for n in sizes:
            references[n] = reference_loss_and_grad(
                n, args.dim, args.seed, not args.no_grad_check and n <= MAX_CHECKED_N)
            configurations = [(1, SINGLE)] if SINGLE in methods else []
            configurations += [(w, m) for w in worlds for m in methods if m != SINGLE]
            for world, method in configurations:
                rows.append(measure(world, method, n))
                add_ratios(rows)
                write_outputs(base, rows, machine, settings)
        # Rows that other processes disturbed get one more chance, later (often quieter); the
        # less disturbed of the two is kept.
        for i, row in enumerate(rows):
            if args.retries and disturbed(row):
                print(f"again (others busy {row['others_busy']:.2f}): ranks={row['world']} "
                      f"N={row['n_global']} {row['method']}", flush=True)
                again = measure(row["world"], row["method"], row["n_global"], skip=False)
                again["retried"] = True
                if again["status"] == "ok" and again.get("others_busy", 1.0) < row["others_busy"]:
                    rows[i] = again
                else:
                    row["retried"] = True
                add_ratios(rows)
                write_outputs(base, rows, machine, settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if rows:
            machine["load average at end"] = load_average()
            write_outputs(base, rows, machine, settings)
            print(f"wrote {base}.txt, .json", flush=True)
    if rows:
        print("\n" + table(rows))
    return rows

if __name__ == "__main__":
    main()
