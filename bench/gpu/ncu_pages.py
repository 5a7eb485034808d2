"""Nsight Compute's text pages of the walks' tile kernels, read for the decision rules of
bench/decisions/2026-11-28-walks-m0-rules.md (rules 2-4, and rule 5's profile beside the times;
rules 1 and 5 read bench.gpu.walks' times).

    python -m bench.gpu.ncu_pages --raw walks_kernels.raw.csv [--sass walks_kernels.sass.csv]

Per kernel (from the raw page, `ncu --import R --page raw --csv`): duration, the tensor pipe's
and the MUFU (XU) pipe's share of their peak, and the warp-state breakdown (each stall reason's
share of all warp cycles). From the source page (`--page source --print-source sass --csv`),
per kernel: the sampled stalls at each fence and wait line of its tile loop (GPU- and CTA-scope
MEMBARs and the instruction after each, the cluster-scope acquire waits: an mbarrier try-wait
followed by CCTL.IVALL, the TMA stage waits, the consumer turns' named barriers, the wgmma
waits) and their share of the kernel's samples. Then the numbers each rule reads, and what the
rule says. A page it cannot read is reported as such: the pages themselves come back beside it.

Nsight Compute's column names differ between releases: metrics are found by pattern and the
pattern that matched is printed. The page layouts assumed here were not yet checked against a
real report on 2026-11-28 (no GPU that day); bench/tests/test_bench_gpu_walks.py holds them.
"""
import argparse
import csv
import re
import sys

from bench.gpu.step import short_kernel
from bench.static import sass

# Rules 2-4 as written before the run (bench/decisions/2026-11-28-walks-m0-rules.md).
FENCE_WAIT_SHARE = 0.25   # rule 2: of the triangle backward's warp cycles
MUFU_BOUND = 70.0         # rule 3: % of the MUFU pipe's peak -> step 3b
TENSOR_LOW, MUFU_LOW = 50.0, 60.0  # rule 4: both under -> step 3a
_DURATION_UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def _number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def _pick(header, values, must, suffix):
    """(column, value) of the largest value among columns holding every part of `must` and
    ending with `suffix`; (None, None) if none holds a number."""
    found = [(values[i], column) for i, column in enumerate(header)
             if all(part in column for part in must) and column.endswith(suffix)
             and _number(values[i]) is not None]
    if not found:
        return None, None
    value, column = max(found, key=lambda pair: _number(pair[0]))
    return column, _number(value)


def read_raw(text):
    """[{"name", "short", "ms", "tensor", "mufu", "stalls": {reason: share}}] per profiled kernel,
    in the report's order."""
    rows = list(csv.reader(text.splitlines()))
    if not rows or "Kernel Name" not in rows[0]:
        return []
    header = rows[0]
    units = rows[1] if len(rows) > 1 and not (rows[1][0].strip().isdigit()) else [""] * len(header)
    kernels = []
    for values in rows[1:]:
        if len(values) != len(header) or not values[0].strip().isdigit():
            continue  # the units row
        name = values[header.index("Kernel Name")]
        duration = (header.index("gpu__time_duration.sum")
                    if "gpu__time_duration.sum" in header else None)
        ms = None
        if duration is not None and _number(values[duration]) is not None:
            ms = _number(values[duration]) * _DURATION_UNITS.get(units[duration], 1.0)
        tensor = _pick(header, values, ("pipe_tensor",), "pct_of_peak_sustained_active")
        mufu = _pick(header, values, ("pipe_xu",), "pct_of_peak_sustained_active")
        stalls = {}
        for i, column in enumerate(header):
            match = _STALL.match(column)
            if match and _number(values[i]) is not None:
                stalls[match.group(1)] = _number(values[i])
        total = sum(stalls.values())
        kernels.append({"name": name, "short": short_kernel(name), "ms": ms,
                        "tensor": tensor[1], "tensor_metric": tensor[0],
                        "mufu": mufu[1], "mufu_metric": mufu[0],
                        "stalls": {k: v / total for k, v in stalls.items()} if total else {}})
    return kernels


