"""AOTInductor engines: each step compiled and packaged as ``<step>.pt2``.

The kvpop ops are ``triton_op``s whose bodies Inductor inlines, so a package runs in a process
that never imports kvpop_compile. The cache is an input of the step (mutated in place), never a
constant of the package: the runner allocates it empty at load time.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .steps import export_step


def build(steps: dict[str, tuple[torch.nn.Module, tuple]], folder: Path) -> None:
    for name, (module, example) in steps.items():
        program = export_step(module, example)
        torch._inductor.aoti_compile_and_package(program, package_path=str(folder / f"{name}.pt2"))


def open_steps(folder: Path, manifest: dict) -> dict:
    if manifest.get("torch_version") != torch.__version__:
        raise ValueError(
            f"{folder} was compiled with torch {manifest.get('torch_version')}; AOTInductor "
            f"packages run only on the torch that built them (this is {torch.__version__})"
        )
    steps = {}
    for name in manifest["steps"]:
        package = torch._inductor.aoti_load_package(str(folder / f"{name}.pt2"))
        steps[name] = lambda inputs, package=package: list(package(*inputs))
    return steps
