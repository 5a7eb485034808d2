"""The backend matrix, a pytest plugin (registered by python_tests/conftest.py's
``pytest_plugins``).

Every test that takes a ``backend`` argument runs once per backend that
``scl_kernels.available_backends(device)`` lists, for the CPU and (when present) CUDA; a test
that takes ``op_backend`` runs for the backends that have raw ops (``forward_op`` /
``backward_op``). A new backend inherits the whole matrix by being registered.

``@pytest.mark.matrix(name=[values], ...)`` parametrises a backend test over its other
arguments as well. How much of that matrix a backend runs is its :class:`Budget`, decided in one
place (:func:`budget_for`): the full product of the values, or a subset that covers every pair of
values, and for slow backends (Triton's interpreter) row / dimension sizes up to a limit.

Two tiers. The default one (``python -m pytest``) runs the primary backends' full product and the
secondary cases (the dense reference, the device-prep variant) pairwise: they rerun the primary
cases' arguments on another path, and their full product was most of the suite's time.
``--full`` runs the secondary cases' full product too. Nothing is dropped silently: the terminal
summary states the tier and counts, and ``-v`` lists what each budget left out.
"""
import functools
import itertools
import os
from dataclasses import dataclass

import pytest
import torch

# Without a GPU the Triton backend runs in Triton's interpreter, which must be chosen before
# triton is first imported (and before the registry is asked which backends run on the CPU).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import scl_kernels  # noqa: E402
from scl_kernels._extension import library_loaded  # noqa: E402
from scl_kernels._testing import NOT_A_TEST_BUILD, test_build, test_hooks  # noqa: E402
from scl_kernels.backends import get_backend  # noqa: E402

from .needs import why_library_is_missing  # noqa: E402

MATRIX_MARKER = ("matrix(**values): parametrise a backend test over these values too, within each "
                 "backend's budget (python_tests/support/backend_matrix.py)")


# Set from --full and --interpreter-each in pytest_configure, before any test module is collected.
full_tier = False
interpreter_each = False


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="run every matrix case of the secondary backend cases (the dense "
                          "reference, the device-prep variant), not their pairwise cover, and "
                          "Triton's interpreter over every pair of values")
    parser.addoption("--interpreter-each", action="store_true",
                     help="with --full: Triton's interpreter takes each value once, as in the "
                          "default tier (CI, whose time limit the pairwise cover's 400 more "
                          "interpreted cases, about 0.5 s each, would strain)")


def pytest_configure(config):
    global full_tier, interpreter_each
    full_tier = config.getoption("full")
    interpreter_each = config.getoption("interpreter_each")
    config.addinivalue_line("markers", MATRIX_MARKER)


def pytest_collection_modifyitems(config, items):
    """The default tier skips the tests marked slow (pytest.ini), saying that --full runs them."""
    if full_tier:
        return
    skip = pytest.mark.skip(reason="slow (a compile, a 65,536-row check): the full tier, --full, "
                                   "runs it")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


# ------------------------------------------------------------------------------------------
# Budgets: how much of each test's matrix a backend runs
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    max_rows: int         # largest N (or M) of a generated case; larger sizes are left out
    max_dim: int          # largest D
    combinations: str     # "all": the full product of a test's values; "pairs": a subset in
                          # which every pair of values of two arguments appears at least once;
                          # "each": every value of every argument at least once
    cannot_run: tuple = ()  # (input dtype, why): matrix cases with dtype=that are skipped, saying why

    def rows(self, n):
        """A size for tests whose exact N does not matter: n, capped by the budget."""
        return min(n, self.max_rows)


