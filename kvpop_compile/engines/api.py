"""``export(model, path, format=...)`` and ``load(path)``."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers
from torch import nn

from ..config import KVpopConfig, require_int
from ..fingerprints import weights_sha256
from ..kv_cache import KVpopCache
from ..transform import require_transformed
from . import aoti, onnx_engine, tensorrt
from .manifest import read_manifest, write_engine_folder
from .runner import EngineRunner
from .steps import DecodeStep, PrefillStep, row_major, state_names

FORMATS = {"aoti": aoti, "onnx": onnx_engine, "tensorrt": tensorrt}
# Formats that can carry the prefill step (its stable sort has no exact ONNX operator).
PREFILL_FORMATS = ("aoti",)
# Which step form each format runs: ONNX needs the updated cache as real outputs.
FUNCTIONAL = {"aoti": False, "onnx": True, "tensorrt": True}
MODEL_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings",
)  # fmt: skip


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _model_description(model: nn.Module) -> dict:
    config = model.config
    description = {name: getattr(config, name, None) for name in MODEL_FIELDS}
    description["dtype"] = _dtype_name(next(model.parameters()).dtype)
    return description


def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")


def export(
    model: nn.Module,
    path: str | os.PathLike,
    format: str = "aoti",
    *,
    batch: int = 1,
    prefill_length: int | None = None,
) -> Path:
    """Export a transformed model's decode step (and a prefill step for prompts of
    ``prefill_length`` tokens, if given) as an engine folder at ``path``.

    Shapes are static: ``batch`` sequences per call. Returns the folder.
    """
    _check_format(format)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    config = require_transformed(model, "before exporting it")
    require_int("batch", batch, 1)
    if prefill_length is not None:
        require_int("prefill_length (or None)", prefill_length, 2)
    if prefill_length is not None and format not in PREFILL_FORMATS:
        raise ValueError(
            f"the {format} format exports the decode step only (prefill sorts priorities, which "
            f"has no exact ONNX equivalent); use prefill_length=None: prompts then run through "
            f"the decode step"
        )
    model.eval()
    device = next(model.parameters()).device
    # Allocate the cache with one real prefill, so every state tensor has its true shape.
    cache = KVpopCache(model.config.num_hidden_layers, config)
    warmup = torch.zeros(batch, 2, dtype=torch.int64, device=device)
    with torch.no_grad():
        model(input_ids=warmup, cache=cache, use_cache=True)
    # Row-major examples: the runner passes every input in the strides it was exported with.
    state = [row_major(t) for layer in cache.layers for t in layer.state.tensors()]
    names = state_names(model.config.num_hidden_layers)
    functional = FUNCTIONAL[format]
    token = torch.zeros(batch, 1, dtype=torch.int64, device=device)
    steps = {"decode": (DecodeStep(model, functional=functional), (token, *state))}
    if prefill_length is not None:
        prompt = torch.zeros(batch, prefill_length, dtype=torch.int64, device=device)
        steps["prefill"] = (PrefillStep(model, functional=functional), (prompt, *state))
    manifest = {
        "format": format,
        "steps": sorted(steps),
        "batch": batch,
        "prefill_length": prefill_length,
        "model": _model_description(model),
        "weights_sha256": weights_sha256(model),
        "kvpop_config": config.to_dict(),
        "state": [
            {"name": n, "shape": list(t.shape), "dtype": _dtype_name(t.dtype)}
            for n, t in zip(names, state, strict=True)
        ],
        "device": device.type,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    # Each engine file records these too, so files of different exports are never mixed.
    identity = {key: manifest[key] for key in ("weights_sha256", "kvpop_config")}
    return write_engine_folder(
        Path(path), lambda folder: FORMATS[format].build(steps, folder, identity), manifest
    )


def _check_config(manifest: dict, config: KVpopConfig, whose: str) -> None:
    for key, value in config.to_dict().items():
        if manifest["kvpop_config"].get(key) != value:
            raise ValueError(
                f"engine mismatch: exported with {key}={manifest['kvpop_config'].get(key)!r}, "
                f"{whose} {key}={value!r}"
            )


def _check_model(manifest: dict, model: nn.Module) -> None:
    """Refuse an engine exported for another architecture, KVpop config or weights."""
    for key, value in _model_description(model).items():
        if manifest["model"].get(key) != value:
            raise ValueError(
                f"engine mismatch: exported for a model with {key}="
                f"{manifest['model'].get(key)!r}, this model has {key}={value!r}"
            )
    # The same weights under another budget run another policy.
    model_config = getattr(model, "kvpop_config", None)
    if model_config is not None:
        _check_config(manifest, model_config, "this model is transformed with")
    # Same architecture is not the same model: the engine carries the exported weights.
    if manifest["weights_sha256"] != weights_sha256(model):
        raise ValueError(
            "engine mismatch: exported from other weights (the SHA-256 of this model's "
            f"state_dict is not the recorded {manifest['weights_sha256']!r}); export this "
            "model to get its engine"
        )


def _check_step_files(folder: Path, manifest: dict) -> None:
    suffix = FORMATS[manifest["format"]].SUFFIX
    for step in manifest["steps"]:
        if f"{step}{suffix}" not in manifest["files"]:
            raise ValueError(
                f"{folder / 'manifest.json'} lists the {step} step but not its file "
                f"{step}{suffix}: it is not a complete engine; re-export the model"
            )


def load(
    path: str | os.PathLike,
    *,
    config: KVpopConfig | None = None,
    model: nn.Module | None = None,
    cuda_graph: bool = False,
) -> EngineRunner:
    """Open an engine folder. With ``config`` or ``model`` given, refuse an engine exported for a
    different KVpop config, or for a model of another architecture, KVpop config or weights
    (the weights, scorers included, are hashed: a few seconds per GB). Every engine file
    records the weights' SHA-256 and the KVpop config it was exported from, and its inputs'
    shapes and dtypes; a file that disagrees with the manifest (copied in from another export,
    or a manifest edited to state another cache) is refused before it runs. ``cuda_graph``
    replays an AOTInductor engine's decode step on a CUDA device from one CUDA graph.

    An engine folder is code: an AOTInductor package is a shared library, loaded into this
    process. The hashes catch damaged, edited or mixed-up folders, not a forged one (they are
    unkeyed, and whoever can write the folder can write the code it runs), so load only engine
    folders you exported or got from a source you trust."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if config is not None and not isinstance(config, KVpopConfig):
        raise TypeError(f"config must be a KVpopConfig or None, got {type(config).__name__}")
    if model is not None and getattr(model, "config", None) is None:
        raise TypeError(
            f"model must be a Hugging Face model (with a .config) or None, got "
            f"{type(model).__name__}"
        )
    folder = Path(path)
    manifest = read_manifest(folder)
    _check_format(manifest["format"])
    _check_step_files(folder, manifest)
    if config is not None:
        _check_config(manifest, config, "expected")
    if model is not None:
        _check_model(manifest, model)
    steps = FORMATS[manifest["format"]].open_steps(folder, manifest)
    return EngineRunner(folder, manifest, steps, device=manifest["device"], cuda_graph=cuda_graph)
