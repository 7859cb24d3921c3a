"""The import rules of docs/architecture.md, checked on the source with `ast` (a lint rule, not a convention).

- The trainer stands on its own: nothing under reference_trainer/ imports rlbench.
- Floors: each folder (or root module) imports only its own floor or lower ones (FLOORS, lowest first).
- No import circles between modules, counting imports inside functions.
- A function-local import is either in a command (rlbench/commands/, rlbench/cli.py), or of an optional or
  heavy dependency: a third-party package in HEAVY, or a project module whose top-level imports reach one.
- Benchmarks run as a package (`python -m benchmarks.NAME`): no `sys.path` edits.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reference_trainer", "rlbench")

# Lowest first. A folder of a package, or a module at a package's root, is one unit; units on one line
# share a floor and may import each other (the no-circle rule still holds between their modules).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("reference_trainer.errors", "reference_trainer.inputs", "reference_trainer.option"),
    ("reference_trainer.trace",),
    ("reference_trainer.tasks",),
    ("reference_trainer.model",),
    ("reference_trainer.engine",),
    ("reference_trainer.speculation",),
    ("reference_trainer.rollout",),
    ("reference_trainer.modes",),
    ("reference_trainer.train",),
    ("rlbench.gguf_import", "rlbench.models", "rlbench.rundirs"),
    ("rlbench.eval", "rlbench.simulate", "rlbench.observe", "rlbench.perfetto"),
    ("rlbench.report",),
    ("rlbench.training", "rlbench.profiling", "rlbench.integrations", "rlbench.evaluate"),
    ("rlbench.reproduce",),
    ("rlbench.options", "rlbench.commands", "rlbench.cli"),
)
# Packages that are slow to import (torch, transformers, datasets, scipy, math-verify's sympy: 0.3-2.5 s
# each) or optional (ray, vllm, gguf, pynvml, ...): the only imports a non-command module may defer.
HEAVY = frozenset(
    [
        "torch",
        "transformers",
        "datasets",
        "scipy",
        "sympy",
        "math_verify",
        "latex2sympy2_extended",
        "plotly",
        "ray",
        "vllm",
        "gguf",
        "pynvml",
        "accelerate",
        "huggingface_hub",
        "jsonschema",
        "safetensors",
        "arctic_inference",
    ]
)
COMMAND_UNITS = ("rlbench.commands", "rlbench.cli")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _unit(module: str) -> str:
    """The floor unit of a module: its package's first-level folder or root module."""
    return ".".join(module.split(".")[:2])


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Fully qualified names an import statement brings in (a submodule when `from pkg import sub`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if MODULES[module].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def _project_module(name: str) -> str | None:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


@cache
def _imports(module: str) -> tuple[list[tuple[str, int, bool]], ...]:
    """(imported name, line, at top level) for every import statement of a module."""
    tree = ast.parse(MODULES[module].read_text())
    top_level = set()
    for stmt in tree.body:  # module-level if/try blocks (optional dependencies, TYPE_CHECKING) are top level
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.If, ast.Try)):
            top_level.update(id(n) for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append([(t, node.lineno, id(node) in top_level) for t in _targets(module, node)])
    return tuple(found)


def _edges(top_level_only: bool = False) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module in MODULES:
        for statement in _imports(module):
            for name, _, top in statement:
                target = _project_module(name)
                if target and target != module and (top or not top_level_only):
                    edges[module].add(target)
    return edges


@cache
def _heavy(module: str) -> bool:
    """A project module whose top-level imports reach a HEAVY package."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for statement in _imports(current):
            for name, _, top in statement:
                if not top:
                    continue
                if name.split(".")[0] in HEAVY:
                    return True
                if target := _project_module(name):
                    todo.append(target)
                elif name.split(".")[0] in PACKAGES:  # `import rlbench` style: the package __init__
                    todo.append(name.split(".")[0])
    return False


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_the_trainer_imports_nothing_of_rlbench() -> None:
    offenders = [
        f"{_where(module, line)} imports {name}"
        for module in MODULES
        if module.startswith("reference_trainer")
        for statement in _imports(module)
        for name, line, _ in statement
        if name.split(".")[0] == "rlbench"
    ]
    assert not offenders, "\n".join(offenders)


def test_every_unit_has_a_floor() -> None:
    placed = {unit for floor in FLOORS for unit in floor}
    units = {_unit(m) for m in MODULES if "." in m}
    assert units <= placed, f"units without a floor in FLOORS: {sorted(units - placed)}"


def test_imports_go_to_the_same_floor_or_lower() -> None:
    floor_of = {unit: i for i, floor in enumerate(FLOORS) for unit in floor}
    offenders = []
    for module in MODULES:
        if "." not in module:
            continue
        for statement in _imports(module):
            for name, line, _ in statement:
                target = _project_module(name)
                if target is None or "." not in target:
                    continue
                if floor_of[_unit(target)] > floor_of[_unit(module)]:
                    offenders.append(f"{_where(module, line)}: {_unit(module)} imports {target} (upward)")
    assert not offenders, "\n".join(offenders)


def test_no_import_circles() -> None:
    edges = _edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(sorted([v, *component]))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert not circles, f"import circles: {circles}"


def test_function_local_imports_are_heavy_optional_or_in_commands() -> None:
    offenders = []
    for module in MODULES:
        if _unit(module) in COMMAND_UNITS:
            continue
        for statement in _imports(module):
            for name, line, top in statement:
                if top or name.split(".")[0] in HEAVY:
                    continue
                target = _project_module(name)
                if target is not None and _heavy(target):
                    continue
                offenders.append(f"{_where(module, line)}: local import of {name} (import it at the top)")
    assert not offenders, "\n".join(offenders)


def test_benchmarks_do_not_edit_sys_path() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("benchmarks", "faults")
        for path in sorted((ROOT / folder).glob("*.py"))
        if "sys.path" in path.read_text()
    ]
    assert not offenders, (
        f"run benchmarks as `python -m benchmarks.NAME` instead of editing sys.path: {offenders}"
    )


# Functions still over the size rule: none left. This list may only shrink.
LONG_FUNCTIONS_LEFT: frozenset[str] = frozenset()
# Files over the size rule: none left. This list may only shrink.
LONG_FILES_LEFT: frozenset[str] = frozenset()
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 450


def test_no_function_over_60_lines_and_no_file_over_450() -> None:
    long_functions, long_files = [], []
    for path in MODULES.values():
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        if len(text.splitlines()) > MAX_FILE_LINES and where not in LONG_FILES_LEFT:
            long_files.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES and f"{where}:{node.name}" not in LONG_FUNCTIONS_LEFT:
                    long_functions.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    assert not long_functions, "split by what they do:\n" + "\n".join(long_functions)
    assert not long_files, "\n".join(long_files)


def _names_kind(node: ast.AST) -> bool:
    """`x["kind"]`, `x.get("kind")`, `x.kind` or a variable `kind`."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind"
    return (isinstance(node, ast.Attribute) and node.attr == "kind") or (
        isinstance(node, ast.Name) and node.id == "kind"
    )


def test_trace_kinds_are_compared_by_name() -> None:
    """A trace event's kind is compared with trace/schema.py's constants, never a string literal."""
    from reference_trainer.trace import schema

    kinds = {*schema.NUMBERS, schema.HELDOUT}
    offenders = []
    for module, path in MODULES.items():
        if module == "reference_trainer.trace.schema":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            values = [
                e for s in sides for e in (s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s])
            ]
            literals = [v.value for v in values if isinstance(v, ast.Constant) and v.value in kinds]
            if literals and any(_names_kind(s) for s in sides):
                offenders.append(f"{_where(module, node.lineno)}: kind compared with {literals[0]!r}")
    assert not offenders, "\n".join(offenders)
