"""What the benchmarks compare: full attention and every policy at each budget, a learned
method at the span, window, lam and sizes its scorer was saved with."""

import dataclasses
import shutil

import pytest
from tiny_models import tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.evaluation.methods import (
    Method,
    budget_config,
    build_model,
    capacities,
    method_notes,
    methods,
)


def test_methods_and_budgets_are_checked():
    assert [m.name for m in methods(("window",), ("88%",))] == ["full", "window @ 88%"]
    with pytest.raises(ValueError, match="policy must be one of"):
        methods(("lru",))
    with pytest.raises(ValueError, match="budget must be one of 75%, 88%; got '50%'"):
        methods(budgets=("50%",))
    with pytest.raises(ValueError, match="capacity must exceed sinks \\+ window = 68"):
        budget_config("window", 68)


def test_capacity_follows_the_sequence_length():
    assert capacities() == {"75%": 512, "88%": 256}
    assert capacities(600) == {"75%": 150, "88%": 75}
    (full, window) = methods(("window",), ("88%",), 600)
    assert (full.capacity, window.capacity) == (None, 75)
    assert budget_config("window", window.capacity).capacity == 75


def test_a_learned_method_takes_the_span_its_scorer_was_saved_with(tmp_path):
    spread = kc.transform(tiny_qwen3(), budget_config("memory", 256, priority_span=5))
    kc.save_scorer(spread, tmp_path / "memory-256")
    saved = methods(("memory", "mlp", "random"), ("88%",), priority_span=None, scorer_root=tmp_path)
    # memory-256 says 5; mlp-256 is missing (refused by name when the run checks its scorers);
    # a heuristic never spreads.
    assert [(m.name, m.priority_span) for m in saved[1:]] == [
        ("memory @ 88%", 5), ("mlp @ 88%", 0), ("random @ 88%", 0),
    ]  # fmt: skip
    asked = methods(("memory",), ("88%",), priority_span=2, scorer_root=tmp_path)
    assert asked[1].priority_span == 2  # a span given outright wins


def test_a_learned_method_keeps_the_window_and_sizes_its_scorer_was_saved_with(tmp_path):
    wide = kc.transform(tiny_qwen3(), budget_config("memory", 256, window=128))
    kc.save_scorer(wide, tmp_path / "memory-256")
    listed = methods(("memory", "mlp", "random"), ("88%",), scorer_root=tmp_path)
    # memory-256 says 128; mlp-256 is missing and a heuristic has no scorer: both keep 64.
    assert [(m.name, m.window) for m in listed] == [
        ("full", 64), ("memory @ 88%", 128), ("mlp @ 88%", 64), ("random @ 88%", 64),
    ]  # fmt: skip
    assert listed[1].record() == {"policy": "memory", "budget": "88%", "window": 128}
    assert listed[3].record() == {"policy": "random", "budget": "88%"}  # as files before
    model = build_model(tiny_qwen3(), listed[1], scorer_root=tmp_path)
    assert model.kvpop_config == budget_config("memory", 256, window=128)
    assert method_notes({m.name: m.record() for m in listed}) == [
        "window (the most recent tokens always kept, inside the budget): memory @ 88% 128, the "
        "window each trained scorer was saved with; every other method keeps 64"
    ]
    # A scorer of other sizes than the defaults runs at its own sizes.
    wider = budget_config("mlp", 256, window=128)
    wider = dataclasses.replace(wider, scorer_hidden=16)
    kc.save_scorer(kc.transform(tiny_qwen3(), wider), tmp_path / "mlp-256")
    mlp = methods(("mlp",), ("88%",), scorer_root=tmp_path)[1]
    assert build_model(tiny_qwen3(), mlp, scorer_root=tmp_path).kvpop_config == wider
    # A saved window the sequence length leaves no pool for is refused before anything runs.
    shutil.copytree(tmp_path / "memory-256", tmp_path / "memory-128")  # 88% of 1024 tokens
    with pytest.raises(
        ValueError,
        match="keeps 128 tokens at the 88% budget, but memory @ 88% "
        "needs more than sinks \\+ window = 132; use a length of at least 1064",
    ):
        methods(("memory",), ("88%",), length=1024, scorer_root=tmp_path)


