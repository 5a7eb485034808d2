"""compute-sanitizer over bench/gpu/sanitizer_case.py's cases: each tool over each group of cases
in a process of its own, all side by side, each verdict read from its log.

    python -m bench.gpu.sanitize --out DIR                      # every case, in 6 groups
    python -m bench.gpu.sanitize --out DIR --groups "14 15 18 19" --timeout 90

Side by side because one process is slow: on an H100 (2026-11-27) all three tools over every case
took about 100 s in 11 processes, where racecheck alone was not done after 190 s in one. A group
is clean when its log says the cases ran to the end ("cases, twice") and the tool found nothing;
a process still running at --timeout is killed and counts as not clean.
"""
import argparse
import os
import re
import subprocess
import sys
import time

from bench.gpu import sanitizer_case

TOOLS = ("memcheck", "racecheck", "synccheck")
CLEAN = re.compile(r"ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards")
FINISHED = "cases, twice"


def log_path(out, tool, group):
    return os.path.join(out, f"sanitizer_{tool}_{group.replace(',', '-')}.log")


def run_side_by_side(groups, tools, out, timeout):
    """{(tool, group): verdict}: "clean", "FAILED" or "not finished in N s"."""
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    running = {}
    for tool in tools:
        for group in groups:
            with open(log_path(out, tool, group), "w") as log:
                running[(tool, group)] = subprocess.Popen(
                    ["compute-sanitizer", "--tool", tool, "--error-exitcode", "1", sys.executable,
                     "-m", "bench.gpu.sanitizer_case", "--cases", group],
                    stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    verdicts = {}
    for key, process in running.items():
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            verdicts[key] = f"not finished in {timeout:.0f} s"
            continue
        with open(log_path(out, *key)) as log:
            text = log.read()
        verdicts[key] = "clean" if FINISHED in text and CLEAN.search(text) else "FAILED"
    return verdicts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", required=True, help="folder of the logs")
    parser.add_argument("--groups", default=None,
                        help="space-separated groups of comma-separated case numbers (default: "
                             "every case in SCL_SANITIZER_GROUPS groups, 6)")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help="compute-sanitizer tools, comma-separated (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds before the processes still running are killed")
    args = parser.parse_args(argv)
    groups = (args.groups.split() if args.groups else sanitizer_case.case_groups(
        len(sanitizer_case.all_runs()), int(os.environ.get("SCL_SANITIZER_GROUPS", "6"))))
    tools = args.tools.split(",")
    unknown = set(tools) - set(TOOLS)
    if unknown:
        parser.error(f"--tools: unknown {sorted(unknown)}; known: {', '.join(TOOLS)}")
    os.makedirs(args.out, exist_ok=True)
    verdicts = run_side_by_side(groups, tools, args.out, args.timeout)
    for (tool, group), verdict in verdicts.items():
        print(f"compute-sanitizer {tool}, cases {group}: {verdict}")
        if verdict == "FAILED":
            with open(log_path(args.out, tool, group)) as log:
                print("".join(log.readlines()[-20:]), end="")
    return 0 if all(v == "clean" for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
