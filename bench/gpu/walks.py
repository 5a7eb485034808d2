"""M0 of the tile kernels' work (issue 40): the CUDA C++ symmetric backward's walks (the triangle,
the triangle with its partners' exchange by st.async, full rows) and Triton, timed three ways
side by side in one process on one machine, per kernel, with the SM clock under load; then the
numbers the decision rules read (bench/decisions/2026-11-28-walks-m0-rules.md).

    python -m bench.gpu.walks          # cuda:triangle, cuda:triangle-async, cuda:rows, triton;
                                       # N = 65,536; D = 64, 128, 256; bf16; one set
    python -m bench.gpu.walks --device cpu --backends cpu,reference --sizes 256 --dims 16

Per backend and D: synchronised (median of --repeats steps, each waited for), back to back (ms
per step of steps issued with one wait at the end, as a training loop issues them), the same
step replayed from a CUDA graph (synchronised and back to back), each tile kernel's time from
one profiled step, which backward walk ran (the triangle takes D <= 128 only: at 256 CUDA C++
runs rows whatever is asked), and the SM clock (nvidia-smi, sampled every 100 ms while the row
was measured). Writes walks_<device>_<date>.{md,json} to --out. Nsight Compute's part is
bench/gpu/gpu_session.sh's phase "walks"; bench.gpu.ncu_pages reads its pages. On the CPU there
are no kernels, graphs or clocks: that run exists so that the script is tested without a GPU.
"""
import datetime
import re
import shutil
import statistics
import subprocess

import torch

from bench.gpu import options
from bench.gpu.profile import TILE_KERNELS, profile_backend
from bench.gpu.step import TEMPERATURE, WALK_KERNEL_TAGS, short_kernel, split_backend
from bench.harness import cli, report
from bench.harness.machine import machine_description

# The rules written before the run (bench/decisions/2026-11-28-walks-m0-rules.md): the full-row
# walk becomes CUDA C++'s default on sm_90 where it takes at most this share of the triangle's
# back-to-back step (rule 1); the triangle's exchange by st.async becomes the triangle's where it
# takes at most this share at every D the triangle runs, once the GPU tests and
# compute-sanitizer pass with it (rule 5).
ROWS_DEFAULT_RATIO = 0.9
ASYNC_DEFAULT_RATIO = 0.85
CLOCK_PERIOD_MS = 100


