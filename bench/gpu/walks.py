"""M0 of the tile kernels' work: the CUDA C++ symmetric backward's walks (the triangle,
the triangle with its partners' exchange by st.async, full rows) timed three ways side by side in
one process on one machine, per kernel, with the SM clock under load, each walk twice (early and
late, in alternating order); Triton beside them where asked; whether the walks' gradients agree;
then the verdicts of the decision rules (bench/decisions/2026-11-28-walks-m0-rules.md).

    python -m bench.gpu.walks     # at N = 16,384 and 65,536, D = 64 and 128, bf16, one set:
                                  # cuda:triangle, cuda:triangle-async, cuda:rows, cuda:rows,
                                  # cuda:triangle-async, cuda:triangle; triton at 65,536 x 128
    python -m bench.gpu.walks --device cpu --backends cpu,reference,cpu --also reference@96x8 \
        --sizes 96 --dims 8 --repeats 2 --agreement-steps 2

Per D, per N, the --backends in their order (a spec named twice is measured twice), then the
--also specs at their points; per row: synchronised (median of --repeats steps, each waited for),
back to back (ms per step of steps issued with one wait at the end, as a training loop issues
them), the same step replayed from a CUDA graph (synchronised and back to back), each tile
kernel's time from one profiled step, which backward walk ran (the triangle takes D <= 128 only:
at 256 CUDA C++ runs rows whatever is asked), and the SM clock (nvidia-smi, sampled every 100 ms
while the row was measured). After each D's rows, at its largest N: every other spec of
--backends against --agreement-against (bench.gpu.walk_agreement), per step.

Writes walks_<device>_<date>.{json,md,verdicts.json} to --out, each rewritten whole after every
row and every agreement: a run killed or hung after row k leaves rows 1..k and what they decide.
The verdicts file: {"rule 1": {"verdict": "fires" | "stays" | "not decided", "reads": [its
lines, the verdict's last]}, "rule 5": {...}, "agreement": [{"d", "n", "walk", "against",
"errors", "state": "steady" | "moves" | "wrong"}], "auto": [lines]}. Nsight Compute's part is
read by bench.gpu.ncu_pages. On the CPU there are no walks, kernels, graphs or clocks: that run
exists so that the script is tested without a GPU.
"""
import argparse
import dataclasses
import datetime
import os
import re
import shutil
import statistics
import subprocess

import torch

from bench.gpu import options, walk_agreement
from bench.gpu.profile import TILE_KERNELS, profile_backend
from bench.gpu.step import TEMPERATURE, WALK_KERNEL_TAGS, short_kernel, split_backend
from bench.harness import cli, report
from bench.harness.machine import machine_description

# Each walk measured twice, early and late, in mirrored order: a drift in the clock or the
# machine's state then shows as a walk's two measurements apart, not as one walk against another.
REPEATED_BACKENDS = ("cuda:triangle,cuda:triangle-async,cuda:rows,cuda:rows,cuda:triangle-async,"
                     "cuda:triangle")
CLOCK_PERIOD_MS = 100
# Where rules 1 and 5 read: every N and D of M0 where the triangle runs (D <= 128).
RULE_SIZES = (16384, 65536)
RULE_DIMS = (64, 128)
# A walk's measurements at one point more than this far apart (of the smaller) are not steady,
# and a rule reading that point is not decided.
NOISE_BAND = 0.05


@dataclasses.dataclass(frozen=True)
class Rule:
    """A rule written before the run: fires where ``walk``'s back-to-back step takes at most
    ``ratio`` of ``against``'s in every pair of their measurements at every point."""
    name: str
    walk: str
    against: str
    ratio: float
    fires: str
    stays: str
    stays_closer: str = ""  # said instead of ``stays`` where some pair was faster, by too little


