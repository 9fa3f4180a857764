"""The user's own code named by Hydra's `_target_` ("package.module.function"): checked without
running it, so that a wrong name fails before TensorFlow loads, then resolved when it is needed.

`check_target` finds the module's file (`importlib.util.find_spec`, which imports its parent
packages but not the module) and reads its syntax tree for a top-level `def`, `class`,
assignment or import of the name: a module that is not there, a name it does not define, or a
name bound to a literal that is not callable (a number, a string) is refused naming the key.
`resolve_target` imports it (the user's module may import TensorFlow) and checks it is callable.
"""

import ast
import importlib
import importlib.util
from typing import Callable

from bwopt.schema.checks import ConfigError

NOT_CALLABLE = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr)


def split_target(key: str, target: str):
    """('package.module', 'function') of `target`, or a ConfigError naming `key`."""
    module, _, attribute = (target or "").rpartition(".")
    if not module or not attribute or not all(part.isidentifier() for part in target.split(".")):
        raise ConfigError(
            f"{key}={target!r}: expected a dotted path package.module.function (Hydra's _target_ convention)"
        )
    return module, attribute


def check_target(key: str, target: str) -> None:
    """Refuse a `_target_` whose module cannot be found or does not define the name, without importing it.

    Raises:
        ConfigError: naming `key`, the value and what is wrong.
    """
    module, attribute = split_target(key, target)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:  # a parent package that is missing or fails to import
        raise ConfigError(
            f"{key}={target!r}: module {module!r} cannot be imported ({error}); check PYTHONPATH"
        ) from None
    if spec is None:
        raise ConfigError(f"{key}={target!r}: no module named {module!r}; put its folder on PYTHONPATH or install it")
    if not spec.origin or not spec.origin.endswith(".py"):
        return  # a compiled or namespace module: only importing it can tell
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read(), spec.origin)
    bound = top_level_binding(tree, attribute)
    if bound is None:
        raise ConfigError(f"{key}={target!r}: module {module!r} ({spec.origin}) defines no {attribute!r}")
    if isinstance(bound, NOT_CALLABLE):
        raise ConfigError(f"{key}={target!r}: {attribute!r} is a {type(bound).__name__.lower()}, not a function")


def top_level_binding(tree: ast.Module, name: str):
    """The node that binds `name` at the module's top level (a def, class, import or the value
    assigned), or None."""
    found = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            found = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node.value if node.value is not None else node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                found = node
        elif isinstance(node, (ast.If, ast.Try)):  # bound conditionally: trust it
            if any(
                top_level_binding(ast.Module(body=block, type_ignores=[]), name) is not None for block in _blocks(node)
            ):
                found = node
    return found


def _blocks(node):
    if isinstance(node, ast.If):
        return [node.body, node.orelse]
    return [node.body, node.orelse, node.finalbody, *[handler.body for handler in node.handlers]]


def resolve_target(key: str, target: str) -> Callable:
    """Import the user's callable.

    Raises:
        ConfigError: the module fails to import, lacks the name, or the name is not callable.
    """
    module_name, attribute = split_target(key, target)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module raising on import is the user's to see, in one line
        raise ConfigError(
            f"{key}={target!r}: importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from None
    function = getattr(module, attribute, None)
    if function is None:
        raise ConfigError(f"{key}={target!r}: module {module_name!r} has no attribute {attribute!r}")
    if not callable(function):
        raise ConfigError(f"{key}={target!r}: {attribute!r} is a {type(function).__name__}, not callable")
    return function
