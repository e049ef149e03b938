"""The engine folder: engine files plus ``manifest.json``, written atomically and verified.

The manifest says what the engine is (format, model and KVpop config, the SHA-256 of the
weights it was exported from, dtypes, the cache state's names/shapes/dtypes, versions) and holds
a SHA-256 of every engine file, so a corrupted, truncated or swapped file is refused instead of
producing wrong tokens. It also holds the SHA-256 of its own content: the engine files were
built for exactly what the manifest says, so an edited manifest (a window, a batch) would
describe an engine that does not exist, and is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from .._version import __version__
from ..atomic import replace_folder, sha256

MANIFEST = "manifest.json"
# Version 2 adds the manifest's own hash and the weights' hash.
MANIFEST_VERSION = 2


def manifest_sha256(manifest: dict) -> str:
    """SHA-256 of a manifest's content (its own ``manifest_sha256`` entry left out), over the
    canonical JSON text, so it does not depend on indentation or key order."""
    content = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def write_engine_folder(path: Path, build: Callable[[Path], None], manifest: dict) -> Path:
    """Build into a temporary folder beside ``path``, hash every file, write the manifest, then
    move the folder into place. An existing engine folder at ``path`` is replaced only once the
    new one is complete; any other existing, non-empty folder is refused (never overwritten)."""
    path = Path(path)
    if path.exists() and any(path.iterdir()) and not (path / MANIFEST).is_file():
        raise FileExistsError(f"{path} exists and is not an engine folder; choose another path")

    def build_and_hash(staging: Path) -> None:
        build(staging)
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        complete = {
            **manifest,
            "manifest_version": MANIFEST_VERSION,
            "library_version": __version__,
            "files": {str(p.relative_to(staging)): sha256(p) for p in files},
        }
        complete["manifest_sha256"] = manifest_sha256(complete)
        (staging / MANIFEST).write_text(json.dumps(complete, indent=2, sort_keys=True))

    replace_folder(path, build_and_hash)
    return path


def read_manifest(path: Path) -> dict:
    """Read and verify an engine folder's manifest and files."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} not found: {path} is not an exported engine")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{manifest_path} is not valid JSON: {error}") from None
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise ValueError(
            f"{manifest_path} has manifest version {manifest.get('manifest_version')!r}; "
            f"this kvpop_compile reads version {MANIFEST_VERSION}: re-export the model"
        )
    if manifest.get("library_version") != __version__:
        raise ValueError(
            f"{path} was exported by kvpop_compile {manifest.get('library_version')!r}, this is "
            f"{__version__}: re-export the model with this version"
        )
    if manifest.get("manifest_sha256") != manifest_sha256(manifest):
        raise ValueError(
            f"{manifest_path} was edited or corrupted (its SHA-256 differs from the one recorded "
            f"at export): the engine files were built for the manifest as exported; re-export "
            f"the model to change a setting"
        )
    for name, digest in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"engine file {file} is missing")
        if sha256(file) != digest:
            raise ValueError(f"engine file {file} is corrupted or truncated (SHA-256 mismatch)")
    return manifest
