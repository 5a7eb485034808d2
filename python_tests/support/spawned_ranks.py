"""Running test cases on every rank of a gloo group of spawned processes: the harness shared by
distributed/test_distributed*.py and the fine-tuning tests' distributed files.

Each case runs on every rank; a rank records None or the traceback of every case in a JSON file,
rewritten after each case, so that a case that leaves the ranks out of step (ending the run at
the next barrier) keeps the results of the cases before it.
"""
import datetime
import json
import os
import traceback

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from . import needs

# The marks of a test file whose cases run on spawned ranks.
SPAWNED_CASE_MARKS = [
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
    needs.library,
]


def run_cases(cases, names, rank, folder):
    """Runs the named cases of ``cases`` in order on this rank, then leaves the group."""
    outcome = {}
    for name in names:
        try:
            cases[name](rank, dist.get_world_size())
            outcome[name] = None
        except Exception:  # every failure is recorded; the next case still runs
            outcome[name] = traceback.format_exc()
        with open(os.path.join(folder, f"rank{rank}.json"), "w") as out:
            json.dump(outcome, out)
        dist.barrier()
    dist.destroy_process_group()


def spawn_ranks(entry, world, folder, args, timeout_s):
    """Spawns ``entry(rank, *args)`` on ``world`` processes and returns
    ``{rank: {case: None or traceback}}`` from the files :func:`run_cases` wrote in ``folder``."""
    context = mp.start_processes(entry, args=args, nprocs=world, join=False,
                                 start_method="spawn")
    for process in context.processes:
        process.join(timeout_s)
    alive = [p for p in context.processes if p.is_alive()]
    for process in alive:
        process.kill()
    assert not alive, f"{world} ranks did not finish within {timeout_s} s"
    results = {}
    for rank in range(world):
        path = os.path.join(folder, f"rank{rank}.json")
        results[rank] = json.loads(open(path).read()) if os.path.exists(path) else {}
    return results


def spawn_worlds(cases_module, worlds, tmp_path_factory, timeout_s):
    """``{world size: {rank: {case: None or traceback}}}``: every case of ``cases_module`` (its
    ``run_rank(rank, world, store, names, folder)`` and ``CASES``) on each of ``worlds``, each
    world spawned once, in a folder of its own."""
    results = {}
    for world in worlds:
        folder = str(tmp_path_factory.mktemp(f"world{world}"))
        results[world] = spawn_ranks(
            cases_module.run_rank, world, folder,
            (world, os.path.join(folder, "store"), list(cases_module.CASES), folder), timeout_s)
    return results


def every_rank_tests(cases_module, timeout_s=600):
    """The fixture ``outcomes`` and the test ``test_case_on_every_rank`` of a test file whose
    cases live in ``cases_module``: each world size the cases have local batch sizes for (its
    ``SIZES``) spawned once for all the cases, then one test a case and world size. The test file
    binds both at module level under those names, which is where pytest looks for them."""
    worlds = tuple(cases_module.SIZES)

    @pytest.fixture(scope="module")
    def outcomes(tmp_path_factory):
        """{world size: {rank: {case: None or the traceback}}}, spawned once per world size."""
        return spawn_worlds(cases_module, worlds, tmp_path_factory, timeout_s)

    @pytest.mark.parametrize("world", worlds)
    @pytest.mark.parametrize("name", list(cases_module.CASES))
    def test_case_on_every_rank(outcomes, world, name):
        assert_passed_on_every_rank(outcomes[world], name)

    return outcomes, test_case_on_every_rank


def assert_passed_on_every_rank(outcomes, name):
    """``outcomes``: {rank: {case: None or traceback}}."""
    missing = [rank for rank, cases in outcomes.items() if name not in cases]
    assert not missing, f"ranks {missing} stopped before this case (an earlier case hung or crashed)"
    failures = {rank: cases[name] for rank, cases in outcomes.items() if cases[name]}
    assert not failures, "\n".join(f"rank {rank}:\n{text}" for rank, text in failures.items())


def mean_over_ranks(tensors):
    """Each tensor's mean over the ranks (what DDP does to the gradients), as new tensors."""
    out = []
    for tensor in tensors:
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        out.append(tensor / dist.get_world_size())
    return out


def join_gloo_group(rank, world, store):
    """Joins the gloo group through the file ``store``, with a 60 s timeout so that a rank left
    waiting by a bug fails instead of hanging the test run."""
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"file://{store}",
                            timeout=datetime.timedelta(seconds=60))