def read_source_tables(text):
    """[[(address, SASS text, samples)]] per kernel of the source page, in the report's order:
    a table starts at a row naming both an address and a source column."""
    tables, columns = [], None
    for row in csv.reader(text.splitlines()):
        lowered = [cell.strip().lower() for cell in row]
        address = next((i for i, c in enumerate(lowered) if c.endswith("address")), None)
        source = next((i for i, c in enumerate(lowered) if c == "source"), None)
        if address is not None and source is not None:
            samples = next((i for i, c in enumerate(lowered)
                            if c.startswith("warp stall sampling (all")), None)
            columns = (address, source, samples)
            tables.append([])
            continue
        if columns is None or len(row) <= max(i for i in columns if i is not None):
            continue
        a, s, n = columns
        try:
            tables[-1].append((int(row[a], 16), row[s].strip(),
                               (_number(row[n]) or 0.0) if n is not None else 0.0))
        except ValueError:
            continue
    return tables


def _instructions(table):
    """The table as bench.static.sass Instructions at offsets from its first address, branch
    targets moved the same way when the page prints them absolute."""
    base = min(address for address, _, _ in table)

    def offset(match):
        value = int(match.group(0), 16)
        return hex(value - base) if value >= base else match.group(0)
    lines = []
    for address, text, _ in table:
        if text.lstrip("@!PU0123456789T ").startswith("BRA"):
            text = re.sub(r"0x[0-9a-f]+", offset, text)
        lines.append(f"/*{address - base:04x}*/ {text.rstrip(' ;')} ;")
    return sass.parse_sass("\n".join(lines)), base


def fence_and_wait_lines(table):
    """[(offset, SASS, kind, samples)] of the fence and wait lines of a kernel's tile loops (the
    outermost loops holding tensor instructions; the whole kernel if none is found), and the
    kernel's total samples."""
    instructions, base = _instructions(table)
    samples = {address - base: n for address, _, n in table}
    loops = sass.tensor_loops(instructions)

    def in_loop(i):
        return not loops or any(loop.contains(i.address) for loop in loops)
    found = []
    for k, i in enumerate(instructions):
        if not in_loop(i):
            continue
        following = instructions[k + 1] if k + 1 < len(instructions) else None
        kind = None
        if i.base == "MEMBAR":
            kind = "fence " + i.opcode.split(".")[-1]
        elif i.base == "CCTL":
            kind = "cluster wait"
        elif i.opcode.startswith("SYNCS.PHASECHK"):
            kind = ("cluster wait" if following is not None and following.base == "CCTL"
                    else "stage wait")
        elif i.base == "BAR":
            kind = "turn barrier"
        elif i.opcode.startswith("WARPGROUP.DEPBAR"):
            kind = "wgmma wait"
        elif k and instructions[k - 1].base == "MEMBAR" and i.base != "MEMBAR":
            kind = "after fence " + instructions[k - 1].opcode.split(".")[-1]
        if kind:
            found.append((i.address, f"{i.opcode} {i.operands}".strip(), kind,
                          samples.get(i.address, 0.0)))
    return found, sum(samples.values())


def fence_wait_share(lines, total):
    """Rule 2's number: the share of a kernel's samples at its GPU- and CTA-scope fences, the
    instruction after each, and its cluster-scope waits."""
    if not total:
        return None
    return sum(n for _, _, kind, n in lines
               if kind.startswith(("fence", "after fence", "cluster wait"))) / total


