"""Multi-hot labels' class words on the device ([rows, K] int64, bit c % 64 of word c // 64 for
class c: csrc/core/supcon_problem.h), for the positive walk (positive_walk.py) and the tiles'
group mask (tiles.py)."""
import torch


def set_bits(words, keep=None):
    """(rows, classes, counts): every set bit of the rows' words as a (row, class) pair, int64,
    by row then class, of the `keep` rows only where given; and each row's count of them
    (int32). The bits come from the words' bytes, little-endian as the core packs them (bit b of
    byte j is class 8 j + b): [rows, 64 K] bytes, no wider."""
    shifts = torch.arange(8, dtype=torch.uint8, device=words.device)
    bits = (words.contiguous().view(torch.uint8).unsqueeze(-1) >> shifts).bitwise_and_(1)
    bits = bits.view(words.shape[0], -1)
    if keep is not None:
        bits.masked_fill_(~keep[:, None], 0)
    by_row = torch.nonzero(bits)
    return by_row[:, 0], by_row[:, 1], bits.sum(1, dtype=torch.int32)


def group_class_words(groups, words):
    """[rows, W] int32: each row's classes numbered within its group (`groups`: [rows] ids, -1
    for none, whose rows get no bit), in as many words as the group with the most classes needs.
    Two rows of one group share a class exactly when their words share a bit, and a group's
    classes are few (W = 1 up to 32 of them), so that the tiles test a pair as cheaply as by its
    pair classes, whatever C (kernels._group_pairs). W is read on the host."""
    rows, classes, _ = set_bits(words, groups >= 0)
    span = words.shape[1] * 64
    distinct, which = torch.unique(groups.long()[rows] * span + classes, return_inverse=True)
    group_of = distinct // span
    numbers = torch.arange(distinct.numel(), device=words.device)
    local = (numbers - torch.searchsorted(group_of, group_of))[which]
    count = int(local.max()) // 32 + 1 if local.numel() else 1
    out = torch.zeros(words.shape[0] * count, dtype=torch.int32, device=words.device)
    # A row's bits are distinct: their sum is their OR (bit 31 as int32's sign).
    out.index_add_(0, rows * count + local // 32,
                   torch.ones_like(local, dtype=torch.int32) << (local % 32).to(torch.int32))
    return out.view(-1, count)
