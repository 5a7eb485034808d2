"""scl_kernels.usable_cpus: the affinity mask capped by the cgroup quota, read from a fake
/sys/fs/cgroup and /proc/self/cgroup."""
import os

import pytest

from scl_kernels import usable_cpus
from scl_kernels.usable_cpus import cgroup_cpu_quota, usable_cpu_count


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _self_cgroup(tmp_path, text):
    path = tmp_path / "self_cgroup"
    path.write_text(text)
    return path


def test_cgroup_v2_quota_of_the_process_and_its_ancestors_the_smallest(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "job" / "cpu.max", "300000 100000\n")
    _write(root / "job" / "step" / "cpu.max", "max 100000\n")
    self_cgroup = _self_cgroup(tmp_path, "0::/job/step\n")
    assert cgroup_cpu_quota(root, self_cgroup) == 3.0
    _write(root / "job" / "step" / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_quota(root, self_cgroup) == 1.5


def test_cgroup_v1_quota_from_the_cpu_controller(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us", "200000\n")
    _write(root / "cpu,cpuacct" / "docker" / "cpu.cfs_period_us", "100000\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    self_cgroup = _self_cgroup(tmp_path, "4:memory:/docker\n3:cpu,cpuacct:/docker\n0::/\n")
    assert cgroup_cpu_quota(root, self_cgroup) == 2.0


def test_no_limit_and_unreadable_files_mean_none(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(root, _self_cgroup(tmp_path, "0::/\n")) is None
    assert cgroup_cpu_quota(root, tmp_path / "missing") is None
    # A container that sees the host's cgroup path: the mount's root is the container's own.
    _write(root / "cpu.max", "100000 100000\n")
    assert cgroup_cpu_quota(root, _self_cgroup(tmp_path, "0::/host/path\n")) == 1.0


@pytest.mark.parametrize("quota, affinity, expected", [(None, 8, 8), (2.5, 8, 3), (0.2, 8, 1),
                                                      (16.0, 4, 4)])
def test_usable_count_is_the_affinity_capped_by_the_quota_rounded_up(monkeypatch, quota,
                                                                      affinity, expected):
    monkeypatch.setattr(usable_cpus, "cgroup_cpu_quota", lambda *_: quota)
    monkeypatch.setattr(usable_cpus, "affinity_cpu_count", lambda: affinity)
    assert usable_cpu_count() == expected


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity on this platform")
def test_this_process_counts_at_most_its_affinity():
    assert 1 <= usable_cpu_count() <= len(os.sched_getaffinity(0))
