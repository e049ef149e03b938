"""TensorRT engines through torch-tensorrt (optional; needs a CUDA GPU): ``<step>.ep``.

The kvpop ops are decomposed into aten ops first; torch-tensorrt converts what TensorRT
supports and runs the rest in PyTorch within the same saved program. ``torch_tensorrt.save``
stores no metadata of ours, so a saved program carries no binding (:mod:`.binding`); its inputs
as the saved program states them are checked against the manifest at load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..optional import import_torch_tensorrt
from .binding import check_specs, program_inputs
from .steps import export_step

SUFFIX = ".ep"


def build(steps: dict[str, tuple[torch.nn.Module, tuple]], folder: Path, identity: dict) -> None:
    torch_tensorrt = import_torch_tensorrt()
    for name, (module, example) in steps.items():
        program = export_step(module, example, decompose=True)
        with torch.no_grad():
            compiled = torch_tensorrt.dynamo.compile(program, inputs=list(example))
        torch_tensorrt.save(
            compiled, str(folder / f"{name}{SUFFIX}"), output_format="exported_program",
            inputs=list(example),
        )  # fmt: skip


def open_steps(folder: Path, manifest: dict) -> dict:
    import_torch_tensorrt()  # registers TensorRT's runtime ops before the programs load
    steps = {}
    for name in manifest["steps"]:
        file = folder / f"{name}{SUFFIX}"
        program = torch.export.load(str(file))
        # TensorRT binds its inputs by shape and dtype, not by the traced strides.
        inputs = [{"shape": s["shape"], "dtype": s["dtype"]} for s in program_inputs(program)]
        check_specs(file, name, manifest, inputs, None)
        module = program.module()
        steps[name] = lambda inputs, module=module: list(module(*inputs))
    return steps
