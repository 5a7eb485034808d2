#!/usr/bin/env bash
# The host's share of a Triton step at N = 16,384 on the GPU (cProfile and torch.profiler), and the
# 16-bit raw-op test on Triton with the temperature tolerance of 2026-11-26.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda MAX_JOBS=16 PYTHONUNBUFFERED=1 CXX=c++ SCL_BUILD_CUDA=0
t0=$SECONDS
python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || tail -30 $OUT/build.log
echo "build $((SECONDS-t0)) s"
timeout 45 python3 -m pytest -q -p no:cacheprovider python_tests/conformance/test_conformance_ops.py -k "test_raw_op_outputs_16_bit and triton-cuda" 2>&1 | tail -3
echo "tests at $((SECONDS-t0)) s"
timeout 70 env PYTHONPATH=. python3 bench/results/gpu_h100_2026-11-26/host_profile.py > $OUT/host_profile.txt 2>&1; head -c 6000 $OUT/host_profile.txt
echo "done at $((SECONDS-t0)) s"
