"""bench/gpu/sanitizer_case.py's grouping of its cases, which bench/gpu/gpu_session.sh's sanitize
phase runs side by side (a process per group and tool): every case exactly once, the cluster
pairs' slow cases (14 and 15, and 18 and 19 with the exchange by st.async) apart; and each
case's checks of its loss and gradients against the float64 reference, run on the CPU backend
(the cases' kernels need a GPU)."""
import subprocess
import sys

import pytest
import torch

import scl_kernels
from bench.gpu import sanitizer_case


def test_groups_hold_every_case_once():
    count = len(sanitizer_case.all_runs())
    for groups in (1, 2, 6, count, count + 5):
        dealt = [group.split(",") for group in sanitizer_case.case_groups(count, groups)]
        assert len(dealt) == min(groups, count)
        numbers = sorted(int(n) for group in dealt for n in group)
        assert numbers == list(range(1, count + 1))
    slow = [group for group in sanitizer_case.case_groups(count, 6)
            if {"14", "15", "18", "19"} & set(group.split(","))]
    assert len(slow) == 4
    assert [fn.__name__ for fn, _ in sanitizer_case.all_runs()[17:]] == ["run_async_triangle"] * 2
    assert [case for _, case in sanitizer_case.all_runs()[17:]] == sanitizer_case.TRIANGLE_CASES
    assert [case for _, case in sanitizer_case.all_runs()[13:15]] == sanitizer_case.TRIANGLE_CASES


def test_print_groups_without_a_gpu():
    done = subprocess.run([sys.executable, "-m", "bench.gpu.sanitizer_case", "--print-groups", "6"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count = len(sanitizer_case.all_runs())
    assert done.stdout.split() == sanitizer_case.case_groups(count, 6)
    refused = subprocess.run([sys.executable, "-m", "bench.gpu.sanitizer_case", "--print-groups",
                              "0"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "at least 1" in refused.stderr


@pytest.fixture
def on_the_cpu_backend(monkeypatch):
    """The cases' checks run on the CPU backend: the GPU's kernels apart, everything a case
    compares is exercised here."""
    if not scl_kernels.backends.library_loaded():
        pytest.skip("the CPU backend needs the compiled library")
    monkeypatch.setattr(sanitizer_case, "DEVICE", "cpu")
    monkeypatch.setattr(sanitizer_case, "BACKEND", "cpu")


def test_every_case_checks_its_loss_and_gradients_against_float64(on_the_cpu_backend, monkeypatch):
    checked = []

    def counted(case, dtype, got, want):
        checked.append((case, len(got)))
        return check(case, dtype, got, want)
    check = sanitizer_case._check_gradients
    monkeypatch.setattr(sanitizer_case, "_check_gradients", counted)
    for fn, case in sanitizer_case.all_runs():
        fn(*case)
    cases = [case for _, case in sanitizer_case.all_runs()]
    assert [case for case, _ in checked] == cases
    # features and contrast where the case has a contrast set
    assert [count for _, count in checked] == [2 if case[3:4] == ("cross",) else 1 for case in cases]


def test_a_wrong_gradient_fails_its_case():
    want = torch.randn(50, 8, dtype=torch.float64)
    close = (want * (1 + 1e-2)).to(torch.bfloat16)
    sanitizer_case._check_gradients("case", torch.bfloat16, (close,), (want,))
    with pytest.raises(AssertionError, match="grad of features"):
        sanitizer_case._check_gradients("case", torch.float32, (close.float(),), (want,))
    off = want.clone()
    off[3, 4] += 0.1 * want.abs().max()
    with pytest.raises(AssertionError, match="grad of contrast"):
        sanitizer_case._check_gradients("case", torch.bfloat16, (want, off.to(torch.bfloat16)),
                                        (want, want))
