"""The Triton backend's per-call host overhead, measured on the CPU: microseconds per call of its
Python launchers (everything around the kernels: tensor descriptors, per-column terms, partial-sum
buffers, the float64 finish) and of a whole forward + backward of `supcon_loss`, with every Triton
kernel replaced by a no-op, so that only the host's work is left. In Triton's interpreter (the
launchers are the ones a GPU runs; only the kernels' execution differs, and the JIT's dispatch,
which the interpreter does not have), the shared core on the device's path, one intra-op thread
(the host's own work, not OpenMP's fan-out over tiny tensors); the library must be a test build
(SCL_BUILD_TESTS=1, for the hook that takes the device's path). The last line replays each Triton
stage op's first outputs instead of running its Python: the step's cost outside the launchers
(front end, shared core, autograd, the crossings into the ops).

    python -m bench.triton_glue_time                     # N = 256, D = 128
    python -m bench.triton_glue_time --against 7e9aeeb   # and that revision, in the same run

--against checks the revision out into a temporary git worktree and measures its package in
child processes of its own, alternating with this checkout's children round by round, so that
both see the same machine load. Medians of all rounds' timings. The revision's package loads
its own ops' library (SCL_KERNELS_LIBRARY): this checkout's where the revision's C++ sources are
this checkout's, else the one --against-library names, built from the revision's sources (a test
build: SCL_BUILD_TESTS=1 python setup.py build_ext --inplace in a checkout of it; LIBRARY below is
the _C library that build leaves in that checkout's scl_kernels/).

    python -m bench.triton_glue_time --against c05debd --against-library LIBRARY

The table's last line counts the step's crossings from the shared core into Python: its calls of
the ops whose kernels the Triton backend registers in Python.

Below the table, for this checkout only, what the interpreter leaves out: one GPU launch's
dispatch of the symmetric backward's tile kernel, its arguments as grad_symmetric passes them,
through the autotuner and the JIT (triton's own path) and through the launchers' cached choice
and handle (launch.TileKernel), both with Triton's binder for sm_90, a stand-in device and a
no-op in place of the compiled launcher (equal in both; on a GPU it adds its own few us).

The outputs of the stubbed kernels are garbage: this times the host, it checks nothing.
"""
import argparse
import contextlib
import glob
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.harness.interpreter import in_interpreter_child, interpreter_command
from bench.harness.report import REPO_ROOT

LAUNCHERS = ("lse launcher (symmetric)", "grad launcher (symmetric)",
             "forward + backward of supcon_loss")
REPLAYED = "forward + backward, stage ops replayed"
CROSSINGS = "crossings into Python a step"


def by_name(stage, **arguments):
    """A stage op's Python function called with ``arguments`` by name, None for the parameters
    it takes beyond them (a revision's may take more: the group mask's ids), so that one call
    serves this checkout's launchers and a revision's."""
    return stage(**{name: arguments.get(name) for name in inspect.signature(stage).parameters})


def timings_per_call(fn, calls, repeats):
    """Microseconds per call of fn, one timing of `calls` calls per repeat."""
    fn()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        timings.append(1e6 * (time.perf_counter() - start) / calls)
    return timings


def replay_stage_ops():
    """Each Python kernel that the Triton backend registers (its stage ops, whichever a revision
    has) returns its first call's outputs from then on; done before the backend registers them
    (on the first call of supcon_loss)."""
    register = torch_library().Library.impl

    def impl_replaying(library, name, fn, *args, **kwargs):
        first = []

        def replay(*op_args):
            if not first:
                first.append(fn(*op_args))
            return first[0]
        return register(library, name, replay, *args, **kwargs)
    torch_library().Library.impl = impl_replaying


def python_kernel_names():
    """The set that the names of the ops the Triton backend registers Python kernels for are
    added to, as it registers them (set before, as replay_stage_ops): the step's crossings into
    Python are its calls of these ops."""
    register = torch_library().Library.impl
    names = set()

    def impl_named(library, name, *args, **kwargs):
        names.add(f"{library.ns}::{name}")
        return register(library, name, *args, **kwargs)
    torch_library().Library.impl = impl_named
    return names


