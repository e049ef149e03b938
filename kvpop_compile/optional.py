"""Optional dependencies, imported only when a feature asks for them, with an ``ImportError``
that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch


def import_extra(module: str, *, purpose: str, needs: str, extra: str) -> ModuleType:
    """``import module``, or an ``ImportError``: ``<purpose> needs <needs>: pip install
    'kvpop_compile[<extra>]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{purpose} needs {needs}: pip install 'kvpop_compile[{extra}]'"
        ) from error


def import_torch_tensorrt(purpose: str = "the tensorrt format") -> ModuleType:
    """torch_tensorrt, imported only when asked for; a clear ImportError without it or a GPU.
    Importing it registers torch.compile's ``tensorrt`` backend and TensorRT's runtime ops."""
    torch_tensorrt = import_extra(
        "torch_tensorrt",
        purpose=purpose,
        needs="torch-tensorrt, TensorRT and a CUDA GPU",
        extra="tensorrt",
    )
    if not torch.cuda.is_available():
        raise ImportError(f"{purpose} needs a CUDA GPU; none is available")
    return torch_tensorrt
