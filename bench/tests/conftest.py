"""Stand-ins for the GPU machine's tools, first on the PATH, so that the scripts written for one
device call run here (bench/gpu/session.py's rehearsal): nvidia-smi, Nsight Compute (ncu),
compute-sanitizer and nvcc, plus CuTe headers that are only a marker file. Each records its
arguments; ncu runs the command it profiles and answers --import with pages in the layout the
readers assume (ncu_page_text), compute-sanitizer reports a clean run of the cases it is given."""
import os
import stat
from dataclasses import dataclass

import pytest

from bench.gpu import ncu_pages
from ncu_page_text import RAW, source_page

SCRIPTS = {
    "nvidia-smi": """#!/usr/bin/env bash
echo "$*" >> {calls}/nvidia-smi
if [[ " $* " == *" -lms "* ]]; then while true; do echo 1755; sleep 0.02; done; fi
echo "NVIDIA H200 stand-in, 580.00, 1980 MHz, 1755 MHz"
""",
    # Profiles: runs the command from its first executable file on (python), then writes the
    # report, STAND_IN_NCU_REPORT_BYTES of random bytes (gzip cannot shrink them).
    "ncu": """#!/usr/bin/env bash
echo "$*" >> {calls}/ncu
case " $* " in
  *" --version "*) echo "NVIDIA (R) Nsight Compute stand-in"; exit 0 ;;
  *" --query-metrics "*) printf 'Device GH100 stand-in\n%s\n' "$STAND_IN_NCU_METRICS"; exit 0 ;;
  *" --page raw "*) cat {pages}/raw.csv; exit 0 ;;
  *" --page source "*) cat {pages}/source.csv; exit 0 ;;
  *" --page details "*) echo "  walk_kernel stand-in"; echo "    Duration  msecond  5.78"; exit 0 ;;
esac
report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --export) report="$2"; shift 2 ;;
    *) if [ -f "$1" ] && [ -x "$1" ]; then "$@" || exit $?; break; fi; shift ;;
  esac
done
head -c "${{STAND_IN_NCU_REPORT_BYTES:-4096}}" /dev/urandom > "$report.ncu-rep"
""",
    "compute-sanitizer": """#!/usr/bin/env bash
echo "$*" >> {calls}/compute-sanitizer
case " $* " in
  *" --version "*) echo "NVIDIA (R) Compute Sanitizer stand-in"; exit 0 ;;
  *" racecheck "*) echo "2 cases, twice (stand-in)"; echo "========= RACECHECK SUMMARY: 0 hazards displayed" ;;
  *) echo "2 cases, twice (stand-in)"; echo "========= ERROR SUMMARY: 0 errors" ;;
esac
""",
    "nvcc": """#!/usr/bin/env bash
echo "$*" >> {calls}/nvcc
echo "Cuda compilation tools, release 13.0, stand-in"
""",
}


@dataclass
class StandIns:
    folder: object
    env: dict

    def calls(self, tool):
        """The argument lines `tool` was called with, in order."""
        path = self.folder / "calls" / tool
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def gpu_stand_ins(tmp_path):
    """The stand-ins in tmp_path/bin, and the environment that puts them first on the PATH and
    points the build at marker headers (call the scripts with env=stand_ins.env merged)."""
    bin_dir, calls, pages = tmp_path / "bin", tmp_path / "calls", tmp_path / "pages"
    for folder in (bin_dir, calls, pages):
        folder.mkdir()
    (pages / "raw.csv").write_text(RAW)
    (pages / "source.csv").write_text(source_page(4))
    for name, text in SCRIPTS.items():
        path = bin_dir / name
        path.write_text(text.format(calls=calls, pages=pages))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    headers = tmp_path / "cutlass_include"
    (headers / "cute").mkdir(parents=True)
    (headers / "cute" / "tensor.hpp").write_text("// a marker: the stand-in build compiles nothing\n")
    # Every metric the rules read, by base name, as `ncu --query-metrics` lists them.
    metrics = "\n".join(sorted({m.split(".")[0] + "  a metric" for m in ncu_pages.METRICS}))
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STAND_IN_NCU_METRICS": metrics,
           "SCL_CUTLASS_INCLUDE": str(headers), "PYTHONPATH": ROOT_ON_PATH}
    return StandIns(tmp_path, env)


ROOT_ON_PATH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