def crossings(step, python_kernels):
    """How many times one call of step() calls an op with a Python kernel (profiler events)."""
    from torch.profiler import profile
    with profile() as recorded:
        step()
    return sum(event.name in python_kernels for event in recorded.events())


def torch_library():
    import torch.library
    return torch.library


def measure(n, d, calls, repeats, replayed):
    """{what: timings in microseconds per call} with the kernels stubbed out."""
    import torch
    from triton.runtime import interpreter
    import scl_kernels
    from scl_kernels._testing import test_hooks
    from scl_kernels.backends.triton import tiles

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    labels = torch.randint(0, 100, (n,), generator=g)
    inv_norm = x.norm(dim=1).reciprocal()
    coef = torch.rand(n, generator=g)
    features = x.clone().requires_grad_()
    # t on the host, as the core passes a float temperature's: 1/t = 10
    host_temperature = torch.tensor([0.1], dtype=torch.float64)

    def step():
        loss = scl_kernels.supcon_loss(features, labels, 0.1, backend="triton")
        torch.autograd.grad(loss, [features])

    if replayed:
        replay_stage_ops()
        timed = {REPLAYED: step}
    else:
        python_kernels = python_kernel_names()
        symmetric_tiles = dict(q=x, z=x, q_inv_norm=inv_norm, z_inv_norm=inv_norm,
                               temperature=host_temperature, temperature_in_memory=False,
                               self_offset=0, symmetric=True)
        timed = dict(zip(LAUNCHERS, (
            lambda: by_name(tiles.lse_tiles, **symmetric_tiles),
            lambda: by_name(tiles.grad_tiles, **symmetric_tiles, deterministic=False, coef=coef,
                            lse_hi=coef, lse_lo=coef),
            step)))
    original = interpreter.InterpretedFunction.run
    interpreter.InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None
    try:
        with test_hooks(device_preparation=True):
            timings = {name: timings_per_call(fn, calls, repeats) for name, fn in timed.items()}
            if not replayed:
                timings[CROSSINGS] = [crossings(step, python_kernels)]
            return timings
    finally:
        interpreter.InterpretedFunction.run = original


DISPATCH = ("tile kernel, autotuner + JIT", "tile kernel, cached choice + handle",
            "column terms kernel, JIT", "column terms kernel, cached handle")


