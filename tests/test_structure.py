"""The code's shape, read from its syntax trees: tiers without import cycles, MLflow behind the
tracking package, modules and functions of a readable size (README, "Architecture")."""

import ast
from pathlib import Path
from typing import Dict, Set

PACKAGE = Path(__file__).resolve().parent.parent / "bwopt"
MAX_MODULE_LINES = 400
MAX_PARAMETERS = 7


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST) -> Set[str]:
    """Every module named by an import, functions' own included; `if TYPE_CHECKING:` blocks left out."""
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def trees() -> Dict[str, ast.AST]:
    return {module_name(path): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def dependencies() -> Dict[str, Set[str]]:
    modules = trees()
    return {name: {other for other in imports(tree) if other in modules} for name, tree in modules.items()}


def cycle_through(start: str, graph: Dict[str, Set[str]]):
    """A path start -> ... -> start, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for successor in graph[node]:
            if successor == start:
                return path + [start]
            if successor not in seen:
                seen.add(successor)
                stack.append((successor, path + [successor]))
    return None


def test_no_module_imports_one_that_imports_it_back():
    graph = dependencies()
    # A package's __init__ re-exporting its own modules is the package, not a cycle.
    graph = {name: {dep for dep in deps if not name.startswith(dep + ".")} for name, deps in graph.items()}
    cycles = [cycle_through(name, graph) for name in graph]
    assert [" -> ".join(cycle) for cycle in cycles if cycle] == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycle_through("a", {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_through("a", {"a": {"b"}, "b": set()}) is None


def test_only_the_tracking_package_imports_mlflow():
    outside = [
        name
        for name, tree in trees().items()
        if not name.startswith("bwopt.tracking") and any(module.split(".")[0] == "mlflow" for module in imports(tree))
    ]
    assert outside == []


def test_modules_and_functions_stay_readable():
    long_modules = {
        module_name(path): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    wide = []
    for name, tree in trees().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                count = len([argument for argument in arguments if argument.arg not in ("self", "cls")])
                if count > MAX_PARAMETERS:
                    wide.append(f"{name}.{node.name}: {count}")
    assert long_modules == {} and wide == []


def test_the_tiers_import_only_downward():
    """launch -> modes -> run -> workload and summary: none of them imports one above it."""
    graph = dependencies()
    order = ["bwopt.app", "bwopt.launch", "bwopt.modes", "bwopt.run", "bwopt.workload"]
    for position, module in enumerate(order):
        above = set(order[:position])
        assert graph[module] & above == set(), module
    assert graph["bwopt.summary"] & {*order, "bwopt.summary"} == set()