class SmClock:
    """The SM clock (MHz) sampled by nvidia-smi while a block runs; no samples where there is no
    nvidia-smi. One GPU on the machine (the device tool's): the index is torch's."""

    def __init__(self, index):
        self.index, self.samples, self._process = index, [], None

    def __enter__(self):
        smi = shutil.which("nvidia-smi")
        if smi:
            self._process = subprocess.Popen(
                [smi, "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                 "-i", str(self.index), "-lms", str(CLOCK_PERIOD_MS)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        if self._process:
            self._process.terminate()
            out, _ = self._process.communicate(timeout=10)
            self.samples = [int(v) for v in re.findall(r"^\s*(\d+)", out, re.MULTILINE)]
        return False

    def summary(self):
        if not self.samples:
            return None
        return {"median": statistics.median(self.samples), "min": min(self.samples),
                "max": max(self.samples), "count": len(self.samples)}


def tile_kernels(row):
    """[(short name, ms)] of a row's tile kernels, largest first."""
    return [(short_kernel(name), ms) for name, _, ms in row["top"]
            if any(k in name for k in TILE_KERNELS)]


def backward_walk_ms(row, walk):
    """ms of the walk's backward kernel in the row's profiled step, None if it did not run."""
    return next((ms for name, _, ms in row["top"] if WALK_KERNEL_TAGS[walk] in name), None)


def walk_ratios(by, walk, against):
    """{D: back-to-back ratio of cuda:<walk> to cuda:<against>} at the D where both ran as asked,
    and the lines that show each with the replay ratio and both backward kernels' times."""
    ratios, lines = {}, []
    for d in sorted({d for _, d in by}):
        mine, theirs = by.get((f"cuda:{walk}", d)), by.get((f"cuda:{against}", d))
        if not (mine and theirs and mine["walk_ran"] == walk and theirs["walk_ran"] == against):
            continue
        ratios[d] = mine["back_to_back_ms"] / theirs["back_to_back_ms"]
        lines.append(f"D={d}: {walk} / {against} back to back {ratios[d]:.3f} "
                     f"({mine['back_to_back_ms']:.3f} / {theirs['back_to_back_ms']:.3f} ms); "
                     f"graph replay back to back {ratio(mine, theirs, 'graph_back_to_back_ms')}; "
                     f"backward kernel {millis(backward_walk_ms(mine, walk))} / "
                     f"{millis(backward_walk_ms(theirs, against))} ms")
    return ratios, lines


def readings(rows):
    """The lines of what rules 1 and 5 read (the rows walk and the triangle's exchange by st.async
    against the triangle, per D where the triangle runs) and what `auto`'s size rule reads (CUDA
    C++'s fastest walk against Triton), with the rules' verdicts. Rules 2-4 read Nsight
    Compute's pages (bench.gpu.ncu_pages)."""
    by = {(r["backend"], r["d"]): r for r in rows}
    ratios, shown = walk_ratios(by, "rows", "triangle")
    lines = [f"rule 1 reads, {line}" for line in shown]
    if not ratios:
        lines.append("rule 1: no D where both CUDA C++ walks ran as asked: not decided")
    elif all(r <= ROWS_DEFAULT_RATIO for r in ratios.values()):
        lines.append(f"rule 1: rows <= {ROWS_DEFAULT_RATIO}x the triangle at every D it runs: rows "
                     "becomes CUDA C++'s default on sm_90, and auto_rule.py is refitted")
    elif any(r < 1 for r in ratios.values()):
        lines.append(f"rule 1: rows faster somewhere, by less than {1 - ROWS_DEFAULT_RATIO:.0%} at "
                     "some D: the triangle stays the default until step 1's walk is measured")
    else:
        lines.append("rule 1: the triangle is as fast or faster at every D: it stays the default")
    ratios, shown = walk_ratios(by, "triangle-async", "triangle")
    lines += [f"rule 5 reads, {line}" for line in shown]
    if not ratios:
        lines.append("rule 5: no D where both triangles ran as asked: not decided")
    elif all(r <= ASYNC_DEFAULT_RATIO for r in ratios.values()):
        lines.append(f"rule 5: triangle-async <= {ASYNC_DEFAULT_RATIO}x the triangle at every D it "
                     "runs: its exchange becomes the triangle's once the CUDA tests and "
                     "compute-sanitizer's set pass with it (phases tests and sanitize); rule 1 is "
                     "then read with it in the triangle's place")
    else:
        lines.append(f"rule 5: triangle-async above {ASYNC_DEFAULT_RATIO}x the triangle at some D: "
                     "it stays opt-in, and the fences were not what the triangle waits for")
    for d in sorted({r["d"] for r in rows}):
        cuda = [by[(b, d)] for b in ("cuda:triangle", "cuda:triangle-async", "cuda:rows") if (b, d) in by]
        triton = by.get(("triton", d))
        if cuda and triton:
            best = min(cuda, key=lambda r: r["back_to_back_ms"])
            lines.append(f"auto reads, D={d}: CUDA C++ {best['walk_ran'] or best['backend']} "
                         f"{best['back_to_back_ms']:.3f} ms against Triton "
                         f"{triton['back_to_back_ms']:.3f} ms back to back")
    return lines


def ratio(a, b, key):
    return "—" if a.get(key) is None or b.get(key) is None else f"{a[key] / b[key]:.3f}"


def millis(value):
    return "—" if value is None else f"{value:.3f}"


def clock_text(clock):
    if clock is None:
        return "—"
    return f"{clock['median']:.0f} ({clock['min']}-{clock['max']}, {clock['count']})"


def write_report(stem, rows, *, device, dtype, steps, command):
    lines = report.markdown_header(
        f"The tile kernels' walks, M0: {device.type}, {datetime.date.today().isoformat()}",
        machine_description(device),
        {"problem": f"{dtype} features, one set (the symmetric schedule), {TEMPERATURE} "
                    "temperature, 100 classes, forward + backward",
         "command": f"`{command}`",
         "methods": f"synchronised: median of {steps} steps, each waited for; back to back: ms "
                    "per step of at least 50 ms of steps issued with one wait at the end (median "
                    "of 5); graph replay: the step captured once and replayed, synchronised "
                    f"(median of {steps}) and back to back; kernels: one profiled step; SM clock: "
                    f"nvidia-smi every {CLOCK_PERIOD_MS} ms while the row was measured, median "
                    "(min-max, samples)"})
    lines += ["", "| backend | N | D | backward walk that ran | synchronised ms | back to back ms "
              "| graph replay ms | graph replay back to back ms | tile kernels ms (each) "
              "| GPU busy ms | SM clock MHz |", "|" + "---|" * 11]
    for r in rows:
        kernels = ", ".join(f"{name} {ms:.3f}" for name, ms in tile_kernels(r)) or "—"
        lines.append(f"| {r['backend']} | {r['n']} | {r['d']} | {r['walk_ran'] or '—'} | "
                     f"{r['wall_ms']:.3f} | {r['back_to_back_ms']:.3f} | {millis(r['graph_ms'])} | "
                     f"{millis(r['graph_back_to_back_ms'])} | {kernels} | {r['busy_ms']:.3f} | "
                     f"{clock_text(r['clock'])} |")
    lines += ["", "## What the rules read", ""] + [f"- {line}" for line in readings(rows)]
    with open(stem + ".md", "w") as out:
        out.write("\n".join(lines) + "\n")
    report.write_json(stem + ".json", rows)


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, device="cuda", sizes="65536", dims="64,128,256",
                                  repeats=5, helps={"repeats": "synchronised steps (and replays) "
                                                               "per median (default %(default)s)"})
    options.add_step_options(parser, backends="cuda:triangle,cuda:triangle-async,cuda:rows,triton")
    args = parser.parse_args(argv)
    import scl_kernels
    device = torch.device(args.device)
    dtype = options.DTYPES[args.dtype]
    for spec in args.backends:
        backend = split_backend(spec)[0]
        why = None if backend == "reference" else scl_kernels.backends.why_not_fused(backend, device)
        if why:
            raise SystemExit(f"python -m bench.gpu.walks: {spec} cannot run on {device}: {why}")
    rows = []
    for d in args.dims:  # each D's backends back to back: one clock, one thermal state
        for n in args.sizes:
            for spec in args.backends:
                with SmClock(device.index or 0) as clock:
                    row = profile_backend(spec, "single", n, d, dtype, device, args.repeats)
                row["clock"] = clock.summary()
                row.pop("runtime")
                print(f"{spec} N={n} D={d}: synchronised {row['wall_ms']:.3f} ms, back to back "
                      f"{row['back_to_back_ms']:.3f}, graph replay {millis(row['graph_ms'])} "
                      f"({millis(row['graph_back_to_back_ms'])} back to back); walk "
                      f"{row['walk_ran'] or '—'}; tile kernels "
                      + (", ".join(f"{k} {ms:.3f}" for k, ms in tile_kernels(row)) or "—")
                      + f"; SM clock {clock_text(row['clock'])} MHz", flush=True)
                rows.append(row)
    for line in readings(rows):
        print(line)
    stem = report.result_stem(args.out, f"walks_{device.type}_{datetime.date.today().isoformat()}")
    write_report(stem, rows, device=device, dtype=args.dtype, steps=args.repeats,
                 command=report.command_line("bench.gpu.walks", argv))
    print("wrote", stem + ".md")
    return rows


if __name__ == "__main__":
    main()