def dispatch_timings(n, d, calls, repeats):
    """{DISPATCH row: timings} of one launch of grad_rows_kernel and of column_terms_kernel,
    as the docstring says."""
    import torch
    from triton import autotune
    from triton.backends.compiler import GPUTarget
    from triton.compiler import CompiledKernel
    from triton.compiler.compiler import make_backend
    from triton.runtime import jit as triton_jit
    from triton.runtime.jit import JITFunction, create_function_from_signature
    from scl_kernels.backends.triton import handles, kernels, launch

    recorded = {}
    launch.GRAD_SYMMETRIC, launch.COLUMN_TERMS, real = (
        lambda grid, args: recorded.update(grid=grid, args=args),
        lambda grid, *a, **k: recorded.update(terms=(grid, a, k)),
        (launch.GRAD_SYMMETRIC, launch.COLUMN_TERMS))
    try:
        x = torch.randn(n, d)
        host = launch.temperature_of(torch.tensor([0.1], dtype=torch.float64), False)
        launch.grad_symmetric(x, torch.ones(n), torch.ones(n), host, False)
    finally:
        launch.GRAD_SYMMETRIC, launch.COLUMN_TERMS = real
    grid, args = recorded["grid"], recorded["args"]
    args["terms_ptr"] = torch.empty(0)
    backend = make_backend(GPUTarget("cuda", 90, 32))

    def stand_in_jit(kernel):
        fn = JITFunction(kernel.fn)
        fn.device_caches[0] = ({}, {}, None, backend,
                               create_function_from_signature(fn.signature, fn.params, backend))

        def compile_stand_in(key, signature, device, constexprs, options, attrs, warmup):
            compiled = object.__new__(CompiledKernel)
            compiled._run, compiled.module, compiled.src = (lambda *a: None), True, None
            compiled.name, compiled.function, compiled.packed_metadata = "k", None, None
            fn.device_caches[device][0][key] = compiled
            return compiled
        fn._do_compile = compile_stand_in
        return fn
    fn = stand_in_jit(kernels.grad_rows_kernel)
    terms_fn = stand_in_jit(kernels.column_terms_kernel)
    terms_handle = handles.CompiledKernels(terms_fn)
    terms_grid, terms_args, terms_kwargs = recorded["terms"]
    device = type("Device", (), {"get_current_device": lambda self: 0,
                                 "get_current_stream": lambda self, index: 0})()
    stand_in = type("Driver", (), {"active": device})()
    triton_jit.driver, handles.driver = stand_in, stand_in
    launch.INTERPRET, interpreting = False, launch.INTERPRET  # the GPU's configurations
    try:
        use = launch.KERNEL_USES["grad_symmetric"]
        tuner = autotune(launch._configs(use), key=launch._grad_symmetric.keys,
                         reset_to_zero=["dq_ptr"])(fn)
    finally:
        launch.INTERPRET = interpreting
    tuner._bench = lambda *a, config, **k: [1.0, 1.0, 1.0]  # the first config "wins"
    tile_kernel = launch.TileKernel(tuner)
    paths = dict(zip(DISPATCH, (
        lambda: tuner[grid](**args), lambda: tile_kernel(grid, dict(args)),
        lambda: terms_fn[terms_grid](*terms_args, **terms_kwargs),
        lambda: terms_handle(terms_grid, *terms_args, **terms_kwargs))))
    return {name: timings_per_call(path, calls, repeats) for name, path in paths.items()}


def built_library():
    """This checkout's built library: SCL_KERNELS_LIBRARY's, else the in-place build."""
    found = glob.glob(os.path.join(REPO_ROOT, "scl_kernels", "_C*.so"))
    library = os.environ.get("SCL_KERNELS_LIBRARY") or (found[0] if found else None)
    if library is None:
        raise SystemExit("--against needs this checkout's built library (scl_kernels/_C*.so)")
    return library


def revision_library(revision, given):
    """The library the revision's package runs with: `given` (--against-library), else this
    checkout's where the revision's C++ sources are this checkout's (its ops' schemas are then
    the same)."""
    if given is not None:
        return os.path.realpath(given)
    same_sources = subprocess.run(["git", "-C", REPO_ROOT, "diff", "--quiet", revision, "--",
                                   "csrc", "setup.py"], check=False).returncode == 0
    if not same_sources:
        raise SystemExit(f"{revision}'s C++ sources differ from this checkout's: name a library "
                         f"built from them with --against-library (SCL_BUILD_TESTS=1 python "
                         f"setup.py build_ext --inplace in a checkout of {revision})")
    return built_library()


@contextlib.contextmanager
def revision_tree(revision):
    """A temporary git worktree of `revision`, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="triton_glue_time_") as parent:
        tree = os.path.join(parent, "tree")
        subprocess.run(["git", "-C", REPO_ROOT, "worktree", "add", "--detach", "--quiet", tree,
                        revision], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", REPO_ROOT, "worktree", "remove", "--force", tree],
                           check=False)


def run_child(args, replayed, package_root=None, library=None):
    """One interpreter child's timings: {what: [microseconds]}, of this checkout's package or of
    the one under package_root."""
    argv = ["--n", str(args.n), "--d", str(args.d), "--calls", str(args.calls), "--repeats",
            str(args.repeats), "--json"]
    if replayed:
        argv.append("--replayed")
    elif package_root is None:
        argv.append("--dispatch")
    extra = {}
    if package_root is not None:
        argv += ["--package-root", package_root]
        extra["SCL_KERNELS_LIBRARY"] = library
    command, env = interpreter_command("bench.triton_glue_time", argv, **extra)
    done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"the measurement of {package_root or 'this checkout'} failed:\n"
                         f"{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected_root = package_root or REPO_ROOT
    if not result["package"].startswith(os.path.realpath(expected_root)):
        raise SystemExit(f"measured the package at {result['package']}, not {expected_root}'s")
    return result["timings"]


def collect(args, package_root=None, library=None, into=None):
    """Adds one round's timings (launchers, then the replayed step) to `into`."""
    for replayed in (False, True):
        for name, timings in run_child(args, replayed, package_root, library).items():
            into.setdefault(name, []).extend(timings)


