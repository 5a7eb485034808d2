#!/usr/bin/env bash
# The GPU checks, in phases, on a CUDA machine (the device tool's, or any):
#   build      the library with the CUDA C++ kernels (sm_80 + sm_90a), in place
#   tests      the GPU tests: the CUDA backend's, the Triton backend's, no host synchronisation
#              (test_host_reads.py), and the conformance suite's
#              cases on CUDA tensors (every backend that runs there)
#   profile    bench/gpu/profile.py: host issue time, GPU busy time, launches and host waits of a
#              forward + backward per fused backend (where the per-call fixed part goes); then
#              the CUDA single set again with the full-row symmetric backward
#              (SCL_CUDA_SYMMETRIC_BACKWARD=rows, in full_row_backward/): the triangle's gain
#   sanitize   compute-sanitizer memcheck, racecheck and synccheck on bench/gpu/sanitizer_case.py
#   probe      bench/static/l2_reduce_probe.cu: fp32 reduction bandwidth into L2 (the triangle-backward
#              decision, docs/CUDA_KERNELS.md)
#   sweep      the headline sweep (bf16, D = 128 and 256, N = 4k .. 64k; Triton, CUDA, dense)
# SCL_GPU_PHASES picks phases (default: all, in this order); a failing phase is reported and the
# next one runs. Results go to $OUT (the device tool's folder) when set, else bench/results/local/
# (git-ignored).
# SCL_CUTLASS_INCLUDE: the CuTe headers (else pip installs nvidia-cutlass, which needs a network).
# Extra arguments are passed to bench.gpu_sweep, e.g.
#   SCL_GPU_PHASES=sweep bash bench/gpu/gpu_session.sh --dims 256,768 --dtypes bf16,fp32
set -uo pipefail
export SHELLOPTS  # pipefail in the phases too (they run in child shells, under timeout)
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export out="${OUT:-bench/results/local}" python="${PYTHON:-python3}"
phases="${SCL_GPU_PHASES:-build tests profile sanitize probe sweep}"
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

{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  "$python" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__)"
  nvcc --version | tail -n 1
  date -u
} 2>&1 | tee "$out/environment.txt"

build() {
  if [ -z "${SCL_CUTLASS_INCLUDE:-}" ]; then
    "$python" -m pip install -q "nvidia-cutlass==4.2.0.0" || return 1
  fi
  SCL_BUILD_CUDA=1 "$python" setup.py build_ext --inplace > "$out/build.log" 2>&1 \
    || { tail -n 60 "$out/build.log"; return 1; }
  grep -E "scl_kernels setup.py" "$out/build.log" | sort -u
  "$python" -c "import torch, scl_kernels
assert scl_kernels.backends.cuda_kernels_built(), 'no CUDA kernels registered'
print('scl::supcon CUDA kernel registered; backends on cuda:', scl_kernels.available_backends('cuda'))"
}
gpu_tests() {
  # With pytest-xdist, 8 workers by default: faster, and a worker that crashes (the first
  # session's segmentation fault) costs its test, not the run. SCL_GPU_PYTEST_ARGS replaces that
  # (empty: one process).
  local parallel=""
  "$python" -c "import xdist" 2>/dev/null && parallel="-n 8"
  # shellcheck disable=SC2086
  "$python" -m pytest -q -p no:cacheprovider --timeout 300 --maxfail "${SCL_GPU_MAXFAIL:-30}" -rfE \
    ${SCL_GPU_PYTEST_ARGS-$parallel} \
    python_tests/backends/test_cuda_backend.py python_tests/backends/test_triton_gpu.py python_tests/backends/test_host_reads.py \
    python_tests/conformance/test_conformance.py python_tests/conformance/test_conformance_ops.py -k "cuda or gpu" \
    2>&1 | tee "$out/gpu_tests.log" | tail -n 60
}
sanitize() {
  local tool status=0
  for tool in memcheck racecheck synccheck; do
    if PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 1 \
        "$python" -m bench.gpu.sanitizer_case > "$out/sanitizer_$tool.log" 2>&1; then
      echo "compute-sanitizer $tool: clean ($(tail -n 1 "$out/sanitizer_$tool.log"))"
    else
      echo "compute-sanitizer $tool: FAILED"; tail -n 30 "$out/sanitizer_$tool.log"; status=1
    fi
  done
  return $status
}
profile() {
  "$python" -m bench.gpu.profile --out "$out" --sizes 4096,16384,65536 --dims 128,256 &&
    mkdir -p "$out/full_row_backward" &&
    SCL_CUDA_SYMMETRIC_BACKWARD=rows "$python" -m bench.gpu.profile --out "$out/full_row_backward" \
      --backends cuda --layouts single --sizes 4096,16384,65536 --dims 128
}
probe() {
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/static/l2_reduce_probe.cu \
    -o build/l2_reduce_probe && build/l2_reduce_probe | tee "$out/l2_reduce_probe.txt"
}
sweep() {
  if [ "$#" -eq 0 ]; then
    set -- --sizes 4096,16384,65536 --dims 128,256 --dtypes bf16 --modes fwd,both
  fi
  "$python" -m bench.gpu_sweep --out "$out" "$@"
}

export -f build gpu_tests profile sanitize probe sweep
wanted build && phase build 900 build
wanted tests && phase tests 1800 gpu_tests
wanted profile && phase profile 600 profile
wanted sanitize && phase sanitize 900 sanitize
wanted probe && phase probe 300 probe
wanted sweep && phase sweep 1800 sweep "$@"
# The device tool brings back at most 8 files from $OUT: more are packed into one archive.
if [ -n "${OUT:-}" ] && [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
  archive=$(mktemp --suffix=.tar.gz)
  tar -C "$out" -czf "$archive" . && find "$out" -mindepth 1 -delete \
    && mv "$archive" "$out/gpu_session_results.tar.gz" && echo "packed into gpu_session_results.tar.gz"
fi
echo "== phases failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
