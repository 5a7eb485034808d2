"""Expected calibration error (ECE) of a classifier's test predictions."""
import torch

ECE_BINS = 15


def expected_calibration_error(confidences, correct, bins=ECE_BINS):
    """ECE over ``bins`` equal-width confidence bins (Naeini et al. 2015; Guo et al. 2017)::

        ECE = sum_b (|B_b| / n) * |accuracy(B_b) - mean confidence(B_b)|

    Bin b holds the predictions whose confidence lies in ``(b / bins, (b + 1) / bins]``; the
    confidence of a prediction is its largest softmax probability.

    Args:
        confidences: ``[n]`` the predicted class's probability, in [0, 1].
        correct: ``[n]`` bool, whether the prediction was right.
        bins: the number of bins (default 15).

    Returns:
        A float in [0, 1]; 0.0 for no predictions.
    """
    confidences = torch.as_tensor(confidences, dtype=torch.float64).flatten()
    correct = torch.as_tensor(correct, dtype=torch.float64).flatten()
    if confidences.shape != correct.shape:
        raise ValueError(f"confidences and correct must have the same length, got "
                         f"{confidences.numel()} and {correct.numel()}")
    if confidences.numel() == 0:
        return 0.0
    index = (torch.ceil(confidences * bins).long() - 1).clamp(0, bins - 1)
    counts = torch.bincount(index, minlength=bins).to(torch.float64)
    confidence_sums = torch.bincount(index, weights=confidences, minlength=bins)
    correct_sums = torch.bincount(index, weights=correct, minlength=bins)
    # |sum correct - sum confidence| / n per bin is |B_b| / n times the bin's gap.
    return float((correct_sums - confidence_sums).abs().sum() / counts.sum())
