"""Save and load a transformed model's scorers: ``scorer.safetensors`` + ``scorer.json``.

The JSON records what the tensors mean (scorer kind and sizes, window, model shapes) and the
SHA-256 of the tensors file; loading refuses a scorer whose shapes or config do not match the
model and names the mismatch, a tensors file that is not the one saved (corrupted, truncated or
swapped), and parameters that are not finite (a NaN score never wins, so a NaN scorer silently
freezes the pool). Each file is written to a temporary name and renamed into place, tensors
first and the JSON last, so an interrupted save never leaves a folder that loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ._version import __version__
from .atomic import atomic_write, sha256
from .config import KVpopConfig
from .transform import require_transformed

FORMAT = "kvpop-scorer"
# Version 2 records the tensors file's SHA-256 (``tensors_sha256``); version 1 did not.
FORMAT_VERSION = 2
TENSORS_FILE = "scorer.safetensors"
CONFIG_FILE = "scorer.json"
# Config fields a trained scorer depends on: its architecture and the delay it was trained for.
SCORER_FIELDS = ("scorer", "scorer_hidden", "memory_dim", "memory_value_dim", "window")


def _folder(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike folder, got {type(path).__name__}")
    return Path(path)


def _attentions(model: nn.Module):
    require_transformed(model)
    return [layer.self_attn for layer in model.model.layers]


def describe(config: KVpopConfig, *, num_layers: int, num_kv_heads: int, head_dim: int):
    """The JSON description saved beside a model's scorers."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "library_version": __version__,
        "num_layers": num_layers,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "kvpop_config": config.to_dict(),
    }


def _describe(model: nn.Module) -> dict:
    first = _attentions(model)[0]
    return describe(
        model.kvpop_config,
        num_layers=len(model.model.layers),
        num_kv_heads=first.scorer.num_kv_heads,
        head_dim=first.head_dim,
    )


def _check_finite(tensors: dict[str, torch.Tensor], where: Path) -> None:
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            count = int((~torch.isfinite(tensor)).sum())
            raise ValueError(
                f"{where}: {name} has {count} non-finite value(s) (NaN or inf); a scorer's "
                "parameters must all be finite"
            )


def save_scorers(scorers: list[nn.Module], description: dict, path: str | os.PathLike) -> Path:
    """Write per-layer ``scorers`` and their ``description`` to the folder ``path``, with the
    SHA-256 of the tensors file. Non-finite parameters are refused before anything is written."""
    folder = _folder(path)
    tensors = {
        f"layers.{i}.{name}": tensor.detach().contiguous().cpu()
        for i, scorer in enumerate(scorers)
        for name, tensor in scorer.state_dict().items()
    }
    _check_finite(tensors, folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / TENSORS_FILE, lambda tmp: save_file(tensors, tmp))
    # Hash the file as written, so loading checks exactly the bytes that are on disk.
    described = {**description, "tensors_sha256": sha256(folder / TENSORS_FILE)}
    text = json.dumps(described, indent=2, sort_keys=True)
    atomic_write(folder / CONFIG_FILE, lambda tmp: Path(tmp).write_text(text))
    return folder


def save_scorer(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write the scorers of a transformed model to the folder ``path`` (created if needed)."""
    attentions = _attentions(model)
    return save_scorers([a.scorer for a in attentions], _describe(model), path)


def _read_description(folder: Path) -> dict:
    """The checked contents of a saved scorer folder's ``scorer.json``."""
    for name in (CONFIG_FILE, TENSORS_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} not found: not a saved KVpop scorer folder")
    try:
        saved = json.loads((folder / CONFIG_FILE).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{folder / CONFIG_FILE} is not valid JSON: {error}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("kvpop_config"), dict):
        raise ValueError(f"{folder / CONFIG_FILE} is not a {FORMAT} file (no kvpop_config)")
    if saved.get("format") == FORMAT and saved.get("format_version") == 1:
        raise ValueError(
            f"{folder / CONFIG_FILE} is a {FORMAT} v1 file, which records no SHA-256 of "
            f"{TENSORS_FILE}, so its tensors cannot be verified; this kvpop_compile reads "
            f"v{FORMAT_VERSION}: save the scorer again (save_scorer) to record one"
        )
    if saved.get("format") != FORMAT or saved.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{folder / CONFIG_FILE} is not a {FORMAT} v{FORMAT_VERSION} file "
            f"(format {saved.get('format')!r}, version {saved.get('format_version')!r})"
        )
    digest = saved.get("tensors_sha256")
    if not isinstance(digest, str) or len(digest) != 64:
        raise ValueError(
            f"{folder / CONFIG_FILE} has no valid tensors_sha256 (a 64-digit hex SHA-256 of "
            f"{TENSORS_FILE}), got {digest!r}"
        )
    return saved


