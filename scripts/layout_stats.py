"""Layout statistics of the source tree, and the package crossings of one traced CLI run.

    python scripts/layout_stats.py                       # files, lines, largest file, circles, local imports
    python scripts/layout_stats.py --trace -- profile --mode sorted --steps 2 --eval-every 0 --out /tmp/p

The static part parses every module of `rlbench/` and `reference_trainer/` with `ast`. `--trace` runs the
CLI in this process under `sys.setprofile` and counts, for every call from one project module into another,
the calls that cross between the two top-level packages ("switches"), the distinct module pairs that do, and
the project files that ran. Prints one JSON object.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlbench", "reference_trainer")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    """The project modules an import statement names (a `from pkg import name` of a submodule counts as
    it)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known and name != module:
            out.append(name)
    return out


def static_stats() -> dict[str, object]:
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    local_all = local_project = 0
    lines = {}
    for module, path in known.items():
        text = path.read_text()
        lines[str(path.relative_to(ROOT))] = len(text.splitlines())
        tree = ast.parse(text)
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = imported(module, path, node, known)
            edges[module].update(targets)
            if id(node) not in top and not _module_level(tree, node):
                local_all += 1
                local_project += bool(targets)
    cycles = strongly_connected(known, edges)
    largest = max(lines.items(), key=lambda kv: kv[1])
    return {
        "files": len(known),
        "lines": sum(lines.values()),
        "largest_file": {"path": largest[0], "lines": largest[1]},
        "function_local_imports": local_all,
        "function_local_imports_of_project_modules": local_project,
        "module_circles": [sorted(c) for c in cycles],
        "cross_package_imports": sorted(
            f"{a} -> {b}"
            for a in edges
            for b in edges[a]
            if a.split(".")[0] != b.split(".")[0] and a.startswith("reference_trainer")
        ),
    }


def _module_level(tree: ast.Module, node: ast.AST) -> bool:
    """An import in a module-level `if`/`try` (TYPE_CHECKING, optional dependency) is not function-local."""
    for stmt in tree.body:
        if isinstance(stmt, (ast.If, ast.Try)) and any(n is node for n in ast.walk(stmt)):
            return not any(
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(stmt)
            )
    return False


def strongly_connected(nodes: dict[str, Path], edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def traced_run(argv: list[str]) -> dict[str, object]:
    roots = {package: str(ROOT / package) for package in PACKAGES}

    def package_of(filename: str) -> str | None:
        for package, root in roots.items():
            if filename.startswith(root):
                return package
        return None

    files: set[str] = set()
    pairs: Counter[tuple[str, str]] = Counter()
    switches = Counter()

    def profiler(frame, event, arg):  # noqa: ANN001, ANN202
        if event != "call":
            return
        callee = frame.f_code.co_filename
        callee_package = package_of(callee)
        if callee_package is None:
            return
        files.add(callee)
        caller = frame.f_back
        while caller is not None and package_of(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is None:
            return
        caller_package = package_of(caller.f_code.co_filename)
        if caller_package != callee_package:
            switches[f"{caller_package} -> {callee_package}"] += 1
            pairs[(caller.f_code.co_filename, callee)] += 1

    from rlbench.cli import app

    sys.argv = ["rlbench", *argv]
    sys.setprofile(profiler)
    try:
        app()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    rel = lambda p: str(Path(p).relative_to(ROOT))  # noqa: E731
    return {
        "command": "rlbench " + " ".join(argv),
        "project_files_run": len(files),
        "package_switches": sum(switches.values()),
        "package_switches_by_direction": dict(switches),
        "cross_package_module_pairs": len({(rel(a), rel(b)) for a, b in pairs}),
        # Calls from the trainer into rlbench can only be callbacks it was handed (it imports nothing there).
        "calls_into_rlbench": sorted(
            f"{rel(a)} -> {rel(b)}" for a, b in pairs if package_of(a) == "reference_trainer"
        ),
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    result: dict[str, object] = static_stats()
    if args[:1] == ["--trace"]:
        result["traced"] = traced_run(args[args.index("--") + 1 :])
    print(json.dumps(result, indent=1))
