"""The benchmark suite runs end to end in its --quick mode and writes its results."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from script_support import load_script

from kvpop_compile import KVpopConfig
from kvpop_compile.runtime import BoundedCacheState, build_scorer, decode_step, decode_tokens

run_all = load_script("benchmarks/run_all.py")
fill_bounded_state = load_script("benchmarks/cache_fill.py").fill_bounded_state
matplotlib_available = load_script("benchmarks/plots.py").matplotlib_available


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


@pytest.mark.parametrize("n", [1, 3, 9, 12])
def test_filled_state_before_any_eviction_is_what_decoding_leaves(n):
    """Up to capacity nothing is evicted, so the filled cache holds exactly the positions that
    n decode steps leave, in the same slots."""
    config = KVpopConfig(sinks=2, window=4, topk=6, scorer="window")
    scorer = build_scorer(config, num_kv_heads=2, head_dim=8)
    decoded = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    q, k, v = torch.randn(3, 1, 2, n, 8)
    decode_tokens(decoded, q, k, k, v, scorer=scorer, config=config, scale=1.0)
    filled = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    fill_bounded_state(filled, config, n, torch.Generator().manual_seed(0))
    assert filled.cached_positions() == decoded.cached_positions()
    sinks_and_window = [*range(config.sinks), *range(config.sinks + config.topk, config.capacity)]
    assert torch.equal(filled.positions[..., sinks_and_window],
                       decoded.positions[..., sinks_and_window])  # fmt: skip
    assert int(filled.seen) == n


def test_filled_state_past_capacity_has_a_full_pool_and_keeps_decoding():
    config = KVpopConfig(sinks=2, window=4, topk=6, scorer="window")
    scorer = build_scorer(config, num_kv_heads=2, head_dim=8)
    state = BoundedCacheState.empty(config, scorer, batch=1, head_dim=8)
    fill_bounded_state(state, config, 100, torch.Generator().manual_seed(0))
    for held in state.cached_positions()[0]:
        assert held[:2] == [0, 1] and held[-4:] == [96, 97, 98, 99]
        assert len(set(held)) == config.capacity and all(2 <= p < 96 for p in held[2:-4])
    assert torch.isfinite(state.priorities).all()
    q, k, v = torch.randn(3, 1, 2, 1, 8)
    decode_step(state, q, k, k, v, scorer=scorer, config=config, scale=1.0)
    assert all(100 in held for held in state.cached_positions()[0])
