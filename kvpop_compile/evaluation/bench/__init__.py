"""``kvpop-compile bench``: long-context prefill and decode speed and memory on this machine.

- :mod:`.settings`: the methods, context lengths, :class:`BenchSettings` and the results;
- :mod:`.run`: :func:`bench_model` (a checkpoint or a random-weight shape) and :func:`run_bench`;
- :mod:`.timing`: how one method runs and is timed at one context;
- :mod:`.report`: ``long_context.md``, ``long_context.json`` and ``long_context.png``;
- :mod:`.model_shapes`: Qwen3 shapes with random weights; :mod:`.peak_memory`: peak memory of a
  region of code, on the CPU or a CUDA device.
"""

from .model_shapes import MODELS
from .report import bench_setup, bench_table, write_bench
from .run import DTYPES, bench_model, run_bench
from .settings import (
    DEFAULT_METHODS,
    METHODS,
    TRANSFORMERS_METHODS,
    BenchSettings,
    context_label,
    parse_contexts,
)

__all__ = [
    "DEFAULT_METHODS",
    "DTYPES",
    "METHODS",
    "MODELS",
    "TRANSFORMERS_METHODS",
    "BenchSettings",
    "bench_model",
    "bench_setup",
    "bench_table",
    "context_label",
    "parse_contexts",
    "run_bench",
    "write_bench",
]
