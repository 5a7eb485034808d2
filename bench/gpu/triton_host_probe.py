"""Is launching Triton's JIT-compiled cubins from the C++ core worth building?

On an H100 (2026-11-27) the host took 1.68 ms to issue a Triton step at N = 16,384, D = 128 for
0.52 ms of GPU work; since then the launchers lost 1.6x of their host instructions, counted on
the CPU with the kernels stubbed, which cannot see the driver's side of a launch (its pointer
attribute queries, the TMA descriptors' encoding), and nine launches cannot explain a 1.1 ms gap.
This probe measures where an eager Triton step's host time goes, on the GPU, and applies a rule
written before its first run (bench/decisions/2026-12-01-triton-host-probe-rule.md; the
constants below). For each backend (bf16, one set, 100 classes, temperature 0.1, bench.gpu.step):
the step synchronised (median), its host issue time (until the host returns from the backward,
median), steps back to back, the step replayed from a CUDA graph (synchronised and back to back:
bench.gpu.profile.profile_backend), the loss made by torch.cuda.make_graphed_callables timed back
to back, and cProfile of 50 eager steps: the top 25 functions by own time and the host time by
part, of which the rule reads the share in Triton's launch path (host_time_by_part).

    python -m bench.gpu.triton_host_probe      # CUDA: triton and cuda, N = 16,384, D = 128
    python -m bench.gpu.triton_host_probe --device cpu --backends cpu --sizes 256 --dims 16

The rule's lines start with "triton host rule", its verdict's with "triton host rule:"; they are
printed as soon as the Triton row is measured, and the report is written after every row, so
that a run stopped by its time box keeps what it measured. Writes
triton_host_probe_<device>_<date>.md and .json to --out (bench/results/local/ by default). The
CPU run has no graphs and no verdict ("not decided (no GPU)"): it exists so that the script is
tested without a GPU, in a few seconds.

Predicted time of the default run on an H100 or H200 with the library built (it must fit the
session's 70 s box with room, so 60 s at most): start-up and imports 5-8 s; the Triton step's
first calls, which compile its kernels and autotune the two tile kernels on a fresh machine's
empty cache, 20-30 s (bench.gpu.profile's phase, both backends at two sizes, took 32 s on an
H100 on 2026-11-26: bench/gpu/gpu_session.sh); the CUDA C++ warm-up under 1 s; per
backend the timings (20 synchronised steps, five back-to-back timings of 50 ms each for the eager
step, the graph and the graphed callables, captures and replays) about 1.5 s and one
torch.profiler step 1-3 s (CUPTI's start, the first time); cProfile's 50 steps under 0.5 s.
About 30-45 s in all.
"""
import cProfile
import datetime
import fnmatch
import importlib.util
import os
import pstats
import time

import torch

import scl_kernels
from bench.gpu import options, profile
from bench.gpu.step import CLASSES, TEMPERATURE, split_backend, supcon_step, walk_of, warm_up
from bench.harness import cli, report
from bench.harness.machine import machine_description
from bench.harness.timing import synchronize

PROFILED_STEPS = 50
TOP_FUNCTIONS = 25

# The rule, written on 2026-12-01 before any GPU run. Shares are of the eager Triton step's host
# time as cProfile measured it; the ratio is eager steps back to back over the same step replayed
# from a CUDA graph back to back, the time a training loop loses to the host.
BUILD_AT_LAUNCH_SHARE = 0.50
LOOK_ELSEWHERE_BELOW_SHARE = 0.25
HOST_BOUND_AT_EAGER_OVER_GRAPH = 1.2
BUILD, NOT_WORTH_IT, NOT_DECIDED = "build it", "not worth it", "not decided"
RULE = (f"build the C++ launcher of Triton's compiled cubins when Triton's launch path takes "
        f">= {BUILD_AT_LAUNCH_SHARE:.0%} of an eager Triton step's host time and eager steps "
        f"back to back take >= {HOST_BOUND_AT_EAGER_OVER_GRAPH}x the graph replay's; not worth "
        f"it when the launch path takes < {LOOK_ELSEWHERE_BELOW_SHARE:.0%} (the host time is "
        f"elsewhere: the largest other part says where to look) or when back to back the eager "
        f"step is already within {HOST_BOUND_AT_EAGER_OVER_GRAPH}x of the replay (the host is "
        f"hidden behind the GPU); between {LOOK_ELSEWHERE_BELOW_SHARE:.0%} and "
        f"{BUILD_AT_LAUNCH_SHARE:.0%} not decided. Built, its argument packing and "
        f"specialisation key must equal Triton's own launcher's byte for byte, tested on the CPU")

