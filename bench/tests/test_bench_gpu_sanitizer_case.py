"""bench/gpu/sanitizer_case.py's grouping of its cases, which bench/gpu/gpu_session.sh's sanitize
phase runs side by side (a process per group and tool): every case exactly once, the cluster
pairs' slow cases (14 and 15, and 18 and 19 with the exchange by st.async) apart. The cases
themselves need a GPU."""
import subprocess
import sys

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
