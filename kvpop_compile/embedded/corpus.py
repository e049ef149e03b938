"""The embedded model's corpus: the Python standard library's own ``.py`` files.

Every machine with Python carries this text, and nobody in this project wrote it. Files are
split by a hash of their path relative to the standard library folder, so the split needs no
list to reproduce and a file keeps its side of the split on every Python version that has it.
The lists actually used for the shipped model are recorded in its ``split.json``.

Excluded, so that the corpus is the same library code on every machine:

- ``site-packages`` / ``dist-packages``: installed third-party code, different everywhere;
- test folders (``test``, ``tests``, ``idle_test``): Debian and Ubuntu ship them in a separate
  package, so they are missing on many machines, and they are full of deliberately odd code;
- ``pydoc_data`` (a 750 KB generated string of documentation text), ``_sysconfigdata_*`` and the
  ``config-*`` build folder (generated for the machine that built Python), and the generated
  character-map tables in ``encodings`` (256-entry hex tables, 1.4 MB of near-identical files).
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

HELD_OUT_MODULUS = 10
"""A file is held out iff ``sha256(relative path) % HELD_OUT_MODULUS == 0`` (about 10%)."""

_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "pydoc_data", "__pycache__"}
)
# Header line of the tables that Tools/unicode/gencodec.py generates into encodings/.
_GENERATED_CODEC_MARK = b"generated from"


def stdlib_dir() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def _is_excluded(relpath: Path, root: Path) -> bool:
    parts = relpath.parts
    if _EXCLUDED_DIRS.intersection(parts[:-1]) or parts[0].startswith("config-"):
        return True
    if parts[-1].startswith("_sysconfigdata"):
        return True
    if parts[0] == "encodings":
        with open(root / relpath, "rb") as f:
            return _GENERATED_CODEC_MARK in f.read(1024).lower()
    return False


def list_files(root: str | Path | None = None) -> list[str]:
    """Relative POSIX paths of the corpus files under ``root`` (default: the stdlib), sorted."""
    root = Path(root) if root is not None else stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"standard library folder {str(root)!r} does not exist")
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if path.is_file() and not _is_excluded(rel, root):
            files.append(rel.as_posix())
    return sorted(files)


def is_held_out(relpath: str) -> bool:
    """Whether the file at ``relpath`` (POSIX, relative to the stdlib) is held out."""
    digest = hashlib.sha256(relpath.encode("utf-8")).hexdigest()
    return int(digest, 16) % HELD_OUT_MODULUS == 0


def split_files(root: str | Path | None = None) -> tuple[list[str], list[str]]:
    """``(train, held_out)`` relative paths, each sorted; disjoint by construction."""
    files = list_files(root)
    held_out = [f for f in files if is_held_out(f)]
    train = [f for f in files if not is_held_out(f)]
    return train, held_out


VALIDATION_DIR = "test"
"""The standard library's own test folder: code the corpus excludes (see above), so the model
never trained on it and no benchmark item is made from it."""
_VALIDATION_MARK = "test_grammar.py"
# Debian's libpython3.X-stdlib carries a stub of the folder (``support/``, ``libregrtest/``: a
# few hundred KB); the test suite itself, with this file, comes in libpython3.X-testsuite.


def validation_files(root: str | Path | None = None) -> list[str]:
    """Relative POSIX paths of the ``.py`` files under the standard library's ``test`` folder,
    sorted: text for choosing among trained scorers on code the model has not seen, without
    touching the held-out files the benchmarks ask about. A few are not UTF-8 on purpose (the
    tests of source encodings); items are bytes, as the model's tokens are.

    ``FileNotFoundError`` where the test suite is missing: Debian and Ubuntu ship it apart, in
    ``libpython3.X-testsuite``, and leave only a stub of the folder without it."""
    root = Path(root) if root is not None else stdlib_dir()
    folder = root / VALIDATION_DIR
    if not (folder / _VALIDATION_MARK).is_file():
        raise FileNotFoundError(
            f"the standard library's test suite is not in {str(folder)!r} (no "
            f"{_VALIDATION_MARK}): validation items are made from it; install it (on Debian "
            "and Ubuntu: libpython3.X-testsuite), or select on 'train' items"
        )
    files = [
        path.relative_to(root).as_posix()
        for path in folder.rglob("*.py")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    return sorted(files)


def read_bytes(relpath: str, root: str | Path | None = None) -> bytes:
    """The raw bytes of one corpus file (the model's tokens are these bytes)."""
    root = Path(root) if root is not None else stdlib_dir()
    return (root / relpath).read_bytes()


def read_held_out(root: str | Path | None = None) -> dict[str, str]:
    """Held-out texts by relative path (decoded as UTF-8; undecodable bytes are replaced)."""
    _, held_out = split_files(root)
    return {f: read_bytes(f, root).decode("utf-8", errors="replace") for f in held_out}


def encode(text: str | bytes) -> torch.Tensor:
    """Byte tokens of ``text``: its UTF-8 bytes as int64 ids in 0..255, shape (N,)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def decode(ids: torch.Tensor) -> str:
    """Text of byte tokens ``ids`` (shape (N,), values 0..255); bad UTF-8 is replaced."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be one-dimensional, got shape {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > 255):
        raise ValueError("ids must be byte tokens in 0..255")
    return bytes(ids.to(torch.uint8).tolist()).decode("utf-8", errors="replace")
