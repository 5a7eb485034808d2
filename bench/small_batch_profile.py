"""Where a small batch's time goes in supcon_loss(backend="cpu"), forward + backward, and the floor.

    python -m bench.small_batch_profile                      # N = 16 and 256, D = 128
    python -m bench.small_batch_profile --sizes 16,64,256 --dims 128 --rounds 40

All in one process, float32, single set, labels over min(100, max(2, N // 4)) classes, t = 0.1.

1. Wall clock: medians over interleaved rounds (bench.measure.interleaved_seconds; rounds that
   other processes disturbed are dropped) of nested calls, whose differences are the parts of
   one training step (its forward half + its backward half, timed inside fwd+bwd calls):
     front end        supcon_loss with the op replaced by a stub: argument checks, the temperature
                      tensor, flattening, the mean (and building its autograd nodes)
     fwd plumbing     torch.ops.scl.supcon with grad enabled minus its CPU kernel called the way
                      register_autograd's wrapper calls it (below Autograd, redispatch to CPU):
                      the Python autograd_impl, Function.apply, setup_context
     C++ forward      that kernel call: ATen glue = kernel - tile kernel; tile kernel =
                      lse_symmetric timed inside C++ (a small extension linked against
                      scl_kernels' library), among the interleaved calls
     C++ backward     the same for scl::supcon_backward and grad_symmetric
     bwd plumbing     the backward half of the same training step with an empty C++ op (same
                      schema, same scl_kernels._op autograd) minus that empty backward kernel:
                      engine, the mean's backward nodes, the register_autograd wrapper,
                      _op._backward, AccumulateGrad
     rest             step - all of the above: the same calls run slower inside a training
                      step than back to back on their own: the kernels right after a dense
                      SupCon step (other code) run ~1.5x slower than in a loop of their own
                      (instruction caches, branch predictors); "fwd+bwd, 1 thread" shows what
                      the second thread costs
2. torch.profiler over the training step: ATen calls per part (outermost aten:: calls, and all
   aten:: events including nested ones), the autograd nodes of the backward, and the most
   expensive ATen ops.
3. Floors: one ATen call from Python; an empty C++ op with scl::supcon's schema and the same
   register_autograd plumbing (scl_kernels._op), alone and behind supcon_loss; the smallest dense
   PyTorch forward+backward (masks precomputed), with autograd and by hand; bench.floor's
   GEMM + exp floor of the symmetric schedule.

Needs a C++ compiler for the extension (torch.utils.cpp_extension.load_inline, built once into
the temp folder); without one the tiles and the empty op are reported as unavailable.
Writes bench/results/small_batch_profile_cpu_<date>_<time>.md (or --out).
"""
import argparse
import collections
import contextlib
import datetime
import functools
import glob
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

import scl_kernels
import scl_kernels.loss as loss_module
from scl_kernels import _op

from . import report
from .floor import measure_floor
from .baselines import dense_supcon
from .implementations import TEMPERATURE, make_inputs
from .measure import interleaved_seconds, make_step, wait_until_quiet
from .small_batch import num_classes

FRONT_MARK, BACKWARD_MARK = "bench: supcon_loss", "bench: backward"
FWD_OP, BWD_OP = "scl::supcon", "scl::supcon_backward"
REPO_ROOT = report.REPO_ROOT

PART_FRONT = "Python front end (supcon_loss)"
PART_FWD_PLUMBING = "autograd plumbing, forward"
PART_FWD_GLUE = "C++ forward: ATen glue"
PART_FWD_TILES = "C++ forward: tile kernel"
PART_BWD_GLUE = "C++ backward: ATen glue"
PART_BWD_TILES = "C++ backward: tile kernel"
PART_BWD_PLUMBING = "autograd plumbing, backward"
PART_CONTEXT = "the same calls slower inside a training step than alone"
PARTS = (PART_FRONT, PART_FWD_PLUMBING, PART_FWD_GLUE, PART_FWD_TILES, PART_BWD_GLUE,
         PART_BWD_TILES, PART_BWD_PLUMBING, PART_CONTEXT)


# ---------------------------------------------------------------------------------------------
# The C++ helper: an empty op with scl::supcon's schema, and the tile kernels timed in C++.

