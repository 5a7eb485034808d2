"""Multi-hot labels' class words on the device (scl_kernels/backends/triton/multi_hot.py): their
set bits, and the group mask's classes numbered within each group, against the multi-hot rows
they come from. Plain tensor ops: no kernel, no interpreter needed."""
import torch

from scl_kernels.backends.triton import multi_hot
from support.class_words import class_words


def test_set_bits_lists_every_class_by_row(gen):
    hot = torch.rand(9, 130, generator=gen) < 0.05
    hot[2, [0, 63, 64, 127, 129]] = True
    hot[5] = False
    keep = torch.ones(9, dtype=torch.bool)
    keep[7] = False
    rows, classes, counts = multi_hot.set_bits(class_words(hot), keep)
    want = torch.nonzero(hot & keep[:, None])
    assert torch.equal(rows, want[:, 0]) and torch.equal(classes, want[:, 1])
    assert torch.equal(counts, (hot & keep[:, None]).sum(1, dtype=torch.int32))


def test_group_class_words_share_a_bit_where_the_rows_share_a_class(gen):
    """Within every group, and with more than 32 classes in one group (several words)."""
    rows, classes = 60, 200
    hot = torch.rand(rows, classes, generator=gen) < 0.03
    groups = torch.randint(-1, 6, (rows,), generator=gen)
    groups[:10] = 7
    hot[:10, 100:140] = torch.rand(10, 40, generator=gen) < 0.5
    hot[3] = False
    most = max(int(hot[groups == g].any(0).sum()) for g in range(8))
    assert most > 32
    local = multi_hot.group_class_words(groups, class_words(hot))
    assert local.dtype == torch.int32 and local.shape == (rows, (most + 31) // 32)
    shares_bit = ((local[:, None, :] & local[None, :, :]) != 0).any(-1)
    shares_class = (hot.double() @ hot.double().T) > 0
    same_group = (groups[:, None] == groups[None, :]) & (groups >= 0)[:, None]
    assert torch.equal(shares_bit & same_group, shares_class & same_group)
    assert not local[groups < 0].any()


def test_group_class_words_of_rows_without_a_group_or_a_class():
    words = torch.zeros(4, 2, dtype=torch.int64)
    local = multi_hot.group_class_words(torch.tensor([-1, 0, 0, 1]), words)
    assert local.shape == (4, 1) and not local.any()