FULL = Budget(max_rows=1 << 30, max_dim=1 << 30, combinations="all")
# Triton's interpreter runs every tile operation in numpy, 32 x 32 tiles: about 0.3 - 1 s for
# a forward and backward at 70 x 40, 10 s at 300 x 130. Sizes up to 70 rows still cross two tile
# boundaries and leave partial tiles (33, 70); the pairwise subset keeps every value of every
# argument and every pair of them.
INTERPRETED = Budget(max_rows=70, max_dim=40, combinations="pairs")
# The default tier's budget for the interpreter, which was still about 40% of its time with the
# pairwise cover: every value of every argument once (each_choice), at the same sizes; --full
# runs the pairwise cover.
INTERPRETED_EACH = Budget(max_rows=INTERPRETED.max_rows, max_dim=INTERPRETED.max_dim,
                          combinations="each")
# The default tier's budget for the secondary cases: every value of every argument and every pair
# of them, at every size.
SECONDARY = Budget(max_rows=FULL.max_rows, max_dim=FULL.max_dim, combinations="pairs")


@functools.cache
def _interpreter_multiplies_bf16():
    """Whether Triton's interpreter computes tl.dot of bfloat16 tiles (triton 3.6 stores them as
    uint16 and multiplies the bit patterns): a 16 x 16 probe."""
    from .triton_probe import bf16_dot
    a = torch.full((16, 16), 2.0, dtype=torch.bfloat16)
    return bool((bf16_dot(a, a) == 64.0).all())


def budget_for(name, device, variant=""):
    """The one place that decides how much of the matrix a backend runs. Triton's interpreter
    keeps its sizes in both tiers (about a second a case there): each value once by default,
    every pair of values with --full."""
    if name == "triton" and device == "cpu":
        interpreted = INTERPRETED if full_tier and not interpreter_each else INTERPRETED_EACH
        if _interpreter_multiplies_bf16():
            return interpreted
        return Budget(interpreted.max_rows, interpreted.max_dim, interpreted.combinations,
                      cannot_run=((torch.bfloat16, "Triton's interpreter multiplies bfloat16 tiles "
                                   "as their uint16 bit patterns (probe: support/triton_probe.py); "
                                   "bf16 runs on CUDA"),))
    if not full_tier and (name == "reference" or variant):
        return SECONDARY
    return FULL


# ------------------------------------------------------------------------------------------
# The backends under test
# ------------------------------------------------------------------------------------------

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@dataclass(frozen=True)
class BackendCase:
    """One backend on one device: the value of the ``backend`` / ``op_backend`` arguments."""
    name: str
    device: str
    # "device-prep": the CPU backend with the shared core's accelerator preparation (no host
    # reads: sort-based class ids, deferred value checks), which GPUs always take; the
    # _preparation fixture sets the device_preparation test hook for its tests.
    variant: str = ""

    def __str__(self):
        return "-".join(filter(None, (self.name, self.device, self.variant)))

    @property
    def budget(self):
        return budget_for(self.name, self.device, self.variant)

    @property
    def info(self):
        return get_backend(self.name)

    @property
    def forward_op(self):
        return self.info.forward_op

    @property
    def backward_op(self):
        return self.info.backward_op

    def computes_in(self, dtype):
        return self.info.computes_in(dtype)

    def put(self, value):
        """Tensors (also inside dicts, lists and tuples) moved to this backend's device."""
        if isinstance(value, torch.Tensor):
            return value.to(self.device)
        if isinstance(value, dict):
            return {k: self.put(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.put(v) for v in value)
        return value


def _backend_cases():
    cases = [BackendCase(name, device)
             for device in DEVICES for name in scl_kernels.available_backends(device)]
    if "cpu" in scl_kernels.available_backends("cpu"):
        cases.append(BackendCase("cpu", "cpu", variant="device-prep"))
    return cases


BACKEND_CASES = _backend_cases()
OP_BACKEND_CASES = [case for case in BACKEND_CASES if case.forward_op is not None]


# ------------------------------------------------------------------------------------------
# Matrix generation
# ------------------------------------------------------------------------------------------

_DTYPE_IDS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
              torch.float64: "f64", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
              torch.uint8: "u8"}


