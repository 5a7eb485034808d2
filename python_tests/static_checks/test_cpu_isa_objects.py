"""The portable build's machine code: AVX instructions only in the per-ISA copies of the CPU tile
kernels (namespaces scl_avx2 / scl_avx512, csrc/cpu/supcon_tiles_<isa>.cpp), none in any function
a baseline caller reaches, so the library loads and runs on any x86-64 CPU. The hazard it guards
is the one of csrc/cpu/isa_target.h: a shared inline function compiled inside a raised target.
"""
import platform
import re
import shutil
import subprocess
from collections import Counter

import pytest

from scl_kernels._extension import _library_path

# Every mnemonic of AVX or later starts with "v" (vmovups, vfmadd231ps, vzeroupper, ...); AVX-512
# adds the mask-register instructions k*. SSE and scalar x86-64 code has neither.
AVX_MNEMONIC = re.compile(r"^(v[a-z0-9]+|k(mov|and|or|xor|not|shift|test|ortest|add|unpck)[a-z]*)$")
ISA_NAMESPACES = ("scl_avx2", "scl_avx512")


def _avx_instructions_per_function(path):
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path],
                          capture_output=True, text=True, check=True).stdout
    counts, current = Counter(), None
    for line in dump.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = header.group(1)
            counts[current] += 0
        elif current is not None and "\t" in line:
            fields = line.split("\t", 1)[1].split()
            if fields and AVX_MNEMONIC.match(fields[0]):
                counts[current] += 1
    return counts


@pytest.fixture(scope="module")
def avx_counts():
    if platform.machine() != "x86_64" or platform.system() != "Linux":
        pytest.skip("the per-ISA kernels exist on x86-64; this check reads ELF code")
    if shutil.which("objdump") is None:
        pytest.skip("needs objdump (binutils)")
    path = _library_path()
    if path is None:
        pytest.skip("no compiled library")
    counts = _avx_instructions_per_function(path)
    if any(n for name, n in counts.items() if "scl_default" in name):
        pytest.skip("a build for the host's ISA (SCL_CPU_ARCH_FLAGS=-march=native): AVX everywhere")
    return counts


def test_each_isa_copy_has_its_vector_code(avx_counts):
    for namespace in ISA_NAMESPACES:
        assert sum(n for name, n in avx_counts.items() if namespace in name) > 100, namespace


def test_no_avx_outside_the_per_isa_copies(avx_counts):
    outside = sorted(name for name, n in avx_counts.items()
                     if n and not any(ns in name for ns in ISA_NAMESPACES))
    assert not outside, f"AVX code a baseline caller can reach: {outside[:10]}"
