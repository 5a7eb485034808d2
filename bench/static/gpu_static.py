"""Static GPU check of the Triton kernels, without a GPU: compiles every kernel with every tile
its autotuner can choose, specialised the way Triton's JIT specialises them at run time, for
Hopper (sm_90) with the tools bundled in Triton's wheel; reads the machine code; predicts the
headline forward + backward times with an issue-slot model (bench/static/issue_slots.py).

    python -m bench.static.gpu_static [--dims 128,256,768,100] [--dtypes bf16,fp32] [--jobs 2]
                                      [--json FILE] [--no-cuda]

Per compiled kernel: registers, spill bytes and spill instructions (STL/LDL), shared memory,
whether its tile loop holds HGMMA and UTMALDG, the loop's warp instructions per tile by class,
and per 1,000 tensor multiply-adds (beside a fused-attention forward compiled the same way,
bench/static/attention_reference.py). Then the predicted times of the symmetric schedule (single
set, contrast_mode="all": the headline) for N = 65,536 and 262,144, next to the floor of that
schedule. Every time it prints is a prediction of the model, not a measurement.

Then the CUDA C++ kernels of csrc/cuda (bench/static/cuda_static.py: both families for sm_80 and
sm_90a, their registers, spills, HMMA / HGMMA / UTMALDG and the same prediction), unless --no-cuda
or nvcc / the CuTe headers are missing (it says so).

Exit status 1 when a tile that autotuning may keep spills registers or does not fit in shared
memory, or a CUDA kernel spills or lacks its tensor-core or TMA instructions (CI runs this)."""
import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor

from bench.static import cuda_static
from bench.static.requirements import CUDA_NEEDS, TRITON_NEEDS, missing_triton


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=f"{TRITON_NEEDS} {CUDA_NEEDS}", allow_abbrev=False)
    parser.add_argument("--dims", default="128,256,768,100",
                        help="row widths D to compile for (comma-separated)")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--jobs", type=int, default=2, help="compiler processes")
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--no-cuda", action="store_true",
                        help="skip the CUDA C++ kernels (bench.static.cuda_static)")
    args = parser.parse_args(argv)
    missing = missing_triton("python -m bench.static.gpu_static")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from bench.static.triton_kernels import (cases, compile_case, compile_fused_stages,
                                             compile_hard_pairs, compile_reference, problems,
                                             report, tile_text)
    dims = [int(d) for d in args.dims.split(",")]
    todo = list(cases(dims, args.dtypes.split(",")))
    with ProcessPoolExecutor(args.jobs) as pool:
        reference_future = pool.submit(compile_reference)
        results = list(pool.map(compile_case, todo))
        reference = reference_future.result()
        fused_stages = pool.submit(compile_fused_stages)
        # One configuration each, any D: hard-pair mining (per dtype), the O(N D) stages.
        single = list(pool.map(compile_hard_pairs, args.dtypes.split(","))) + fused_stages.result()
    bad = [(r, problems(r)) for r in results + single if problems(r)]
    report(results, reference, dims)
    print()
    for r in single:
        print(f"{r['use']} {r['dtype']:<5} {r['tile_text']}: {r['registers']} registers, "
              f"{r['spill_bytes']} B spilled ({r['spill_instructions']} STL/LDL), "
              f"{r['shared_bytes'] / 1024:.0f} KiB shared memory")
    cuda_results = []
    if not args.no_cuda:
        tools, why_not = cuda_static.toolchain()
        print()
        if tools is None:
            print(f"CUDA C++ kernels not checked: {why_not}")
        else:
            cuda_results = cuda_static.analyse_all(tools)
            cuda_static.report(cuda_results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "reference": reference, "cuda": cuda_results,
                       "single_config": single}, f,
                      indent=1)
    bad += [({"use": r["kernel"], "dtype": r["arch"], "d": "-", "tile": None}, cuda_static.problems(r))
            for r in cuda_results if cuda_static.problems(r)]
    for r, why in bad:
        tile = tile_text(r["tile"]) if r["tile"] else r.get("tile_text", "")
        print(f"NOT FIT: {r['use']} {r['dtype']} D={r['d']} {tile}: {'; '.join(why)}",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
