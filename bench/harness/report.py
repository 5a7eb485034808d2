"""Where results go and how they are written: a git-ignored folder by default (a run never
overwrites the tracked results), file stems named by benchmark and time, markdown headers and
tables, CSV and JSON."""
import csv
import sys
import datetime
import json
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Git-ignored (.gitignore): the tracked results under bench/results/ are curated by hand
# (bench/results/INDEX.md), not written by a run.
LOCAL_RESULTS = os.path.join(REPO_ROOT, "bench", "results", "local")


def timestamp():
    return datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")


def result_stem(out_dir, name):
    """``out_dir/name``, the folder created: the path that a benchmark's files extend with
    their suffixes (.md, .csv, .json, .png)."""
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, name)


def command_line(module, argv):
    """The command that reproduces a run: ``python -m module`` and its arguments."""
    return " ".join(["python -m", module, *(sys.argv[1:] if argv is None else argv)])


def fmt(value, digits=2):
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def markdown_table(header, lines):
    text = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    text += ["| " + " | ".join(fmt(v) for v in line) + " |" for line in lines]
    return "\n".join(text)


def markdown_header(title, *facts):
    """A report's opening lines: the title, then every {label: text} of ``facts`` as a list."""
    lines = [f"# {title}", ""]
    for group in facts:
        lines += [f"- **{label}**: {text}" for label, text in group.items()]
    return lines


def write_rows(base, title, facts, caption, rows, fields, header):
    """A benchmark's rows (dicts) as ``base``.csv (the ``fields``) and ``base``.md: the title,
    the ``facts`` (markdown_header), the caption, and the table (its ``header`` over the
    fields)."""
    write_csv(base + ".csv", rows, fields)
    parts = markdown_header(title, facts) + ["", caption, ""]
    parts.append(markdown_table(header, [tuple(row[k] for k in fields) for row in rows]))
    with open(base + ".md", "w") as out:
        out.write("\n".join(parts) + "\n")
    print(f"wrote {base}.md and .csv")


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_json(path, payload):
    """Written whole or not at all (a reader never sees half a file, an interrupt keeps the
    previous version)."""
    with open(path + ".tmp", "w") as out:
        json.dump(payload, out, indent=1)
    os.replace(path + ".tmp", path)
