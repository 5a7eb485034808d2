#!/usr/bin/env bash
# The GPU checks beyond the deciding call, in phases, on a CUDA machine (the device tool's, or any).
# The first call of a GPU window is `python3 -m bench.gpu.session` (the walks and their rules in
# one budget of 540 s); these phases are for the calls after it:
#   build      the library with the CUDA C++ kernels (SCL_CUDA_ARCH_LIST, default sm_80 + sm_90a),
#              in place, by the system's c++, then a bad argument on CUDA tensors must raise
#              ValueError (bench/gpu/build.py); a failed build ends the run
#   tests      the GPU tests (pytest-xdist): the CUDA backend's, the Triton backend's, no host
#              synchronisation (test_host_reads.py), the CUDA graphs' (test_cuda_graphs.py), and
#              the conformance suite's cases on CUDA tensors (every backend that runs there)
#   sanitize   compute-sanitizer memcheck, racecheck and synccheck over every case of
#              bench/gpu/sanitizer_case.py, in SCL_SANITIZER_GROUPS (6) groups side by side, a
#              process each (bench/gpu/sanitize.py); SCL_SANITIZER_CASES="14,15 1,2" takes only
#              those groups (case numbers as printed)
#   profile    bench/gpu/profile.py at N = 16,384 and 65,536, D = 128, 100 classes, single set:
#              wall, host issue time, tile-kernel time apart from the rest, launches, host waits,
#              the same step replayed from a CUDA graph, the Triton autotuner's choices
#   kernels    Nsight Compute over each tile kernel of one step per GPU backend at N = 65,536
#              (SCL_NCU_SIZES), D = 128 (bench/gpu/ncu_run.py): the report and its details, raw
#              and source pages as text
#   size_fit   bench/gpu/size_fit.py: N = 4,096 .. 65,536 fitted as a + b N + c N^2, with the
#              run-to-run spread of every point
#   sweep      bench/gpu_sweep.py against dense eager and dense torch.compile (bf16, D = 128,
#              N = 4,096 .. 65,536)
#   probe      (not by default) bench/static/l2_reduce_probe.cu: fp32 reduction bandwidth into L2
# SCL_GPU_PHASES picks phases (default: all but probe, in the order below); a failing phase is
# reported and the next one runs, except the build, whose failure ends the run. Measured on an
# H100 on 2026-11-26/27 (bench/results/gpu_h100_2026-11-26, gpu_h100_2026-11-27b): build 71-88 s
# (sm_90a only), the whole test selection 348-390 s on 12-16 workers, profile 32 s, a one-size
# sweep 30 s, a four-size fit 11 s, all three sanitizers over every case about 100 s in 11
# processes. The phases' limits add up to 25 minutes: three 10-minute device calls
# (SCL_GPU_PHASES="build profile kernels sweep", then "build tests", then "build sanitize size_fit").
# Results go to $OUT (the device tool's folder) when set, else bench/results/local/;
# environment.txt records the git hash, the clocks at start and end, and versions.
# The CuTe headers: as for bench.gpu.session, `python -m bench.gpu.build --prepare-headers` here
# and `.cutlass` carried (bench/gpu/build.py); SCL_CUTLASS_INCLUDE names another folder.
# Extra arguments are passed to bench.gpu_sweep, e.g.
#   SCL_GPU_PHASES=sweep bash bench/gpu/gpu_session.sh --dims 256,768 --dtypes bf16,fp32
# Only pipefail reaches the phases (`bash -o pipefail` below): nounset exported through SHELLOPTS
# would reach every child bash script too, pyenv's python3 shim among them, which reads unset
# variables and then fails every python call.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export out="${OUT:-bench/results/local}" python="${PYTHON:-python3}"
phases="${SCL_GPU_PHASES:-build profile kernels sweep tests sanitize size_fit}"
mkdir -p "$out" build
failed=()

phase() {  # phase NAME LIMIT_S COMMAND...: runs COMMAND under a time limit, logs whether it passed
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  echo "== $name"
  timeout "$limit" bash -o pipefail -c '"$@"' _ "$@"  # the phases are exported functions
  status=$?
  echo "== $name: $([ $status -eq 0 ] && echo ok || echo "FAILED (exit $status)") in $((SECONDS - start)) s"
  [ $status -eq 0 ] || failed+=("$name")
  return $status
}
wanted() { [[ " $phases " == *" $1 "* ]]; }

clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader; }
{
  echo "git $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "clocks at start (SM, memory, temperature, power): $(clocks)"
  "$python" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__)"
  nvcc --version | tail -n 1
  "$("$python" -c 'from bench.gpu.ncu_run import ncu_binary; print(ncu_binary())')" --version 2>/dev/null \
    | tail -n 1 || echo "no ncu (Nsight Compute): the kernels phase fails"
  date -u
} 2>&1 | tee "$out/environment.txt"

build() {
  "$python" -m bench.gpu.build --log "$out/build.log" --arch-list "${SCL_CUDA_ARCH_LIST:-8.0;9.0a}"
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
    python_tests/backends/test_cuda_graphs.py \
    python_tests/conformance/test_conformance.py python_tests/conformance/test_conformance_ops.py -k "cuda or gpu" \
    2>&1 | tee "$out/gpu_tests.log" | tail -n 60
}
sanitize() {
  "$python" -m bench.gpu.sanitize --out "$out" ${SCL_SANITIZER_CASES:+--groups "$SCL_SANITIZER_CASES"} --timeout 200
}
profile() {
  "$python" -m bench.gpu.profile --out "$out" --sizes 16384,65536 --dims 128 --layouts single
}
kernels() {
  "$python" -m bench.gpu.ncu_run --report "$out/tile_kernels" -- --sizes "${SCL_NCU_SIZES:-65536}" --dims 128
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

export -f build gpu_tests sanitize profile kernels size_fit sweep probe
# Limits: 25 minutes in all (probe apart). Without a library nothing after the build means
# anything: a failed build ends the run.
if wanted build && ! phase build 240 build; then
  echo "== the build failed: no later phase runs"
else
  wanted profile && phase profile 120 profile
  wanted kernels && phase kernels 180 kernels
  wanted sweep && phase sweep 240 sweep "$@"
  wanted tests && phase tests 420 gpu_tests
  wanted sanitize && phase sanitize 210 sanitize
  wanted size_fit && phase size_fit 90 size_fit
  wanted probe && phase probe 120 probe
fi
echo "clocks at end (SM, memory, temperature, power): $(clocks)" | tee -a "$out/environment.txt"
# The device tool brings back at most 8 files from $OUT: more are packed into one archive.
if [ -n "${OUT:-}" ] && [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
  archive=$(mktemp --suffix=.tar.gz)
  tar -C "$out" -czf "$archive" . && find "$out" -mindepth 1 -delete \
    && mv "$archive" "$out/gpu_session_results.tar.gz" && echo "packed into gpu_session_results.tar.gz"
fi
echo "== phases failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
