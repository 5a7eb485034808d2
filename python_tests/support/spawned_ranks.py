"""Running test cases on every rank of a gloo group of spawned processes: the harness shared by
distributed/test_distributed.py and the fine-tuning tests' distributed files.

Each case runs on every rank; a rank records None or the traceback of every case in a JSON file,
rewritten after each case, so that a case that leaves the ranks out of step (ending the run at
the next barrier) keeps the results of the cases before it.
"""
import datetime
import json
import os
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


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