def analyse(raw_text, sass_text):
    """The report's lines: per kernel, then the rules."""
    kernels = read_raw(raw_text)
    tables = read_source_tables(sass_text) if sass_text else []
    out = []
    if not kernels:
        return ["the raw page holds no kernel rows: nothing to read (see the page itself)"]
    if tables and len(tables) != len(kernels):
        out.append(f"the source page has {len(tables)} kernels, the raw page {len(kernels)}: "
                   "per-line stalls not matched to kernels")
        tables = []
    for k, kernel in enumerate(kernels):
        stalls = ", ".join(f"{reason} {share:.1%}" for reason, share in
                           sorted(kernel["stalls"].items(), key=lambda kv: -kv[1])[:8])
        out.append(f"{kernel['short']}: {fmt(kernel['ms'], ' ms')}; tensor pipe "
                   f"{fmt(kernel['tensor'], '%')} ({kernel['tensor_metric']}), MUFU "
                   f"{fmt(kernel['mufu'], '%')} ({kernel['mufu_metric']}); warp cycles: "
                   f"{stalls or 'no warp-state metrics'}")
        if tables:
            lines, total = fence_and_wait_lines(tables[k])
            kernel["fence_wait_share"] = fence_wait_share(lines, total)
            for offset, text, kind, n in lines:
                if n:
                    out.append(f"    {offset:#07x} {kind:<18} {n / total:6.1%}  {text}")
    out += rules(kernels, bool(tables))
    return out


def fmt(value, unit):
    return "—" if value is None else f"{value:.3f}{unit}" if unit == " ms" else f"{value:.1f}{unit}"


def rules(kernels, have_lines):
    out = []
    triangle = next((k for k in kernels if k["short"] == "kGradTriangle"), None)
    if triangle is None:
        out.append("rule 2: no triangle backward profiled: not decided")
    else:
        membar = triangle["stalls"].get("membar")
        share = triangle.get("fence_wait_share")
        out.append(f"rule 2 reads: triangle backward, samples at its fences and cluster waits "
                   f"{'—' if share is None else f'{share:.1%}'} of its warp cycles"
                   f"{'' if have_lines else ' (no source page)'}; warp state: membar "
                   f"{'—' if membar is None else f'{membar:.1%}'}, barrier "
                   f"{triangle['stalls'].get('barrier', 0):.1%}, long scoreboard "
                   f"{triangle['stalls'].get('long_scoreboard', 0):.1%}")
        if share is None:
            out.append("rule 2: not decided (no per-line samples)")
        else:
            out.append("rule 2: " + ("over 25%: step 1 (the triangle without GPU-scope fences) "
                                     "comes before step 4" if share > FENCE_WAIT_SHARE else
                                     "at most 25%: the fences are not the triangle's limit; "
                                     "step 1 is not brought forward"))
    asynchronous = next((k for k in kernels if k["short"] == "kGradTriangleAsync"), None)
    if triangle is not None and asynchronous is not None:
        share = asynchronous.get("fence_wait_share")
        out.append(f"rule 5 reads (beside the timings): triangle-async backward "
                   f"{fmt(asynchronous['ms'], ' ms')} against the triangle's {fmt(triangle['ms'], ' ms')}, "
                   f"samples at its fences and cluster waits "
                   f"{'—' if share is None else f'{share:.1%}'} of its warp cycles")
    forward = next((k for k in kernels if k["short"] == "kLseSymmetric"), None)
    if forward is None or forward["mufu"] is None or forward["tensor"] is None:
        out.append("rules 3-4: no forward pipe shares: not decided")
    else:
        out.append(f"rules 3-4 read: forward MUFU {forward['mufu']:.1f}% of peak, tensor pipe "
                   f"{forward['tensor']:.1f}%")
        if forward["mufu"] > MUFU_BOUND:
            out.append("rule 3: MUFU over 70%: step 3b (a polynomial exp2 on the FMA pipe for "
                       "a share of the elements)")
        elif forward["tensor"] < TENSOR_LOW and forward["mufu"] < MUFU_LOW:
            out.append("rule 4: tensor under 50% and MUFU under 60%: step 3a (the logits of "
                       "tile t + 1 issued before the exps of tile t)")
        else:
            out.append("rules 3-4: neither fires")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--raw", required=True, help="the raw page as CSV")
    parser.add_argument("--sass", help="the source page (SASS) as CSV")
    args = parser.parse_args(argv)
    with open(args.raw) as f:
        raw_text = f.read()
    sass_text = None
    if args.sass:
        with open(args.sass) as f:
            sass_text = f.read()
    print("\n".join(analyse(raw_text, sass_text)))
    return 0 if read_raw(raw_text) else 1


if __name__ == "__main__":
    sys.exit(main())