# Where each part of the host time is, and where to look when it is the largest outside the
# launch path.
LAUNCH_PYTHON = "Triton launch path: Python"
LAUNCH_DRIVER = "Triton launch path: driver entries"
STAGE_OPS = "Triton stage ops"
CPP = "C++ called from elsewhere"
OTHER_PYTHON = "other Python"
PARTS = (LAUNCH_PYTHON, LAUNCH_DRIVER, STAGE_OPS, CPP, OTHER_PYTHON)
LAUNCH_PATH = (LAUNCH_PYTHON, LAUNCH_DRIVER)
WHERE_TO_LOOK = {
    STAGE_OPS: "the stage ops' own Python around the launches: their allocations and views from "
               "Python, 1.2-2 us each and about 14 a step (2026-11-29-triton-launchers-host.md), "
               "which the shared core could allocate and pass in",
    CPP: "the C++ that cProfile sees only as built-ins' own time (the shared core's host code, "
         "ATen's dispatch of its ~50 calls a step, the autograd engine): a native profile of "
         "the same steps (perf, or py-spy --native), and nsys for the driver calls",
    OTHER_PYTHON: "the Python around the op: supcon_loss's checks and layout, torch.autograd's "
                  "and torch.ops' Python (this report's top functions)",
}

# Triton's compiled C modules: the launcher of each kernel signature (its `launch` queries each
# pointer argument's attributes and calls cuLaunchKernelEx) and the driver utilities
# (fill_tma_descriptor encodes a TMA descriptor per descriptor argument and launch), named as
# cProfile names a built-in of a C module (triton/backends/nvidia/driver.py, triton 3.6).
DRIVER_ENTRIES = tuple(f"<built-in method {module}." for module in ("__triton_launcher",
                                                                     "cuda_utils"))
BACKEND_DIR = os.path.join(os.path.dirname(os.path.abspath(scl_kernels.__file__)), "backends",
                           "triton")
# The launchers' modules among the backend's files: launch.py builds each launch's arguments and
# handles.py starts the compiled kernel; the other files are the stage ops that call them.
LAUNCHER_FILES = ("launch*.py", "handles.py")
# Stages that only the backward runs: a profile without them did not see the thread where the
# autograd engine runs a CUDA backward (cProfile sees other threads from Python 3.12 on).
BACKWARD_STAGE_FILES = ("anchor_weights.py", "backward_assembly.py")


def triton_dir():
    """The installed triton package's folder, or None."""
    spec = importlib.util.find_spec("triton")
    return None if spec is None or spec.origin is None else os.path.dirname(spec.origin)


def _under(path, folder):
    return folder is not None and os.path.abspath(path).startswith(folder + os.sep)


def part_of_function(function, triton_folder, backend_folder=BACKEND_DIR):
    """The part of (file, line, name), a pstats key, or None for a built-in that takes its
    callers' part."""
    path, _, name = function
    if path == "~":
        return LAUNCH_DRIVER if name.startswith(DRIVER_ENTRIES) else None
    if _under(path, triton_folder):
        return LAUNCH_PYTHON
    if _under(path, backend_folder):
        base = os.path.basename(path)
        return (LAUNCH_PYTHON if any(fnmatch.fnmatch(base, pattern) for pattern in LAUNCHER_FILES)
                else STAGE_OPS)
    return OTHER_PYTHON


def host_time_by_part(table, triton_folder, backend_folder=BACKEND_DIR):
    """{part: seconds of own time} of a pstats table ({(file, line, name): (primitive calls,
    calls, own s, cumulative s, {caller: (calls, primitive calls, own s, cumulative s)})}).
    A Python function counts by its file: Triton's package and the backend's launcher modules
    are the launch path, the backend's other modules its stage ops. Triton's compiled C entries
    are the launch path's driver entries. Every other built-in (an ATen call, a tensor's
    method, the op itself) is split among its callers by the own time each caller's calls took:
    the launch path's or the stage ops' where they called it (a torch.empty of the launchers),
    else C++ called from elsewhere (the op's core, the autograd engine)."""
    seconds = dict.fromkeys(PARTS, 0.0)
    for function, (_, _, own, _, callers) in table.items():
        part = part_of_function(function, triton_folder, backend_folder)
        if part is not None:
            seconds[part] += own
            continue
        attributed = 0.0
        for caller, (_, _, own_from_caller, _) in callers.items():
            caller_part = part_of_function(caller, triton_folder, backend_folder)
            seconds[caller_part if caller_part in (*LAUNCH_PATH, STAGE_OPS) else CPP] += (
                own_from_caller)
            attributed += own_from_caller
        seconds[CPP] += max(0.0, own - attributed)
    return seconds


