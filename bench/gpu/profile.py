"""Where a forward + backward's time goes, per fused backend, from torch.profiler: wall time, the
host's time to issue the step, steps issued back to back (the host hidden where the GPU's work is
longer), kernel time and how much of the wall the GPU is busy, launches, host synchronisations
and the largest kernels; on CUDA also the same step replayed from a CUDA graph (the kernels with
no host in the way), synchronised and back to back, and the Triton autotuner's choices. It answers the
first GPU session's open question: about 3 ms per call that does not grow with N^2
(bench/decisions/2026-11-23-first-gpu-session.md).

    python -m bench.gpu.profile                 # CUDA: triton and cuda, single and cross set,
                                                # N = 16,384 / 65,536, D = 128
    python -m bench.gpu.profile --device cpu --backends cpu --sizes 512 --dims 64
    python -m bench.gpu.profile --backends cuda:triangle,cuda:rows   # both CUDA C++ backward walks

Writes gpu_profile_<device>_<date>.md to --out (bench/results/local/ by default). On the CPU there
are no kernel rows: that run exists so that the script is tested without a GPU.
"""
import datetime
import itertools
import statistics
import time
from dataclasses import dataclass

import torch

from bench.gpu import options
from bench.gpu.step import TEMPERATURE, split_backend, supcon_step, walk_of, walk_that_ran, warm_up
from bench.harness import cli, report
from bench.harness.machine import machine_description
from bench.harness.timing import median_seconds, synchronize

# The O(N^2) tile kernels of each backend; every other kernel is the call's O(N D) work.
TILE_KERNELS = ("lse_plain_kernel", "lse_symmetric_kernel", "grad_rows_kernel", "grad_cols_kernel",
                "walk_kernel")
# Host-side runtime calls worth counting: launches, copies, and the ones that make the host wait.
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamSynchronize",
                 "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMalloc", "cudaHostAlloc")
WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
BACK_TO_BACK_SECONDS = 0.05  # calls per back-to-back timing: enough to last this long


@dataclass(frozen=True)
class Event:
    """What the summary needs of a profiler event; times in microseconds."""
    name: str
    on_device: bool
    start: float
    end: float
    top_level_aten: bool = False


def events_of(prof):
    found = []
    for e in prof.events():
        on_device = e.device_type == torch.autograd.DeviceType.CUDA
        parent = e.cpu_parent
        top = (not on_device and e.name.startswith("aten::")
               and (parent is None or not parent.name.startswith("aten::")))
        found.append(Event(e.name, on_device, e.time_range.start, e.time_range.end, top))
    return found


