#!/usr/bin/env bash
# The second call: the fixes of the first call's findings, built again (sm_90a): racecheck over the
# triangle backward's cases with the exit barrier, the test that failed, and the sweep (which
# aborted at its exit) at 16,384 again.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda SCL_CUTLASS_INCLUDE=$PWD/.cutlass/include SCL_CUDA_ARCH_LIST=9.0a
export MAX_JOBS=16 PYTHONUNBUFFERED=1
t0=$SECONDS
mkdir -p $OUT/q
SCL_GPU_PHASES=build OUT=$OUT/q timeout 120 bash bench/gpu/gpu_session.sh 2>&1 | tail -n 4
echo "build done at $((SECONDS-t0)) s"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 70 compute-sanitizer --tool racecheck --error-exitcode 1 \
  python3 -m bench.gpu.sanitizer_case --cases 14,15,1 > $OUT/q/sanitizer_racecheck_triangle.log 2>&1
echo "racecheck rc $? at $((SECONDS-t0)) s"
grep -E "ERROR SUMMARY|FAILED|cases" $OUT/q/sanitizer_racecheck_triangle.log | sort | uniq -c | head
grep -E "^=========     at" $OUT/q/sanitizer_racecheck_triangle.log | sed 's/+0x[0-9a-f]*//' | sort | uniq -c | head -n 4
timeout 40 python3 -m pytest -q -p no:cacheprovider -rfE python_tests/conformance/test_conformance_ops.py \
  -k "skips_the_temperature_gradient and cuda" 2>&1 | tail -n 3
echo "test done at $((SECONDS-t0)) s"
timeout 45 python3 -m bench.gpu_sweep --out $OUT/q --sizes 16384 --dims 128 --dtypes bf16 --modes both 2>&1 | grep -v Warning | tail -n 8
echo "sweep rc $? at $((SECONDS-t0)) s"
cd $OUT && tar czf results2.tar.gz q && rm -rf q
