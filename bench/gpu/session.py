"""The one GPU call that decides the kernels: stages in a fixed order inside one budget of 540 s,
each with its own limit and each deciding something by the rules written before it runs
(bench/decisions/2026-11-28-walks-m0-rules.md, amended 2026-12-01), then a verdict block of at
most 40 lines, printed last.

    python -m bench.gpu.build --prepare-headers    # 1. here, where a package index answers
    python3 -m bench.gpu.session                   # 2. the device call: carry [".cutlass"],
                                                   #    timeout_s 600, then give the machine back
    python -m bench.gpu.session --rehearsal        # the same on the CPU, with stand-ins on PATH
                                                   # (bench/tests/test_bench_gpu_session.py, in CI)

Preparation. The device tool's machine reaches no package index, and the build needs the CuTe
headers of the pinned nvidia-cutlass wheel: step 1 unpacks them into `.cutlass/include`
(git-ignored, about 27 MB), the call carries `.cutlass`, and the build finds them there. Without
them, and with no index answering, the call refuses in its first seconds, in one line.

The stages (limits and predicted GPU seconds in STAGES):
  preflight    driver, ncu, compute-sanitizer, torch / triton / nvcc versions, the CuTe headers:
               environment.txt; refuses the call where the headers are missing
  build        sm_90a only, the system's c++ (bench.gpu.build); a failure ends the call
  smoke        the triangle by st.async in its own processes under 60 s: sanitizer cases 18 and 19
               (no sanitizer) and one N = 65,536, D = 128 step whose gradients are compared with the
               fenced triangle's and with rows'; a failure drops that walk from every later stage
  timings      bench.gpu.walks: the walks in alternating order, repeated, at N = 16,384 and 65,536,
               D = 64 and 128, Triton at 65,536 x 128, every row written as measured; rules 1 and 5
               (time half) and the walks' gradient agreement over repeated steps
  ncu          Nsight Compute over one step of each walk at 65,536 x 128, the rules' metrics by
               name (bench.gpu.ncu_run), read by bench.gpu.ncu_pages: rules 2-4
  correctness  rule 5's correctness half: the triangle-against-rows GPU tests on 16 workers beside
               memcheck, racecheck and synccheck over the cluster-pair cases 14, 15, 18 and 19
  probe        the Triton host probe (bench.gpu.triton_host_probe), only if 70 s remain
  pack         at most 7 small files and one gzip archive under 15 MiB into $OUT (the device tool
               returns at most 8 files of at most 16 MiB): a Nsight Compute report goes in only if
               it fits

Each stage's output goes to its log in a scratch folder (packed into the archive); the terminal
gets a few lines a stage, so the device tool's last 12,000 characters hold the verdict block.
stages.json is rewritten after every stage: a call killed midway still says how far it got.

--rehearsal runs every stage on the CPU with small sizes: the stand-ins on the PATH answer for the
driver, ncu and compute-sanitizer, the build stage checks the library already built, and
SCL_REHEARSAL_FAIL=stage,... makes those stages fail (the gating it exercises).
"""
import argparse
import datetime
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field

from bench.harness.report import LOCAL_RESULTS, REPO_ROOT

BUDGET_S = 540
PACK_RESERVE_S = 15          # kept back from every stage's limit for packing and the verdict
PROBE_NEEDS_S = 70           # the probe runs only if this much of the budget is left
ARCHIVE_LIMIT_BYTES = 15 * 2**20
SMALL_FILE_LIMIT_BYTES = 2**20
VERDICT_LINES = 40
CLUSTER_PAIR_CASES = {"fenced": ("14", "15"), "async": ("18", "19")}  # bench.gpu.sanitizer_case
GPU_TEST_WORKERS = 16


@dataclass(frozen=True)
class Stage:
    name: str
    limit_s: int       # the stage's own limit (the whole budget's remainder may cut it shorter)
    predicted_s: int   # on the device tool's H200 (16 cores), from the H100 sessions of 11-26/27
    why: str