def busy_union(intervals):
    """Length of the union of (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarise(events, top=8):
    """Counts and device times (ms) of one profiled step."""
    kernels = [e for e in events if e.on_device and not e.name.startswith(("Memcpy", "Memset"))]
    by_kernel = {}
    for k in kernels:
        count, total = by_kernel.get(k.name, (0, 0.0))
        by_kernel[k.name] = (count + 1, total + (k.end - k.start))
    runtime = {name: sum(1 for e in events if not e.on_device and e.name == name)
               for name in RUNTIME_CALLS}
    return {
        "kernels": len(kernels),
        "kernel_ms": sum(k.end - k.start for k in kernels) / 1e3,
        "tile_ms": sum(k.end - k.start for k in kernels
                       if any(name in k.name for name in TILE_KERNELS)) / 1e3,
        "busy_ms": busy_union([(k.start, k.end) for k in kernels]) / 1e3,
        "copies": sum(1 for e in events if e.on_device and e.name.startswith("Memcpy")),
        "aten_calls": sum(1 for e in events if e.top_level_aten),
        "runtime": {name: count for name, count in runtime.items() if count},
        "host_waits": sum(runtime[name] for name in WAITS),
        "top": sorted(((name, count, total / 1e3) for name, (count, total) in by_kernel.items()),
                      key=lambda row: -row[2])[:top],
    }


def back_to_back_ms(run, device):
    """ms per call of calls issued with no wait between them and one at the end, as a training
    loop issues its steps: the host's issue time is hidden wherever the GPU's work is longer."""
    return 1e3 * median_seconds(run, device, repeats=5, min_seconds=BACK_TO_BACK_SECONDS)


def profile_backend(backend, layout, n, d, dtype, device, steps):
    """One row of the report (``supcon_step``'s problem); ``backend`` may name the CUDA C++
    symmetric backward's walk ("cuda:rows", bench.gpu.step.walk_of)."""
    with walk_of(backend):
        return _profile_step(backend, supcon_step(split_backend(backend)[0], layout, n, d, dtype,
                                                  device), layout, n, d, device, steps)


def _profile_step(backend, step, layout, n, d, device, steps):
    warm_up(step, device)
    walls, issues = [], []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        issued = time.perf_counter()
        synchronize(device)
        walls.append(time.perf_counter() - start)
        issues.append(issued - start)
    replay = replay_times(step, device, steps) if device.type == "cuda" else {}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        synchronize(device)
    summary = summarise(events_of(prof))
    summary.update(backend=backend, walk_ran=walk_that_ran(name for name, _, _ in summary["top"]), layout=layout, n=n, d=d, wall_ms=1e3 * statistics.median(walls),
                   wall_spread_ms=1e3 * (max(walls) - min(walls)),
                   issue_ms=1e3 * statistics.median(issues),
                   back_to_back_ms=back_to_back_ms(step, device),
                   graph_ms=replay.get("graph_ms"),
                   graph_back_to_back_ms=replay.get("graph_back_to_back_ms"),
                   graph_error=replay.get("graph_error"))
    return summary


def replay_times(step, device, steps):
    """The step captured in a CUDA graph and replayed: {"graph_ms": median ms of ``steps``
    synchronised replays, "graph_back_to_back_ms": ms per replay issued back to back}, or
    {"graph_error": why it cannot be captured}. The same kernels with no host in the way: the
    bound that the target "eager within 1.1x of the graph" compares the eager step against."""
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # capture wants its warm-up off the default stream
            step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        synchronize(device)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            graph.replay()
            synchronize(device)
            times.append(time.perf_counter() - start)
        return {"graph_ms": 1e3 * statistics.median(times),
                "graph_back_to_back_ms": back_to_back_ms(graph.replay, device)}
    except Exception as error:  # noqa: BLE001 - a step that cannot be captured is a finding
        return {"graph_error": f"{type(error).__name__}: {str(error)[:200]}"}


def autotuner_choices():
    """The Triton backend's autotuned kernels: {kernel: {key: chosen configuration}}."""
    from scl_kernels.backends.triton import launch
    choices = {}
    for name in launch.KERNEL_USES:  # each use is autotuned as launch._<name>
        cache = getattr(getattr(launch, f"_{name}", None), "cache", {}) or {}
        if cache:
            choices[name] = {str(key): str(config) for key, config in cache.items()}
    return choices


def write_markdown(path, rows, *, device, dtype, steps, command):
    lines = report.markdown_header(
        f"Where a forward + backward's time goes: {device.type}, "
        f"{datetime.date.today().isoformat()}", machine_description(device),
        {"problem": f"{dtype} features, {TEMPERATURE} temperature; single: one set (symmetric "
                    "schedule), cross: N anchors against N other rows (plain schedule, gradients "
                    "for both)",
         "command": f"`{command}`",
         "timing": f"wall: median of {steps} synchronised steps; host issue: the same steps until "
                   "the host returns from the backward (all work queued); back to back: ms per "
                   f"step of at least {BACK_TO_BACK_SECONDS * 1e3:.0f} ms of steps issued with one "
                   "wait at the end (median of 5), as a training loop issues them; graph: the "
                   "same step replayed from a CUDA graph, "
                   "synchronised and back to back; the rest from one profiled step"})
    lines += ["", "| backend | layout | N | D | wall ms | wall spread ms | graph replay ms "
             "| eager / graph | back to back ms | graph back to back ms | eager / graph back to back "
             "| host issue ms | GPU busy ms | kernel ms | tile kernels ms | kernels | copies "
             "| host waits | top-level ATen calls |",
             "|" + "---|" * 19]

    def ratio(eager, graph):
        return "—" if graph is None else f"{eager / graph:.2f}"

    def millis(value):
        return "—" if value is None else f"{value:.3f}"
    for r in rows:
        lines.append(f"| {r['backend']} | {r['layout']} | {r['n']} | {r['d']} | {r['wall_ms']:.3f} | "
                     f"{r['wall_spread_ms']:.3f} | {millis(r['graph_ms'])} | "
                     f"{ratio(r['wall_ms'], r['graph_ms'])} | {r['back_to_back_ms']:.3f} | "
                     f"{millis(r['graph_back_to_back_ms'])} | "
                     f"{ratio(r['back_to_back_ms'], r['graph_back_to_back_ms'])} | "
                     f"{r['issue_ms']:.3f} | {r['busy_ms']:.3f} | {r['kernel_ms']:.3f} | "
                     f"{r['tile_ms']:.3f} | {r['kernels']} | {r['copies']} | {r['host_waits']} | {r['aten_calls']} |")
    for r in rows:
        if r["graph_error"]:
            lines += ["", f"{r['backend']} {r['layout']} N = {r['n']}: not capturable in a CUDA "
                          f"graph: {r['graph_error']}"]
    choices = autotuner_choices() if any(r["backend"] == "triton" for r in rows) else {}
    if choices:
        lines += ["", "Triton autotuner's choices (key: configuration):"]
        lines += [f"- {kernel}: " + "; ".join(f"{key} -> {config}" for key, config in by_key.items())
                  for kernel, by_key in choices.items()]
    for r in rows:
        lines += ["", f"## {r['backend']}, {r['layout']}, N = {r['n']}, D = {r['d']}", "",
                  "Runtime calls: " + (", ".join(f"{name} {count}" for name, count in
                                                 r["runtime"].items()) or "none (CPU)")]
        if r["top"]:
            lines += ["", "| kernel | calls | ms |", "|---|---|---|"]
            lines += [f"| `{name[:90]}` | {count} | {ms:.3f} |" for name, count, ms in r["top"]]
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, device="cuda", sizes="16384,65536", dims="128",
                                  repeats=5, helps={"repeats": "synchronised steps timed for the "
                                                               "wall and host issue medians "
                                                               "(default %(default)s)"})
    options.add_step_options(parser)
    options.add_layout_option(parser, "single,cross")
    args = parser.parse_args(argv)
    import scl_kernels
    device = torch.device(args.device)
    dtype = options.DTYPES[args.dtype]
    # Rows are labelled by backend ("reference" runs as itself): one that cannot run is skipped,
    # saying why, and a run left with none would be an empty profile.
    why_not = {b: None if b == "reference"
               else scl_kernels.backends.why_not_fused(split_backend(b)[0], device)
               for b in args.backends}
    if all(why_not.values()):
        raise SystemExit(f"python -m bench.gpu.profile: none of the backends {args.backends} runs "
                         f"on {device}: " + "; ".join(f"{b}: {why}" for b, why in why_not.items()))
    rows = []
    for backend in args.backends:
        if why_not[backend]:
            print(f"{backend}: skipped, it cannot run on {device} here: {why_not[backend]}",
                  flush=True)
            continue
        for layout, d, n in itertools.product(args.layouts, args.dims, args.sizes):
            row = profile_backend(backend, layout, n, d, dtype, device, args.repeats)
            graph = ("—" if row["graph_ms"] is None else
                     f"{row['graph_ms']:.3f} ms ({row['graph_back_to_back_ms']:.3f} back to back)")
            print(f"{backend} {layout} N={n} D={d}: wall {row['wall_ms']:.3f} ms "
                  f"({row['back_to_back_ms']:.3f} back to back), graph replay {graph}, host issue "
                  f"{row['issue_ms']:.3f} ms, GPU busy {row['busy_ms']:.3f} ms, "
                  f"{row['kernels']} kernels, {row['host_waits']} host waits, "
                  f"{row['aten_calls']} ATen calls", flush=True)
            rows.append(row)
    path = report.result_stem(
        args.out, f"gpu_profile_{device.type}_{datetime.date.today().isoformat()}") + ".md"
    write_markdown(path, rows, device=device, dtype=args.dtype, steps=args.repeats,
                   command=report.command_line("bench.gpu.profile", argv))
    print("wrote", path)
    return rows


if __name__ == "__main__":
    main()
