"""The float64 oracle of a batch against a cross-batch memory, and multi-hot labels to test with:
shared by the memory's tests with group ids and with multi-hot labels, single-process and
distributed."""
import torch

from .reference64 import supcon_reference64


def multi_hot(count, classes, generator, no_class_share=0.25):
    """``[count, classes]`` bool multi-hot rows that share classes often enough for positives:
    the first and the last class (in the second 64-bit word once ``classes`` > 64) are common,
    any other rare; about ``no_class_share`` of the rows have no class."""
    rows = torch.rand(count, classes, generator=generator) < min(0.5, 2 / classes)
    common = torch.rand(count, 2, generator=generator) < 0.5
    rows[:, 0] |= common[:, 0]
    rows[:, -1] |= common[:, 1]
    rows[torch.rand(count, generator=generator) < no_class_share] = False
    return rows


def oracle_with_memory(features, labels, groups, memory, temperature, contrast_mode="all",
                       reduction="mean", multi_label="any"):
    """The float64 oracle of a batch's anchors against the batch and the memory's rows (contrast
    only, detached): the single set [batch rows; memory rows], of which only the batch's anchors
    count. Without labels the batch's ids are its sample indices and the memory's rows are in no
    class; without groups the batch is in no group."""
    views = 1 if features.dim() == 2 else features.shape[1]
    batch = features.shape[0]
    rows = features.transpose(0, 1).reshape(-1, features.shape[-1]) if views > 1 else features
    held_rows, held_labels = memory.contrast()
    if labels is None:
        row_labels = torch.arange(batch).repeat(views)
        held_labels = torch.full(held_labels.shape[:1], -1)
    else:
        row_labels = torch.cat([labels] * views).to(held_labels.dtype)
    row_groups = (torch.full((batch,), -1) if groups is None else groups).repeat(views)
    result = supcon_reference64(torch.cat([rows, held_rows.to(rows.dtype)]),
                                torch.cat([row_labels, held_labels]), temperature,
                                groups=torch.cat([row_groups, memory.contrast_groups()]),
                                reduction="none", full=True, multi_label=multi_label)
    anchors = batch if contrast_mode == "one" else rows.shape[0]
    per_anchor = result.per_anchor[:anchors]
    if reduction == "none":
        return per_anchor
    if reduction == "sum":
        return per_anchor.sum()
    return per_anchor.sum() / max(int((result.num_positives[:anchors] > 0).sum()), 1)
