"""design.md §6 is the index of the tests: every test it cites exists, and every module of the
package has a test file of its own name or a row in §6's table of modules tested elsewhere."""

import ast
import re
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
PACKAGE = ROOT / "kvpop_compile"


def _section(title_start: str) -> str:
    text = DESIGN.read_text()
    start = text.index(title_start)
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
    }


def cited_tests(text: str) -> list[tuple[str, str | None]]:
    """``(test file, test name or None)`` for every test the text cites. In a table cell, a bare
    `` `test_x` `` names a test of the file cited last before it in the same cell."""
    cited = []
    for cell in re.split(r"\||\n", text):
        current = None
        for span in re.findall(r"`([^`]+)`", cell):
            file, _, name = span.partition("::")
            if file.startswith("tests/") and file.endswith(".py") and "<" not in file:
                current = file
                cited.append((file, name or None))
            elif current and re.fullmatch(r"test_\w+", span):
                cited.append((current, span))
    return cited


def test_every_test_design_cites_exists():
    cited = cited_tests(_section("## 6. Invariants"))
    assert len(cited) > 50, "the citations were not found"
    missing = []
    for file, name in cited:
        path = ROOT / file
        if not path.is_file():
            missing.append(file)
        elif name is not None and name not in _defined_names(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"design.md §6 cites tests that do not exist: {missing}"


def indexed_modules(text: str) -> set[str]:
    """The module patterns (relative to the package, e.g. ``passes/*.py``) in the first column of
    the table of modules tested elsewhere."""
    table = text[text.index("### Where each module is tested") :]
    patterns = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first_column = line.split("|")[1]
            patterns.update(re.findall(r"`([\w/*.]+\.py)`", first_column))
    return patterns


def test_every_module_has_a_test_file_or_an_index_row():
    test_files = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    patterns = indexed_modules(_section("## 6. Invariants"))
    unindexed = []
    for module in sorted(PACKAGE.rglob("*.py")):
        relative = module.relative_to(PACKAGE).as_posix()
        if module.name == "__init__.py" or f"test_{module.stem}.py" in test_files:
            continue
        if not any(fnmatch(relative, pattern) for pattern in patterns):
            unindexed.append(relative)
    assert not unindexed, (
        "modules with neither a tests/**/test_<module>.py nor a row in design.md §6's table of "
        f"modules tested elsewhere: {unindexed}"
    )


def test_test_file_names_are_unique():
    # pytest imports test files by their name (rootdir mode, no __init__.py): two files of one
    # name in different folders would not both be collected.
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_the_index_reader_finds_bare_names_after_their_file():
    cell = "| `tests/a.py::test_one`, `test_two`, `tests/b.py` |"
    assert cited_tests(cell) == [
        ("tests/a.py", "test_one"),
        ("tests/a.py", "test_two"),
        ("tests/b.py", None),
    ]


def test_every_test_file_the_documents_name_exists():
    # experiments.md quotes files as they were when each measurement ran: history, not a map.
    documents = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"] + [
        path for path in (ROOT / "docs").glob("*.md") if path.name != "experiments.md"
    ]
    missing = [
        f"{document.relative_to(ROOT)}: {name}"
        for document in documents
        for name in re.findall(r"tests/[\w/]+\.py", document.read_text())
        if not (ROOT / name).is_file()
    ]
    assert not missing, missing


def test_every_op_has_a_kernel_a_reference_and_a_test_file_of_its_name():
    ops_source = (PACKAGE / "runtime" / "ops.py").read_text()
    ops = re.findall(r'"kvpop::(\w+)"', ops_source)
    assert len(ops) >= 7, f"the ops were not found in ops.py: {ops}"
    missing = [
        path
        for op in ops
        for path in (
            f"kvpop_compile/runtime/kernels/{op}.py",
            f"kvpop_compile/runtime/reference/{op}.py",
            f"tests/runtime/ops/test_{op}.py",
        )
        if not (ROOT / path).is_file()
    ]
    assert not missing, missing
