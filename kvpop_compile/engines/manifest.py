"""The engine folder: engine files plus ``manifest.json``, written atomically and verified.

The manifest says what the engine is (format, model and KVpop config, the SHA-256 of the
weights it was exported from, dtypes, the cache state's names/shapes/dtypes, versions) and holds
a SHA-256 of every engine file, so a corrupted, truncated or swapped file is refused instead of
producing wrong tokens. It also holds the SHA-256 of its own content: the engine files were
built for exactly what the manifest says, so an edited manifest (a window, a batch) would
describe an engine that does not exist, and is refused.

These hashes are unkeyed: they catch accidents (a damaged copy, a hand edit, files mixed from
two exports), not someone who rewrites the folder, who could as well rewrite the engine's code.
Each engine file also records what it was built from (:mod:`.binding`), checked at load.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from .._version import __version__
from ..atomic import replace_folder, sha256

MANIFEST = "manifest.json"
# Version 2 adds the manifest's own hash and the weights' hash; version 3, engine files that
# record their own inputs and the weights and config they were exported from; version 4, the
# weights' hash of kvpop_compile.fingerprints.weights_sha256 (the one the benchmarks' results
# record), where versions 2 and 3 hashed the weights another way.
MANIFEST_VERSION = 4
OTHER_WEIGHTS_HASH = (2, 3)
"""Manifest versions whose ``weights_sha256`` no model's digest matches any more."""
STEPS = ("decode", "prefill")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64}  # fmt: skip
# The fields every manifest holds and the JSON types they have (None: JSON null).
FIELDS = {
    "manifest_version": int, "library_version": str, "manifest_sha256": str, "format": str,
    "steps": list, "batch": int, "prefill_length": (int, type(None)), "model": dict,
    "weights_sha256": str, "kvpop_config": dict, "state": list, "device": str,
    "torch_version": str, "transformers_version": str, "files": dict,
}  # fmt: skip
STATE_FIELDS = {"name": str, "shape": list, "dtype": str}
JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number",
              float: "a number", bool: "a boolean", type(None): "null"}  # fmt: skip


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


def _json_type(value) -> str:
    return JSON_NAMES.get(type(value), type(value).__name__)


def _has_type(value, kind) -> bool:
    # JSON true/false load as bools, which Python counts as ints: never a valid count.
    return isinstance(value, kind) and not isinstance(value, bool)


def _check_fields(manifest_path: Path, entries: dict, fields: dict, where: str = "") -> None:
    """Refuse a missing field or one of another JSON type, naming it and what is expected."""
    for name, kind in fields.items():
        field = f"{where}{name}"
        if name not in entries:
            raise ValueError(
                f"{manifest_path} lacks the field {field!r}: it is not a complete engine "
                f"manifest; re-export the model"
            )
        if not _has_type(entries[name], kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            raise ValueError(
                f"{manifest_path}: field {field!r} must be "
                f"{' or '.join(JSON_NAMES[k] for k in kinds)}, got {_json_type(entries[name])} "
                f"{entries[name]!r}"
            )


def _check_state(manifest_path: Path, state: list) -> None:
    for i, spec in enumerate(state):
        if not isinstance(spec, dict):
            raise ValueError(
                f"{manifest_path}: state[{i}] must be an object with name, shape and dtype, got "
                f"{_json_type(spec)} {spec!r}"
            )
        _check_fields(manifest_path, spec, STATE_FIELDS, where=f"state[{i}].")
        if not all(_has_type(size, int) and size >= 0 for size in spec["shape"]):
            raise ValueError(
                f"{manifest_path}: state[{i}].shape must be a list of sizes >= 0, got "
                f"{spec['shape']!r}"
            )
        if spec["dtype"] not in DTYPES:
            raise ValueError(
                f"{manifest_path}: state[{i}].dtype must be one of {', '.join(DTYPES)}, got "
                f"{spec['dtype']!r}"
            )


def _check_steps(manifest_path: Path, manifest: dict) -> None:
    steps, prefill_length = manifest["steps"], manifest["prefill_length"]
    if (
        not all(isinstance(step, str) for step in steps)
        or "decode" not in steps
        or not set(steps) <= set(STEPS)
        or len(set(steps)) != len(steps)
    ):
        raise ValueError(
            f"{manifest_path}: steps must be decode and optionally prefill, got {steps!r}"
        )
    if manifest["batch"] < 1 or (prefill_length is not None and prefill_length < 2):
        raise ValueError(
            f"{manifest_path}: batch must be >= 1 and prefill_length >= 2 or null, got batch "
            f"{manifest['batch']!r}, prefill_length {prefill_length!r}"
        )
    if ("prefill" in steps) != (prefill_length is not None):
        raise ValueError(
            f"{manifest_path}: a prefill step goes with a prefill_length, got steps {steps!r} "
            f"and prefill_length {prefill_length!r}"
        )
    if not _has_type(manifest["model"].get("vocab_size"), int):
        raise ValueError(
            f"{manifest_path}: model.vocab_size must be a number of token ids, got "
            f"{manifest['model'].get('vocab_size')!r}"
        )


def read_manifest(path: Path) -> dict:
    """Read and verify an engine folder's manifest and files: a JSON object with every field of
    :data:`FIELDS`, of this library's version, unedited, and every file it lists intact."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path} not found: {path} is not an exported engine")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{manifest_path} is not valid JSON: {error}") from None
    if not isinstance(manifest, dict):
        raise ValueError(
            f"{manifest_path} must hold a JSON object (format, steps, batch, state, files, ...), "
            f"got {_json_type(manifest)}: it is not an engine manifest"
        )
    if manifest.get("manifest_version") in OTHER_WEIGHTS_HASH:
        raise ValueError(
            f"{manifest_path} has manifest version {manifest['manifest_version']}, whose "
            f"weights_sha256 was computed another way than this kvpop_compile's (manifest "
            f"version {MANIFEST_VERSION}), so no model can be checked against it: re-export the "
            "model with this version"
        )
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
    _check_fields(manifest_path, manifest, FIELDS)
    _check_state(manifest_path, manifest["state"])
    _check_steps(manifest_path, manifest)
    for name, digest in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"engine file {file} is missing")
        if sha256(file) != digest:
            raise ValueError(f"engine file {file} is corrupted or truncated (SHA-256 mismatch)")
    return manifest