def value_id(value):
    if isinstance(value, torch.dtype):
        return _DTYPE_IDS.get(value, str(value).replace("torch.", ""))
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)
    if isinstance(value, tuple) and value and isinstance(value[0], str):
        return value[0]  # (id, ...) case tuples
    if isinstance(value, tuple) and all(isinstance(v, (str, int, float, bool, torch.dtype))
                                        for v in value):
        return "-".join(value_id(v) for v in value)
    name = getattr(value, "id", None)
    if isinstance(name, str):
        return name
    raise TypeError(f"no test id for {value!r}: give it an id attribute or make it (id, ...)")


def each_choice(sizes):
    """Index rows in which every value of every argument appears at least once."""
    count = max(sizes, default=1)
    return [tuple(i % s for s in sizes) for i in range(count)]


def pairwise(sizes):
    """Index rows covering every pair of values of two arguments (greedy, deterministic), starting
    from each_choice(sizes) so that the quick subset is always part of it."""
    rows = each_choice(sizes)
    uncovered = {(a, i, b, j) for a, b in itertools.combinations(range(len(sizes)), 2)
                 for i in range(sizes[a]) for j in range(sizes[b])}

    def pairs(row):
        return {(a, row[a], b, row[b]) for a, b in itertools.combinations(range(len(row)), 2)}

    for row in rows:
        uncovered -= pairs(row)
    candidates = list(itertools.product(*(range(s) for s in sizes)))
    while uncovered:
        best = max(candidates, key=lambda row: len(pairs(row) & uncovered))
        rows.append(best)
        uncovered -= pairs(best)
    return sorted(set(rows))


def _default_size(name):
    if name in ("n", "m"):
        return lambda v: (v, 0)
    if name == "d":
        return lambda v: (0, v)
    return None


def _fits(budget, size):
    rows, dim = size
    return rows <= budget.max_rows and dim <= budget.max_dim


# What each backend's budget left out, for the terminal summary: (backend, test) -> text
_LEFT_OUT = {}
_COUNTS = {}  # backend -> [generated, full]


def _value_names(marker):
    """The arguments a matrix marker gives values to (its other keywords are options)."""
    return [k for k in marker.kwargs if k not in ("quick", "sizes")]


def _matrix_params(metafunc, marker, case):
    """(names, [(values, quick)]) of one backend's part of a matrix test."""
    names = _value_names(marker)
    sizes = dict(marker.kwargs.get("sizes") or {})
    quick = marker.kwargs.get("quick")
    values, dropped = [], []
    for name in names:
        size = sizes.get(name) or _default_size(name)
        kept = [v for v in marker.kwargs[name] if size is None or _fits(case.budget, size(v))]
        if len(kept) < len(marker.kwargs[name]):
            dropped.append(f"{name}={[value_id(v) for v in marker.kwargs[name] if v not in kept]}")
        assert kept, f"{metafunc.function.__name__}: the budget of {case} leaves no {name}"
        values.append(kept)
    full = 1
    for name in names:
        full *= len(marker.kwargs[name])
    lens = [len(v) for v in values]
    product = list(itertools.product(*(range(s) for s in lens)))
    rows = {"all": lambda: product, "pairs": lambda: pairwise(lens),
            "each": lambda: each_choice(lens)}[case.budget.combinations]()
    quick_rows = set()
    if quick == "each":
        quick_rows = set(each_choice(lens))
    elif quick == "all":
        quick_rows = set(rows)
    elif callable(quick):
        # Chosen from the whole product and run under any budget, so that -m quick selects the
        # same cases in either tier.
        quick_rows = {r for r in product if quick(**{n: values[k][i] for k, (n, i) in
                                                      enumerate(zip(names, r))})}
        rows = sorted(set(rows) | quick_rows)
    elif quick is not None:
        raise ValueError(f"matrix quick= must be 'each', 'all' or a predicate, got {quick!r}")
    if len(rows) < full:
        why = []
        if dropped:
            why.append("sizes over budget: " + ", ".join(dropped))
        if case.budget.combinations != "all":
            why.append({"pairs": "pairwise cover of the rest",
                        "each": "each value once"}[case.budget.combinations])
        _LEFT_OUT[(str(case), metafunc.function.__name__)] = (
            f"{len(rows)} of {full} ({'; '.join(why)})")
    counts = _COUNTS.setdefault(str(case), [0, 0])
    counts[0] += len(rows)
    counts[1] += full
    return names, [(tuple(values[k][i] for k, i in enumerate(r)), r in quick_rows) for r in rows]