RULES = (
    Rule("rule 1", "rows", "triangle", 0.9,
         fires="rows becomes CUDA C++'s default symmetric backward on sm_90 and the size sweep "
               "is scheduled",
         stays="the triangle is as fast or faster in every pair: it stays the default",
         stays_closer="rows is faster in some pair, by less than 10%: the triangle stays the "
                      "default until step 1's walk is measured"),
    Rule("rule 5", "triangle-async", "triangle", 0.85,
         fires="fires on time; becomes the default only if the correctness stage passes",
         stays="it stays opt-in, and the fences were not what the triangle waits for"),
)
# Rule 1 read again, from the same rows, where rule 5 makes the exchange by st.async the triangle's
# (the rules' amendment of 2026-12-01).
RULE_1_AFTER_RULE_5 = dataclasses.replace(RULES[0], name="rule 1 with the triangle by st.async",
                                          against="triangle-async")


class SmClock:
    """The SM clock (MHz) sampled by nvidia-smi while a block runs; no samples where there is no
    nvidia-smi. One GPU on the machine (the device tool's): the index is torch's."""

    def __init__(self, index):
        self.index, self.samples, self._process = index, [], None

    def __enter__(self):
        smi = shutil.which("nvidia-smi")
        if smi:
            self._process = subprocess.Popen(
                [smi, "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                 "-i", str(self.index), "-lms", str(CLOCK_PERIOD_MS)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        if self._process:
            self._process.terminate()
            out, _ = self._process.communicate(timeout=10)
            self.samples = [int(v) for v in re.findall(r"^\s*(\d+)", out, re.MULTILINE)]
        return False

    def summary(self):
        if not self.samples:
            return None
        return {"median": statistics.median(self.samples), "min": min(self.samples),
                "max": max(self.samples), "count": len(self.samples)}


def also_points(text):
    """--also's type: "SPEC@NxD,SPEC@NxD" -> [(spec, n, d)]; "" -> []."""
    points = []
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"([\w:-]+)@(\d+)x(\d+)", item)
        if not match or not int(match.group(2)) or not int(match.group(3)):
            raise argparse.ArgumentTypeError(
                f"expected SPEC@NxD (e.g. triton@65536x128), got {item!r}")
        try:
            split_backend(match.group(1))
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        points.append((match.group(1), int(match.group(2)), int(match.group(3))))
    return points


def one_spec(text):
    """--agreement-against's type: one backend spec."""
    specs = options.walk_specs(text)
    if len(specs) != 1:
        raise argparse.ArgumentTypeError(f"expected one backend spec, got {text!r}")
    return specs[0]


def tile_kernels(row):
    """[(short name, ms)] of a row's tile kernels, largest first."""
    return [(short_kernel(name), ms) for name, _, ms in row["top"]
            if any(k in name for k in TILE_KERNELS)]


def backward_walk_ms(row, walk):
    """ms of the walk's backward kernel in the row's profiled step, None if it did not run."""
    return next((ms for name, _, ms in row["top"] if WALK_KERNEL_TAGS[walk] in name), None)


def measurements(rows, spec, n, d):
    """The rows of ``spec`` at (n, d), in the order they were measured."""
    return [r for r in rows if (r["backend"], r["n"], r["d"]) == (spec, n, d)]


def spread(values):
    """How far apart a walk's measurements lie, as a share of the smallest."""
    return max(values) / min(values) - 1


def decide(rows, rule):
    """(verdict, lines) of a rule on the rows measured so far: the k-th measurement of its walk
    paired with the k-th of the one it is held against, at every point of RULE_SIZES x
    RULE_DIMS. "fires" where every pair is at or under the rule's ratio, "stays" where every pair
    is over it; "not decided" where pairs fall on both sides, a point is missing (not measured,
    or a walk ran other than asked) or a walk's measurements at a point lie more than NOISE_BAND
    apart."""
    lines, missing, unsteady, sides = [], [], [], {}
    every_ratio = []
    for n in RULE_SIZES:
        for d in RULE_DIMS:
            point = f"N={n} D={d}"
            mine = measurements(rows, f"cuda:{rule.walk}", n, d)
            theirs = measurements(rows, f"cuda:{rule.against}", n, d)
            both = ((rule.walk, mine), (rule.against, theirs))
            absent = [f"{walk} not measured" for walk, found in both if not found]
            absent += [f"cuda:{walk} ran {r['walk_ran'] or 'no sm90 walk'}"
                       for walk, found in both for r in found if r["walk_ran"] != walk]
            if absent:
                missing.append(f"{point} ({', '.join(dict.fromkeys(absent))})")
                continue
            for walk, found in both:
                times = [r["back_to_back_ms"] for r in found]
                if spread(times) > NOISE_BAND:
                    unsteady.append(f"{point} {walk} " + " / ".join(f"{t:.3f}" for t in times)
                                    + " ms")
            pairs = list(zip(mine, theirs))
            ratios = [m["back_to_back_ms"] / t["back_to_back_ms"] for m, t in pairs]
            every_ratio += ratios
            fired = {ratio <= rule.ratio for ratio in ratios}
            sides[point] = "fires" if fired == {True} else "stays" if fired == {False} else "split"
            lines.append(
                f"{rule.name} reads, {point}: {rule.walk} / {rule.against} back to back "
                + ", ".join(f"{ratio:.3f}" for ratio in ratios)
                + " (" + ", ".join(f"{m['back_to_back_ms']:.3f} / {t['back_to_back_ms']:.3f}"
                                   for m, t in pairs)
                + " ms); graph replay back to back "
                + ", ".join(ratio_text(m, t, "graph_back_to_back_ms") for m, t in pairs)
                + "; backward kernel " + ", ".join(
                    f"{millis(backward_walk_ms(m, rule.walk))} / "
                    f"{millis(backward_walk_ms(t, rule.against))}" for m, t in pairs) + " ms")
    why_not = []
    if missing:
        why_not.append("missing " + "; ".join(missing))
    if unsteady:
        why_not.append(f"not steady (a walk's measurements more than {NOISE_BAND:.0%} apart): "
                       + "; ".join(unsteady))
    if len(set(sides.values())) > 1 or "split" in sides.values():
        why_not.append(f"pairs on both sides of {rule.ratio}: " + "; ".join(
            f"{point} {side}" for point, side in sides.items()))
    if why_not:
        verdict, text = "not decided", "; ".join(why_not)
    elif set(sides.values()) == {"fires"}:
        verdict, text = "fires", (f"{rule.walk} <= {rule.ratio}x {rule.against} in every pair at "
                                  f"every N and D: {rule.fires}")
    else:
        verdict = "stays"
        text = (f"{rule.walk} over {rule.ratio}x {rule.against} in every pair: "
                + (rule.stays_closer if rule.stays_closer and min(every_ratio) < 1 else rule.stays))
    return verdict, lines + [f"{rule.name}: {verdict}: {text}"]


def auto_reads(rows):
    """What auto's size rule reads: at each point where Triton ran, the fastest CUDA C++ walk
    (median of its measurements) against Triton, back to back."""
    lines = []
    points = dict.fromkeys((r["n"], r["d"]) for r in rows if r["backend"] == "triton")
    for n, d in points:
        triton = statistics.median(r["back_to_back_ms"] for r in measurements(rows, "triton", n, d))
        walks = {}
        for r in rows:
            if (r["n"], r["d"]) == (n, d) and split_backend(r["backend"])[0] == "cuda":
                walks.setdefault(r["walk_ran"] or r["backend"], []).append(r["back_to_back_ms"])
        if walks:
            walk, times = min(walks.items(), key=lambda item: statistics.median(item[1]))
            lines.append(f"auto reads, N={n} D={d}: CUDA C++ {walk} "
                         f"{statistics.median(times):.3f} ms (median of {len(times)}) against "
                         f"Triton {triton:.3f} ms back to back")
    return lines


def agreement_line(entry):
    marks = {"steady": "(steady)", "moves": "(MOVES: a race?)", "wrong": "(WRONG)"}
    return (f"agreement D={entry['d']} N={entry['n']}: {entry['walk']} vs {entry['against']} "
            + " ".join(f"{error:.1e}" for error in entry["errors"]) + f" {marks[entry['state']]}")


def verdicts(rows, agreement):
    """The verdicts file's content."""
    found = {}
    for rule in RULES:
        verdict, lines = decide(rows, rule)
        found[rule.name] = {"verdict": verdict, "reads": lines}
    return {**found, "agreement": agreement, "auto": auto_reads(rows)}


def verdict_lines(found):
    return ([line for rule in RULES for line in found[rule.name]["reads"]]
            + [agreement_line(entry) for entry in found["agreement"]] + found["auto"])


def ratio_text(a, b, key):
    return "—" if a.get(key) is None or b.get(key) is None else f"{a[key] / b[key]:.3f}"


def millis(value):
    return "—" if value is None else f"{value:.3f}"


def clock_text(clock):
    if clock is None:
        return "—"
    return f"{clock['median']:.0f} ({clock['min']}-{clock['max']}, {clock['count']})"


def write_whole(path, text):
    """Written whole or not at all, as report.write_json writes."""
    with open(path + ".tmp", "w") as out:
        out.write(text)
    os.replace(path + ".tmp", path)


class Record:
    """The run's three files, rewritten whole after every row and every agreement."""

    def __init__(self, stem, header, notes):
        self.stem, self.header, self.notes = stem, header, notes
        self.rows, self.agreement = [], []

    def add_row(self, row):
        row["measurement"] = len(measurements(self.rows, row["backend"], row["n"], row["d"])) + 1
        self.rows.append(row)
        self.write()

    def add_agreement(self, entry):
        self.agreement.append(entry)
        self.write()

    def write(self):
        found = verdicts(self.rows, self.agreement)
        report.write_json(self.stem + ".json", self.rows)
        report.write_json(self.stem + ".verdicts.json", found)
        lines = self.header + [f"- {note}" for note in self.notes]
        lines += ["", "| backend | N | D | measurement | backward walk that ran | synchronised ms "
                  "| back to back ms | graph replay ms | graph replay back to back ms "
                  "| tile kernels ms (each) | GPU busy ms | SM clock MHz |", "|" + "---|" * 12]
        for r in self.rows:
            kernels = ", ".join(f"{name} {ms:.3f}" for name, ms in tile_kernels(r)) or "—"
            lines.append(f"| {r['backend']} | {r['n']} | {r['d']} | {r['measurement']} | "
                         f"{r['walk_ran'] or '—'} | {r['wall_ms']:.3f} | "
                         f"{r['back_to_back_ms']:.3f} | {millis(r['graph_ms'])} | "
                         f"{millis(r['graph_back_to_back_ms'])} | {kernels} | {r['busy_ms']:.3f} | "
                         f"{clock_text(r['clock'])} |")
        lines += ["", "## What the rules read", ""] + [f"- {line}" for line in verdict_lines(found)]
        write_whole(self.stem + ".md", "\n".join(lines) + "\n")


def header_lines(device, dtype, steps, agreement_steps, against, command):
    return report.markdown_header(
        f"The tile kernels' walks, M0: {device.type}, {datetime.date.today().isoformat()}",
        machine_description(device),
        {"problem": f"{dtype} features, one set (the symmetric schedule), {TEMPERATURE} "
                    "temperature, 100 classes, forward + backward",
         "command": f"`{command}`",
         "methods": f"synchronised: median of {steps} steps, each waited for; back to back: ms "
                    "per step of at least 50 ms of steps issued with one wait at the end (median "
                    "of 5); graph replay: the step captured once and replayed, synchronised "
                    f"(median of {steps}) and back to back; kernels: one profiled step; SM clock: "
                    f"nvidia-smi every {CLOCK_PERIOD_MS} ms while the row was measured, median "
                    "(min-max, samples); measurement: the k-th of that backend at that N and D",
         "rules": f"rules 1 and 5 pair the k-th measurement of a walk with the k-th of the "
                  f"triangle at every N in {RULE_SIZES} and D in {RULE_DIMS}; a walk's "
                  f"measurements more than {NOISE_BAND:.0%} apart at a point leave them not "
                  "decided",
         "agreement": f"at each D's largest N, {agreement_steps} steps of each other spec "
                      f"against {against} on the same inputs: max |g - g_against| / "
                      f"max |g_against|; wrong over {walk_agreement.TOLERANCE:g} or not finite, "
                      "moving where the steps' errors spread wider than one unit in the last "
                      "place of the gradient's dtype (at least "
                      f"{walk_agreement.FLOAT32_MOVES_BAND:g})"})


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, device="cuda", sizes="16384,65536", dims="64,128",
                                  repeats=5, helps={"repeats": "synchronised steps (and replays) "
                                                               "per median (default %(default)s)"})
    options.add_step_options(parser, backends=REPEATED_BACKENDS)
    parser.add_argument("--also", type=also_points, default="triton@65536x128",
                        metavar="SPEC@NxD[,SPEC@NxD]",
                        help="backends measured once, only at these points, after the --backends "
                             "there (default %(default)s; \"\" for none)")
    parser.add_argument("--agreement-steps", type=cli.non_negative_int, default=3,
                        help="steps of each spec compared with --agreement-against after each "
                             "D's timings, at its largest N; 0: none (default %(default)s)")
    parser.add_argument("--agreement-against", type=one_spec, default=None, metavar="SPEC",
                        help="the spec whose gradient the others are held to (default: cuda:rows "
                             "on a CUDA device, reference elsewhere)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = options.DTYPES[args.dtype]
    against = args.agreement_against or ("cuda:rows" if device.type == "cuda" else "reference")
    compared = [spec for spec in dict.fromkeys(args.backends) if spec != against]
    notes = [f"--also {spec}@{n}x{d}: not a point of --sizes x --dims, not measured"
             for spec, n, d in args.also if n not in args.sizes or d not in args.dims]
    also = [point for point in args.also if point[1] in args.sizes and point[2] in args.dims]
    needed = args.backends + [spec for spec, _, _ in also]
    if args.agreement_steps and compared:
        needed.append(against)
    for spec in dict.fromkeys(needed):
        why = walk_agreement.why_spec_cannot_run(spec, device)
        if why:
            raise SystemExit(f"python -m bench.gpu.walks: {spec} cannot run on {device}: {why}")
    for note in notes:
        print(note, flush=True)
    stem = report.result_stem(args.out, f"walks_{device.type}_{datetime.date.today().isoformat()}")
    record = Record(stem, header_lines(device, args.dtype, args.repeats, args.agreement_steps,
                                       against, report.command_line("bench.gpu.walks", argv)),
                    notes)
    for d in args.dims:  # each D's rows back to back: one clock, one thermal state
        for n in args.sizes:
            for spec in args.backends + [spec for spec, an, ad in also if (an, ad) == (n, d)]:
                with SmClock(device.index or 0) as clock:
                    row = profile_backend(spec, "single", n, d, dtype, device, args.repeats)
                row["clock"] = clock.summary()
                row.pop("runtime")
                record.add_row(row)
                print(f"{spec} N={n} D={d} ({row['measurement']}): synchronised "
                      f"{row['wall_ms']:.3f} ms, back to back {row['back_to_back_ms']:.3f}, graph "
                      f"replay {millis(row['graph_ms'])} ({millis(row['graph_back_to_back_ms'])} "
                      f"back to back); walk {row['walk_ran'] or '—'}; tile kernels "
                      + (", ".join(f"{k} {ms:.3f}" for k, ms in tile_kernels(row)) or "—")
                      + f"; SM clock {clock_text(row['clock'])} MHz", flush=True)
        if args.agreement_steps and compared:  # after the D's timings: a hang here keeps them
            n = max(args.sizes)
            for spec, _, errors in walk_agreement.compare(compared, [against], n, d, dtype, device,
                                                          args.agreement_steps):
                entry = {"d": d, "n": n, "walk": spec, "against": against, "errors": errors,
                         "state": walk_agreement.agreement_state(errors, dtype)}
                record.add_agreement(entry)
                print(agreement_line(entry), flush=True)
    found = verdicts(record.rows, record.agreement)
    for line in [line for rule in RULES for line in found[rule.name]["reads"]] + found["auto"]:
        print(line)
    print("wrote", ", ".join(stem + suffix for suffix in (".md", ".json", ".verdicts.json")))
    return record.rows


if __name__ == "__main__":
    main()
