"""Known false negatives (``groups=``) under scl_kernels.distributed on gloo with 2 and 4
processes spawned here: loss and gradients equal to the float64 oracle on the global batch (and
on the global batch followed by a cross-batch memory's rows), groups spanning ranks, rows in no
group, every row in one group, unequal batches and an empty rank; errors on every rank.

The cases live in support/groups_distributed_cases.py; each world size is spawned once."""
import pytest
import torch

import scl_kernels.distributed as sd
from support import groups_distributed_cases
from support.spawned_ranks import SPAWNED_CASE_MARKS, every_rank_tests

pytestmark = SPAWNED_CASE_MARKS

outcomes, test_case_on_every_rank = every_rank_tests(groups_distributed_cases)


def test_process_group_and_group_ids_are_told_apart():
    """``group`` (the process group) and ``groups`` (the rows' group ids) are two arguments,
    and the docstrings say which is which."""
    criterion = sd.SupConLoss(group=None)
    assert criterion.group is None
    for documented in (sd.supcon_loss.__doc__, sd.SupConLoss.__init__.__doc__,
                       sd.SupConLoss.forward.__doc__):
        assert "process group" in documented and "groups" in documented
    with pytest.raises(RuntimeError, match="init_process_group"):
        criterion(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), groups=torch.zeros(4).long())
