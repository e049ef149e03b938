"""The kernel benchmark runs end to end (tiny shapes on the interpreter; figures only on a GPU)."""

import pytest
from script_support import load_script

from kvpop_compile.runtime.dispatch import interpreting


@pytest.mark.skipif(not interpreting(), reason="runs the kernels on CPU through the interpreter")
def test_kernel_benchmark_quick_mode_writes_its_table(tmp_path):
    module = load_script("benchmarks/triton_kernels.py")
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
