"""``--resume``: the runs an earlier command with the same options already recorded in the
output directory, so that a comparison interrupted after k runs goes on from there, and the
metrics.json that records the resume beside the first command."""
import json
from pathlib import Path

from .data import InputError

# Options that may differ between the command that wrote a directory and the one resuming it:
# where and how it reports, and which runs it asks for (added seeds or objectives just run).
FREE_OPTIONS = frozenset({"output_dir", "resume", "overwrite", "no_progress", "no_plot",
                          "save_models", "save_splits", "seeds", "seed", "objectives", "runs"})
# What metrics.json says of the command that made the directory: a resume keeps them and records
# its own in its entry of "resumes".
FIRST_COMMAND_KEYS = ("command", "created", "seconds", "environment")


def resume_key(run):
    """A recorded run's identity: ``(objective, seed)``."""
    return run["objective"], run["seed"]


def load_earlier_metrics(output_dir, options):
    """``output_dir/metrics.json``, after checking that its runs (failed ones included: their
    failure is deterministic for their seed) were made with ``options``.

    Returns:
        The recorded metrics (a dict with ``runs``); None when the directory has no
        metrics.json yet.

    Raises:
        InputError: metrics.json is unreadable, or it was written with other options (named).
    """
    path = Path(output_dir) / "metrics.json"
    if not path.exists():
        return None
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
    return recorded


def resumed_metrics(earlier, current):
    """The metrics.json of a command that resumed ``earlier`` (the recorded metrics), from
    ``current``, what this command would record alone (its runs after the earlier ones).

    The first command's ``command``, ``created``, ``seconds`` (its own wall time) and
    ``environment`` stay: rewriting them would give the resume's few seconds as the time of
    runs it did not make. This command is appended to ``resumes`` with its own ``command``,
    ``created``, ``seconds``, ``environment`` and ``added_runs`` (``[objective, seed]`` each).
    Where it added no run, everything else stays as recorded too.
    """
    added = current["runs"][len(earlier["runs"]):]
    merged = (current | {key: earlier[key] for key in FIRST_COMMAND_KEYS if key in earlier}
              if added else dict(earlier))
    merged["resumes"] = [*earlier.get("resumes", ()),
                         {key: current[key] for key in FIRST_COMMAND_KEYS}
                         | {"added_runs": [list(resume_key(run)) for run in added]}]
    return merged
