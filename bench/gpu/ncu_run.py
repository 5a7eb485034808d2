"""Nsight Compute over the tile kernels of one step per backend (bench/gpu/kernel_profile.py: the
warm-up outside the profiled range), then the report's pages as text.

    python -m bench.gpu.ncu_run --report DIR/walks_kernels -- --backends cuda:triangle,cuda:rows \
        --sizes 65536 --dims 128

Writes REPORT.ncu-rep, REPORT.log (the profiled program's output), REPORT.details.txt, REPORT.raw.csv
and REPORT.sass.csv (the source page, SASS; a release of ncu without it loses that file, not the
run), and prints the details page's main lines. --clock-control none: the clocks a timed run has,
not ncu's base-clock lock. The metrics the decision rules read (bench.gpu.ncu_pages.METRICS) are
asked for by name beside the sections, so that the raw page holds each of them under that name;
ncu refuses a whole run over one name it does not know, so a name the GPU's own list
(`ncu --query-metrics`) lacks is left out, said, and its rule reads "not decided".
"""
import argparse
import glob
import re
import shutil
import subprocess
import sys

from bench.gpu import ncu_pages
from bench.gpu.kernel_profile import tile_kernel_regex

SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "LaunchStats",
            "Occupancy", "SchedulerStats", "WarpStateStats", "InstructionStats", "SourceCounters")
SUMMARY = re.compile(r"^  [^ ]|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per "
                     r"Thread|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued Instruction")


def ncu_binary():
    """ncu on the PATH, else the newest under /opt/nvidia (where the device image keeps it)."""
    found = shutil.which("ncu")
    if found:
        return found
    versions = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"),
                      key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r"[./]", p)])
    return versions[-1] if versions else "ncu"


def known_metrics(ncu):
    """The base names (before the first dot) of the metrics this GPU's ncu lists, or None where
    the list cannot be read (then every metric is asked for)."""
    try:
        done = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = set(re.findall(r"^([a-z0-9]+__\w+)", done.stdout, re.MULTILINE))
    return names or None


def askable(metrics, known):
    """(metrics to ask for, metrics left out) given the known base names."""
    if known is None:
        return list(metrics), []
    kept = [m for m in metrics if m.split(".")[0] in known]
    return kept, [m for m in metrics if m not in kept]


def profile_command(ncu, report, profile_args, metrics):
    return [ncu, "--profile-from-start", "off", "--clock-control", "none",
            "--kernel-name-base", "demangled", "--kernel-name", f"regex:{tile_kernel_regex()}",
            *(["--metrics", ",".join(metrics)] if metrics else []),
            *[part for section in SECTIONS for part in ("--section", section)],
            "--export", report, "--force-overwrite",
            sys.executable, "-m", "bench.gpu.kernel_profile", *profile_args]


def page(ncu, report, *options, path):
    """Writes one page of the report to `path`; whether ncu could."""
    with open(path, "w") as out:
        done = subprocess.run([ncu, "--import", report + ".ncu-rep", *options], stdout=out,
                              stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(f"no {' '.join(options)} page: {done.stderr.strip()[:200]}")
    return done.returncode == 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--report", required=True, help="the report's path without a suffix")
    parser.add_argument("profile_args", nargs=argparse.REMAINDER,
                        help="after --: bench.gpu.kernel_profile's arguments")
    args = parser.parse_args(argv)
    profile_args = args.profile_args[1:] if args.profile_args[:1] == ["--"] else args.profile_args
    ncu = ncu_binary()
    metrics, left_out = askable(ncu_pages.METRICS, known_metrics(ncu))
    if left_out:
        print("not in this ncu's metrics, so not asked for: " + ", ".join(left_out))
    with open(args.report + ".log", "w") as log:
        done = subprocess.run(profile_command(ncu, args.report, profile_args, metrics), stdout=log,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        with open(args.report + ".log") as log:
            print(f"ncu failed (exit {done.returncode}); its last lines:")
            print("".join(log.readlines()[-30:]), end="")
        return 1
    ok = (page(ncu, args.report, "--page", "details", path=args.report + ".details.txt")
          and page(ncu, args.report, "--page", "raw", "--csv", path=args.report + ".raw.csv"))
    page(ncu, args.report, "--page", "source", "--print-source", "sass", "--csv",
         path=args.report + ".sass.csv")
    if ok:
        with open(args.report + ".details.txt") as details:
            print("".join(line for line in details if SUMMARY.search(line)), end="")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