STAGES = (
    Stage("preflight", 30, 10, "nvidia-smi, ncu and sanitizer versions, python with torch and "
          "triton imported (about 5 s)"),
    Stage("build", 180, 90, "sm_90a only: 71-88 s on H100s with 16 cores (2026-11-26/27); on "
          "the 2-core VM (2026-12-03, a fresh clone, the carried headers, no index) 177 s with 2 "
          "jobs, the longest unit 51 s, so 16 cores wait for that unit and the link"),
    Stage("smoke", 60, 30, "two processes' CUDA start (about 8 s each), cases 18-19 twice, three "
          "walks' warm-up and step at 65,536 (about 10 ms a step)"),
    Stage("timings", 170, 120, "bench.gpu.walks' prediction: 24 CUDA C++ rows and one Triton row "
          "with its autotuning, the agreement steps"),
    Stage("ncu", 100, 75, "start and warm-up, 6 tile kernels of 1.4-6 ms replayed about 40 passes "
          "each, three pages read back (M0's estimate, 2026-11-28)"),
    Stage("correctness", 110, 85, "128 small GPU tests on 16 workers (about 30 s) beside 12 "
          "sanitizer processes; racecheck of a cluster-pair case is the longest (about 80 s)"),
    Stage("probe", PROBE_NEEDS_S, 60, "bench.gpu.triton_host_probe's prediction"),
    Stage("pack", 15, 5, "copies and one gzip archive"),
)


@dataclass(frozen=True)
class Target:
    """What the stages run on: the GPU's walks, or the CPU's stand-ins for them."""
    device: str
    walks: dict                 # role -> backend spec: "triangle", "async", "rows"
    also: str                   # walks.py --also
    timing_args: tuple
    agreement_args: tuple       # walk_agreement's problem (sizes, dims, dtype, device)
    profile_args: tuple         # kernel_profile's problem
    probe_args: tuple

    def spec(self, role):
        return self.walks[role]


GPU = Target(
    device="cuda",
    walks={"triangle": "cuda:triangle", "async": "cuda:triangle-async", "rows": "cuda:rows"},
    also="triton@65536x128",
    timing_args=("--sizes", "16384,65536", "--dims", "64,128"),
    agreement_args=("--sizes", "65536", "--dims", "128", "--steps", "1"),
    profile_args=("--sizes", "65536", "--dims", "128"),
    probe_args=(),
)
REHEARSAL = Target(
    device="cpu",
    walks={"triangle": "cpu", "async": "reference", "rows": "cpu"},
    also="cpu@96x16",
    timing_args=("--device", "cpu", "--dtype", "fp32", "--sizes", "64,96", "--dims", "8,16",
                 "--repeats", "2", "--agreement-steps", "2", "--agreement-against", "reference"),
    agreement_args=("--device", "cpu", "--dtype", "fp32", "--sizes", "96", "--dims", "16",
                    "--steps", "1"),
    profile_args=("--device", "cpu", "--sizes", "64", "--dims", "8"),
    probe_args=("--device", "cpu", "--backends", "cpu", "--sizes", "256", "--dims", "16"),
)
# The alternating order of the compared walks at every point (each measured twice, early and late).
TIMING_ORDER = ("triangle", "async", "rows", "rows", "async", "triangle")


@dataclass
class Outcome:
    status: str                 # "ok", "FAILED", "refused", "skipped", "not run"
    lines: list = field(default_factory=list)
    seconds: float = 0.0


