"""Command-line options that the GPU scripts timing one fused forward + backward share."""
import torch

from bench.harness import cli

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_step_options(parser):
    """--backends (the fused backends to time) and --dtype (of the features)."""
    parser.add_argument("--backends", default="triton,cuda", type=cli.name_list,
                        help="fused backends, comma-separated (default %(default)s)")
    parser.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))


def add_layout_option(parser, default):
    """--layouts: "single" (one set, the symmetric schedule) and / or "cross" (anchors against
    other rows, the plain schedule)."""
    parser.add_argument("--layouts", default=default, type=cli.name_list,
                        help="single and / or cross (default %(default)s)")
