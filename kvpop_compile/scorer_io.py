"""Save and load a transformed model's scorers: ``scorer.safetensors`` + ``scorer.json``.

The JSON records what the tensors mean (scorer kind and sizes, window, model shapes) and the
SHA-256 of the tensors file; loading refuses a ``scorer.json`` whose config or shapes are not
valid, a scorer whose shapes or config do not match the model and names the mismatch, a tensors
file that is not the one saved (corrupted, truncated or swapped), tensors the model has no place
for (extra layers or names), integer tensors for floating-point parameters, and parameters that
are not finite (a NaN score never wins, so a NaN scorer silently freezes the pool). Each file
is written to a temporary name and renamed into place, tensors first and the JSON last, so an
interrupted save never leaves a folder that loads.
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
from .config import KVpopConfig, require_int
from .streaming_heads import check_streaming_recency, saved_streaming_heads
from .transform import require_transformed

FORMAT = "kvpop-scorer"
# Version 2 records the tensors file's SHA-256 (``tensors_sha256``); version 1 did not.
FORMAT_VERSION = 2
TENSORS_FILE = "scorer.safetensors"
CONFIG_FILE = "scorer.json"
# Config fields a trained scorer depends on: its architecture and the delay it was trained for.
SCORER_FIELDS = ("scorer", "scorer_hidden", "memory_dim", "memory_value_dim", "window")
SHAPE_FIELDS = ("num_layers", "num_kv_heads", "head_dim")


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
    # Every reader sees the same checks: a file saved_config would refuse never loads either.
    _kvpop_config(saved, folder)
    for key in SHAPE_FIELDS:
        if key in saved:
            try:
                require_int(key, saved[key], 1)
            except ValueError as error:
                raise ValueError(f"{folder / CONFIG_FILE}: {error}") from None
    return saved


def _kvpop_config(saved: dict, folder: Path) -> KVpopConfig:
    """The :class:`KVpopConfig` of a ``scorer.json``'s contents ``saved``, or ``ValueError``
    naming the file and the invalid field."""
    try:
        return KVpopConfig(**saved["kvpop_config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{folder / CONFIG_FILE} holds an invalid kvpop_config: {error}") from None


def read_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The verified tensors of a saved scorer folder: the file's SHA-256 must be the one saved
    in ``scorer.json``, the file must parse, every floating-point tensor must be finite, and
    every tensor must belong to one of the layers ``scorer.json`` records."""
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
    _check_layer_names(tensors, saved.get("num_layers"), file)
    return tensors


def _check_layer_names(tensors: dict[str, torch.Tensor], num_layers: int | None, where: Path):
    """Refuse tensors not named ``layers.<i>.<name>`` for a layer ``i < num_layers`` (the
    layers ``scorer.json`` records; any index when it records none)."""
    extra = [
        key for key in tensors if (index := _layer_index(key)) is None
        or (num_layers is not None and index >= num_layers)
    ]  # fmt: skip
    if extra:
        layers = "" if num_layers is None else f" with i < {num_layers} (its layers)"
        raise ValueError(
            f"{where} holds tensors of no layer: {_names(extra)}; {CONFIG_FILE} allows "
            f"layers.<i>.<name>{layers}"
        )


def _layer_index(key: str) -> int | None:
    """The layer ``i`` of a tensor named ``layers.<i>.<name>``, or None for any other name."""
    parts = key.split(".", 2)
    if len(parts) < 3 or parts[0] != "layers" or not parts[1].isdigit():
        return None
    return int(parts[1])


def _names(keys) -> str:
    """Tensor names for a message: sorted, the first ten and how many more."""
    keys = sorted(keys)
    more = f" and {len(keys) - 10} more" if len(keys) > 10 else ""
    return ", ".join(keys[:10]) + more


def tensors_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a saved scorer folder's tensors file, as its ``scorer.json`` records it:
    what tells one trained scorer from another."""
    return _read_description(_folder(path))["tensors_sha256"]


def saved_config(path: str | os.PathLike) -> KVpopConfig:
    """The :class:`KVpopConfig` a scorer folder was saved with (transform with it, then
    :func:`load_scorer`)."""
    folder = _folder(path)
    return _kvpop_config(_read_description(folder), folder)


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
    config = _kvpop_config(saved, folder).to_dict()
    # The random scorer is its seed; other scorers' seed only initialised what was loaded.
    random_scorer = expected["kvpop_config"]["scorer"] == "random"
    for key in (*SCORER_FIELDS, "seed") if random_scorer else SCORER_FIELDS:
        have, want = config[key], expected["kvpop_config"][key]
        if have != want:
            raise ValueError(
                f"scorer mismatch: saved with {key}={have!r}, the model is transformed with "
                f"{key}={want!r}"
            )
    tensors = read_tensors(folder)
    check_streaming_recency(saved_streaming_heads(tensors), model.kvpop_config.lam)
    load_layers([a.scorer for a in _attentions(model)], tensors)
    return model


def load_layers(scorers: list[nn.Module], tensors: dict[str, torch.Tensor]) -> None:
    """Load a saved scorer's ``tensors`` (:func:`read_tensors`) into the per-layer
    ``scorers`` (in place), refusing tensors of no layer, other names, shapes or an integer
    dtype for a floating-point parameter. All layers are checked before any is loaded."""
    layers = [layer_tensors(tensors, index) for index in range(len(scorers))]
    taken = {f"layers.{index}.{name}" for index, layer in enumerate(layers) for name in layer}
    extra = tensors.keys() - taken
    if extra:
        raise ValueError(
            f"scorer mismatch: the model has {len(scorers)} layers, the saved tensors "
            f"{_names(extra)} belong to none of them"
        )
    for index, (scorer, layer) in enumerate(zip(scorers, layers, strict=True)):
        check_layer(scorer, layer, index)
    for scorer, layer in zip(scorers, layers, strict=True):
        scorer.load_state_dict(layer)


def layer_tensors(tensors: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    """Layer ``index``'s tensors of a saved scorer (:func:`read_tensors`), named as in its
    scorer's ``state_dict``."""
    prefix = f"layers.{index}."
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def check_layer(scorer: nn.Module, layer: dict[str, torch.Tensor], index: int) -> None:
    """Raise ``ValueError`` unless one layer's saved tensors fit its ``scorer``: the same names
    and shapes, and a floating-point dtype wherever the parameter is floating point (an
    integer tensor would load as rounded numbers). ``index`` names the layer in the message."""
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
        if own[name].is_floating_point() and not tensor.is_floating_point():
            raise ValueError(
                f"scorer mismatch in layer {index}: {name} is {tensor.dtype}, the model's "
                f"{name} is {own[name].dtype}: a floating-point tensor is needed"
            )


def load_layer(scorer: nn.Module, layer: dict[str, torch.Tensor], index: int) -> None:
    """Load one layer's saved tensors into its ``scorer`` (in place), refusing what
    :func:`check_layer` refuses (``index`` names the layer in the message)."""
    check_layer(scorer, layer, index)
    scorer.load_state_dict(layer)
