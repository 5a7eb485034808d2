"""Nsight Compute's text pages of the walks' tile kernels, read for the decision rules of
bench/decisions/2026-11-28-walks-m0-rules.md (rules 2-4, and rule 5's profile beside the times;
rules 1 and 5 decide on bench.gpu.walks' times).

    python -m bench.gpu.ncu_pages --raw walks_kernels.raw.csv [--sass walks_kernels.sass.csv]

Per kernel (from the raw page, `ncu --import R --page raw --csv`): duration, the tensor pipe's
and the MUFU (XU) pipe's share of their peak, and the warp-state table (each stall reason's
share of the warp cycles per issued instruction). From the source page (`--page source
--print-source sass --csv`), per kernel: the sampled stalls at each fence and wait line of its
tile loop (GPU- and CTA-scope MEMBARs and the instruction after each, the cluster-scope acquire
waits: an mbarrier try-wait followed by CCTL.IVALL, the TMA stage waits, the consumer turns'
named barriers, the wgmma waits) and their share of the kernel's samples. Then the numbers each
rule reads, and what the rule says; a rule whose number is not on the pages says "not decided"
and which metric or page it lacks. Rule 2 is explanatory: it says what it would suggest and
changes no default.

Metrics are read by their exact names (METRICS: what the rules read, for ncu's --metrics); the
header row of either page is found wherever it is (ncu's own "==PROF==" lines may come first).
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
DURATION = "gpu__time_duration.sum"
TENSOR_PIPE = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
XU_PIPE = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
# The stall reasons' ratios below are warps stalled per issued instruction: together they make up
# the warp cycles per issued instruction, which makes each a share.
WARP_CYCLES = "smsp__average_warp_latency_per_inst_issued.ratio"


def stall_metric(reason):
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


# Printed beside rule 2's reading.
RULE_TWO_STALLS = ("membar", "barrier", "long_scoreboard")
# The warp-state table shown per kernel, where the page holds them (WarpStateStats collects them
# all): sm_90's reasons, not asked by METRICS, whose every name must exist or ncu refuses the run.
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss",
                 "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle",
                 "misc", "no_instruction", "not_selected", "selected", "short_scoreboard",
                 "sleeping", "tex_throttle", "wait")
METRICS = (DURATION, TENSOR_PIPE, XU_PIPE, WARP_CYCLES) + tuple(
    stall_metric(reason) for reason in RULE_TWO_STALLS)
_DURATION_UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}


def _number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def _csv_rows(text):
    """Each line of a page as a CSV row on its own, so that a stray quote in a line before the
    header (ncu's log lines) cannot swallow the lines after it."""
    return [next(csv.reader([line])) for line in text.splitlines() if line.strip()]


def read_raw(text):
    """[{"name", "short", "ms", "tensor", "mufu", "stalls": {reason: share}, "missing": [metric
    names not on the page, or not a number there]}] per profiled kernel, in the report's order."""
    rows = _csv_rows(text)
    start = next((i for i, row in enumerate(rows) if "Kernel Name" in row), None)
    if start is None:
        return []
    header, body = rows[start], rows[start + 1:]
    first = header.index("ID") if "ID" in header else 0
    has_units = body and len(body[0]) == len(header) and not body[0][first].strip().isdigit()
    units = body[0] if has_units else [""] * len(header)
    kernels = []
    for values in body:
        if len(values) != len(header) or not values[first].strip().isdigit():
            continue  # the units row, and ncu's lines after the table
        read = {metric: _number(values[header.index(metric)]) if metric in header else None
                for metric in (DURATION, TENSOR_PIPE, XU_PIPE, WARP_CYCLES)}
        missing = [metric for metric, value in read.items() if value is None]
        ms = None
        if read[DURATION] is not None:
            unit = units[header.index(DURATION)]
            if unit in _DURATION_UNITS:
                ms = read[DURATION] * _DURATION_UNITS[unit]
            else:
                missing.append(f"{DURATION} (unit {unit!r} unknown)")
        stalls = {}
        for reason in STALL_REASONS:
            metric = stall_metric(reason)
            value = _number(values[header.index(metric)]) if metric in header else None
            if value is not None and read[WARP_CYCLES]:
                stalls[reason] = value / read[WARP_CYCLES]
            elif reason in RULE_TWO_STALLS and value is None:
                missing.append(metric)
        name = values[header.index("Kernel Name")]
        kernels.append({"name": name, "short": short_kernel(name), "ms": ms,
                        "tensor": read[TENSOR_PIPE], "mufu": read[XU_PIPE], "stalls": stalls,
                        "missing": missing})
    return kernels


def read_source_tables(text):
    """[[(address, SASS text, samples)]] per kernel of the source page, in the report's order:
    a table starts at a row naming both an address and a source column."""
    tables, columns = [], None
    for row in _csv_rows(text):
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
        out.append("the raw page holds no kernel rows (no header row naming \"Kernel Name\" "
                   "followed by a kernel's): nothing to read (see the page itself)")
    if kernels and tables and len(tables) != len(kernels):
        out.append(f"the source page has {len(tables)} kernels, the raw page {len(kernels)}: "
                   "per-line stalls not matched to kernels")
        tables = []
    for k, kernel in enumerate(kernels):
        stalls = ", ".join(f"{reason} {share:.1%}" for reason, share in
                           sorted(kernel["stalls"].items(), key=lambda kv: -kv[1])[:8])
        out.append(f"{kernel['short']}: {fmt(kernel['ms'], ' ms')}; tensor pipe "
                   f"{fmt(kernel['tensor'], '%')}, MUFU {fmt(kernel['mufu'], '%')}; warp cycles: "
                   f"{stalls or 'no warp-state metrics'}"
                   + (f"; not on the page: {', '.join(kernel['missing'])}" if kernel["missing"]
                      else ""))
        if tables:
            lines, total = fence_and_wait_lines(tables[k])
            kernel["fence_wait_share"] = fence_wait_share(lines, total)
            for offset, text, kind, n in lines:
                if n:
                    out.append(f"    {offset:#07x} {kind:<18} {n / total:6.1%}  {text}")
    return out + rules(kernels, bool(tables))


def fmt(value, unit):
    return "—" if value is None else f"{value:.3f}{unit}" if unit == " ms" else f"{value:.1f}{unit}"


def share_text(value):
    return "—" if value is None else f"{value:.1%}"


def lacking(kernel, *metrics):
    """The metrics of ``metrics`` that a kernel's row lacks."""
    return [m for m in kernel["missing"] if m.split(" ")[0] in metrics]


def rules(kernels, have_lines):
    out = []
    triangle = next((k for k in kernels if k["short"] == "kGradTriangle"), None)
    if triangle is None:
        out.append("rule 2 (explanatory): not decided: no triangle backward (kGradTriangle) on "
                   "the raw page")
    else:
        share = triangle.get("fence_wait_share")
        beside = ", ".join(
            f"{reason.replace('_', ' ')} {share_text(triangle['stalls'].get(reason))}"
            for reason in RULE_TWO_STALLS)
        not_read = lacking(triangle, WARP_CYCLES, *map(stall_metric, RULE_TWO_STALLS))
        out.append(f"rule 2 reads (explanatory): triangle backward, samples at its fences and "
                   f"cluster waits {share_text(share)} of its warp cycles"
                   f"{'' if have_lines else ' (no source page matched to the raw page)'}; warp "
                   f"state: {beside}"
                   + (f" (not on the page: {', '.join(not_read)})" if not_read else ""))
        if share is None:
            out.append("rule 2 (explanatory): not decided: no per-line samples of the triangle "
                       "backward (the source page is absent or its kernels do not match the raw "
                       "page's)")
        elif share > FENCE_WAIT_SHARE:
            out.append("rule 2 (explanatory, changes no default): over 25%: would suggest step 1 "
                       "(the triangle without GPU-scope fences) before step 4")
        else:
            out.append("rule 2 (explanatory, changes no default): at most 25%: would suggest the "
                       "fences are not the triangle's limit, step 1 not brought forward")
    asynchronous = next((k for k in kernels if k["short"] == "kGradTriangleAsync"), None)
    if triangle is not None and asynchronous is not None:
        share = asynchronous.get("fence_wait_share")
        not_read = lacking(triangle, DURATION) + lacking(asynchronous, DURATION)
        out.append(f"rule 5 reads (beside the timings): triangle-async backward "
                   f"{fmt(asynchronous['ms'], ' ms')} against the triangle's "
                   f"{fmt(triangle['ms'], ' ms')}, "
                   f"samples at its fences and cluster waits {share_text(share)} of its warp cycles"
                   + (f" (not on the page: {DURATION})" if not_read else ""))
    forward = next((k for k in kernels if k["short"] == "kLseSymmetric"), None)
    if forward is None:
        return out + ["rule 3: not decided: no symmetric forward (kLseSymmetric) on the raw page",
                      "rule 4: not decided: no symmetric forward (kLseSymmetric) on the raw page"]
    out.append(f"rules 3-4 read: forward MUFU {fmt(forward['mufu'], '%')} of peak, tensor pipe "
               f"{fmt(forward['tensor'], '%')}")
    fired = False
    if forward["mufu"] is None:
        out.append(f"rule 3: not decided: {XU_PIPE} not on the raw page")
    elif forward["mufu"] > MUFU_BOUND:
        fired = True
        out.append("rule 3: MUFU over 70%: step 3b (a polynomial exp2 on the FMA pipe for a share "
                   "of the elements)")
    else:
        out.append("rule 3: MUFU at most 70%: does not fire")
    not_read = lacking(forward, TENSOR_PIPE, XU_PIPE)
    if not_read:
        out.append(f"rule 4: not decided: {', '.join(not_read)} not on the raw page")
    elif forward["tensor"] < TENSOR_LOW and forward["mufu"] < MUFU_LOW:
        fired = True
        out.append("rule 4: tensor under 50% and MUFU under 60%: step 3a (the logits of tile "
                   "t + 1 issued before the exps of tile t)")
    else:
        out.append("rule 4: tensor 50% or more, or MUFU 60% or more: does not fire")
    if not fired and not not_read:
        out.append("rules 3-4: neither fires: step 3a's expected gain is re-estimated from the "
                   "forward's warp-state table before it is built")
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
