"""Which implementation a ``kvpop`` op runs: the Triton kernel or the PyTorch reference.

CUDA tensors take the Triton kernels. CPU tensors take the reference, which Inductor and
AOTInductor can lower; under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is
first imported) :func:`triton_kernels_on_cpu` sends CPU tensors through the kernels too, so the
dispatch itself is tested on machines without a GPU. This module never imports triton.
"""

from __future__ import annotations

import contextlib
import os

import torch

_kernels_on_cpu = False


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (CPU tensors allowed)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether an op called on ``tensor`` runs its Triton kernel."""
    if tensor.device.type == "cuda":
        return True
    return _kernels_on_cpu and tensor.device.type == "cpu"


@contextlib.contextmanager
def triton_kernels_on_cpu():
    """Run the ``kvpop`` ops' Triton kernels on CPU tensors, through Triton's interpreter.

    Raises:
        RuntimeError: if ``TRITON_INTERPRET=1`` was not set (CPU tensors cannot reach a
            compiled kernel).
    """
    global _kernels_on_cpu
    if not interpreting():
        raise RuntimeError(
            "Triton kernels run on CPU tensors only under its interpreter: set "
            "TRITON_INTERPRET=1 before triton is first imported"
        )
    previous, _kernels_on_cpu = _kernels_on_cpu, True
    try:
        yield
    finally:
        _kernels_on_cpu = previous
