"""TensorRT engines through torch-tensorrt (optional; needs a CUDA GPU): ``<step>.ep``.

The kvpop ops are decomposed into aten ops first; torch-tensorrt converts what TensorRT
supports and runs the rest in PyTorch within the same saved program.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..optional import import_torch_tensorrt
from .steps import export_step


def build(steps: dict[str, tuple[torch.nn.Module, tuple]], folder: Path) -> None:
    torch_tensorrt = import_torch_tensorrt()
    for name, (module, example) in steps.items():
        program = export_step(module, example, decompose=True)
        with torch.no_grad():
            compiled = torch_tensorrt.dynamo.compile(program, inputs=list(example))
        torch_tensorrt.save(
            compiled, str(folder / f"{name}.ep"), output_format="exported_program",
            inputs=list(example),
        )  # fmt: skip


def open_steps(folder: Path, manifest: dict) -> dict:
    import_torch_tensorrt()  # registers TensorRT's runtime ops before the programs load
    steps = {}
    for name in manifest["steps"]:
        program = torch.export.load(str(folder / f"{name}.ep")).module()
        steps[name] = lambda inputs, program=program: list(program(*inputs))
    return steps