def read_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The verified tensors of a saved scorer folder: the file's SHA-256 must be the one saved
    in ``scorer.json``, the file must parse, and every floating-point tensor must be finite."""
    folder = _folder(path)
    saved = _read_description(folder)
    file = folder / TENSORS_FILE
    if sha256(file) != saved["tensors_sha256"]:
        raise ValueError(
            f"{file} is corrupted, truncated or not the file that was saved: its SHA-256 "
            f"differs from the one recorded in {folder / CONFIG_FILE}"
        )
    try:
        tensors = load_file(file)
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{file} is not a readable safetensors file: {error}") from None
    _check_finite(tensors, file)
    return tensors


def tensors_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a saved scorer folder's tensors file, as its ``scorer.json`` records it:
    what tells one trained scorer from another."""
    return _read_description(_folder(path))["tensors_sha256"]


def saved_config(path: str | os.PathLike) -> KVpopConfig:
    """The :class:`KVpopConfig` a scorer folder was saved with (transform with it, then
    :func:`load_scorer`)."""
    folder = _folder(path)
    saved = _read_description(folder)
    try:
        return KVpopConfig(**saved["kvpop_config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{folder / CONFIG_FILE} holds an invalid kvpop_config: {error}") from None


SHAPE_FIELDS = ("num_layers", "num_kv_heads", "head_dim")


def saved_shape(path: str | os.PathLike) -> dict[str, int | None]:
    """The model shape a scorer folder was saved for: ``num_layers``, ``num_kv_heads`` and
    ``head_dim`` (``None`` where ``scorer.json`` lacks one)."""
    saved = _read_description(_folder(path))
    return {key: saved.get(key) for key in SHAPE_FIELDS}


def check_shape(saved: dict, have: dict, what: str) -> None:
    """Raise ``ValueError`` unless the model shape a scorer was ``saved`` for equals ``have``
    (both keyed by :data:`SHAPE_FIELDS`); ``what`` begins the message."""
    for key in SHAPE_FIELDS:
        if saved.get(key) != have[key]:
            raise ValueError(f"{what}: saved for {key}={saved.get(key)}, the model has {have[key]}")


def load_scorer(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load scorers saved by :func:`save_scorer` into a transformed model (in place)."""
    folder = _folder(path)
    saved = _read_description(folder)
    expected = _describe(model)
    check_shape(saved, expected, "scorer mismatch")
    # The random scorer is its seed; other scorers' seed only initialised what was loaded.
    random_scorer = expected["kvpop_config"]["scorer"] == "random"
    for key in (*SCORER_FIELDS, "seed") if random_scorer else SCORER_FIELDS:
        have, want = saved["kvpop_config"].get(key), expected["kvpop_config"][key]
        if have != want:
            raise ValueError(
                f"scorer mismatch: saved with {key}={have!r}, the model is transformed with "
                f"{key}={want!r}"
            )
    load_layers([a.scorer for a in _attentions(model)], read_tensors(folder))
    return model


def load_layers(scorers: list[nn.Module], tensors: dict[str, torch.Tensor]) -> None:
    """Load a saved scorer's ``tensors`` (:func:`read_tensors`) into the per-layer
    ``scorers`` (in place), refusing other names or shapes."""
    for index, scorer in enumerate(scorers):
        load_layer(scorer, layer_tensors(tensors, index), index)


def layer_tensors(tensors: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    """Layer ``index``'s tensors of a saved scorer (:func:`read_tensors`), named as in its
    scorer's ``state_dict``."""
    prefix = f"layers.{index}."
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_layer(scorer: nn.Module, layer: dict[str, torch.Tensor], index: int) -> None:
    """Load one layer's saved tensors into its ``scorer`` (in place), refusing other names or
    shapes (``index`` names the layer in the message)."""
    own = scorer.state_dict()
    if layer.keys() != own.keys():
        raise ValueError(
            f"scorer mismatch in layer {index}: saved tensors {sorted(layer)} but the model's "
            f"scorer has {sorted(own)}"
        )
    for name, tensor in layer.items():
        if tensor.shape != own[name].shape:
            raise ValueError(
                f"scorer mismatch in layer {index}: {name} has shape {tuple(tensor.shape)}, "
                f"the model's has {tuple(own[name].shape)}"
            )
    scorer.load_state_dict(layer)
