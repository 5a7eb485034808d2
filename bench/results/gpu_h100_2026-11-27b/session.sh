#!/usr/bin/env bash
# HEAD (the mean inside the op, ledger 16) on one H100, one call: build sm_90a by the system c++
# (+ raises_cleanly); the profile with CUDA-graph replay at 16,384 / 65,536; the sweep over N and D
# for auto's size rule (both backends, dense eager / torch.compile up to 16,384); then, side by
# side and time-boxed, every sanitizer case under memcheck, racecheck and synccheck (split into
# groups of cases, one process each: the exit barrier's first whole run) and the GPU tests
# (the backends' files and the op's conformance cases, which take the mean inside the op).
set -uo pipefail
export CUDA_HOME=/usr/local/cuda SCL_CUTLASS_INCLUDE=$PWD/.cutlass/include SCL_CUDA_ARCH_LIST=9.0a
export MAX_JOBS=16 PYTHONUNBUFFERED=1
t0=$SECONDS
echo "${SCL_COMMIT:-unknown}" > $OUT/commit.txt
SCL_GPU_PHASES=build timeout 200 bash bench/gpu/gpu_session.sh 2>&1 | tail -n 6
echo "build done at $((SECONDS-t0)) s"
mkdir -p $OUT/p
timeout 100 python3 -m bench.gpu.profile --out $OUT/p --sizes 16384,65536 --dims 128 --layouts single 2>&1 | grep -v Warning | tail -n 24
echo "profile done at $((SECONDS-t0)) s"
timeout 150 python3 -m bench.gpu_sweep --out $OUT/p --sizes 4096,8192,16384,32768,65536 --dims 128,256,64 \
  --dtypes bf16 --modes both --max-dense-n 16384 2>&1 | grep -v Warning | tail -n 50
echo "sweep done at $((SECONDS-t0)) s"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> $OUT/p/clocks_end.txt
left=$((455 - (SECONDS-t0))); [ $left -lt 90 ] && left=90
echo "sanitizer and tests time box: $left s"
san() {  # san TOOL CASES
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $left compute-sanitizer --tool $1 --error-exitcode 1 \
    python3 -m bench.gpu.sanitizer_case --cases $2 > $OUT/p/sanitizer_$1_${2//,/-}.log 2>&1
  echo "compute-sanitizer $1 cases $2: rc $?"
}
for c in 14 15 1,2 3,4,5,6,7 8,9,10,11,12,13 16,17; do san racecheck $c & done
for c in 14,15 1,2,3,4,5,6,7 8,9,10,11,12,13,16,17; do san synccheck $c & done
for c in 1,2,3,4,5,6,7,14 8,9,10,11,12,13,15,16,17; do san memcheck $c & done
setsid timeout -s INT --kill-after=10 $((left - 15)) python3 -m pytest -q -p no:cacheprovider -n 6 --timeout 100 -rfE \
  python_tests/backends/test_cuda_backend.py python_tests/backends/test_host_reads.py python_tests/backends/test_triton_gpu.py \
  python_tests/conformance/test_conformance_ops.py -k "cuda or gpu" > $OUT/p/gpu_tests.log 2>&1
echo "tests rc $? at $((SECONDS-t0)) s"; wait
grep -E "FAILED|ERROR|crashed|passed|failed" $OUT/p/gpu_tests.log | tail -n 20
for f in $OUT/p/sanitizer_*.log; do echo "== $(basename $f): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|cases, twice|runs failed" $f | tr '\n' ' ')"; done
cd $OUT && tar czf results.tar.gz p build.log environment.txt commit.txt 2>/dev/null; rm -rf p build.log
ls -la $OUT
echo "all done at $((SECONDS-t0)) s"
