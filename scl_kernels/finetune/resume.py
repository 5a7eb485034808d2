"""``--resume``: the runs an earlier command with the same options already recorded in the
output directory, so that a comparison interrupted after k runs goes on from there."""
import json
from pathlib import Path

from .data import InputError

# Options that may differ between the command that wrote a directory and the one resuming it:
# where and how it reports, and which runs it asks for (added seeds or objectives just run).
FREE_OPTIONS = frozenset({"output_dir", "resume", "overwrite", "no_progress", "no_plot",
                          "save_models", "save_splits", "seeds", "seed", "objectives", "runs"})


def resume_key(run):
    """A recorded run's identity: ``(objective, seed)``."""
    return run["objective"], run["seed"]


def load_finished_runs(output_dir, options):
    """The runs recorded in ``output_dir/metrics.json`` (failed ones included: their failure is
    deterministic for their seed), after checking that they were made with ``options``.

    Returns:
        A list of run records; empty when the directory has no metrics.json yet.

    Raises:
        InputError: metrics.json is unreadable, or it was written with other options (named).
    """
    path = Path(output_dir) / "metrics.json"
    if not path.exists():
        return []
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        previous, runs = recorded["options"], recorded["runs"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"--resume: cannot read {path} ({type(error).__name__}: {error}); "
                         "pass another --output-dir") from None
    current = json.loads(json.dumps(options))  # as it would be recorded (tuples -> lists)
    differing = sorted(key for key in set(previous) | set(current)
                       if key not in FREE_OPTIONS and previous.get(key) != current.get(key))
    if differing:
        shown = ", ".join(f"--{key.replace('_', '-')} {previous.get(key)!r} there, "
                          f"{current.get(key)!r} now" for key in differing)
        raise InputError(f"--resume: {path} was written with other options ({shown}); resume "
                         "with the same options or pass another --output-dir")
    return runs