def _no_backend_to_run(argname, value_count):
    """The one, skipped, case of a test that no backend on this machine can run, saying why."""
    why = f"no backend on this machine provides {argname}"
    if not library_loaded():
        why += f": {why_library_is_missing()}"
    return pytest.param(*[None] * (1 + value_count), id=f"no-{argname}",
                        marks=pytest.mark.skip(reason=why))


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        argname, cases = "backend", BACKEND_CASES
    elif "op_backend" in metafunc.fixturenames:
        argname, cases = "op_backend", OP_BACKEND_CASES
    else:
        assert metafunc.definition.get_closest_marker("matrix") is None, \
            f"{metafunc.function.__name__}: @pytest.mark.matrix needs a backend argument"
        return
    marker = metafunc.definition.get_closest_marker("matrix")
    if not cases:
        names = [] if marker is None else _value_names(marker)
        metafunc.parametrize([argname, *names], [_no_backend_to_run(argname, len(names))])
        return
    if marker is None:
        metafunc.parametrize(argname, cases, ids=str)
        for case in cases:
            counts = _COUNTS.setdefault(str(case), [0, 0])
            counts[0] += 1
            counts[1] += 1
        return
    params = []
    for case in cases:
        names, rows = _matrix_params(metafunc, marker, case)
        for values, quick in rows:
            marks = [pytest.mark.quick] if quick else []
            for dtype, why in case.budget.cannot_run:
                if any(v == dtype for n, v in zip(names, values) if n == "dtype"):
                    marks.append(pytest.mark.skip(reason=f"{case}: {why}"))
            params.append(pytest.param(case, *values,
                                       id="-".join([str(case)] + [value_id(v) for v in values]),
                                       marks=marks))
    metafunc.parametrize([argname, *names], params)


def pytest_terminal_summary(terminalreporter, config):
    if not _COUNTS:
        return
    write = terminalreporter.write_line
    generated = sum(counts[0] for counts in _COUNTS.values())
    whole = sum(counts[1] for counts in _COUNTS.values())
    tier = (("full tier (--full --interpreter-each)" if interpreter_each else "full tier (--full)")
            if full_tier else
            "default tier (--full runs the secondary cases' full product, the interpreter's "
            "pairwise cover and the slow tests)")
    write(f"{tier}: {generated} of {whole} backend cases; per backend (budgets: "
          "support.backend_matrix.budget_for): " + ", ".join(
              f"{name} {counts[0]}/{counts[1]}" for name, counts in _COUNTS.items()))
    if config.getoption("verbose") > 0:
        for (name, test), text in sorted(_LEFT_OUT.items()):
            write(f"  budget of {name}: {test} runs {text}")
    elif _LEFT_OUT:
        write(f"  ({len(_LEFT_OUT)} matrix tests run a budgeted subset; -v lists them)")


# ------------------------------------------------------------------------------------------
# The device-prep variant
# ------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _preparation(request):
    """The device-prep backend case runs with the core's accelerator preparation (BackendCase)."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    case = params.get("backend", params.get("op_backend"))
    if not (isinstance(case, BackendCase) and case.variant == "device-prep"):
        yield
        return
    if not test_build():
        pytest.skip(NOT_A_TEST_BUILD)
    with test_hooks(device_preparation=True):
        yield
