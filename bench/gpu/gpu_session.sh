#!/usr/bin/env bash
# The GPU checks, in phases, on a CUDA machine (the device tool's, or any):
#   build      the library with the CUDA C++ kernels (sm_80 + sm_90a), in place, by the system's
#              c++; then a bad argument on CUDA tensors must raise ValueError (raises_cleanly)
#   tests      the GPU tests (pytest-xdist): the CUDA backend's, the Triton backend's, no host
#              synchronisation (test_host_reads.py), and the conformance suite's cases on CUDA
#              tensors (every backend that runs there)
#   sanitize   compute-sanitizer memcheck, racecheck and synccheck over every case of
#              bench/gpu/sanitizer_case.py, to the end (a failing case is reported, the rest run),
#              in SCL_SANITIZER_GROUPS (6) groups of cases side by side, a process each;
#              SCL_SANITIZER_CASES="14,15 1,2" takes only those groups (case numbers as printed)
#   walks      M0 of the tile kernels' work (issue 40; rules written before the run in
#              bench/decisions/2026-11-28-walks-m0-rules.md): bench/gpu/walks.py times the CUDA C++
#              triangle backward, the same with its partners' exchange by st.async
#              (SCL_CUDA_SYMMETRIC_BACKWARD=triangle-async), its full-row walk (=rows) and Triton at
#              N = 65,536, D = 64 / 128 / 256, bf16, one set, synchronised, back to back and as a
#              graph replay, per kernel, with the SM clock sampled by nvidia-smi under load; then
#              Nsight Compute over the tile kernels of one step of each CUDA C++ walk at D = 128
#              (warp state, source counters, pipes) and bench/gpu/ncu_pages.py's reading of its
#              pages: the stalls at each fence and wait line, and the numbers each rule reads
#              (walks_rules.txt). One device call: SCL_CUDA_ARCH_LIST=9.0a
#              SCL_GPU_PHASES="build walks" (budget below, about 5 minutes predicted, 6 allowed)
#   profile    bench/gpu/profile.py at N = 16,384 and 65,536, D = 128, 100 classes, single set:
#              wall, host issue time, tile-kernel time apart from the rest, launches, host waits,
#              the same step replayed from a CUDA graph, the Triton autotuner's choices
#   kernels    Nsight Compute over each tile kernel of one step per GPU backend at N = 65,536
#              (SCL_NCU_SIZES), D = 128 (bench/gpu/kernel_profile.py: the warm-up outside the
#              profiled range): throughput against peak, the pipes' use (tensor, exp), occupancy,
#              issue stalls, and the stalls per SASS instruction; the report (.ncu-rep) and its
#              details, raw and source pages as text
#   size_fit   bench/gpu/size_fit.py: N = 4,096 .. 65,536 fitted as a + b N + c N^2, with the
#              run-to-run spread of every point
#   sweep      bench/gpu_sweep.py against dense eager and dense torch.compile (bf16, D = 128,
#              N = 4,096 .. 65,536)
#   probe      (not by default) bench/static/l2_reduce_probe.cu: fp32 reduction bandwidth into L2
# SCL_GPU_PHASES picks phases (default: all but probe, in the order below: what the GPU targets
# need first); a failing phase is reported and the next one runs. The phases' limits add up to
# 28.5 minutes; the device tool's 10-minute calls take them in two or three calls
# (SCL_GPU_PHASES="build walks" first, then "build profile kernels sweep", then "build tests
# sanitize"). Measured on an H100 on 2026-11-26 (bench/results/gpu_h100_2026-11-26): build 74 s
# (sm_90a only, SCL_CUDA_ARCH_LIST=9.0a), the whole test selection 348 s on 16 workers, profile
# 32 s, a one-size sweep 30 s, a four-size fit 11 s: everything but sanitize fits one 10-minute
# call with that architecture list. On 2026-11-27 (bench/results/gpu_h100_2026-11-27): build 71 s,
# the test selection 390 s on 12 workers beside memcheck (all cases, about 60 s) and racecheck
# (not done after 190 s); later that day (bench/results/gpu_h100_2026-11-27b) all three tools over
# every case in 11 processes side by side took about 100 s, as sanitize now runs them. Results go
# to $OUT (the device tool's folder) when set,
# else bench/results/local/ (git-ignored); environment.txt records the git hash, the clocks at start and end, and versions.
# SCL_CUTLASS_INCLUDE: the CuTe headers (else pip installs nvidia-cutlass, which needs a network).
# Extra arguments are passed to bench.gpu_sweep, e.g.
#   SCL_GPU_PHASES=sweep bash bench/gpu/gpu_session.sh --dims 256,768 --dtypes bf16,fp32
set -uo pipefail
export SHELLOPTS  # pipefail in the phases too (they run in child shells, under timeout)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export out="${OUT:-bench/results/local}" python="${PYTHON:-python3}"
phases="${SCL_GPU_PHASES:-build walks profile kernels sweep tests sanitize size_fit}"
mkdir -p "$out" build
failed=()