HELPER_SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>

#include <chrono>
#include <optional>
#include <tuple>

#include "supcon_tiles.h"

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_supcon(
    const at::Tensor& features, const at::Tensor& labels, const std::optional<at::Tensor>& contrast,
    const std::optional<at::Tensor>& contrast_labels, const at::Tensor& temperature,
    int64_t num_anchors, bool normalize) {
  const auto loss = features.options().dtype(at::kFloat);
  return {at::empty({num_anchors}, loss), at::empty({num_anchors}, loss),
          at::empty({num_anchors}, features.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_supcon_backward(
    const at::Tensor& grad_loss, const at::Tensor& features, const at::Tensor& labels,
    const std::optional<at::Tensor>& contrast, const std::optional<at::Tensor>& contrast_labels,
    const at::Tensor& temperature, int64_t num_anchors, bool normalize, const at::Tensor& lse) {
  return {at::empty_like(features), at::empty({0, features.size(1)}, features.options()),
          at::empty_like(temperature)};
}

// Seconds per call of lse_symmetric and grad_symmetric on unit rows z (float32), as the op runs
// them; `reps` calls each after one warm-up call.
at::Tensor time_tiles(const at::Tensor& z, double inv_t, const at::Tensor& g, int64_t reps) {
  TORCH_CHECK(z.scalar_type() == at::kFloat && z.is_contiguous() && g.is_contiguous());
  const int64_t n = z.size(0), d = z.size(1);
  const float it = static_cast<float>(inv_t);
  at::Tensor lse = at::empty({n}, z.options());
  at::Tensor dz = at::zeros_like(z);
  using clock = std::chrono::steady_clock;
  scl::cpu::lse_symmetric<float>(z.data_ptr<float>(), n, d, it, lse.data_ptr<float>());
  auto t0 = clock::now();
  for (int64_t r = 0; r < reps; ++r)
    scl::cpu::lse_symmetric<float>(z.data_ptr<float>(), n, d, it, lse.data_ptr<float>());
  auto t1 = clock::now();
  scl::cpu::grad_symmetric<float>(z.data_ptr<float>(), n, d, it, lse.data_ptr<float>(),
                                  g.data_ptr<float>(), dz.data_ptr<float>());
  auto t2 = clock::now();
  for (int64_t r = 0; r < reps; ++r)
    scl::cpu::grad_symmetric<float>(z.data_ptr<float>(), n, d, it, lse.data_ptr<float>(),
                                    g.data_ptr<float>(), dz.data_ptr<float>());
  auto t3 = clock::now();
  const double fwd = std::chrono::duration<double>(t1 - t0).count() / reps;
  const double bwd = std::chrono::duration<double>(t3 - t2).count() / reps;
  return at::tensor({fwd, bwd}, at::kDouble);
}

}  // namespace

TORCH_LIBRARY(scl_bench, m) {
  m.def("supcon" SUPCON_SCHEMA);
  m.def("supcon_backward" SUPCON_BACKWARD_SCHEMA);
  m.def("time_tiles(Tensor z, float inv_t, Tensor g, int reps) -> Tensor");
}

TORCH_LIBRARY_IMPL(scl_bench, CPU, m) {
  m.impl("supcon", &empty_supcon);
  m.impl("supcon_backward", &empty_supcon_backward);
  m.impl("time_tiles", &time_tiles);
}
"""


@functools.lru_cache(maxsize=None)
def helper_ops():
    """Builds and loads the helper; registers scl_kernels' own autograd plumbing on the empty op.
    Returns torch.ops.scl_bench, or None if it cannot be built."""
    from torch.utils.cpp_extension import load_inline
    library = glob.glob(os.path.join(os.path.dirname(scl_kernels.__file__), "_C*.so"))
    if not library:
        print("helper not built: scl_kernels/_C*.so not found", file=sys.stderr)
        return None
    source = (HELPER_SOURCE.replace("SUPCON_SCHEMA", '"' + _op.SUPCON_SCHEMA + '"')
              .replace("SUPCON_BACKWARD_SCHEMA", '"' + _op.SUPCON_BACKWARD_SCHEMA + '"'))
    build = os.path.join(tempfile.gettempdir(), "scl_bench_helper")
    os.makedirs(build, exist_ok=True)
    lib_dir = os.path.dirname(library[0])
    try:
        load_inline("scl_bench_helper", cpp_sources=[source], is_python_module=False,
                    build_directory=build, extra_cflags=["-O2"],
                    extra_include_paths=[os.path.join(REPO_ROOT, "csrc", "cpu")],
                    # The tile kernels are exported template instances of scl_kernels' library;
                    # the loader maps the already loaded file, it does not load a second copy.
                    extra_ldflags=[library[0], f"-Wl,-rpath,{lib_dir}"], verbose=False)
    except Exception as error:  # no compiler: the report says so
        print(f"helper not built: {type(error).__name__}: {error}"[:400], file=sys.stderr)
        return None
    backward_op = torch.ops.scl_bench.supcon_backward.default
    torch.library.register_autograd("scl_bench::supcon",
                                    functools.partial(_op._backward, backward_op),
                                    setup_context=_op._setup_context)
    return torch.ops.scl_bench


def tile_call(features, halves):
    """A call that times the symmetric forward and backward tile kernels once each inside C++ on
    these rows (normalised as the op does) and appends (fwd, bwd) seconds to ``halves``; None
    without the helper. Run among the interleaved calls, so that drift hits it and the kernels
    it is subtracted from alike."""
    ops = helper_ops()
    if ops is None:
        return None
    z = F.normalize(features.detach().float(), dim=1).contiguous()
    g = torch.full((z.shape[0],), 1.0 / z.shape[0])

    def call():
        halves.append(tuple(ops.time_tiles(z, 1.0 / TEMPERATURE, g, 1).tolist()))
    return call


# ---------------------------------------------------------------------------------------------
# The calls whose wall-clock differences are the parts.

CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def kernel_call(op, *args):
    """The op's CPU kernel as register_autograd's wrapper calls it (below Autograd, redispatched
    to the CPU key): the C++ op with none of the Python autograd plumbing around it."""
    with torch._C._AutoDispatchBelowAutograd():
        return op.default.redispatch(CPU_KEYS, *args)


def _op_args(features, labels, n):
    temperature = torch.tensor(TEMPERATURE, dtype=torch.float64)
    return (features, labels, None, None, temperature, n, True)


@contextlib.contextmanager
def backend_replaced(run):
    """supcon_loss with its backend function replaced by ``run`` (same arguments and results)."""
    saved = loss_module.resolve_backend
    loss_module.resolve_backend = lambda name, device: run
    try:
        yield
    finally:
        loss_module.resolve_backend = saved


def _train_step(features, loss_fn, halves):
    """A training step that appends (forward seconds, backward seconds) to ``halves``."""
    def step():
        features.grad = None
        start = time.perf_counter()
        loss = loss_fn()
        middle = time.perf_counter()
        loss.backward()
        halves.append((middle - start, time.perf_counter() - middle))
    return step


def _one_thread(fn):
    def call():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            fn()
        finally:
            torch.set_num_threads(threads)
    return call


def nested_calls(features, labels, splits):
    """{name: fn} of the nested calls (see the module docstring); every fn does one call. The
    fwd+bwd calls append the seconds of their two halves to splits[name]: the forward alone runs
    in another context (its graph is freed at once), so fwd+bwd - forward is no clean backward."""
    n = features.shape[0]
    args = _op_args(features, labels, n)
    detached = (features.detach(),) + args[1:]
    _, lse, num_positives = kernel_call(torch.ops.scl.supcon, *detached)
    # What backward receives: d mean / d loss_i = 1 / (anchors with a positive).
    grad_loss = torch.full((n,), 1.0 / max(1, int((num_positives > 0).sum())))
    per_anchor_leaf = torch.zeros(n, requires_grad=True)

    def stub(*_args):
        return per_anchor_leaf, num_positives

    def fused_loss():
        return scl_kernels.supcon_loss(features, labels, TEMPERATURE, backend="cpu")

    train = _train_step(features, fused_loss, splits["fwd+bwd"])
    train_one_thread = _one_thread(_train_step(features, fused_loss, splits["fwd+bwd, 1 thread"]))

    def forward():
        scl_kernels.supcon_loss(features, labels, TEMPERATURE, backend="cpu")

    def front_end():
        with backend_replaced(stub):
            scl_kernels.supcon_loss(features, labels, TEMPERATURE, backend="cpu")

    def op_autograd():
        torch.ops.scl.supcon(*args)

    def op_no_grad():
        with torch.no_grad():
            torch.ops.scl.supcon(*detached)

    def forward_kernel():
        kernel_call(torch.ops.scl.supcon, *detached)

    def backward_kernel():
        kernel_call(torch.ops.scl.supcon_backward, grad_loss, *detached, lse)

    # The kernels right after other code (a dense SupCon step): how much of their time is cold
    # instruction caches and branch predictors rather than work. Appends (fwd, bwd) seconds.
    dense_step = make_step(dense_supcon, features, labels, TEMPERATURE, backward=True)

    def kernels_after_dense_step():
        dense_step()
        start = time.perf_counter()
        forward_kernel()
        middle = time.perf_counter()
        dense_step()
        middle2 = time.perf_counter()
        backward_kernel()
        splits["kernels right after a dense SupCon step"].append(
            (middle - start, time.perf_counter() - middle2))

    return {"fwd+bwd": train, "fwd+bwd, 1 thread": train_one_thread,
            "kernels right after a dense SupCon step": kernels_after_dense_step,
            "set_num_threads(1) and back": _one_thread(lambda: None),
            "forward": forward, "front end (stub op)": front_end,
            "op, grad enabled": op_autograd,
            "op under no_grad (register_autograd's no-grad path)": op_no_grad,
            "forward kernel (redispatch)": forward_kernel,
            "backward kernel (redispatch)": backward_kernel}


# ---------------------------------------------------------------------------------------------
# torch.profiler over the training step.

def _ancestors(event):
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def _part(event):
    names = [a.name for a in _ancestors(event)]
    if BWD_OP in names:
        return PART_BWD_GLUE
    if FWD_OP in names:
        return PART_FWD_GLUE
    if BACKWARD_MARK in names:
        return PART_BWD_PLUMBING
    if FRONT_MARK in names:
        return PART_FRONT
    return None


def _descendant_time(event, name):
    """Inclusive µs of the events called ``name`` below ``event`` (outermost ones only)."""
    total = 0.0
    for child in event.cpu_children:
        total += child.cpu_time_total if child.name == name else _descendant_time(child, name)
    return total


def _outermost_aten(event, out):
    for child in event.cpu_children:
        if child.name.startswith("aten::"):
            out.append((child.name, child.cpu_time_total))
        else:
            _outermost_aten(child, out)


def profile_training(features, labels, steps):
    """Per step: {part: [outermost aten calls, all aten events, µs in the outermost calls]},
    {op: [calls, inclusive µs, self µs, parts]} of the outermost aten calls, and
    {autograd node: µs} of the backward, the C++ backward kernel left out."""
    def step():
        features.grad = None
        with record_function(FRONT_MARK):
            loss = scl_kernels.supcon_loss(features, labels, TEMPERATURE, backend="cpu")
        with record_function(BACKWARD_MARK):
            loss.backward()

    for _ in range(5):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    parts = collections.defaultdict(lambda: [0, 0, 0.0])
    ops = collections.defaultdict(lambda: [0, 0.0, 0.0, set()])
    nodes = collections.Counter()
    # The outermost ATen calls of each kernel in call order: [(name, µs summed over steps)].
    sequences = {FWD_OP: [], BWD_OP: []}
    prefix = "autograd::engine::evaluate_function: "
    for event in prof.events():
        if event.name in sequences:
            calls = []
            _outermost_aten(event, calls)
            sequence = sequences[event.name]
            if not sequence:
                sequence.extend([name, 0.0] for name, _ in calls)
            if [name for name, _ in sequence] == [name for name, _ in calls]:
                for entry, (_, micros) in zip(sequence, calls):
                    entry[1] += micros / steps
        if event.name.startswith(prefix):
            nodes[event.name[len(prefix):]] += (event.cpu_time_total
                                                - _descendant_time(event, BWD_OP))
        if not event.name.startswith("aten::"):
            continue
        part = _part(event)
        if part is None:
            continue
        parts[part][1] += 1
        if any(a.name.startswith("aten::") for a in _ancestors(event)):
            continue  # nested inside another aten call: part of that call's inclusive time
        parts[part][0] += 1
        parts[part][2] += event.cpu_time_total
        op = ops[event.name]
        op[0] += 1
        op[1] += event.cpu_time_total
        op[2] += event.self_cpu_time_total
        op[3].add(part)
    scale = 1.0 / steps
    parts = {k: [v * scale for v in counts] for k, counts in parts.items()}
    ops = {k: [v[0] * scale, v[1] * scale, v[2] * scale, "; ".join(p for p in PARTS if p in v[3])]
           for k, v in ops.items()}
    return parts, ops, {k: v * scale for k, v in nodes.items()}, sequences


# ---------------------------------------------------------------------------------------------
# Floors.

def minimal_dense(features, labels, temperature):
    """The smallest dense SupCon forward+backward: -inf on the diagonal, and positives / |P(i)|
    / (anchors with a positive) as one weight matrix, both computed once outside the timing.
    Returns (autograd step, by-hand step)."""
    n = features.shape[0]
    same = (labels[:, None] == labels[None, :]) & (labels[:, None] >= 0)
    same.fill_diagonal_(False)
    counts = same.sum(1)
    anchors = (counts > 0).sum().clamp_min(1)
    weights = same.float() / counts.clamp_min(1)[:, None] / anchors
    self_mask = torch.zeros(n, n).fill_diagonal_(float("-inf"))
    has_positive = (counts > 0).float() / anchors
    inv_t = 1.0 / temperature

    def autograd_step():
        features.grad = None
        z = F.normalize(features, dim=1)
        s = z @ z.T * inv_t
        loss = (torch.logsumexp(s + self_mask, 1) @ has_positive) - (s * weights).sum()
        loss.backward()

    x = features.detach()

    def manual_step():
        # Forward and gradient by hand: 13 ATen calls, no autograd.
        norm = x.norm(dim=1, keepdim=True).clamp_min(1e-12)
        z = x / norm
        s = torch.addmm(self_mask, z, z.T, alpha=inv_t)
        lse = torch.logsumexp(s, 1, keepdim=True)
        p = torch.exp(s - lse)                            # softmax, 0 on the diagonal
        g = p.mul_(has_positive[:, None]).sub_(weights)   # dLoss / ds
        dz = torch.mm(g + g.T, z).mul_(inv_t)
        radial = (z * dz).sum(1, keepdim=True)
        return (dz - z * radial) / norm

    return autograd_step, manual_step


def floor_calls(features, labels, splits):
    n = features.shape[0]
    small = torch.randn(16)
    calls = {"one ATen call from Python (torch.add, 16 floats)": lambda: torch.add(small, small)}
    dense_autograd, dense_manual = minimal_dense(features, labels, TEMPERATURE)
    calls["dense minimal, autograd (fwd+bwd)"] = dense_autograd
    calls["dense minimal, by hand (fwd + grad, 13 ATen calls)"] = dense_manual
    ops = helper_ops()
    if ops is None:
        return calls
    op = ops.supcon
    args = _op_args(features, labels, n)
    detached = (features.detach(),) + args[1:]

    def empty_kernel():
        kernel_call(op, *detached)

    lse = torch.zeros(n)
    grad_loss = torch.full((n,), 1.0 / n)

    def empty_backward_kernel():
        kernel_call(ops.supcon_backward, grad_loss, *detached, lse)

    def empty_fwd_bwd():
        features.grad = None
        op(*args)[0].sum().backward()

    def run_empty(*op_args):
        loss, _lse, num_positives = op(*op_args)
        return loss, num_positives

    def empty_loss():
        with backend_replaced(run_empty):
            return scl_kernels.supcon_loss(features, labels, TEMPERATURE, backend="cpu")

    name = "empty C++ op behind supcon_loss, fwd+bwd"
    empty_behind_supcon_loss = _train_step(features, empty_loss, splits[name])
    calls["empty C++ op, kernel only (redispatch)"] = empty_kernel
    calls["empty C++ backward op, kernel only (redispatch)"] = empty_backward_kernel
    calls["empty C++ op + register_autograd, .sum(), fwd+bwd"] = empty_fwd_bwd
    calls[name] = empty_behind_supcon_loss
    return calls


# ---------------------------------------------------------------------------------------------

def _fmt_us(value):
    if value is None:
        return "—"
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def analyse(n, d, *, rounds, min_seconds, profile_steps, quiet_threshold, max_wait):
    features, labels = make_inputs(n, d, torch.float32, "cpu", num_classes=num_classes(n))
    # The calls record into `pending`; a round's records count only if the round does.
    pending, splits = collections.defaultdict(list), collections.defaultdict(list)
    calls = {**nested_calls(features, labels, pending), **floor_calls(features, labels, pending)}
    tiles = tile_call(features, pending["tile kernels, timed in C++"])
    if tiles is not None:
        calls["tile kernels, timed in C++"] = tiles

    def round_hook(event):
        for name, records in pending.items():
            if event == "kept":
                splits[name].extend(records)
            records.clear()

    times, _, info = interleaved_seconds(calls, "cpu", warmup=5, rounds=rounds,
                                         min_seconds=min_seconds, quiet_threshold=quiet_threshold,
                                         max_wait=max_wait, round_hook=round_hook)
    wall = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    for name, halves in splits.items():
        first, second = ("forward kernel", "backward kernel") if "kernels" in name else (
            "forward half", "backward half")
        wall[f"{name}: {first}"] = statistics.median(h[0] for h in halves) * 1e6
        wall[f"{name}: {second}"] = statistics.median(h[1] for h in halves) * 1e6
    fwd_tiles = wall.get("tile kernels, timed in C++: forward kernel")
    bwd_tiles = wall.get("tile kernels, timed in C++: backward kernel")
    # Not interleaved, so at least started in a quiet spell.
    quiet = quiet_threshold or 1.0
    wait_until_quiet(quiet, max_wait)
    parts, ops, nodes, sequences = profile_training(features, labels, profile_steps)
    wait_until_quiet(quiet, max_wait)
    floor = measure_floor(n, d)

    kernel_fwd, kernel_bwd = wall["forward kernel (redispatch)"], wall["backward kernel (redispatch)"]
    empty = "empty C++ op behind supcon_loss, fwd+bwd: backward half"
    breakdown = {
        PART_FRONT: wall["front end (stub op)"],
        PART_FWD_PLUMBING: wall["op, grad enabled"] - kernel_fwd,
        PART_FWD_GLUE: None if fwd_tiles is None else kernel_fwd - fwd_tiles,
        PART_FWD_TILES: fwd_tiles,
        PART_BWD_GLUE: None if bwd_tiles is None else kernel_bwd - bwd_tiles,
        PART_BWD_TILES: bwd_tiles,
        # The same backward, engine and wrappers with an empty kernel.
        PART_BWD_PLUMBING: (wall[empty] - wall["empty C++ backward op, kernel only (redispatch)"]
                            if empty in wall else None),
    }
    step = wall["fwd+bwd: forward half"] + wall["fwd+bwd: backward half"]
    if None not in breakdown.values():
        breakdown[PART_CONTEXT] = step - sum(breakdown.values())
    return {"n": n, "d": d, "classes": num_classes(n), "wall": wall, "breakdown": breakdown,
            "parts": parts, "ops": ops, "nodes": nodes, "sequences": sequences, "info": info,
            "rounds": len(next(iter(times.values()))),
            "floor": {k: v * 1e6 for k, v in floor.items()}}


def render(result, top):
    n, d, wall, breakdown = result["n"], result["d"], result["wall"], result["breakdown"]
    parts, info = result["parts"], result["info"]
    total = wall["fwd+bwd: forward half"] + wall["fwd+bwd: backward half"]
    lines = [f"### N = {n}, D = {d} ({result['classes']} classes)", "",
             f"Measured fwd+bwd {_fmt_us(wall['fwd+bwd'])} µs: forward half "
             f"{_fmt_us(wall['fwd+bwd: forward half'])} µs + backward half "
             f"{_fmt_us(wall['fwd+bwd: backward half'])} µs = {_fmt_us(total)} µs, the total the "
             f"shares below refer to; with 1 thread {_fmt_us(wall['fwd+bwd, 1 thread'])} µs. {result['rounds']} rounds counted, "
             f"{info['dropped']} dropped as disturbed, others' share of the cores "
             f"{info['others'] if info['others'] is not None else float('nan'):.2f}.", ""]
    rows = []
    for part in PARTS:
        value, counts = breakdown.get(part), parts.get(part)
        profiled = counts is not None and "tile" not in part
        rows.append((part, _fmt_us(value),
                     "—" if value is None else f"{100 * value / total:.0f}%",
                     f"{counts[0]:.0f}" if profiled else "—",
                     f"{counts[1]:.0f}" if profiled else "—",
                     _fmt_us(counts[2]) if profiled else "—"))
    lines.append(report.markdown_table(
        ("part", "µs (wall)", "share", "ATen calls", "aten events incl. nested",
         "profiled µs in those calls"), rows))
    lines += ["", "Wall-clock calls behind the parts and the floors (µs, medians):", ""]
    lines.append(report.markdown_table(("call", "µs"),
                                       [(name, _fmt_us(v)) for name, v in wall.items()]))
    floor = result["floor"]
    lines += ["", f"bench.floor, symmetric schedule (2 GEMM passes + N² exps through torch.mm / "
              f"torch.exp): GEMM pass {_fmt_us(floor['gemm_pass'])} µs, N² exps "
              f"{_fmt_us(floor['exp_n2'])} µs, floor {_fmt_us(floor['symmetric_floor'])} µs.", "",
              "Backward autograd nodes (profiled µs per step, the C++ backward kernel left out):",
              ""]
    lines.append(report.markdown_table(
        ("node", "µs"), [(name, _fmt_us(v)) for name, v in
                         sorted(result["nodes"].items(), key=lambda item: -item[1])]))
    lines += ["", f"Top {top} ATen ops of the training step by inclusive profiled time (outermost "
              "calls only; the profiler adds about 1 µs per event):", ""]
    ranked = sorted(result["ops"].items(), key=lambda item: -item[1][1])[:top]
    lines.append(report.markdown_table(
        ("op", "calls / step", "µs / step (incl.)", "self µs / step", "where"),
        [(name, f"{v[0]:.0f}", _fmt_us(v[1]), _fmt_us(v[2]), v[3]) for name, v in ranked]))
    for op, sequence in result["sequences"].items():
        lines += ["", f"Outermost ATen calls of {op}, in call order (index:op=profiled µs), to map "
                  "onto the C++ source:", "",
                  " ".join(f"{i}:{name[len('aten::'):]}={micros:.1f}"
                           for i, (name, micros) in enumerate(sequence))]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,256")
    parser.add_argument("--dims", default="128")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--min-seconds", type=float, default=0.01)
    parser.add_argument("--profile-steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--quiet-threshold", type=float, default=0.2,
                        help="drop rounds in which other processes used this share of the cores")
    parser.add_argument("--wait-quiet", type=float, default=120.0, metavar="SECONDS")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "bench", "results"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    machine = report.machine_description("cpu")
    command = "python -m bench.small_batch_profile " + " ".join(sys.argv[1:] if argv is None else argv)
    print("\n".join(f"{k}: {v}" for k, v in machine.items()), flush=True)
    sections = []
    for d in (int(v) for v in args.dims.split(",")):
        for n in (int(v) for v in args.sizes.split(",")):
            result = analyse(n, d, rounds=args.rounds, min_seconds=args.min_seconds,
                             profile_steps=args.profile_steps,
                             quiet_threshold=args.quiet_threshold or None,
                             max_wait=args.wait_quiet)
            sections.append(render(result, args.top))
            print(sections[-1] + "\n", flush=True)
    machine["load average at end"] = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    header = [f"# SupCon small batches: where the time goes, CPU, {stamp}", ""]
    header += [f"- **{label}**: {text}" for label, text in machine.items()]
    header += [f"- **command**: {command}", ""]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"small_batch_profile_cpu_{stamp}.md")
    with open(path, "w") as out:
        out.write("\n".join(header) + "\n" + "\n\n".join(sections) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
