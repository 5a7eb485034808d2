#!/usr/bin/env bash
# Which C++ toolchain builds extensions on the device, which libstdc++ runs them, and whether a
# TORCH_CHECK message with an integer crashes when built by each compiler.
export PYTHONUNBUFFERED=1
echo "PATH=$PATH"; which -a g++ c++ gcc; for c in /opt/gcc/bin/g++ /usr/bin/g++ /usr/bin/c++; do [ -x $c ] && echo "$c: $($c --version | head -1)"; done
ls /opt/gcc/lib64/libstdc++.so* 2>/dev/null; ls -la /usr/lib/x86_64-linux-gnu/libstdc++.so* 2>/dev/null
python3 - <<'PY'
import torch
maps = open("/proc/self/maps").read().split("\n")
print("loaded:", sorted({l.split()[-1] for l in maps if "libstdc++" in l}))
PY
for f in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /opt/gcc/lib64/libstdc++.so.6; do [ -e $f ] && echo "$f: $(strings $f | grep -o '^GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n | tail -1)"; done
mkdir -p /tmp/probe && cat > /tmp/probe/probe.py <<'PY'
import os, sys, torch
from torch.utils.cpp_extension import load_inline
src = r'''
#include <torch/extension.h>
void raise_with_integer(int64_t n) { TORCH_CHECK_VALUE(n < 0, "n must be negative, got ", n, " of ", n); }
'''
m = load_inline(name="probe_" + sys.argv[1], cpp_sources=[src], functions=["raise_with_integer"],
                build_directory=sys.argv[2], verbose=False)
try:
    m.raise_with_integer(5)
except ValueError as e:
    print("raised cleanly:", e)
PY
for c in /opt/gcc/bin/g++ /usr/bin/g++; do
  [ -x $c ] || continue; n=$(basename $(dirname $(dirname $c))); d=/tmp/probe/$n; mkdir -p $d
  CXX=$c timeout 120 python3 /tmp/probe/probe.py $n $d 2>&1 | tail -3; echo "built by $c: rc ${PIPESTATUS[0]}"
  LD_PRELOAD=/opt/gcc/lib64/libstdc++.so.6 timeout 60 python3 /tmp/probe/probe.py $n $d 2>&1 | tail -2; echo "  with /opt/gcc libstdc++ preloaded: rc ${PIPESTATUS[0]}"
done
