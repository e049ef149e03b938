"""The package's layering, read from its source: imports form no cycle, no module imports the
front file (``__init__.py``) of a package it lives in, and every module imports only its own
floor and the floors below it.

Imports are read with ``ast`` wherever they appear (a function-level import hides a cycle as
well as a module-level one does), relative imports resolved. ``from package import name`` is an
import of the submodule ``package.name`` when there is one, else of the package's front file.
"""

from pathlib import Path

from import_graph import find_cycle, imports, modules

ROOT = "kvpop_compile"
SOURCE = Path(__file__).resolve().parents[2] / ROOT

# Floors, lowest first. A name ending in ".*" stands for a package and everything in it; any
# other name is one module (a package's front file included). Every module must be listed.
FLOORS = [
    ("foundations", [f"{ROOT}._version", f"{ROOT}.config", f"{ROOT}.atomic", f"{ROOT}.optional",
                     f"{ROOT}.compatibility", f"{ROOT}.fingerprints"]),
    ("policy", [f"{ROOT}.runtime.policy"]),
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
        f"{ROOT}.streaming_heads",
    ]),
    ("applications", [
        f"{ROOT}.engines.*", f"{ROOT}.training.*", f"{ROOT}.embedded.*",
        # evaluation: the modules its wings share, then one wing per command
        f"{ROOT}.evaluation", f"{ROOT}.evaluation.data", f"{ROOT}.evaluation.own_data",
        f"{ROOT}.evaluation.methods", f"{ROOT}.evaluation.protocols",
        f"{ROOT}.evaluation.statistics", f"{ROOT}.evaluation.plotting",
        f"{ROOT}.evaluation.quality.*", f"{ROOT}.evaluation.recall.*",
        f"{ROOT}.evaluation.bench.*", f"{ROOT}.evaluation.demo.*",
        f"{ROOT}.cli.*", f"{ROOT}.vllm.*", f"{ROOT}.__main__",
    ]),
    ("front", [ROOT]),
]  # fmt: skip


MODULES = modules(SOURCE, (ROOT,))
IMPORTS = {name: imports(name, MODULES) for name in MODULES}


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
    cycle = find_cycle(IMPORTS)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_scripts_imports_form_no_cycle():
    # The scripts import one another by their file names (scripts/ is on their path).
    scripts = modules(SOURCE.parent / "scripts")
    cycle = find_cycle({name: imports(name, scripts) for name in scripts})
    assert cycle is None, "import cycle in scripts/: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


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
    assert f"{ROOT}.runtime.policy" in IMPORTS[f"{ROOT}.runtime.reference.update_cache"]
