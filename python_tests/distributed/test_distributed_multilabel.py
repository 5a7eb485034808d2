"""Multi-hot labels (multi-label positives, both rules) under scl_kernels.distributed on gloo
with 2 and 4 processes spawned here: loss and gradients equal to the float64 oracle on the
global batch (and on the global batch followed by a multi-hot cross-batch memory's rows), C of
1, 64 and 65, rows without a class, views, cross sets, group ids beside the classes, unequal
batches and an empty rank; errors on every rank (C or the rule differing across ranks, the
ring, labels other than 0 / 1 on one rank).

The cases live in support/multilabel_distributed_cases.py; each world size is spawned once."""
from support import multilabel_distributed_cases
from support.spawned_ranks import SPAWNED_CASE_MARKS, every_rank_tests

pytestmark = SPAWNED_CASE_MARKS

outcomes, test_case_on_every_rank = every_rank_tests(multilabel_distributed_cases)