phase() {  # phase NAME LIMIT_S COMMAND...: runs COMMAND under a time limit, logs whether it passed
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  echo "== $name"
  timeout "$limit" bash -c '"$@"' _ "$@"  # the phases are exported functions
  status=$?
  echo "== $name: $([ $status -eq 0 ] && echo ok || echo "FAILED (exit $status)") in $((SECONDS - start)) s"
  [ $status -eq 0 ] || failed+=("$name")
}
wanted() { [[ " $phases " == *" $1 "* ]]; }

# Nsight Compute: on the PATH, else the newest under /opt/nvidia (where the device image keeps it).
ncu=$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | sort -V | tail -n 1)
export ncu="${ncu:-ncu}"
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader; }
{
  echo "git $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "clocks at start (SM, memory, temperature, power): $(clocks)"
  "$python" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__)"
  nvcc --version | tail -n 1
  "$ncu" --version 2>/dev/null | tail -n 1 || echo "no ncu (Nsight Compute): the kernels phase fails"
  date -u
} 2>&1 | tee "$out/environment.txt"

# The C++ compiler: the system's c++, not an inherited CXX. On the device tool's image CXX names
# /opt/gcc/bin/g++, a wrapper whose objects crash (SIGSEGV in std::ostream) whenever a TORCH_CHECK
# formats an integer against the libstdc++ that python3 loads: every error the op raises became a
# segmentation fault (bench/results/gpu_h200_2026-11-26/README.md). SCL_GPU_CXX overrides.
export CXX="${SCL_GPU_CXX:-c++}"
build() {
  if [ -z "${SCL_CUTLASS_INCLUDE:-}" ]; then
    "$python" -m pip install -q "nvidia-cutlass==4.2.0.0" || return 1
  fi
  # SCL_BUILD_TESTS=1: the tests phase sets the test hooks (scl_kernels._testing).
  SCL_BUILD_CUDA=1 SCL_BUILD_TESTS=1 "$python" setup.py build_ext --inplace > "$out/build.log" 2>&1 \
    || { tail -n 60 "$out/build.log"; return 1; }
  grep -E "scl_kernels setup.py" "$out/build.log" | sort -u
  "$python" -c "import torch, scl_kernels
assert scl_kernels.backends.cuda_kernels_built(), 'no CUDA kernels registered'
print('scl::supcon CUDA kernel registered; backends on cuda:', scl_kernels.available_backends('cuda'))" &&
    raises_cleanly
}
raises_cleanly() {  # a library built against another libstdc++ crashes here instead of raising
  "$python" -c "import torch, scl_kernels
x = torch.randn(6, 4, device='cuda')
try:
    torch.ops.scl.supcon(x, torch.zeros(6, dtype=torch.long, device='cuda'), None, None,
                         torch.tensor(0.1), 6, True, anchor_offset=-1)
except ValueError as error:
    print('a bad argument raises ValueError on CUDA tensors:', str(error)[:60])
else:
    raise SystemExit('anchor_offset=-1 was accepted')" \
    || { echo "the built library does not raise cleanly (compiler: $CXX, $($CXX --version | head -n 1))"; return 1; }
}
gpu_tests() {
  # With pytest-xdist, one worker per CPU by default: faster, and a worker that crashes (the first
  # session's segmentation fault) costs its test, not the run. SCL_GPU_PYTEST_ARGS replaces that
  # (empty: one process).
  local parallel=""
  "$python" -c "import xdist" 2>/dev/null && parallel="-n $(nproc)"
  # shellcheck disable=SC2086
  "$python" -m pytest -q -p no:cacheprovider --timeout 300 --maxfail "${SCL_GPU_MAXFAIL:-30}" -rfE \
    ${SCL_GPU_PYTEST_ARGS-$parallel} \
    python_tests/backends/test_cuda_backend.py python_tests/backends/test_triton_gpu.py python_tests/backends/test_host_reads.py \
    python_tests/conformance/test_conformance.py python_tests/conformance/test_conformance_ops.py -k "cuda or gpu" \
    2>&1 | tee "$out/gpu_tests.log" | tail -n 60
}
sanitize() {
  # Each tool over the cases in groups run side by side, a process each (on an H100 on 2026-11-27
  # the whole set took about 100 s that way; racecheck alone was not done after 190 s in one).
  local tool group status=0 groups
  if [ -n "${SCL_SANITIZER_CASES:-}" ]; then
    groups=$SCL_SANITIZER_CASES
  else
    groups=$("$python" -m bench.gpu.sanitizer_case --print-groups "${SCL_SANITIZER_GROUPS:-6}") || return 1
  fi
  for tool in memcheck racecheck synccheck; do
    for group in $groups; do
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 1 \
        "$python" -m bench.gpu.sanitizer_case --cases "$group" \
        > "$out/sanitizer_${tool}_${group//,/-}.log" 2>&1 &
    done
  done
  wait  # each verdict is read from its log below
  for tool in memcheck racecheck synccheck; do
    for group in $groups; do
      local log="$out/sanitizer_${tool}_${group//,/-}.log"
      if grep -qE "cases, twice" "$log" && grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards" "$log"; then
        echo "compute-sanitizer $tool, cases $group: clean"
      else
        echo "compute-sanitizer $tool, cases $group: FAILED"; tail -n 30 "$log"; status=1
      fi
    done
  done
  return $status
}
profile() {
  "$python" -m bench.gpu.profile --out "$out" --sizes 16384,65536 --dims 128 --layouts single
}
tile_kernels_ncu() {  # tile_kernels_ncu REPORT KERNEL_PROFILE_ARGS...
  # Nsight Compute over the tile kernels of one step per backend (bench/gpu/kernel_profile.py);
  # the report and its details, raw and source pages as text, and the details' main lines.
  # --profile-from-start off: only the step inside kernel_profile's range; --clock-control none:
  # the clocks a timed run has, not ncu's base-clock lock. The source page needs ncu 2023 or later:
  # a version without it loses that file, not the phase.
  local regex report=$1
  shift
  regex=$("$python" -m bench.gpu.kernel_profile --print-tile-kernel-regex) || return 1
  "$ncu" --profile-from-start off --clock-control none --kernel-name-base demangled \
    --kernel-name "regex:$regex" --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    --section SchedulerStats --section WarpStateStats --section InstructionStats \
    --section SourceCounters --export "$report" --force-overwrite \
    "$python" -m bench.gpu.kernel_profile "$@" > "$report.log" 2>&1 || { tail -n 40 "$report.log"; return 1; }
  "$ncu" --import "$report.ncu-rep" --page details > "$report.details.txt" || return 1
  "$ncu" --import "$report.ncu-rep" --page raw --csv > "$report.raw.csv" || return 1
  "$ncu" --import "$report.ncu-rep" --page source --print-source sass --csv > "$report.sass.csv" \
    2> "$report.sass.err" || echo "no SASS source page: $(head -n 3 "$report.sass.err")"
  grep -E "^  [^ ]|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued Instruction" \
    "$report.details.txt" || echo "no summary lines in $report.details.txt"
}
kernels() {
  tile_kernels_ncu "$out/tile_kernels" --sizes "${SCL_NCU_SIZES:-65536}" --dims 128
}
walks() {
  # Budget of the one device call (H100, 16 cores), predicted from the sessions of 2026-11-26/27:
  # build 71-88 s measured (sm_90a only); the timings about 110 s (12 rows of about 3 s each at
  # 5-18 ms a step, plus Triton's compilation and autotuning at each D, 20-30 s, and the process's
  # start); Nsight Compute about 75 s (start and warm-up, 6 tile kernels of 1.4-6 ms replayed
  # about 40 passes each, three pages read back); so about 295 s of the call's 360 (the triangle
  # by st.async added 3 rows, about 10 s, and 2 profiled kernels, about 15 s: it fits, so it is
  # timed at D = 256 too, where it runs rows like the triangle). The limits below (150 + 110 s)
  # keep the walks phase inside 260 s, and a timing part that overruns still leaves the profile
  # its own time. SCL_WALKS_ARGS and SCL_WALKS_NCU_ARGS are appended to the two
  # commands (the later of two equal options wins), e.g. for the script's CPU test.
  local status=0 extra ncu_extra
  read -ra extra <<< "${SCL_WALKS_ARGS:-}"
  read -ra ncu_extra <<< "${SCL_WALKS_NCU_ARGS:-}"
  timeout 150 "$python" -m bench.gpu.walks --out "$out" "${extra[@]}" || status=1
  # ncu_pages prints the numbers each rule reads; its exit status says whether the raw page held
  # any kernel.
  timeout 110 bash -c 'tile_kernels_ncu "$@"' _ "$out/walks_kernels" \
    --backends cuda:triangle,cuda:triangle-async,cuda:rows \
    --sizes 65536 --dims 128 "${ncu_extra[@]}" \
    && "$python" -m bench.gpu.ncu_pages --raw "$out/walks_kernels.raw.csv" \
      --sass "$out/walks_kernels.sass.csv" | tee "$out/walks_rules.txt" || status=1
  return $status
}
size_fit() {
  "$python" -m bench.gpu.size_fit --out "$out" --sizes 4096,8192,16384,24576,32768,49152,65536 --dims 128
}
probe() {
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/static/l2_reduce_probe.cu \
    -o build/l2_reduce_probe && build/l2_reduce_probe | tee "$out/l2_reduce_probe.txt"
}
sweep() {
  if [ "$#" -eq 0 ]; then
    set -- --sizes 4096,8192,16384,32768,65536 --dims 128 --dtypes bf16 --modes both
  fi
  "$python" -m bench.gpu_sweep --out "$out" "$@"
}

export -f build raises_cleanly gpu_tests sanitize profile tile_kernels_ncu kernels walks size_fit sweep probe
# Limits: 28.5 minutes in all (probe apart).
wanted build && phase build 240 build
wanted walks && phase walks 270 walks
wanted profile && phase profile 120 profile
wanted kernels && phase kernels 180 kernels
wanted sweep && phase sweep 240 sweep "$@"
wanted tests && phase tests 420 gpu_tests
wanted sanitize && phase sanitize 210 sanitize
wanted size_fit && phase size_fit 90 size_fit
wanted probe && phase probe 120 probe
echo "clocks at end (SM, memory, temperature, power): $(clocks)" | tee -a "$out/environment.txt"
# The device tool brings back at most 8 files from $OUT: more are packed into one archive.
if [ -n "${OUT:-}" ] && [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
  archive=$(mktemp --suffix=.tar.gz)
  tar -C "$out" -czf "$archive" . && find "$out" -mindepth 1 -delete \
    && mv "$archive" "$out/gpu_session_results.tar.gz" && echo "packed into gpu_session_results.tar.gz"
fi
echo "== phases failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
