"""The import graph of a tree of Python files, read with ``ast`` (function-level and
``TYPE_CHECKING`` imports included: they hide a cycle as well as a module-level one does), and
the cycles in it. Used for the package's layering and for the scripts' own modules."""

import ast
from pathlib import Path


def modules(source: Path, prefix: tuple[str, ...] = ()) -> dict[str, Path]:
    """Every module under ``source`` by dotted name (``prefix`` first, e.g. the package's name);
    a package by its front file."""
    found = {}
    for path in sorted(source.rglob("*.py")):
        parts = (*prefix, *path.relative_to(source).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports. ``from package import name`` is an
    import of the submodule ``package.name`` when there is one, else of the package's front
    file; relative imports are resolved."""
    path = known[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source not in known:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports) as a closed path, or None.
    Depth-first search; a module met again while still on the path closes a cycle."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [name, target]
            if target not in state:
                cycle = visit(target, path + [name])
                if cycle:
                    return cycle
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name, [])
            if cycle:
                return cycle
    return None
