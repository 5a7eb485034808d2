"""Command-line options that the GPU scripts timing one fused forward + backward share."""
import argparse

import torch

from bench.gpu.step import split_backend
from bench.harness import cli

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_step_options(parser, backends="triton,cuda"):
    """--backends (the fused backends to time; "cuda:rows" / "cuda:triangle" /
    "cuda:triangle-async" name the CUDA C++ symmetric backward's walk, bench.gpu.step.walk_of)
    and --dtype (of the features)."""
    parser.add_argument("--backends", default=backends, type=walk_specs,
                        help="fused backends, comma-separated; cuda:triangle, cuda:triangle-async "
                             "and cuda:rows name the CUDA C++ symmetric backward's walk (default "
                             "%(default)s)")
    parser.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))


def add_layout_option(parser, default):
    """--layouts: "single" (one set, the symmetric schedule) and / or "cross" (anchors against
    other rows, the plain schedule)."""
    parser.add_argument("--layouts", default=default, type=cli.name_list,
                        help="single and / or cross (default %(default)s)")


def walk_specs(text):
    """--backends' type: names, each checked by split_backend."""
    specs = cli.name_list(text)
    for spec in specs:
        try:
            split_backend(spec)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return specs
