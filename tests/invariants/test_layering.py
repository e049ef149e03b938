"""The package's layering, read from its source: imports form no cycle, no module imports the
front file (``__init__.py``) of a package it lives in, and every module imports only its own
floor and the floors below it.

Imports are read with ``ast`` wherever they appear (a function-level import hides a cycle as
well as a module-level one does), relative imports resolved. ``from package import name`` is an
import of the submodule ``package.name`` when there is one, else of the package's front file.
"""

import ast
from pathlib import Path

import pytest

ROOT = "kvpop_compile"
SOURCE = Path(__file__).resolve().parents[2] / ROOT

# Floors, lowest first. A name ending in ".*" stands for a package and everything in it; any
# other name is one module (a package's front file included). Every module must be listed.
FLOORS = [
    ("foundations", [f"{ROOT}._version", f"{ROOT}.config", f"{ROOT}.atomic", f"{ROOT}.optional",
                     f"{ROOT}.compatibility"]),
    ("reference", [f"{ROOT}.runtime.reference.*"]),
    ("kernels", [f"{ROOT}.runtime.kernels.*"]),
    ("ops", [f"{ROOT}.runtime.dispatch", f"{ROOT}.runtime.ops"]),
    ("scorers", [f"{ROOT}.runtime.scorers.*"]),
    ("cache and bounded attention", [
        f"{ROOT}.runtime.cache", f"{ROOT}.runtime.decode_step", f"{ROOT}.runtime.chunk_step",
        f"{ROOT}.runtime.bounded_attention", f"{ROOT}.runtime",
    ]),
    ("model", [
        f"{ROOT}.capture", f"{ROOT}.kv_cache", f"{ROOT}.cuda_graph", f"{ROOT}.passes.*",
        f"{ROOT}.modeling", f"{ROOT}.transform", f"{ROOT}.generation", f"{ROOT}.scorer_io",
    ]),
    ("applications", [
        f"{ROOT}.engines.*", f"{ROOT}.training.*", f"{ROOT}.evaluation.*", f"{ROOT}.embedded.*",
        f"{ROOT}.cli.*", f"{ROOT}.vllm.*", f"{ROOT}.__main__",
    ]),
    ("front", [ROOT]),
]  # fmt: skip


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name; a package by its front file."""
    modules = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = (ROOT, *path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The package's modules that module ``name`` imports."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source not in MODULES:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in MODULES else source)
    found.discard(name)
    return found


IMPORTS = {name: _imports(name) for name in MODULES}


def _floor(name: str) -> int:
    for level, (_, members) in enumerate(FLOORS):
        for member in members:
            if member.endswith(".*"):
                package = member[:-2]
                if name == package or name.startswith(package + "."):
                    return level
            elif name == member:
                return level
    raise AssertionError(f"{name} is on no floor: add it to FLOORS in {Path(__file__).name}")


def _violations() -> set[tuple[str, str]]:
    """Imports of a containing package's front file, or of a floor above the importer's."""
    bad = set()
    for name, targets in IMPORTS.items():
        for target in targets:
            front_of_own_package = name.startswith(target + ".")
            if front_of_own_package or _floor(target) > _floor(name):
                bad.add((name, target))
    return bad


def test_every_module_is_on_a_floor():
    for name in MODULES:
        _floor(name)


def test_imports_form_no_cycle():
    # Depth-first search; a module met again while still on the path closes a cycle.
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(IMPORTS[name]):
            if state.get(target) == "open":
                cycle = path[path.index(target) :] + [name, target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [name])
        state[name] = "done"

    for name in sorted(MODULES):
        if name not in state:
            visit(name, [])


def test_no_module_imports_its_front_file_or_a_floor_above():
    floors = {name: FLOORS[_floor(name)][0] for name in MODULES}
    found = sorted(_violations())
    lines = [
        f"{name} ({floors[name]}) imports {target} ({floors[target]})" for name, target in found
    ]
    assert not lines, "\n".join(lines)


def test_the_reader_sees_the_imports():
    # The walk itself: a relative import, a submodule import and a function-level import.
    assert f"{ROOT}.runtime.ops" in IMPORTS[f"{ROOT}.runtime.decode_step"]
    assert f"{ROOT}.runtime.kernels" in IMPORTS[f"{ROOT}.runtime.ops"]
    assert f"{ROOT}.runtime.reference.eviction" in IMPORTS[f"{ROOT}.runtime.reference.evict"]
