"""Writing files and folders so that a reader never sees half of one.

A file is written to a temporary name beside it and renamed over it; a folder is built beside
its target and swapped in once complete, the old one removed only after the swap. An
interrupted write leaves the previous file or folder as it was. ``sha256`` hashes what was
written, so that a reader can check it has the very bytes (saved scorers, engine folders).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def _plain_mode(path: str | Path, mode: int) -> None:
    """Give ``path`` the mode a plain ``open()`` (0o666) or ``mkdir()`` (0o777) would: the
    ``tempfile`` functions create files 0600 and folders 0700, private to their owner."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """``write(temporary_path)``, then rename it to ``path``: readers never see half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    try:
        write(temporary)
        _plain_mode(temporary, 0o666)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def replace_folder(path: Path, build: Callable[[Path], object]) -> Path:
    """``build(staging)`` into a new folder beside ``path``, then move it into place, replacing
    ``path`` if it exists (removed only once the new folder is in place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.building-"))
    try:
        _plain_mode(staging, 0o777)
        build(staging)
        if path.exists():
            retired = path.with_name(f".{path.name}.replaced")
            shutil.rmtree(retired, ignore_errors=True)
            path.rename(retired)
            staging.rename(path)
            shutil.rmtree(retired)
        else:
            staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def sha256(path: Path) -> str:
    """Hex SHA-256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
