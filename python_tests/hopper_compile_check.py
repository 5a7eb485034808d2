"""Compiles every Triton kernel for Hopper (sm_90) on a machine without a GPU: catches what
Triton's interpreter cannot (type rules of tl.dot, shared-memory budgets, unsupported control
flow). Run by test_triton_hopper_compile.py in a process without TRITON_INTERPRET, which would
replace the kernels by interpreted functions.

Prints one line per compiled kernel and exits non-zero on the first failure."""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from scl_kernels.triton_backend import launch

HOPPER = GPUTarget("cuda", 90, 32)
SHARED_MEMORY_BYTES = 227 * 1024  # per block on H100 / H200


def _signature(kernel, element, constexprs):
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("q_ptr", "z_ptr"):
            signature[name] = "*" + element
        elif name.endswith("_ptr"):
            signature[name] = "*fp32"
        elif name == "scale_log2":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature


def variants(kernel):
    """The flag settings the launchers use (launch.py) for the kernel's boolean constexprs."""
    if "SYMMETRIC" in kernel.arg_names:  # grad_rows: plain with its contrast side, or symmetric
        return [dict(SELF_COLUMN=True, CONTRAST_SIDE=True, SYMMETRIC=False),
                dict(SELF_COLUMN=True, CONTRAST_SIDE=False, SYMMETRIC=True)]
    return [{"SELF_COLUMN": True} if "SELF_COLUMN" in kernel.arg_names else {}]


def compile_for_hopper(kernel, meta, flags, warps, stages, element):
    precision = "tf32x3" if element == "fp32" else "tf32"
    constexprs = {**meta, **flags, "PRECISION": precision}
    source = ASTSource(fn=kernel, signature=_signature(kernel, element, constexprs),
                       constexprs=constexprs)
    compiled = triton.compile(source, target=HOPPER,
                              options={"num_warps": warps, "num_stages": stages})
    return compiled.metadata.shared


def main():
    for kernel, tiles in launch.KERNEL_TILES.items():
        # every tile in bf16, the first in fp16 (same element size), and every tile that
        # autotuning keeps for fp32 inputs
        for element, candidates in (("bf16", tiles), ("fp16", tiles[:1]),
                                    ("fp32", [t for t in tiles if t.fp32])):
            assert candidates, f"{kernel.fn.__name__} has no tile for {element}"
            for tile in candidates:
                for flags in variants(kernel):
                    shared = compile_for_hopper(kernel, tile.meta, flags, tile.warps, tile.stages,
                                                element)
                    line = (f"{kernel.fn.__name__} {element} {tile.meta} {flags} w{tile.warps} "
                            f"s{tile.stages}: {shared} B shared")
                    print(line, flush=True)
                    if shared > SHARED_MEMORY_BYTES:
                        sys.exit(f"too much shared memory: {line}")


if __name__ == "__main__":
    main()