def report(args, columns):
    """The table: one column of medians per measured package, and old / new where two."""
    names = [*LAUNCHERS, REPLAYED, CROSSINGS]
    medians = {label: {name: statistics.median(t[name]) for name in names}
               for label, t in columns.items()}
    print(f"N = {args.n}, D = {args.d}, kernels stubbed, Triton's interpreter, one thread: "
          f"microseconds per call, medians of {args.rounds} round(s) x {args.repeats} timings "
          f"of {args.calls} calls")
    labels = list(columns)
    header = f"{'':<42}" + "".join(f"{label:>16}" for label in labels)
    if len(labels) == 2:
        header += f"{labels[1] + ' / ' + labels[0]:>24}"
    print(header)
    for name in names:
        unit = "" if name == CROSSINGS else " us"
        line = f"{name:<42}" + "".join(f"{medians[label][name]:>{16 - len(unit)}.0f}{unit}"
                                       for label in labels)
        if len(labels) == 2:
            line += f"{medians[labels[1]][name] / medians[labels[0]][name]:>23.2f}x"
        print(line)
    print(f"{labels[0]}, one GPU launch's host dispatch (sm_90 binder, stand-in launcher):")
    here = [statistics.median(columns[labels[0]][name]) for name in DISPATCH]
    for (old_path, new_path), (old_us, new_us) in zip(zip(DISPATCH[::2], DISPATCH[1::2]),
                                                      zip(here[::2], here[1::2])):
        print(f"  {old_path}: {old_us:.1f} us; {new_path}: {new_us:.1f} us "
              f"({old_us / new_us:.2f}x)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--n", type=int, default=256, help="rows (default %(default)s)")
    parser.add_argument("--d", type=int, default=128, help="row width (default %(default)s)")
    parser.add_argument("--calls", type=int, default=50,
                        help="calls per timing (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=7,
                        help="timings per round (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="child processes per package and measurement (default %(default)s)")
    parser.add_argument("--against", metavar="REV",
                        help="also measure this git revision's package, in the same run")
    parser.add_argument("--against-library", metavar="PATH",
                        help="the library built from --against's revision (needed where its C++ "
                             "sources differ from this checkout's)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replayed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--package-root", help=argparse.SUPPRESS)
    parser.add_argument("--dispatch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if in_interpreter_child():
        if args.package_root:
            sys.path.insert(0, args.package_root)
        timings = measure(args.n, args.d, args.calls, args.repeats, args.replayed)
        if args.dispatch:
            timings.update(dispatch_timings(args.n, args.d, args.calls, args.repeats))
        import scl_kernels
        print(json.dumps({"package": os.path.realpath(scl_kernels.__file__), "timings": timings}))
        return 0
    columns = {"this checkout": {}}
    if args.against is None:
        for _ in range(args.rounds):
            collect(args, into=columns["this checkout"])
    else:
        columns[args.against] = {}
        library = revision_library(args.against, args.against_library)
        with revision_tree(args.against) as tree:
            for _ in range(args.rounds):
                collect(args, into=columns["this checkout"])
                collect(args, tree, library, into=columns[args.against])
    report(args, columns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
