"""Export a transformed model as an engine folder (AOTInductor, ONNX, TensorRT) and load it."""

from .api import FORMATS, export, load
from .runner import EngineRunner

__all__ = ["FORMATS", "EngineRunner", "export", "load"]
