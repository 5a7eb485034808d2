"""One forward + backward per backend for Nsight Compute: the warm-up (compilation, autotuning,
the caching allocator) runs outside the profiled range and one step inside it, so that

    ncu --profile-from-start off --kernel-name "regex:$(python -m bench.gpu.kernel_profile \\
        --print-tile-kernel-regex)" python -m bench.gpu.kernel_profile --sizes 65536

reads the counters of each tile kernel of one step once, per backend, and nothing of the warm-up
(bench/gpu/gpu_session.sh, phases "kernels" and "walks"). A backend may name the CUDA C++
symmetric backward's walk, `--backends cuda:triangle,cuda:rows`: one step of each walk is
profiled, in this order. Off CUDA the step runs without a range: that run exists so that the
script is tested without a GPU.
"""
import contextlib
import itertools

import torch

from bench.gpu import options
from bench.gpu.profile import TILE_KERNELS
from bench.gpu.step import split_backend, supcon_step, walk_of, warm_up
from bench.harness import cli
from bench.harness.timing import synchronize


def tile_kernel_regex():
    """Matches the tile kernels' names whether ncu reports a kernel's function name or its whole
    demangled signature."""
    return ".*(" + "|".join(TILE_KERNELS) + ").*"


def profiled_range(device):
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.profiler.profile()  # cudaProfilerStart / cudaProfilerStop


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, writes_files=False, device="cuda", sizes="65536",
                                  dims="128")
    options.add_step_options(parser)
    options.add_layout_option(parser, "single")
    parser.add_argument("--print-tile-kernel-regex", action="store_true",
                        help="print the regular expression for ncu's --kernel-name and exit")
    args = parser.parse_args(argv)
    if args.print_tile_kernel_regex:
        print(tile_kernel_regex())
        return []
    device = torch.device(args.device)
    done = []
    for spec, layout, d, n in itertools.product(args.backends, args.layouts, args.dims,
                                                 args.sizes):
        with walk_of(spec):
            step = supcon_step(split_backend(spec)[0], layout, n, d, options.DTYPES[args.dtype],
                               device)
            warm_up(step, device)
            with profiled_range(device):
                step()
                synchronize(device)
        print(f"{spec} {layout} N={n} D={d} {args.dtype}: one step profiled", flush=True)
        done.append((spec, layout, n, d))
    return done


if __name__ == "__main__":
    main()
