"""The types of the public API's options, written once for the signatures that take them
(supcon_loss, explain, the nn modules, the distributed loss, the compat layers). The tuples the
checks in _validation.py compare against are read from these; a test holds BackendName to the
backend registry (scl_kernels.backends.BACKENDS)."""
from typing import Literal, Union

import torch

ContrastMode = Literal["all", "one"]
Reduction = Literal["mean", "sum", "none"]
# How multi-hot labels weigh a pair (docs/MATH.md section 11).
MultiLabel = Literal["any", "jaccard"]
BackendName = Literal["auto", "cpu", "triton", "cuda", "reference"]
# A positive finite float, or a 0-dim floating-point tensor (an nn.Parameter makes it learnable).
Temperature = Union[float, torch.Tensor]
# SupConCrossEntropyLoss's (and the Trainer integration's) reduction of its contrastive term.
SclReduction = Literal["mean", "sum"]
# How the distributed loss spreads the global batch (scl_kernels.distributed.STRATEGIES).
Strategy = Literal["gather", "ring"]
