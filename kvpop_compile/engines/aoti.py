"""AOTInductor engines: each step compiled and packaged as ``<step>.pt2``.

The kvpop ops are ``triton_op``s whose bodies Inductor inlines, so a package runs in a process
that never imports kvpop_compile. The cache is an input of the step (mutated in place), never a
constant of the package: the runner allocates it empty at load time.

A package is compiled for its example inputs' exact strides and indexes every input with them
(it checks none at run time), so the steps are exported at row-major inputs and the runner
passes row-major inputs. The package's metadata holds the step's binding (:mod:`.binding`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.utils._pytree as pytree

from .binding import BINDING_KEY, check_binding, check_specs, program_binding, read_binding
from .steps import export_step

SUFFIX = ".pt2"


def build(steps: dict[str, tuple[torch.nn.Module, tuple]], folder: Path, identity: dict) -> None:
    for name, (module, example) in steps.items():
        program = export_step(module, example)
        metadata = {BINDING_KEY: program_binding(name, program, identity)}
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(folder / f"{name}{SUFFIX}"),
            inductor_configs={"aot_inductor.metadata": metadata},
        )  # fmt: skip


def _check_package(file: Path, name: str, package, manifest: dict) -> None:
    """The package's own binding and call spec against the manifest, before it ever runs."""
    binding = read_binding(file, package.get_metadata().get(BINDING_KEY))
    check_binding(file, name, binding, manifest)
    # The call spec is the runtime's own count of the tensors the package takes.
    leaves = pytree.treespec_loads(package.loader.get_call_spec()[0]).num_leaves
    if leaves != len(binding["inputs"]):
        raise ValueError(
            f"engine mismatch: {file} takes {leaves} inputs, its binding lists "
            f"{len(binding['inputs'])}: re-export the model"
        )
    check_specs(file, name, manifest, binding["inputs"], binding["logits"])


def open_steps(folder: Path, manifest: dict) -> dict:
    if manifest.get("torch_version") != torch.__version__:
        raise ValueError(
            f"{folder} was compiled with torch {manifest.get('torch_version')}; AOTInductor "
            f"packages run only on the torch that built them (this is {torch.__version__})"
        )
    steps = {}
    for name in manifest["steps"]:
        file = folder / f"{name}{SUFFIX}"
        package = torch._inductor.aoti_load_package(str(file))
        _check_package(file, name, package, manifest)
        steps[name] = lambda inputs, package=package: list(package(*inputs))
    return steps