def backward_seen(table, backend_folder=BACKEND_DIR):
    return any(_under(path, backend_folder) and os.path.basename(path) in BACKWARD_STAGE_FILES
               for path, _, _ in table)


def profile_host(step, device, steps=PROFILED_STEPS):
    """The pstats table of ``steps`` eager steps, each profiled from its start until the host
    returns from its backward; the device's work is waited for outside the profile, so that
    each step starts on an idle GPU, as the host issue time's steps do."""
    profiler = cProfile.Profile()
    for _ in range(steps):
        profiler.enable()
        step()
        profiler.disable()
        synchronize(device)
    return pstats.Stats(profiler).stats


def top_functions(table, triton_folder, backend_folder=BACKEND_DIR, count=TOP_FUNCTIONS):
    """The ``count`` functions of most own time: (name, file:line, calls, own s, cumulative s,
    part), a built-in's part the one its callers gave it most of."""
    def part(function):
        by_part = host_time_by_part({function: table[function]}, triton_folder, backend_folder)
        return max(by_part, key=by_part.get)
    rows = sorted(table.items(), key=lambda item: -item[1][2])[:count]
    return [(name, f"{path}:{line}", calls, own, cumulative, part((path, line, name)))
            for (path, line, name), (_, calls, own, cumulative, _) in rows]


def host_profile(backend, n, d, dtype, device, steps=PROFILED_STEPS):
    """The host time of ``steps`` eager steps (bench.gpu.step's) by part, and the top functions."""
    with walk_of(backend):
        step = supcon_step(split_backend(backend)[0], "single", n, d, dtype, device)
        warm_up(step, device)
        table = profile_host(step, device, steps)
    folder = triton_dir()
    parts = host_time_by_part(table, folder)
    total = sum(parts.values())
    return {"profiled_steps": steps, "profiled_ms_per_step": 1e3 * total / steps,
            "parts_ms_per_step": {part: 1e3 * s / steps for part, s in parts.items()},
            "launch_share": sum(parts[p] for p in LAUNCH_PATH) / total,
            "backward_seen": backward_seen(table),
            "top": top_functions(table, folder)}


def graphed_loss_back_to_back_ms(backend, n, d, dtype, device):
    """ms per step of SupConLoss made by torch.cuda.make_graphed_callables (the forward and the
    backward a graph replay each), called as a training loop calls it: on another batch's
    tensors, which the graphed callable copies into its own, back to back. (None, None) off
    CUDA; (None, why) where it cannot be made."""
    if device.type != "cuda":
        return None, None

    def batch():
        return (torch.randn(n, d, device=device, dtype=dtype, requires_grad=True),
                torch.randint(0, CLASSES, (n,), device=device))
    try:
        with walk_of(backend):
            loss = torch.cuda.make_graphed_callables(
                scl_kernels.SupConLoss(TEMPERATURE, backend=split_backend(backend)[0]), batch())
            features, labels = batch()

            def step():
                return torch.autograd.grad(loss(features, labels), features)
            return profile.back_to_back_ms(step, device), None
    except Exception as error:  # noqa: BLE001 - a loss that cannot be graphed is a finding
        return None, f"{type(error).__name__}: {str(error)[:200]}"


def probe_backend(backend, n, d, dtype, device, steps):
    started = time.perf_counter()
    row = profile.profile_backend(backend, "single", n, d, dtype, device, steps)
    row["graphed_back_to_back_ms"], row["graphed_error"] = graphed_loss_back_to_back_ms(
        backend, n, d, dtype, device)
    row["host"] = host_profile(backend, n, d, dtype, device)
    row["seconds"] = time.perf_counter() - started
    return row


