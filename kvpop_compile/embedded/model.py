"""Loading the embedded Qwen3 (``qwen3-stdlib/``, a plain Hugging Face checkpoint)."""

from __future__ import annotations

from pathlib import Path

import torch

EMBEDDED_MODEL = Path(__file__).resolve().parent / "qwen3-stdlib"
"""Folder of the shipped checkpoint: ``config.json``, ``model.safetensors``, card and split."""

_REQUIRED_FILES = ("config.json", "model.safetensors")


def load_embedded_model(
    dtype: torch.dtype = torch.float32, path: str | Path | None = None
) -> torch.nn.Module:
    """The embedded byte-level ``Qwen3ForCausalLM`` in eval mode.

    ``path`` defaults to :data:`EMBEDDED_MODEL`; any folder written by
    ``scripts/train_embedded_model.py`` works. Token ids are UTF-8 bytes (vocabulary 256); see
    :func:`kvpop_compile.embedded.corpus.encode`. Raises ``FileNotFoundError`` when the folder
    or one of its files is missing and ``RuntimeError`` when a file cannot be read as a
    checkpoint.
    """
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    folder = Path(path) if path is not None else EMBEDDED_MODEL
    if not folder.is_dir():
        raise FileNotFoundError(
            f"embedded model folder {str(folder)!r} does not exist; reinstall kvpop_compile or "
            "train one with scripts/train_embedded_model.py"
        )
    missing = [name for name in _REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"embedded model folder {str(folder)!r} lacks {', '.join(missing)}; reinstall "
            "kvpop_compile or retrain with scripts/train_embedded_model.py"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except Exception as error:  # transformers and safetensors raise many types for bad files
        raise RuntimeError(
            f"embedded model folder {str(folder)!r} could not be loaded ({error}); its files "
            "are corrupt or from an incompatible version"
        ) from error
    if not isinstance(model, Qwen3ForCausalLM):
        raise RuntimeError(
            f"embedded model folder {str(folder)!r} holds a {type(model).__name__}, "
            "not a Qwen3ForCausalLM"
        )
    return model.eval()
