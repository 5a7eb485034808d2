"""The package's imports read in one direction: no module imports another that (directly or through
others) imports it back, and no layer imports one above it. Read from the source with ast, so that
imports inside functions (deferred for start-up time) count as much as those at the top."""
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


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{module} ({LAYER_NAMES[layer_of(module)]}) imports {target} "
              f"({LAYER_NAMES[layer_of(target)]})"
              for module, targets in sorted(import_graph().items())
              for target in sorted(targets) if layer_of(target) > layer_of(module)]
    assert upward == []