def test_a_learned_method_runs_with_the_lam_its_scorer_was_saved_with(tmp_path):
    recent = dataclasses.replace(budget_config("mlp", 256), lam=0.003)
    kc.save_scorer(kc.transform(tiny_qwen3(), recent), tmp_path / "mlp-256")
    listed = methods(("mlp", "memory", "window"), ("88%",), scorer_root=tmp_path)
    # mlp-256 says 0.003; memory-256 is missing and a heuristic has no recency term.
    assert [(m.name, m.lam) for m in listed[1:]] == [
        ("mlp @ 88%", 0.003), ("memory @ 88%", 0.0), ("window @ 88%", 0.0),
    ]  # fmt: skip
    assert listed[1].record() == {"policy": "mlp", "budget": "88%", "lam": 0.003}
    assert listed[3].record() == {"policy": "window", "budget": "88%"}  # as files before
    # A results row of the scorer before it had a recency term describes another method.
    assert listed[1].differs_from({"policy": "mlp", "budget": "88%"}) == ("lam", 0.0, 0.003)
    assert build_model(tiny_qwen3(), listed[1], scorer_root=tmp_path).kvpop_config == recent
    assert method_notes({m.name: m.record() for m in listed}) == [
        "lam (a token's priority rises by lam per position, so newer tokens are kept first "
        "among equal scores): mlp @ 88% 0.003, the lam each trained scorer was saved with; "
        "every other method has none"
    ]


def test_a_learned_method_runs_at_the_per_layer_budget_its_scorer_was_saved_with(tmp_path):
    # tiny_qwen3 has two layers: 256 slots on average, shared as 100 and 412.
    shared = budget_config("memory", 256, window=(60, 200), topk=(36, 208))
    assert shared.capacities == (100, 412)
    kc.save_scorer(kc.transform(tiny_qwen3(), shared), tmp_path / "memory-256")
    listed = methods(("memory", "h2o"), ("88%",), scorer_root=tmp_path)
    memory, h2o = listed[1:]
    assert (memory.window, memory.topk) == ((60, 200), (36, 208))
    assert (h2o.window, h2o.topk) == (64, None)  # a heuristic keeps one budget
    record = memory.record()
    assert (record["window"], record["topk"]) == ([60, 200], [36, 208])
    assert memory.differs_from(record) is None  # a resumed row reads back as this method
    assert memory.differs_from({**record, "topk": [36, 200]}) == ("topk", [36, 200], [36, 208])
    assert build_model(tiny_qwen3(), memory, scorer_root=tmp_path).kvpop_config == shared
    assert method_notes({m.name: m.record() for m in listed}) == [
        "per-layer budget (slots per KV head in each layer, first layer first, averaging the "
        "budget's capacity, so the cache holds the same memory): memory @ 88%: 100, 412 "
        "(windows 60, 200), the budget each trained scorer was saved with; every other method "
        "keeps the budget's capacity in every layer"
    ]
    # A per-layer budget of another total is not the budget's memory.
    other_total = r"at capacity 256 keeps 256 slots per layer on average; .* keep \[100, 400\]"
    with pytest.raises(ValueError, match=other_total):
        budget_config("memory", 256, window=(60, 200), topk=(36, 196))
    kc.save_scorer(kc.transform(tiny_qwen3(), dataclasses.replace(shared, topk=(36, 196))),
                   tmp_path / "memory-512")  # fmt: skip
    with pytest.raises(ValueError, match="a per-layer budget at capacity 512"):
        methods(("memory",), ("75%",), scorer_root=tmp_path)


def test_missing_scorer_is_named():
    with pytest.raises(FileNotFoundError, match="no trained memory scorer for capacity 512"):
        build_model(tiny_qwen3(), Method("memory", "75%"), scorer_root="/nonexistent")
