#!/usr/bin/env bash
# One call on a CUDA machine: build (with the CUDA C++ kernels), the whole test suite (its GPU
# tests included), compute-sanitizer on the CUDA kernels, the static predictions
# (bench.gpu_static), then the headline GPU sweep (bf16, D = 128, N = 4k .. 1M; Triton and CUDA).
# Results go to $OUT (the device tool's folder) when set, else bench/results/. Extra arguments
# are passed to bench.gpu_sweep, e.g.
#   bash bench/gpu_session.sh --dims 256,768 --dtypes bf16,fp32 --sizes 4096,65536
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out="${OUT:-bench/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# The library with the CUDA C++ kernels (CuTe headers at build time), for sm_80 and sm_90a.
pip install -q "nvidia-cutlass==4.2.0.0"
SCL_BUILD_CUDA=1 pip install -v --no-build-isolation -e . > "$out/build.log" 2>&1 || {
  tail -n 40 "$out/build.log"; exit 1; }
python -m pytest python_tests -q -x 2>&1 | tee "$out/gpu_tests.log" | tail -n 15
# The CUDA kernels under compute-sanitizer: out-of-bounds and misaligned accesses, shared-memory
# races, barrier misuse (slow: small shapes, bench/cuda_sanitizer_case.py).
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 1 python -m bench.cuda_sanitizer_case \
      > "$out/sanitizer_$tool.log" 2>&1 && echo "compute-sanitizer $tool: clean" \
      || { echo "compute-sanitizer $tool: FAILED"; tail -n 30 "$out/sanitizer_$tool.log"; }
  done
else
  echo "compute-sanitizer is not on PATH: sanitizers skipped" | tee "$out/sanitizer_skipped.log"
fi
# fp32 reduction bandwidth into L2, the number that decides whether a triangle backward (atomic
# column sums) can beat the full-row one (docs/CUDA_KERNELS.md, "Why the backward walks full rows").
mkdir -p build
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/l2_reduce_probe.cu \
  -o build/l2_reduce_probe && build/l2_reduce_probe | tee "$out/l2_reduce_probe.txt" \
  || echo "l2_reduce_probe: not run (needs sm_90a)"
# The static predictions for this Triton, beside the measurements that check them.
python -m bench.gpu_static --dims 128,256,768 --dtypes bf16 --json "$out/gpu_static.json" \
  > "$out/gpu_static.txt" 2>&1 && tail -n 3 "$out/gpu_static.txt"
if [ "$#" -eq 0 ]; then
  set -- --sizes 4096,16384,32768,65536,262144,1048576 --dims 128 --dtypes bf16
fi
python -m bench.gpu_sweep --out "$out" "$@"
