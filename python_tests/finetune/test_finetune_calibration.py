"""Expected calibration error: 15 equal-width bins over the largest softmax probability,
against a computation by hand."""
import pytest

from scl_kernels.finetune.calibration import expected_calibration_error


def test_ece_is_the_hand_computation():
    # bins of width 1/15: (0.6, 0.6667] holds 0.62 and 0.65; (0.9333, 1] holds 0.95 and 1.0;
    # (0.3333, 0.4] holds 0.4 (a right edge belongs to its bin).
    confidences = [0.62, 0.65, 0.95, 1.0, 0.4]
    correct = [True, False, True, True, False]
    by_hand = (2 / 5 * abs(1 / 2 - (0.62 + 0.65) / 2) + 2 / 5 * abs(1.0 - 0.975)
               + 1 / 5 * abs(0.0 - 0.4))
    assert expected_calibration_error(confidences, correct) == pytest.approx(by_hand, rel=1e-12)


def test_perfectly_calibrated_bins_and_edge_cases():
    # In one bin, 80 % right at 80 % confidence: 0.
    assert expected_calibration_error([0.8] * 5, [1, 1, 1, 1, 0]) == pytest.approx(0.0, abs=1e-12)
    assert expected_calibration_error([], []) == 0.0
    assert expected_calibration_error([1.0, 1.0], [0, 0]) == pytest.approx(1.0)
    # the same confidences split across 15 bins or pooled into 1 differ
    confidences, correct = [0.55, 0.95], [1, 0]
    assert expected_calibration_error(confidences, correct) == pytest.approx((0.45 + 0.95) / 2)
    assert expected_calibration_error(confidences, correct, bins=1) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="same length"):
        expected_calibration_error([0.5], [1, 0])
