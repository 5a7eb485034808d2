"""The package's imports read in one direction: no module imports another that (directly or through
others) imports it back, no part of the package (a subpackage such as nn or global_batch, or a
top-level module such as functional) imports another part that imports it back, and no layer
imports one above it. Read from the source with ast, so that imports inside functions (deferred
for start-up time) count as much as those at the top."""
import ast
from pathlib import Path

PACKAGE = "scl_kernels"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE

# Lowest first. A module belongs to the first layer whose prefix it starts with; every module the
# list does not name (functional, backends, nn, compat, global_batch, ...) is the library.
UPPER_LAYERS = (
    ("distributed", (f"{PACKAGE}.distributed",)),
    ("integrations", (f"{PACKAGE}.integrations",)),
    ("finetune", (f"{PACKAGE}.finetune",)),
)
LAYER_NAMES = ("library",) + tuple(name for name, _ in UPPER_LAYERS)


def module_name(path):
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules():
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def imported_modules(node, importer, is_package, modules):
    """The package modules an ``import`` / ``from ... import`` node imports, resolved against its
    importer: ``from package import name`` imports the submodule where name is one, else the
    package itself."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules.keys()
    if node.level == 0:
        base = node.module
    else:
        anchor = importer.split(".")
        if not is_package:
            anchor = anchor[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names} & modules.keys()


def import_graph():
    """{module: {package modules it imports}}, only modules of the package."""
    modules = package_modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported |= imported_modules(node, name, is_package, modules)
        graph[name] = imported - {name}
    return graph


def part_of(module):
    """The part of the package a module belongs to: ``scl_kernels.nn`` for
    ``scl_kernels.nn.supcon``, ``scl_kernels.functional`` for itself, and the package's own
    ``__init__`` (``scl_kernels``) for itself."""
    return ".".join(module.split(".")[:2])


def part_graph(graph):
    """{part: {other parts it imports}}: the module graph with each module replaced by its part
    (imports inside one part dropped), so that a cycle through several modules of two parts, as
    nn.x -> global_batch.y -> nn.z, shows even though no module imports itself back."""
    parts = {part_of(module): set() for module in graph}
    for module, targets in graph.items():
        parts[part_of(module)] |= {part_of(target) for target in targets}
    return {part: targets - {part} for part, targets in parts.items()}


def layer_of(module):
    for name, prefixes in UPPER_LAYERS:
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return LAYER_NAMES.index(name)
    return 0


def cycles(graph):
    """Each cycle once, as the list of modules around it (strongly connected components of
    more than one module, by Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert f"{PACKAGE}.nn.supcon_cross_entropy" in graph
    assert f"{PACKAGE}.functional" in graph[f"{PACKAGE}.nn.supcon"]


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_the_part_graph_sees_the_package_and_deferred_imports():
    parts = part_graph(import_graph())
    assert {f"{PACKAGE}.nn", f"{PACKAGE}.global_batch", f"{PACKAGE}.distributed",
            f"{PACKAGE}.functional", f"{PACKAGE}.backends", PACKAGE} <= parts.keys()
    # SupConCrossEntropyLoss imports global_batch inside its methods only.
    assert f"{PACKAGE}.global_batch" in parts[f"{PACKAGE}.nn"]
    assert f"{PACKAGE}.nn" in parts[f"{PACKAGE}.distributed"]


def test_a_cycle_between_parts_is_found_where_modules_have_none():
    graph = {"p.a.x": {"p.b.y"}, "p.a.z": set(), "p.b.y": {"p.c"}, "p.b.w": {"p.a.z"}, "p.c": set()}
    assert cycles(graph) == []
    assert cycles(part_graph(graph)) == [["p.a", "p.b"]]


def test_no_import_cycle_between_parts_of_the_package():
    assert cycles(part_graph(import_graph())) == []


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{module} ({LAYER_NAMES[layer_of(module)]}) imports {target} "
              f"({LAYER_NAMES[layer_of(target)]})"
              for module, targets in sorted(import_graph().items())
              for target in sorted(targets) if layer_of(target) > layer_of(module)]
    assert upward == []
