"""How many CPUs this process may really use: the CPUs its affinity mask allows, fewer where its
cgroup's CPU quota allows less time than that. torch's default thread count follows the affinity
mask (``taskset -c 0``: 1 thread, torch 2.13) but not the quota, so in a container given 2 CPUs'
worth of time on a larger host it starts more threads than can run at once, and each parallel
region waits for the scheduler (bench/PERFORMANCE.md, "Shared machines")."""
import math
import os
from pathlib import Path
from typing import Iterator, Optional

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def usable_cpu_count(cgroup_root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int:
    """The CPUs of the affinity mask, capped by the cgroup quota rounded up (at least 1)."""
    cpus = affinity_cpu_count()
    quota = cgroup_cpu_quota(cgroup_root, self_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


def affinity_cpu_count() -> int:
    """The CPUs this process may run on (all online CPUs where the platform has no affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT,
                     self_cgroup: Path = SELF_CGROUP) -> Optional[float]:
    """CPUs' worth of time per period that the process's cgroup and its ancestors allow, the
    smallest of their limits (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``); None where none is limited or nothing can be read."""
    limits = [limit for folder in _cpu_cgroup_folders(cgroup_root, self_cgroup)
              for limit in [_folder_quota(folder)] if limit is not None]
    return min(limits, default=None)


def _cpu_cgroup_folders(cgroup_root: Path, self_cgroup: Path) -> Iterator[Path]:
    """The folders of the cgroups whose CPU limits apply: the process's own and its ancestors',
    in the v2 hierarchy and in v1's cpu controller. A cgroup path that is not under this mount
    (a container that sees the host's path) leaves the mount's root, which is the container's."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            mount = cgroup_root
        elif "cpu" in controllers.split(","):
            mount = cgroup_root / controllers
            if not mount.is_dir():
                mount = cgroup_root / "cpu"
        else:
            continue
        folder = mount / path.lstrip("/")
        while True:
            if folder.is_dir():
                yield folder
            if folder == mount:
                break
            folder = folder.parent


def _folder_quota(folder: Path) -> Optional[float]:
    """One cgroup folder's CPU limit in CPUs, None without one."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota == "max" or int(quota) < 0:
        return None
    return int(quota) / int(period)