def triton_host_verdict(launch_share, eager_over_graph, largest_other_part):
    """(verdict, why) of the rule: launch_share of the eager Triton step's host time in Triton's
    launch path; eager_over_graph its steps back to back over the graph replay's back to back
    (None without a GPU); largest_other_part the part outside the launch path that took most."""
    if eager_over_graph is None:
        return NOT_DECIDED, "no GPU"
    if launch_share is None:
        return NOT_DECIDED, ("the profile did not see the backward's thread (cProfile sees the "
                             "autograd engine's device thread from Python 3.12 on)")
    if eager_over_graph < HOST_BOUND_AT_EAGER_OVER_GRAPH:
        return NOT_WORTH_IT, (f"back to back the eager step takes {eager_over_graph:.2f}x the "
                              f"graph replay, under {HOST_BOUND_AT_EAGER_OVER_GRAPH}x: the host is "
                              f"hidden behind the GPU at this size")
    if launch_share >= BUILD_AT_LAUNCH_SHARE:
        return BUILD, (f"the launch path takes {launch_share:.0%} of the host time and back to "
                       f"back the eager step takes {eager_over_graph:.2f}x the graph replay")
    elsewhere = f"look at {largest_other_part}: {WHERE_TO_LOOK[largest_other_part]}"
    if launch_share < LOOK_ELSEWHERE_BELOW_SHARE:
        return NOT_WORTH_IT, (f"the launch path takes {launch_share:.0%} of the host time; the "
                              f"host time is elsewhere: {elsewhere}")
    return NOT_DECIDED, (f"the launch path takes {launch_share:.0%} of the host time, between "
                         f"{LOOK_ELSEWHERE_BELOW_SHARE:.0%} and {BUILD_AT_LAUNCH_SHARE:.0%}: "
                         f"a C++ launcher would remove at most that share; {elsewhere}")


def eager_over_graph(row):
    graph = row.get("graph_back_to_back_ms")
    return None if graph is None else row["back_to_back_ms"] / graph


def rule_lines(rows, device):
    """The rule's printed lines, the verdict's last, read off the first Triton row."""
    lines = [f"triton host rule (written 2026-12-01, before any GPU run): {RULE}"]
    triton = next((r for r in rows if split_backend(r["backend"])[0] == "triton"), None)
    if triton is None:
        verdict, why = NOT_DECIDED, "no GPU" if device.type != "cuda" else "no Triton row"
    else:
        host, ratio = triton["host"], eager_over_graph(triton)
        others = {p: ms for p, ms in host["parts_ms_per_step"].items() if p not in LAUNCH_PATH}
        largest = max(others, key=others.get)
        lines.append(
            f"triton host rule input: N = {triton['n']}, D = {triton['d']}: launch path "
            f"{host['launch_share']:.1%} of {host['profiled_ms_per_step']:.3f} ms profiled host "
            f"time a step ({host['profiled_steps']} steps; host issue unprofiled "
            f"{triton['issue_ms']:.3f} ms; the backward's thread seen: {host['backward_seen']}); "
            f"largest other part: {largest} ({others[largest]:.3f} ms); eager back to back "
            f"{triton['back_to_back_ms']:.3f} ms, graph replay back to back "
            f"{millis(triton['graph_back_to_back_ms'])} ms ({ratio_text(ratio)})")
        verdict, why = triton_host_verdict(
            host["launch_share"] if host["backward_seen"] else None, ratio, largest)
    lines.append(f"triton host rule: {verdict} ({why})")
    return lines, verdict


def millis(value):
    return "—" if value is None else f"{value:.3f}"


def ratio_text(value):
    return "—" if value is None else f"{value:.2f}x"


def write_markdown(path, rows, lines, *, device, dtype, steps, command):
    text = report.markdown_header(
        f"Triton's host time: is a C++ launcher of its cubins worth building? {device.type}, "
        f"{datetime.date.today().isoformat()}", machine_description(device),
        {"problem": f"{dtype} features, one set, {CLASSES} classes, temperature {TEMPERATURE}",
         "command": f"`{command}`",
         "timing": f"wall and host issue (until the host returns from the backward): medians of "
                   f"{steps} synchronised steps; back to back: ms per step of at least "
                   f"{profile.BACK_TO_BACK_SECONDS * 1e3:.0f} ms of steps with one wait at the end "
                   "(median of 5); graph: the step replayed from one CUDA graph; graphed "
                   "callables: scl_kernels.SupConLoss through torch.cuda.make_graphed_callables "
                   "(a graph each way), on another batch's tensors, back to back; host by part: "
                   f"cProfile's own time over {PROFILED_STEPS} eager steps, each waited for "
                   "outside the profile (bench.gpu.triton_host_probe.host_time_by_part)",
         "rule": RULE})
    text += ["", "| backend | N | D | wall ms | host issue ms | back to back ms | graph replay ms "
             "| graph back to back ms | graphed callables back to back ms "
             "| eager / graph back to back | GPU busy ms | kernels | seconds |",
             "|" + "---|" * 13]
    for r in rows:
        text.append(f"| {r['backend']} | {r['n']} | {r['d']} | {r['wall_ms']:.3f} | "
                    f"{r['issue_ms']:.3f} | {r['back_to_back_ms']:.3f} | {millis(r['graph_ms'])} | "
                    f"{millis(r['graph_back_to_back_ms'])} | "
                    f"{millis(r['graphed_back_to_back_ms'])} | {ratio_text(eager_over_graph(r))} | "
                    f"{r['busy_ms']:.3f} | {r['kernels']} | {r['seconds']:.1f} |")
    for r in rows:
        for what in ("graph_error", "graphed_error"):
            if r[what]:
                text += ["", f"{r['backend']} N = {r['n']}: {what.replace('_', ' ')}: {r[what]}"]
    text += ["", "## The rule", "", *[f"- {line}" for line in lines]]
    for r in rows:
        host = r["host"]
        text += ["", f"## {r['backend']}, N = {r['n']}, D = {r['d']}: host time by part "
                     f"(cProfile, {host['profiled_steps']} steps; the backward's thread seen: "
                     f"{host['backward_seen']})", "",
                 "| part | ms a step | share |", "|---|---|---|"]
        total = host["profiled_ms_per_step"]
        text += [f"| {part} | {ms:.3f} | {ms / total if total else 0:.1%} |"
                 for part, ms in host["parts_ms_per_step"].items()]
        text += ["", f"Top {TOP_FUNCTIONS} functions by own time:", "",
                 "| function | file:line | calls | own ms | cumulative ms | part |",
                 "|---|---|---|---|---|---|"]
        text += [f"| `{name[:80]}` | `{where[-90:]}` | {calls} | {1e3 * own:.3f} | "
                 f"{1e3 * cumulative:.3f} | {part} |"
                 for name, where, calls, own, cumulative, part in host["top"]]
    with open(path, "w") as out:
        out.write("\n".join(text) + "\n")


