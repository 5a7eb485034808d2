#!/usr/bin/env bash
# One call on a CUDA machine: build, the whole test suite (its GPU tests included), the static
# predictions (bench.gpu_static), then the headline GPU sweep (bf16, D = 128, N = 4k .. 1M).
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
# No CUDA sources yet: skip nvcc, the Triton backend needs only the C++ library.
SCL_BUILD_CUDA=0 pip install -q --no-build-isolation -e . 2>&1 | tail -n 5
python -m pytest python_tests -q -x 2>&1 | tee "$out/gpu_tests.log" | tail -n 15
# The static predictions for this Triton, beside the measurements that check them.
python -m bench.gpu_static --dims 128,256,768 --dtypes bf16 --json "$out/gpu_static.json" \
  > "$out/gpu_static.txt" 2>&1 && tail -n 3 "$out/gpu_static.txt"
if [ "$#" -eq 0 ]; then
  set -- --sizes 4096,16384,32768,65536,262144,1048576 --dims 128 --dtypes bf16
fi
python -m bench.gpu_sweep --out "$out" "$@"
