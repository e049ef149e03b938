"""The kernel benchmark runs end to end (tiny shapes on the interpreter; figures only on a GPU)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from kvpop_compile.runtime.dispatch import interpreting

BENCHMARK = Path(__file__).parents[1] / "benchmarks" / "kernels.py"


@pytest.mark.skipif(not interpreting(), reason="runs the kernels on CPU through the interpreter")
def test_kernel_benchmark_quick_mode_writes_its_table(tmp_path):
    spec = importlib.util.spec_from_file_location("kernel_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    out = tmp_path / "kernels.md"
    assert module.main(["--quick", "--out", str(out)]) == 0
    table = out.read_text()
    for row in (
        "decode attention C=128",
        "evict + write",
        "memory scorer update + score (one",
        "eviction steps",
        "transposed target",
    ):
        assert row in table
