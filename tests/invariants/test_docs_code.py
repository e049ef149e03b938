"""The code on README.md, in docs/*.md and in benchmarks/README.md runs, and its command lines
name real verbs and flags.

Every fenced ``python`` block runs in a fresh interpreter (``sys.executable -c``) from an empty
temporary folder, so a block that writes files leaves the repository alone; it must exit with
status 0 within :data:`TIMEOUT_S`. A block that cannot run here (it needs a CUDA GPU, vLLM, or a
long training run) is marked by an HTML comment on the line just before its fence::

    <!-- not run: needs a CUDA GPU -->

and is skipped with that reason, after a check that every name it imports from
``kvpop_compile`` (and every ``kc.name`` it reads) still exists.

Every ``kvpop-compile VERB --flag ...`` in a shell block or an inline code span (but the inline
ones of the dated records in :data:`RECORDS`) is checked against the parser the command line
builds: the verb must be one of its subcommands and each flag one of that subcommand's option
strings (options after a bare ``--`` belong to another program and are not checked). Nothing on
a command line is executed.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpop_compile.cli.arguments import Refused

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
]
RECORDS = {ROOT / "docs" / "experiments.md"}
"""Dated records: their inline commands are quoted as they were run, so they are not checked
against today's parser (their code blocks are, like everyone's)."""
TIMEOUT_S = 300
"""Per block. A block should take seconds; the first ``kc.compile`` on a machine fills
Inductor's cache, which takes longer."""

PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console", "zsh"}
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<language>[\w+-]*)")
PROGRAM = "kvpop-compile"


@dataclass(frozen=True)
class Fence:
    """One fenced block of a markdown file."""

    language: str  # as written after the fence, lower case ("" for none)
    start: int  # index of the opening fence's line, from 0
    end: int  # index of the closing fence's line (the last line if the file ends first)
    body: list[str]  # its lines, less the fence's indentation


def fences(lines: list[str]) -> list[Fence]:
    """The fenced blocks of a markdown file's ``lines``, in order."""
    found: list[Fence] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        body = [line[indent:] if not line[:indent].strip() else line for line in lines[i + 1 : j]]
        found.append(Fence(opening["language"].lower(), i, min(j, len(lines) - 1), body))
        i = j + 1
    return found


@dataclass(frozen=True)
class Block:
    """One python or shell block of a markdown file."""

    document: Path
    language: str  # "python" or "shell"
    index: int  # among the document's blocks of that language, from 1
    line: int  # of the opening fence, from 1
    code: str
    not_run: str | None  # the reason a "not run" comment gives, if any

    @property
    def name(self) -> str:
        where = self.document.relative_to(ROOT)
        return f"{where} {self.language} block {self.index} (line {self.line})"


def fenced_blocks(document: Path) -> list[Block]:
    """The python and shell blocks of ``document``, in order, numbered per language."""
    lines = document.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    counts = {"python": 0, "shell": 0}
    for fence in fences(lines):
        if fence.language in PYTHON:
            kind = "python"
        elif fence.language in SHELL:
            kind = "shell"
        else:
            continue
        counts[kind] += 1
        marker = NOT_RUN.match(lines[fence.start - 1]) if fence.start > 0 else None
        blocks.append(
            Block(
                document=document,
                language=kind,
                index=counts[kind],
                line=fence.start + 1,
                code="\n".join(fence.body) + "\n",
                not_run=marker["reason"] if marker else None,
            )
        )
    return blocks


def python_blocks() -> list[Block]:
    return [b for d in DOCUMENTS for b in fenced_blocks(d) if b.language == "python"]


def _block_id(block: Block) -> str:
    return f"{block.document.relative_to(ROOT)}:python-{block.index}"


