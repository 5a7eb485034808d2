"""The core's class words of multi-hot rows (csrc/core/supcon_problem.h), built bit by bit in
Python for tests of the code that reads them."""
import torch


def class_words(hot):
    """[rows, ceil(C / 64)] int64 class words of multi-hot rows, bit c % 64 of word c // 64 for
    class c, set bit by bit."""
    rows, classes = hot.shape
    words = torch.zeros(rows, (classes + 63) // 64, dtype=torch.int64)
    for c in range(classes):
        bit = 1 << (c % 64)
        words[:, c // 64] |= torch.where(hot[:, c], bit - (bit >> 63 << 64), 0)
    return words
