"""The main of a CPU benchmark that sweeps cases and reports one table: torch's threads as
--threads asks, each case's rows printed as they come, then the Markdown table and the CSV of
them all (report.write_rows) with the machine, the command and the load at the end."""
import torch

from . import report
from .machine import load_average, machine_description


def run_sweep(args, argv, module, stem, title, caption, fields, header, cases):
    """Measures ``cases()`` (an iterable of row dicts, measured as it is consumed) for the
    parsed ``args`` (--threads, --repeats, --out) of ``module`` run with ``argv``, and writes
    <out>/<stem>_<time>.{md,csv}."""
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description("cpu")
    rows = []
    for row in cases():
        rows.append(row)
        print(", ".join(f"{k}={report.fmt(row[k])}" for k in fields), flush=True)
    report.write_rows(
        report.result_stem(args.out, f"{stem}_{report.timestamp()}"), title,
        {**machine, "command": report.command_line(module, argv), "repeats": args.repeats,
         "load average at the end": load_average()},
        caption, rows, fields, header)
