"""What each engine file records about itself, checked against its folder's manifest at load.

An engine file holds, inside it (an AOTInductor package's metadata, an ONNX model's metadata
properties), its *binding*: the step it runs, the SHA-256 of the weights and the KVpop config
it was exported from, and the shapes, strides and dtypes of its inputs and of its logits, read
from the exported program the file was compiled from. ``load`` compares the binding, and what
the runtime itself reports (an AOTInductor package's call spec, an ONNX session's inputs), with
the manifest before any step runs. So files copied in from another export, and a manifest whose
state does not match the engine (the runner allocates the cache from the manifest, and an
engine would write past a cache smaller than it was compiled for), are refused.

A step's inputs are ``(input_ids, *state)``: ``input_ids (batch, 1)`` for decode and
``(batch, prefill_length)`` for prefill, int64, then the manifest's state tensors; every one in
row-major strides (:func:`row_major_strides`), the layout the runner passes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .steps import row_major_strides

BINDING_KEY = "kvpop_compile.binding"
BINDING_FIELDS = {"step": str, "weights_sha256": str, "kvpop_config": dict, "inputs": list,
                  "logits": dict}  # fmt: skip


def tensor_spec(tensor: torch.Tensor) -> dict:
    return {
        "shape": [int(s) for s in tensor.shape],
        "stride": [int(s) for s in tensor.stride()],
        "dtype": str(tensor.dtype).removeprefix("torch."),
    }


def program_inputs(program: torch.export.ExportedProgram) -> list[dict]:
    """The specs of an exported step's user inputs, in order, as the program was traced: the
    layout a compiled step indexes its inputs with."""
    nodes = {node.name: node for node in program.graph.nodes}
    return [tensor_spec(nodes[name].meta["val"]) for name in program.graph_signature.user_inputs]


def program_logits(program: torch.export.ExportedProgram) -> dict:
    """The spec of an exported step's first output, its logits."""
    nodes = {node.name: node for node in program.graph.nodes}
    return tensor_spec(nodes[program.graph_signature.user_outputs[0]].meta["val"])


def program_binding(step: str, program: torch.export.ExportedProgram, identity: dict) -> str:
    """The binding of ``step`` compiled from ``program``, as JSON text; ``identity`` holds the
    ``weights_sha256`` and ``kvpop_config`` of the export."""
    inputs, logits = program_inputs(program), program_logits(program)
    return json.dumps({"step": step, **identity, "inputs": inputs, "logits": logits})


def read_binding(file: Path, text: str | None) -> dict:
    """Parse the binding text an engine file carries (``None``: it carries none)."""
    if text is None:
        raise ValueError(
            f"{file} records no {BINDING_KEY!r}: it was not written by kvpop_compile.export; "
            f"re-export the model"
        )
    try:
        binding = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{file}: its {BINDING_KEY!r} is not valid JSON: {error}") from None
    if not isinstance(binding, dict) or any(
        not isinstance(binding.get(name), kind) for name, kind in BINDING_FIELDS.items()
    ):
        raise ValueError(
            f"{file}: its {BINDING_KEY!r} must be an object with {', '.join(BINDING_FIELDS)}; "
            f"re-export the model"
        )
    return binding


def expected_inputs(manifest: dict, step: str) -> list[dict]:
    """The named specs of ``step``'s inputs that the manifest describes, in call order."""
    length = 1 if step == "decode" else manifest["prefill_length"]
    tokens = {"name": "input_ids", "shape": [manifest["batch"], length], "dtype": "int64"}
    return [
        {**spec, "stride": row_major_strides(spec["shape"])}
        for spec in (tokens, *manifest["state"])
    ]


def check_binding(file: Path, step: str, binding: dict, manifest: dict) -> None:
    """Refuse an engine file that holds another step, or was exported from other weights or
    another KVpop config than the manifest records."""
    if binding["step"] != step:
        raise ValueError(
            f"engine mismatch: {file} holds the {binding['step']!r} step, the manifest lists it "
            f"as {step!r}: the folder mixes engine files; re-export the model"
        )
    if binding["weights_sha256"] != manifest["weights_sha256"]:
        raise ValueError(
            f"engine mismatch: {file} was exported from other weights (SHA-256 "
            f"{binding['weights_sha256']!r}) than the manifest records "
            f"({manifest['weights_sha256']!r}): the folder mixes files of different exports; "
            f"re-export the model"
        )
    config = manifest["kvpop_config"]
    for key in sorted(set(binding["kvpop_config"]) | set(config)):
        if binding["kvpop_config"].get(key) != config.get(key):
            raise ValueError(
                f"engine mismatch: {file} was exported with {key}="
                f"{binding['kvpop_config'].get(key)!r}, the manifest states {key}="
                f"{config.get(key)!r}: the folder mixes files of different exports; re-export "
                f"the model"
            )


def _described(spec: dict) -> str:
    stride = f" strides {tuple(spec['stride'])}" if "stride" in spec else ""
    return f"{spec['dtype']} {tuple(spec['shape'])}{stride}"


def _view(spec: dict, keys: list[str]) -> dict:
    return {key: spec[key] if key == "dtype" else list(spec[key]) for key in keys}


def check_specs(
    file: Path, step: str, manifest: dict, inputs: list[dict], logits: dict | None
) -> None:
    """Refuse a manifest whose inputs for ``step`` (tokens, then state), or logits ``(batch,
    vocab_size)`` float32, differ from what the engine file reports: ``inputs`` and ``logits``
    are specs with ``shape`` and ``dtype`` (and ``stride``, where the runtime reports one)."""
    expected = expected_inputs(manifest, step)
    if len(inputs) != len(expected):
        raise ValueError(
            f"engine mismatch: {file} takes {len(inputs)} inputs, the manifest describes "
            f"{len(expected)} (the token ids and {len(expected) - 1} state tensors): the "
            f"manifest does not describe this engine; re-export the model"
        )
    for want, got in zip(expected, inputs, strict=True):
        keys = [key for key in ("dtype", "shape", "stride") if key in got]
        if _view(got, keys) != _view(want, keys):
            raise ValueError(
                f"engine mismatch: {file} takes {want['name']} as {_described(got)}, the "
                f"manifest states {_described(_view(want, keys))}: the manifest does not "
                f"describe this engine; re-export the model"
            )
    vocab = manifest["model"]["vocab_size"]
    want = {"dtype": "float32", "shape": [manifest["batch"], vocab]}
    if logits is not None and _view(logits, ["dtype", "shape"]) != want:
        raise ValueError(
            f"engine mismatch: {file} returns logits as {_described(logits)}, the manifest "
            f"states {_described(want)} (batch, model.vocab_size): the manifest does not "
            f"describe this engine; re-export the model"
        )
