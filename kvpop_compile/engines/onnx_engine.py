"""ONNX engines for onnxruntime (and TensorRT's ONNX parser): ``<step>.onnx``.

The kvpop ops are decomposed into aten ops before conversion, so the file holds only standard
ONNX operators (:data:`TENSORRT_ONNX_OPS` lists those TensorRT's parser supports; a test checks
every exported operator against it). The cache is an explicit input and output of each step.
The model's metadata properties hold the step's binding (:mod:`.binding`), and the session's
own input and output metadata are checked against the manifest at load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..optional import import_extra
from .binding import BINDING_KEY, check_binding, check_specs, program_binding, read_binding
from .steps import export_step

SUFFIX = ".onnx"
OPSET = 18  # run by current onnxruntime and parsed by TensorRT 8.6 and later

# onnxruntime's element type names for the dtypes a manifest states.
ONNX_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
               "tensor(bfloat16)": "bfloat16", "tensor(int64)": "int64"}  # fmt: skip
# Operators of TensorRT's ONNX parser (onnx-tensorrt "operators.md") that exported KVpop steps
# may use. An operator outside this set would make the file unusable with trtexec.
TENSORRT_ONNX_OPS = frozenset(
    """Abs Add And ArgMax ArgMin Cast Ceil Clip Concat Constant ConstantOfShape Cos CumSum Div
    Elu Equal Erf Exp Expand Flatten Floor Gather GatherElements GatherND Gemm Greater
    GreaterOrEqual Identity If Less LessOrEqual Log LogSoftmax MatMul Max Mean Min Mod Mul Neg
    Not Or Pow Range Reciprocal ReduceL2 ReduceLogSumExp ReduceMax ReduceMean ReduceMin
    ReduceSum Relu Reshape ScatterElements ScatterND Shape Sigmoid Sign Sin Slice Softmax
    Softplus Split Sqrt Squeeze Sub Tanh Tile TopK Transpose Trilu Unsqueeze Where Xor""".split()
)


def _onnxruntime():
    return import_extra(
        "onnxruntime",
        purpose="the onnx format",
        needs="onnx, onnxscript and onnxruntime",
        extra="onnx",
    )


def build(steps: dict[str, tuple[torch.nn.Module, tuple]], folder: Path, identity: dict) -> None:
    _onnxruntime()
    for name, (module, example) in steps.items():
        program = export_step(module, example, decompose=True)
        with torch.no_grad():
            onnx_program = torch.onnx.export(program, dynamo=True, opset_version=OPSET)
        onnx_program.model.metadata_props[BINDING_KEY] = program_binding(name, program, identity)
        onnx_program.save(str(folder / f"{name}{SUFFIX}"))


def _spec(value) -> dict:
    """An onnxruntime input or output's shape and dtype, as a spec."""
    return {"shape": list(value.shape), "dtype": ONNX_DTYPES.get(value.type, value.type)}


def _check_session(file: Path, name: str, session, manifest: dict) -> None:
    """The model's binding and the session's own inputs and logits against the manifest."""
    binding = read_binding(file, session.get_modelmeta().custom_metadata_map.get(BINDING_KEY))
    check_binding(file, name, binding, manifest)
    inputs = [_spec(value) for value in session.get_inputs()]
    check_specs(file, name, manifest, inputs, _spec(session.get_outputs()[0]))


def open_steps(folder: Path, manifest: dict) -> dict:
    onnxruntime = _onnxruntime()
    steps = {}
    for name in manifest["steps"]:
        file = folder / f"{name}{SUFFIX}"
        session = onnxruntime.InferenceSession(str(file), providers=["CPUExecutionProvider"])
        _check_session(file, name, session, manifest)
        input_names = [i.name for i in session.get_inputs()]

        def run(inputs, session=session, input_names=input_names):
            feeds = {n: t.detach().cpu().numpy() for n, t in zip(input_names, inputs, strict=True)}
            return [torch.from_numpy(x) for x in session.run(None, feeds)]

        steps[name] = run
    return steps