class Session:
    def __init__(self, target, out, work, rehearsal):
        self.target, self.out, self.work, self.rehearsal = target, out, work, rehearsal
        self.start = time.monotonic()
        self.outcomes = {}
        self.async_dropped = None   # why the st.async walk left the later stages
        self.env = dict(os.environ, PYTHONUNBUFFERED="1",
                        MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)),
                        CUDA_HOME=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
        self.fail = set(filter(None, os.environ.get("SCL_REHEARSAL_FAIL", "").split(","))) \
            if rehearsal else set()

    def remaining(self):
        return BUDGET_S - (time.monotonic() - self.start)

    def limit(self, stage):
        return max(0.0, min(stage.limit_s, self.remaining() - PACK_RESERVE_S))

    def python(self, *args):
        return [sys.executable, *args]

    def run(self, stage_name, command, log_name, timeout):
        """(exit status, or None when killed at `timeout`; the log's text). Each command is a
        process group of its own, so a timeout also ends what it started (ncu's target, pytest's
        workers)."""
        if stage_name in self.fail:
            command = self.python("-c", f"raise SystemExit('rehearsal: {stage_name} made to fail')")
        path = os.path.join(self.work, log_name)
        with open(path, "a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            process = subprocess.Popen(command, cwd=REPO_ROOT, env=self.env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            try:
                status = process.wait(timeout=max(timeout, 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                status = None
        with open(path) as log:
            return status, log.read()

    def roles(self):
        """The compared walks still in play."""
        return [r for r in ("triangle", "async", "rows") if not (r == "async" and self.async_dropped)]

    def record(self):
        """stages.json, rewritten after every stage, in the output folder too: should the call be
        killed from outside, what comes back still says how far it got."""
        table = {s.name: {"status": self.outcomes[s.name].status,
                          "seconds": round(self.outcomes[s.name].seconds, 1),
                          "limit_s": s.limit_s, "predicted_s": s.predicted_s}
                 for s in STAGES if s.name in self.outcomes}
        table["async walk dropped"] = self.async_dropped
        for folder in (self.work, self.out):
            with open(os.path.join(folder, "stages.json"), "w") as f:
                json.dump(table, f, indent=1)


def walks_path(session, suffix):
    """The path of bench.gpu.walks' file ending in `suffix` (".json": the rows, ".verdicts.json",
    ".md"), None where the run wrote none."""
    found = [p for p in glob.glob(os.path.join(session.work, f"walks_{session.target.device}_*{suffix}"))
             if suffix == ".verdicts.json" or not p.endswith(".verdicts.json")]
    return found[0] if found else None


def read_json(path, empty):
    """The JSON at `path`, `empty` where there is none."""
    if path is None:
        return empty
    with open(path) as f:
        return json.load(f)


def last_lines(text, count=6):
    return [line for line in text.strip().splitlines()[-count:] if line.strip()]


def preflight(session, stage):
    target = session.target
    checks = [
        ("driver", ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.sm",
                    "--format=csv,noheader"]),
        ("ncu", [_ncu(), "--version"]),
        ("compute-sanitizer", ["compute-sanitizer", "--version"]),
        ("python", session.python("-c", "import sys, torch, triton; print(sys.version.split()[0], "
                                        "'torch', torch.__version__, 'CUDA', torch.version.cuda, "
                                        "'triton', triton.__version__)")),
        ("nvcc", ["nvcc", "--version"]),
        ("git", ["git", "log", "-1", "--format=%H %cd"]),
    ]
    lines, missing = [], []
    for name, command in checks:
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, env=session.env, capture_output=True,
                                  text=True, timeout=20)
            text = (done.stdout or done.stderr).strip().splitlines()
            found = done.returncode == 0 and text
        except (OSError, subprocess.TimeoutExpired) as error:
            found, text = False, [str(error)]
        lines.append(f"{name}: {text[-1] if found else 'MISSING (' + ' '.join(text)[-120:] + ')'}")
        if not found:
            missing.append(name)
    status, text = session.run(stage.name, session.python("-m", "bench.gpu.build",
                                                          "--check-headers"),
                               "preflight.log", session.limit(stage))
    lines.append(text.strip().splitlines()[-1] if text.strip() else "CuTe headers: no answer")
    lines.append(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}"
                 f"; target: {target.device}{' (rehearsal)' if session.rehearsal else ''}")
    with open(os.path.join(session.work, "environment.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if status != 0:
        return Outcome("refused", [lines[-2]])
    if "python" in missing or "driver" in missing:
        return Outcome("refused", [f"refused: {', '.join(missing)} missing"])
    return Outcome("ok", [f"missing, their stages not decided: {', '.join(missing)}"] if missing else [])


def _ncu():
    from bench.gpu.ncu_run import ncu_binary
    return ncu_binary()


def build(session, stage):
    args = ("--check-only", "cpu") if session.rehearsal else ("--log", os.path.join(session.work, "build.log"))
    status, text = session.run(stage.name, session.python("-m", "bench.gpu.build", *args),
                               "build_check.log", session.limit(stage))
    return Outcome("ok" if status == 0 else "FAILED", last_lines(text, 4 if status == 0 else 12))


def smoke(session, stage):
    deadline = time.monotonic() + session.limit(stage)
    target, lines = session.target, []
    if session.rehearsal:
        lines.append("sanitizer cases 18-19: not run (they need a GPU)")
        status = 0
    else:
        status, text = session.run(stage.name, session.python(
            "-m", "bench.gpu.sanitizer_case", "--cases", ",".join(CLUSTER_PAIR_CASES["async"])),
            "smoke.log", deadline - time.monotonic())
        lines += last_lines(text, 2)
    if status == 0:
        status, text = session.run(stage.name, session.python(
            "-m", "bench.gpu.walk_agreement", "--backends", target.spec("async"), "--against",
            f"{target.spec('triangle')},{target.spec('rows')}", *target.agreement_args),
            "smoke.log", deadline - time.monotonic())
        lines += last_lines(text, 3)
    if status != 0:
        session.async_dropped = ("the smoke gate " + ("ran out of time" if status is None
                                                      else f"failed (exit {status})"))
        return Outcome("FAILED", lines + [f"{target.spec('async')} dropped from every later stage"])
    return Outcome("ok", lines)


def timings(session, stage):
    target = session.target
    order = [target.spec(r) for r in TIMING_ORDER if r in session.roles()]
    status, text = session.run(stage.name, session.python(
        "-m", "bench.gpu.walks", "--out", session.work, "--backends", ",".join(order),
        "--also", target.also, *target.timing_args), "timings.log", session.limit(stage))
    done = "ok" if status == 0 else "FAILED" if status is not None else "timed out"
    rows = read_json(walks_path(session, ".json"), [])
    lines = [f"{len(rows)} timing rows written" if rows else "no timing rows"]
    return Outcome("ok" if done == "ok" else done, lines + ([] if done == "ok" else last_lines(text, 8)))


def ncu(session, stage):
    deadline = time.monotonic() + session.limit(stage)
    target = session.target
    specs = ",".join(target.spec(r) for r in session.roles())
    report = os.path.join(session.work, "walks_kernels")
    status, text = session.run(stage.name, session.python(
        "-m", "bench.gpu.ncu_run", "--report", report, "--", "--backends", specs,
        *target.profile_args), "ncu.log", deadline - time.monotonic())
    if status != 0:
        return Outcome("FAILED" if status is not None else "timed out", last_lines(text, 8))
    pages = ["--raw", report + ".raw.csv"]
    if os.path.exists(report + ".sass.csv"):
        pages += ["--sass", report + ".sass.csv"]
    status, text = session.run(stage.name, session.python("-m", "bench.gpu.ncu_pages", *pages),
                               "ncu_pages.log", deadline - time.monotonic())
    readings = [line for line in text.splitlines() if not line.startswith("$ ")]
    with open(os.path.join(session.work, "ncu_summary.txt"), "w") as f:
        f.write("\n".join(readings) + "\n")
    return Outcome("ok" if status == 0 else "FAILED", [])


def correctness(session, stage):
    """The GPU tests and the sanitizers side by side, each in its own process group."""
    limit = session.limit(stage)
    cases = CLUSTER_PAIR_CASES["fenced"] + (() if session.async_dropped else CLUSTER_PAIR_CASES["async"])
    selection = "triangle_against_full_rows" + (" and not async" if session.async_dropped else "")
    # pytest-xdist and pytest-timeout are on the device tool's image; a rehearsal may lack them.
    plugins = (["-n", str(min(GPU_TEST_WORKERS, os.cpu_count() or 1))]
               if importlib.util.find_spec("xdist") else [])
    plugins += ["--timeout", "120"] if importlib.util.find_spec("pytest_timeout") else []
    tests = session.python("-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins,
                           "python_tests/backends/test_cuda_backend.py", "-k", selection)
    sanitize = session.python("-m", "bench.gpu.sanitize", "--out", session.work, "--groups",
                              " ".join(cases), "--timeout", str(max(1, int(limit) - 5)))
    results = {}

    def side(name, command):
        results[name] = session.run(stage.name, command, f"correctness_{name}.log", limit)
    threads = [threading.Thread(target=side, args=item) for item in
               (("tests", tests), ("sanitize", sanitize))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = []
    for name, (status, text) in results.items():
        state = "passed" if status == 0 else "timed out" if status is None else f"FAILED (exit {status})"
        lines.append(f"{name}: {state}")
        lines += [f"  {line}" for line in last_lines(text, 1 if status == 0 else 6)
                  if name == "tests" or "clean" not in line]
    ok = all(status == 0 for status, _ in results.values())
    return Outcome("ok" if ok else "FAILED", lines)


def probe(session, stage):
    if session.remaining() - PACK_RESERVE_S < PROBE_NEEDS_S:
        return Outcome("skipped", [f"{session.remaining():.0f} s left, the probe needs {PROBE_NEEDS_S}"])
    status, text = session.run(stage.name, session.python(
        "-m", "bench.gpu.triton_host_probe", "--out", session.work, *session.target.probe_args),
        "probe.log", session.limit(stage))
    return Outcome("ok" if status == 0 else "FAILED" if status is not None else "timed out",
                   [] if status == 0 else last_lines(text, 6))


RUNS = {"preflight": preflight, "build": build, "smoke": smoke, "timings": timings, "ncu": ncu,
        "correctness": correctness, "probe": probe}
# A failure here ends the call: nothing after it can mean anything.
STOPS_THE_CALL = ("preflight", "build")


def rule_lines(session):
    """Every rule's verdict line, rule 5 with its correctness half, then the agreement's and the
    readings of the pages and the probe."""
    from bench.gpu import walks  # imports torch: only once the stages are done
    verdicts = read_json(walks_path(session, ".verdicts.json"), {})
    rows = read_json(walks_path(session, ".json"), [])
    lines = []
    for name in ("rule 1", "rule 5"):
        reads = verdicts.get(name, {}).get("reads")
        lines.append(reads[-1] if reads else f"{name}: not decided (no timings)")
    on_time = verdicts.get("rule 5", {}).get("verdict") == "fires"
    correctness = session.outcomes.get("correctness", Outcome("not run")).status
    if session.async_dropped:
        lines.append(f"rule 5 in all: stays opt-in: {session.async_dropped}")
    elif on_time and correctness == "ok":
        lines.append("rule 5 in all: fires: the exchange by st.async becomes the triangle's "
                     "(fast enough at every pair, the correctness stage passed)")
        lines.append(walks.decide(rows, walks.RULE_1_AFTER_RULE_5)[1][-1])
    elif on_time:
        lines.append(f"rule 5 in all: not decided: fast enough, but the correctness stage {correctness}")
    lines += [walks.agreement_line(entry) for entry in verdicts.get("agreement", [])]
    lines += verdicts.get("auto", [])
    summary = os.path.join(session.work, "ncu_summary.txt")
    if os.path.exists(summary):
        lines += [line for line in open(summary).read().splitlines() if line.startswith("rule")]
    else:
        lines.append("rules 2-4: not decided (no Nsight Compute pages)")
    probe_log = os.path.join(session.work, "probe.log")
    probe = [line for line in open(probe_log).read().splitlines()
             if line.startswith("triton host rule:")] if os.path.exists(probe_log) else []
    lines.append(probe[-1] if probe else "triton host rule: not decided (the probe did not run)")
    return lines


def pack(session):
    """The small files into the output folder, everything into one archive under its limit."""
    renamed = {"environment.txt": "environment.txt", "ncu_summary.txt": "ncu_summary.txt"}
    for suffix in (".md", ".json"):
        path = walks_path(session, suffix)
        if path:
            renamed[os.path.basename(path)] = "timings" + suffix
    returned = ["stages.json"]  # written by Session.record
    for name, as_name in renamed.items():
        path = os.path.join(session.work, name)
        if os.path.exists(path):
            _copy_capped(path, os.path.join(session.out, as_name))
            returned.append(as_name)
    left_out = []
    archive = os.path.join(session.out, "session_results.tar.gz")
    reports = sorted(glob.glob(os.path.join(session.work, "*.ncu-rep")))
    _archive(session.work, archive, exclude=reports)
    for report in reports:  # a Nsight Compute report only where it fits
        trial = archive + ".trial"
        _archive(session.work, trial, exclude=[r for r in reports if r != report])
        if os.path.getsize(trial) <= ARCHIVE_LIMIT_BYTES:
            os.replace(trial, archive)
        else:
            os.remove(trial)
            left_out.append(f"{os.path.basename(report)} ({os.path.getsize(report) / 2**20:.1f} MiB)")
    if os.path.getsize(archive) > ARCHIVE_LIMIT_BYTES:
        _archive(session.work, archive, exclude=reports, largest_out=left_out)
    returned.append("session_results.tar.gz")
    return returned, left_out


def _copy_capped(source, destination):
    with open(source, "rb") as f:
        data = f.read()
    if len(data) > SMALL_FILE_LIMIT_BYTES:
        data = data[:SMALL_FILE_LIMIT_BYTES] + b"\n[cut: the whole file is in the archive]\n"
    with open(destination, "wb") as f:
        f.write(data)


def _archive(folder, path, exclude, largest_out=None):
    """gzip archive of `folder` without `exclude`; with `largest_out`, the largest files leave
    (named there) until it fits."""
    names = sorted(os.listdir(folder), key=lambda n: os.path.getsize(os.path.join(folder, n)))
    names = [n for n in names if os.path.join(folder, n) not in exclude]
    while True:
        with tarfile.open(path, "w:gz") as archive:
            for name in names:
                archive.add(os.path.join(folder, name), arcname=name)
        if largest_out is None or os.path.getsize(path) <= ARCHIVE_LIMIT_BYTES or not names:
            return
        dropped = names.pop()
        largest_out.append(f"{dropped} ({os.path.getsize(os.path.join(folder, dropped)) / 2**20:.1f} MiB)")


def verdict_block(session, rules, returned, left_out):
    lines = [f"== verdicts ({'rehearsal, ' if session.rehearsal else ''}"
             f"{time.monotonic() - session.start:.0f} s of {BUDGET_S})"]
    for stage in STAGES:
        outcome = session.outcomes.get(stage.name)
        if outcome is not None:
            lines.append(f"{stage.name:<12} {outcome.status:<9} {outcome.seconds:5.0f} s "
                         f"(limit {stage.limit_s}, predicted {stage.predicted_s})")
    lines += rules
    lines.append("returned: " + ", ".join(returned) + (f"; left out: {', '.join(left_out)}" if left_out else ""))
    if len(lines) > VERDICT_LINES:
        lines = lines[:VERDICT_LINES - 1] + [f"(+{len(lines) - VERDICT_LINES + 1} lines in verdicts.txt)"]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", default=os.environ.get("OUT") or None,
                        help="where the returned files go (default: $OUT, the device tool's, else "
                             "bench/results/local/session_<time>)")
    parser.add_argument("--rehearsal", action="store_true",
                        help="every stage on the CPU with stand-ins (no GPU)")
    parser.add_argument("--print-plan", action="store_true",
                        help="print the stages, their limits and predicted seconds, and exit")
    args = parser.parse_args(argv)
    predicted = sum(s.predicted_s for s in STAGES)
    if args.print_plan:
        for s in STAGES:
            print(f"{s.name:<12} limit {s.limit_s:4d} s, predicted {s.predicted_s:4d} s: {s.why}")
        print(f"predicted {predicted} s of the budget's {BUDGET_S}")
        return 0
    out = args.out or os.path.join(LOCAL_RESULTS, "session_" + time.strftime("%Y-%m-%d_%H%M%S"))
    os.makedirs(out, exist_ok=True)
    session = Session(REHEARSAL if args.rehearsal else GPU, out, tempfile.mkdtemp(prefix="scl_session_"),
                      args.rehearsal)
    print(f"== bench.gpu.session: budget {BUDGET_S} s, predicted {predicted} s; work {session.work}",
          flush=True)
    stopped = None
    for stage in STAGES[:-1]:
        if stopped:
            session.outcomes[stage.name] = Outcome("not run", [f"after {stopped}"])
            continue
        begun = time.monotonic()
        print(f"== {stage.name} (limit {session.limit(stage):.0f} s)", flush=True)
        outcome = RUNS[stage.name](session, stage)
        outcome.seconds = time.monotonic() - begun
        session.outcomes[stage.name] = outcome
        for line in [f"{stage.name}: {outcome.status} in {outcome.seconds:.0f} s"] + outcome.lines:
            print(f"   {line}", flush=True)
        session.record()
        if outcome.status != "ok" and stage.name in STOPS_THE_CALL:
            stopped = f"{stage.name} {outcome.status}"
    begun = time.monotonic()
    rules = rule_lines(session)
    returned, left_out = pack(session)
    session.outcomes["pack"] = Outcome("ok", seconds=time.monotonic() - begun)
    session.record()
    shutil.rmtree(session.work, ignore_errors=True)
    block = verdict_block(session, rules, ["verdicts.txt"] + returned, left_out)
    with open(os.path.join(session.out, "verdicts.txt"), "w") as f:
        f.write("\n".join(block + ["", "== every rule line"] + rules) + "\n")
    print("\n".join(block), flush=True)
    return 0 if stopped is None else 1


if __name__ == "__main__":
    sys.exit(main())