def _environment() -> dict[str, str]:
    """The test's environment, with this checkout first on the import path and a plotting
    backend that needs no display."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("MPLBACKEND", "Agg")
    return env


def check_kvpop_names(block: Block) -> list[str]:
    """Names a block imports from ``kvpop_compile`` (or reads as ``alias.name`` of an imported
    ``kvpop_compile`` module) that do not exist; an empty list when all do."""
    tree = ast.parse(block.code, filename=block.name)
    missing: list[str] = []
    modules: dict[str, types.ModuleType] = {}  # alias in the block -> kvpop_compile module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "kvpop_compile":
                    continue
                try:
                    module = importlib.import_module(alias.name)
                except ImportError as error:
                    missing.append(f"import {alias.name} ({error})")
                    continue
                if alias.asname:
                    modules[alias.asname] = module
                else:
                    modules["kvpop_compile"] = importlib.import_module("kvpop_compile")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == (
            "kvpop_compile"
        ):
            try:
                module = importlib.import_module(node.module)
            except ImportError as error:
                missing.append(f"from {node.module} import ... ({error})")
                continue
            for alias in node.names:
                if hasattr(module, alias.name):
                    value = getattr(module, alias.name)
                else:
                    try:
                        value = importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"from {node.module} import {alias.name}")
                        continue
                if isinstance(value, types.ModuleType):
                    modules[alias.asname or alias.name] = value
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and not hasattr(modules[node.value.id], node.attr)
        ):
            missing.append(f"{node.value.id}.{node.attr}")
    return missing


@pytest.mark.parametrize("block", python_blocks(), ids=_block_id)
def test_python_block_runs(block: Block, tmp_path: Path):
    if block.not_run is not None:
        missing = check_kvpop_names(block)
        assert not missing, f"{block.name} (not run) names what does not exist: {missing}"
        pytest.skip(f"{block.name}: not run: {block.not_run}")
    try:
        result = subprocess.run(
            [sys.executable, "-c", block.code],
            cwd=tmp_path,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.name} ran for more than {TIMEOUT_S} s:\n{block.code}")
    assert result.returncode == 0, (
        f"{block.name} exited with status {result.returncode}:\n{block.code}\n"
        f"--- stderr (last lines) ---\n{result.stderr[-4000:]}"
    )


# Command lines ---------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def command_lines(document: Path) -> list[tuple[int, str]]:
    """``(line number, command)`` of every ``kvpop-compile`` command in ``document``: each
    command of its shell blocks (backslash continuations joined, comments dropped) and each
    inline code span of its text outside code blocks."""
    lines = document.read_text(encoding="utf-8").splitlines()
    found: list[tuple[int, str]] = []
    prose = list(lines)
    for fence in fences(lines):
        prose[fence.start : fence.end + 1] = [""] * (fence.end + 1 - fence.start)
        if fence.language not in SHELL:
            continue
        command, first = "", None
        for number, line in enumerate(fence.body, start=fence.start + 2):
            first = number if first is None else first
            line = re.sub(r"(^|\s)#.*$", "", line)
            if line.rstrip().endswith("\\"):
                command += line.rstrip()[:-1] + " "
                continue
            command += line
            if PROGRAM in command:
                found.append((first, " ".join(command.split())))
            command, first = "", None
    if document in RECORDS:
        return found
    text = "\n".join(prose)
    for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        if PROGRAM in span[1]:
            found.append((text.count("\n", 0, span.start()) + 1, " ".join(span[1].split())))
    return found


def unknown_flags(line: str, parser: argparse.ArgumentParser) -> list[str]:
    """What on one command line the parser does not know: a verb that is not a subcommand, or a
    flag that is not one of its verb's option strings."""
    verbs = _subcommands(parser)
    problems: list[str] = []
    for command in re.split(r"&&|\|\||;|\|", line):
        tokens = command.split()
        if PROGRAM not in tokens:
            continue
        tokens = tokens[tokens.index(PROGRAM) + 1 :]
        options = parser._option_string_actions
        if tokens and not tokens[0].startswith("-"):
            verb = tokens.pop(0)
            if not re.fullmatch(r"[a-z][a-z0-9-]*", verb):
                continue  # a placeholder such as VERB or <verb>
            if verb not in verbs:
                problems.append(f"unknown verb {verb!r}")
                continue
            options = verbs[verb]._option_string_actions
        for token in tokens:
            token = token.strip("[](){}.,;:")
            if token in ("--", ""):
                if token == "--":
                    break  # the rest goes to another program (vLLM's server)
                continue
            flag = re.fullmatch(r"(--?[A-Za-z][\w-]*)(=.*)?", token)
            if not flag:
                continue
            action = options.get(flag[1])
            if action is None:
                problems.append(f"unknown flag {flag[1]!r}")
            elif isinstance(action, Refused):
                problems.append(f"refused flag {flag[1]!r} (use {action.use})")
            elif flag[1] in getattr(action, "deprecated", ()):
                problems.append(f"deprecated flag {flag[1]!r} (use {action.option_strings[0]})")
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_command_lines_use_verbs_and_flags_the_parser_knows(document: Path):
    from kvpop_compile.cli.parser import build_parser

    parser = build_parser()
    problems = [
        f"{document.relative_to(ROOT)}:{number}: {problem} in {line.strip()!r}"
        for number, line in command_lines(document)
        for problem in unknown_flags(line, parser)
    ]
    assert not problems, "\n".join(problems)


def test_the_command_check_catches_unknown_verbs_and_flags():
    from kvpop_compile.cli.parser import build_parser

    parser = build_parser()
    assert unknown_flags("kvpop-compile demo --items 2 --no-image", parser) == []
    assert unknown_flags("kvpop-compile serve m --port 1 -- --dtype float32", parser) == []
    assert unknown_flags("kvpop-compile serve m --scorer x", parser) == [
        "refused flag '--scorer' (use --scorer-path)"
    ]
    assert unknown_flags("kvpop-compile eval --scorers x", parser) == [
        "deprecated flag '--scorers' (use --scorer-root)"
    ]
    assert unknown_flags("kvpop-compile demo --no-such-flag", parser) == [
        "unknown flag '--no-such-flag'"
    ]
    assert unknown_flags("pip install . && kvpop-compile nosuchverb", parser) == [
        "unknown verb 'nosuchverb'"
    ]


def test_every_document_has_its_blocks_found():
    """The extraction sees the README's runnable blocks (a broken fence pattern would find none
    and pass vacuously)."""
    readme = fenced_blocks(ROOT / "README.md")
    assert sum(b.language == "python" and b.not_run is None for b in readme) >= 3
    assert any(PROGRAM in b.code for b in readme if b.language == "shell")
