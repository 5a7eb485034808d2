#!/usr/bin/env bash
# HEAD on one H100, one call (15 minutes of device time in all): build sm_90a by the system c++
# (+ raises_cleanly), profile with CUDA-graph replay at 16,384 / 65,536, the sweep at 16,384
# against dense eager / torch.compile, then the GPU tests and compute-sanitizer (memcheck, then
# racecheck) side by side, time-boxed into what is left.
set -uo pipefail
export CUDA_HOME=/usr/local/cuda SCL_CUTLASS_INCLUDE=$PWD/.cutlass/include SCL_CUDA_ARCH_LIST=9.0a
export MAX_JOBS=16 PYTHONUNBUFFERED=1
t0=$SECONDS
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null || true
SCL_GPU_PHASES=build timeout 200 bash bench/gpu/gpu_session.sh 2>&1 | tail -n 8
echo "build done at $((SECONDS-t0)) s"
mkdir -p $OUT/p
timeout 110 python3 -m bench.gpu.profile --out $OUT/p --sizes 16384,65536 --dims 128 --layouts single 2>&1 | grep -v Warning | tail -n 30
echo "profile done at $((SECONDS-t0)) s"
timeout 90 python3 -m bench.gpu_sweep --out $OUT/p --sizes 16384 --dims 128 --dtypes bf16 --modes both 2>&1 | grep -v Warning | tail -n 14
echo "sweep done at $((SECONDS-t0)) s"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> $OUT/p/clocks_end.txt
left=$((530 - (SECONDS-t0))); [ $left -lt 60 ] && left=60
echo "tests and sanitizer time box: $left s"
( for tool in memcheck racecheck; do
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $((left / 2 - 5)) compute-sanitizer --tool $tool --error-exitcode 1 \
      python3 -m bench.gpu.sanitizer_case > $OUT/p/sanitizer_$tool.log 2>&1
    echo "compute-sanitizer $tool rc $?"
  done ) &
setsid timeout -s INT --kill-after=10 $left python3 -m pytest -v -p no:cacheprovider -n 12 --timeout 100 -rfE \
  python_tests/backends/test_cuda_backend.py python_tests/backends/test_host_reads.py python_tests/backends/test_triton_gpu.py \
  python_tests/conformance/test_conformance.py python_tests/conformance/test_conformance_ops.py -k "cuda or gpu" \
  > $OUT/p/gpu_tests.log 2>&1
echo "tests rc $? at $((SECONDS-t0)) s"; pkill -9 -f pytest; wait
grep -cE " PASSED" $OUT/p/gpu_tests.log; grep -E "FAILED|ERROR|crashed|passed|failed" $OUT/p/gpu_tests.log | tail -n 40
for t in memcheck racecheck; do echo "== $t"; grep -E "ERROR SUMMARY|FAILED|Hazard|hazard|cases" $OUT/p/sanitizer_$t.log | sort | uniq -c | head -n 12; done
cd $OUT && tar czf results.tar.gz p build.log environment.txt commit.txt 2>/dev/null; rm -rf p build.log
ls -la $OUT
