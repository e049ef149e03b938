"""The benchmark suite runs end to end in its --quick mode and writes its results."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import run_all
from benchmarks.plots import matplotlib_available


def test_quick_suite_writes_tables_and_plots(tmp_path):
    assert run_all.main(["--quick", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "performance.md").read_text()
    for title in ("Decode at long context", "Policy overhead", "Target pass", "Prefill"):
        assert f"## {title}" in report
    assert "| path |" in report and "| N |" in report
    assert "KVpop KV memory flat after capacity**: met" in report
    data = json.loads((tmp_path / "performance.json").read_text())
    assert set(data) == {"Decode at long context", "Policy overhead", "Target pass", "Prefill"}
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    if matplotlib_available():
        assert pngs == ["decode_latency.png", "decode_memory.png", "prefill.png",
                        "target_memory.png", "target_time.png"]  # fmt: skip
    else:
        assert pngs == [] and "Plots skipped" in report


def test_only_the_chosen_family_and_tables_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    assert run_all.main(["--quick", "--only", "target", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "performance.md").read_text()
    assert "## Target pass" in report and "## Prefill" not in report
    assert "Plots skipped" in report and not list(tmp_path.glob("*.png"))


def test_bad_thread_count_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        run_all.main(["--quick", "--threads", "0", "--out", str(tmp_path)])