def write_reports(stem, rows, device, args, command, seconds):
    """The .md and .json files of the rows so far; returns the rule's lines and verdict."""
    lines, verdict = rule_lines(rows, device)
    write_markdown(stem + ".md", rows, lines, device=device, dtype=args.dtype,
                   steps=args.repeats, command=command)
    rule = {"text": RULE, "build_at_launch_share": BUILD_AT_LAUNCH_SHARE,
            "look_elsewhere_below_share": LOOK_ELSEWHERE_BELOW_SHARE,
            "host_bound_at_eager_over_graph": HOST_BOUND_AT_EAGER_OVER_GRAPH}
    payload = {"command": command, "rule": rule, "rule_lines": lines, "verdict": verdict,
               "seconds": seconds, "rows": rows}
    report.write_json(stem + ".json", payload)
    return payload


def main(argv=None):
    started = time.perf_counter()
    parser = cli.benchmark_parser(__doc__, device="cuda", sizes="16384", dims="128", repeats=20,
                                  helps={"repeats": "synchronised steps timed for the wall and "
                                                    "host issue medians (default %(default)s)"})
    options.add_step_options(parser)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = options.DTYPES[args.dtype]
    stem = report.result_stem(
        args.out, f"triton_host_probe_{device.type}_{datetime.date.today().isoformat()}")
    command = report.command_line("bench.gpu.triton_host_probe", argv)
    rows, payload, rule_printed = [], None, False
    for backend in args.backends:
        why_not = scl_kernels.backends.why_not_fused(split_backend(backend)[0], device)
        if why_not:
            print(f"{backend}: skipped, it cannot run on {device} here: {why_not}", flush=True)
            continue
        for d in args.dims:
            for n in args.sizes:
                row = probe_backend(backend, n, d, dtype, device, args.repeats)
                print(f"{backend} N={n} D={d}: wall {row['wall_ms']:.3f} ms, host issue "
                      f"{row['issue_ms']:.3f} ms, back to back {row['back_to_back_ms']:.3f} ms, "
                      f"graph back to back {millis(row['graph_back_to_back_ms'])} ms, graphed "
                      f"callables back to back {millis(row['graphed_back_to_back_ms'])} ms, "
                      f"launch path {row['host']['launch_share']:.1%} of the profiled host time "
                      f"({row['seconds']:.1f} s)", flush=True)
                rows.append(row)
                payload = write_reports(stem, rows, device, args, command,
                                        time.perf_counter() - started)
                if not rule_printed and split_backend(backend)[0] == "triton":
                    print("\n".join(payload["rule_lines"]), flush=True)
                    rule_printed = True
    if payload is None:
        raise SystemExit(f"python -m bench.gpu.triton_host_probe: none of the backends "
                         f"{args.backends} runs on {device}")
    if not rule_printed:
        print("\n".join(payload["rule_lines"]), flush=True)
    print(f"wrote {stem}.md and {stem}.json ({payload['seconds']:.1f} s after the start)")
    return payload


if __name__ == "__main__":
    main()
