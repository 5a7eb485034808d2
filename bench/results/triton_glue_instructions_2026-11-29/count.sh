#!/bin/bash
# count.sh LABEL PACKAGE_ROOT MODE: instructions a step of step.py (MODE full or replay) for the
# package under PACKAGE_ROOT ("" for the installed one), by cachegrind: (220 steps - 20 steps) / 200.
# Run from the repository root with the venv's python as PYTHON.
label=$1 root=$2 mode=$3 here=$(dirname "$0")
# Idle OpenMP and MKL threads that spin count instructions that depend on the timing.
export OMP_WAIT_POLICY=PASSIVE MKL_NUM_THREADS=1 OMP_NUM_THREADS=1
for k in 20 220; do
  PKG_ROOT=$root TRITON_INTERPRET=1 valgrind --tool=cachegrind --cache-sim=no \
    --cachegrind-out-file=/dev/null "${PYTHON:-python}" "$here/step.py" $k $mode > "cg.$label.$mode.$k.log" 2>&1
done
a=$(grep -oP 'I\s+refs:\s+\K[\d,]+' "cg.$label.$mode.20.log" | tr -d ,)
b=$(grep -oP 'I\s+refs:\s+\K[\d,]+' "cg.$label.$mode.220.log" | tr -d ,)
rm -f "cg.$label.$mode.20.log" "cg.$label.$mode.220.log"
echo "$label $mode $(( (b - a) / 200 )) instructions/step"
