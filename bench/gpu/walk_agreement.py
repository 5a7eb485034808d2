"""Whether the CUDA C++ symmetric backward's walks give the same gradient: each backend spec's
gradient of supcon_step's problem (bench.gpu.step: one set, 100 classes, temperature 0.1, inputs
fixed by the seed, so every spec sees the same rows) against another spec's on the same inputs,
as max |g - g_against| / max |g_against| per step. bench.gpu.walks reads it after each D's
timings; the GPU session's smoke gate runs it alone:

    python -m bench.gpu.walk_agreement --backends cuda:triangle-async \
        --against cuda:triangle,cuda:rows --sizes 65536 --dims 128 --steps 1
    python -m bench.gpu.walk_agreement --device cpu --dtype fp32 --backends cpu \
        --against reference --sizes 256 --dims 16

One line per (spec, against, step) with its error; exit status 0 when every error is finite and
at most --tolerance, else 1 after a last line "agreement FAILED: ..." naming each that is not.

The smoke call above on an H200 (predicted from the H100's 2026-11-27 numbers, bench/results/
gpu_h100_2026-11-27b: a step of 7.4-7.9 ms at N = 65,536, D = 128): the interpreter, torch and
the library imported and the CUDA context made, 5-8 s; each spec's inputs drawn on the host
(8.4 M normal numbers, about 0.1 s) three times; three steps (one per spec), about 25 ms of GPU
work; so 6-9 s in all. With bench.gpu.sanitizer_case --cases 18,19 without a sanitizer (two small
cluster-pair cases, each twice, against a float64 reference on the host: another process start,
5-8 s, and under 1 s of work) the pair takes about 12-18 s of the gate's 60 s.
"""
import math
import sys

import torch

from bench.gpu import options
from bench.gpu.step import split_backend, supcon_step, walk_of
from bench.harness import cli
from bench.harness.timing import synchronize

# As python_tests/backends/test_cuda_backend.py::test_symmetric_backward_triangle_against_full_rows
# holds the walks to each other on 16-bit inputs: the two walks round different partial sums.
TOLERANCE = 5e-2
# In float32 the errors' own noise: the symmetric forward's atomic adds change the last bits of
# its sums over N rows from call to call (about sqrt(N) units: 3e-5 at 65,536 rows), with room.
FLOAT32_MOVES_BAND = 1e-4


def why_spec_cannot_run(spec, device):
    """Why a backend spec cannot run on ``device``, or None ("reference" runs anywhere)."""
    import scl_kernels
    backend = split_backend(spec)[0]
    return None if backend == "reference" else scl_kernels.backends.why_not_fused(backend, device)


def gradients(spec, n, d, dtype, device, steps):
    """``steps`` gradients of spec's forward + backward (each a tuple, one tensor per input), all
    on the same inputs."""
    with walk_of(spec):
        step = supcon_step(split_backend(spec)[0], "single", n, d, dtype, device)
        made = [step() for _ in range(steps)]
        synchronize(device)
    return made


def relative_error(got, want):
    """max |got - want| / max |want| over every tensor of the two gradients, in float32; NaN or
    inf where either holds a value that is not finite."""
    per_tensor = [(g.float() - w.float()).abs().max()
                  / w.float().abs().max().clamp_min(torch.finfo(torch.float32).tiny)
                  for g, w in zip(got, want)]
    return torch.stack(per_tensor).max().item()  # torch's max keeps a NaN, Python's would not


def compare(specs, againsts, n, d, dtype, device, steps):
    """Yields (spec, against, [error of each of spec's steps]) for every spec against every
    against, as each spec's steps are made: each against's gradient made once (the reference),
    each spec's ``steps`` times (a walk whose result moves between steps on the same inputs
    races)."""
    wanted = {against: gradients(against, n, d, dtype, device, 1)[0] for against in againsts}
    for spec in specs:
        made = gradients(spec, n, d, dtype, device, steps)
        for against, want in wanted.items():
            yield spec, against, [relative_error(got, want) for got in made]


def within(error, tolerance):
    return math.isfinite(error) and error <= tolerance


def moves_band(dtype):
    """How far a spec's errors on the same inputs may move between steps without a race: one unit
    in the last place of the gradient's dtype at its largest element (the forward's atomics change
    its float32 sums in the last bits, so an element may round to its neighbour), and
    FLOAT32_MOVES_BAND where that unit is float32's."""
    return max(torch.finfo(dtype).eps, FLOAT32_MOVES_BAND)


def agreement_state(errors, dtype, tolerance=TOLERANCE):
    """"wrong" where an error is not finite or over the tolerance; "moves" where the errors spread
    wider than moves_band(dtype); else "steady"."""
    if not all(within(error, tolerance) for error in errors):
        return "wrong"
    return "moves" if max(errors) - min(errors) > moves_band(dtype) else "steady"


def main(argv=None):
    parser = cli.benchmark_parser(__doc__, writes_files=False, device="cuda", sizes="65536",
                                  dims="128")
    options.add_step_options(parser, backends="cuda:triangle,cuda:triangle-async")
    parser.add_argument("--against", type=options.walk_specs, default=["cuda:rows"],
                        help="the specs whose gradient each of --backends' is held to, "
                             "comma-separated (default cuda:rows)")
    parser.add_argument("--steps", type=cli.positive_int, default=1,
                        help="steps of each of --backends, each compared (default %(default)s)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="the largest error that passes (default %(default)s)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = options.DTYPES[args.dtype]
    cannot = {spec: why_spec_cannot_run(spec, device) for spec in args.backends + args.against}
    cannot = {spec: why for spec, why in cannot.items() if why}
    if cannot:
        print("agreement FAILED: " + "; ".join(f"{spec} cannot run on {device}: {why}"
                                                for spec, why in cannot.items()), flush=True)
        return 1
    failures = []
    for d in args.dims:
        for n in args.sizes:
            for spec, against, errors in compare(args.backends, args.against, n, d, dtype, device,
                                                 args.steps):
                for step, error in enumerate(errors, 1):
                    print(f"agreement D={d} N={n}: {spec} vs {against} step {step}: {error:.1e}",
                          flush=True)
                    if not within(error, args.tolerance):
                        failures.append(f"{spec} vs {against} at D={d} N={n} step {step}: "
                                        f"{error:.1e}")
    if failures:
        print(f"agreement FAILED: over {args.tolerance:g} or not finite: " + "; ".join(failures))
        return 1
    print(f"agreement ok: every error finite and at most {args.tolerance:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
