"""Shared machines (bench/PERFORMANCE.md, "Shared machines"): the fused op and the fine-tuning
demo on quiet cores, then beside a competing 2-thread PyTorch training job on the same cores, in
one run, each in fresh processes with the OpenMP settings that differ.

    python -m bench.shared_machine                         # about 8 minutes on 2 cores
    python -m bench.shared_machine --before-library old/_C.so --demo-seeds 2

(a) fused N = 256, D = 768 fwd + bwd at torch's default thread count, the median of the
repetitions in --op-seconds: as a library user runs it (torch's default OpenMP waits), with
passive waits (what the commands set), and, given --before-library (an older build's _C.so), that
build with the default waits. (b) the fine-tuning demo, ``python -m scl_kernels.finetune`` with
``--seeds`` (--demo-seeds; the demo itself has 2: the same 40-step runs, half of them): now (the
command restarts itself with passive waits and caps its threads at the usable CPUs) and before
(spinning waits kept by GOMP_SPINCOUNT=300000, libgomp's default spin count, which the command
respects). The competing job is bench.cpu_load's `torch-job`; this process pins itself to --cpus
first, so the job and every measured process share those cores.
"""
import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from . import cpu_load
from .harness import report
from .harness.machine import load_average, machine_description

N, D = 256, 768
# One process per configuration: the wait policy is read when torch loads.
OP_PROBE = """
import json, statistics, sys, time
import torch, scl_kernels
seconds = float(sys.argv[1])
g = torch.Generator().manual_seed(0)
x = torch.nn.functional.normalize(torch.randn({n}, {d}, generator=g), dim=1).requires_grad_()
y = torch.randint(0, 64, ({n},), generator=g)
def step():
    scl_kernels.supcon_loss(x, y, temperature=0.1, backend="cpu").backward()
    x.grad = None
for _ in range(5):
    step()
times, end = [], time.perf_counter() + seconds
while time.perf_counter() < end or len(times) < 20:
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
plan = scl_kernels.explain(x, y, temperature=0.1, backend="cpu").plan["threads"]
print(json.dumps(dict(ms=statistics.median(times) * 1e3, reps=len(times),
                      threads=torch.get_num_threads(), plan=plan)))
""".format(n=N, d=D)
# libgomp's own spin count when no policy is set: the waits of "before", stated so that the
# command keeps them.
SPINNING = {"GOMP_SPINCOUNT": "300000"}
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}


def op_configurations(before_library):
    wait = cpu_load.default_wait_environment
    configs = {"library default (torch's waits)": wait(), "passive waits": wait(**PASSIVE)}
    if before_library:
        configs["before: --before-library, torch's waits"] = wait(
            SCL_KERNELS_LIBRARY=os.path.abspath(before_library))
    return configs


def demo_configurations():
    wait = cpu_load.default_wait_environment
    return {"now (the command's passive waits, usable CPUs)": wait(),
            "before (spinning waits)": wait(**SPINNING)}


def time_op(env, seconds):
    done = subprocess.run([sys.executable, "-c", OP_PROBE, str(seconds)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def time_demo(env, seeds, out_dir):
    """Wall and CPU seconds of one demo run (CPU: user + system of the finished child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "scl_kernels.finetune", "--seeds", str(seeds),
                    "--output-dir", out_dir, "--overwrite"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(seconds=wall, cpu_seconds=cpu)


def measure(args, load):
    """{(part, configuration): result} under ``load`` (None: quiet cores)."""
    results = {}
    with cpu_load.running(load):
        for name, env in op_configurations(args.before_library).items():
            results["op", name] = dict(time_op(env, args.op_seconds), load=load_average())
            print(f"[{load or 'quiet'}] op, {name}: {results['op', name]}", flush=True)
        if args.demo_seeds:
            with tempfile.TemporaryDirectory() as out_dir:
                for name, env in demo_configurations().items():
                    results["demo", name] = dict(time_demo(env, args.demo_seeds, out_dir),
                                                 load=load_average())
                    print(f"[{load or 'quiet'}] demo, {name}: {results['demo', name]}", flush=True)
    return results


def table(quiet, loaded):
    rows = []
    for key in quiet:
        part, name = key
        unit, value = ("ms", "ms") if part == "op" else ("s", "seconds")
        q, l = quiet[key], loaded[key]
        cpu = (f"{q['cpu_seconds']:.0f} / {l['cpu_seconds']:.0f}" if "cpu_seconds" in q else
               f"{q['threads']} threads, {q['plan']}")
        rows.append((f"N = {N}, D = {D} fwd+bwd" if part == "op" else "fine-tuning demo", name,
                     f"{q[value]:.2f} {unit}", f"{l[value]:.2f} {unit}",
                     f"{l[value] / q[value]:.2f}", cpu, f"{q['load']} / {l['load']}"))
    return report.markdown_table(
        ("what", "configuration", "quiet", "beside the job", "ratio", "CPU s quiet / beside (demo); threads (op)",
         "load average quiet / beside"), rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--cpus", default=None,
                        help="comma-separated CPUs for everything (default: this process's)")
    parser.add_argument("--op-seconds", type=float, default=8.0,
                        help="timed repetitions of the op per configuration (default %(default)s s)")
    parser.add_argument("--demo-seeds", type=int, default=1,
                        help="the demo's --seeds (the demo: 2; 0 skips the demo)")
    parser.add_argument("--before-library", default=None,
                        help="an older build's _C.so, timed as (a)'s before")
    parser.add_argument("--out-dir", default=os.path.join(
        report.REPO_ROOT, "bench", "results",
        f"shared_machine_{datetime.date.today().isoformat()}"))
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    cpus = sorted(os.sched_getaffinity(0))
    machine = machine_description("cpu")
    for label, text in machine.items():
        print(f"{label}: {text}")
    print(f"CPUs: {cpus}; the load: {cpu_load.describe('torch-job')}", flush=True)
    quiet = measure(args, None)
    loaded = measure(args, "torch-job")
    text = table(quiet, loaded)
    print("\n" + text)
    lines = report.markdown_header(
        "Shared machines: quiet cores against a 2-thread PyTorch job on the same cores", machine,
        {"command": report.command_line("bench.shared_machine", argv), "CPUs": str(cpus),
         "the load": cpu_load.describe("torch-job"),
         "load average at the end": load_average()})
    stem = report.result_stem(args.out_dir, f"shared_machine_{report.timestamp()}")
    with open(stem + ".md", "w") as out:
        out.write("\n".join(lines + ["", text, ""]))
    print(f"\nwrote {stem}.md")


if __name__ == "__main__":
    main()
