"""The quality benchmark: its sequences, protocols, summaries and a small end-to-end run."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from tiny_models import tiny_qwen3

import kvpop_compile as kc
from kvpop_compile.cli import main
from kvpop_compile.embedded import is_held_out, load_embedded_model
from kvpop_compile.embedded.corpus import read_bytes
from kvpop_compile.evaluation import EvalSettings, evaluate, held_out_sequences
from kvpop_compile.evaluation.methods import (
    Method,
    budget_config,
    build_model,
    method_notes,
    methods,
)
from kvpop_compile.evaluation.protocols import (
    compressed_prompt,
    greedy_continuation,
    teacher_forced,
)
from kvpop_compile.evaluation.report import _ratio, summarize_kvpress


def test_sequences_are_consecutive_windows_of_held_out_files():
    sequences = held_out_sequences(5, length=1024, per_file=3)
    assert len(sequences) == 5
    for s in sequences:
        name, start = s.source.split("@")
        assert is_held_out(name) and s.ids.shape == (1025,)
        data = read_bytes(name)
        assert bytes(s.ids.tolist()) == data[int(start) : int(start) + 1025]
    with pytest.raises(ValueError, match="count must be a positive integer or None, got 0"):
        held_out_sequences(0)


def test_bounded_cache_that_holds_everything_scores_like_full_attention():
    model = tiny_qwen3()
    ids = torch.randint(0, 256, (2, 97), generator=torch.Generator().manual_seed(0))
    roomy = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=4, window=8, topk=100))
    full, bounded = teacher_forced(model, ids), teacher_forced(roomy, ids)
    assert torch.equal(full.correct, bounded.correct)
    torch.testing.assert_close(full.nll, bounded.nll, rtol=1e-4, atol=1e-5)


def test_compression_protocol_with_full_attention_is_teacher_forcing_of_the_suffix():
    model = tiny_qwen3()
    ids = torch.randint(0, 256, (2, 65), generator=torch.Generator().manual_seed(1))
    whole, suffix = teacher_forced(model, ids), compressed_prompt(model, model, ids, 40)
    assert suffix.correct.shape == (2, 24)
    assert torch.equal(whole.correct[:, 40:], suffix.correct)
    torch.testing.assert_close(whole.nll[:, 40:], suffix.nll, rtol=1e-4, atol=1e-5)


def test_compression_protocol_needs_a_filled_cache_and_a_valid_prompt():
    model = tiny_qwen3()
    bounded = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=2, window=4, topk=30))
    ids = torch.randint(0, 256, (1, 33))
    with pytest.raises(ValueError, match="empty slots: the prompt must be longer"):
        compressed_prompt(model, bounded, ids, 20)
    with pytest.raises(ValueError, match="prompt_length must be in 1..31, got 32"):
        compressed_prompt(model, bounded, ids, 32)


def test_greedy_continuation_of_a_roomy_bounded_cache_equals_full_cache():
    model = tiny_qwen3()
    roomy = kc.transform(tiny_qwen3(), kc.KVpopConfig(sinks=2, window=8, topk=60))
    prompt = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(2))
    full = greedy_continuation(model, prompt, 24, record_at={30, 40})
    bounded = greedy_continuation(roomy, prompt, 24, record_at={30, 40})
    assert torch.equal(full.tokens, bounded.tokens)
    assert full.cache_bytes[40] > full.cache_bytes[30]
    assert bounded.cache_bytes[40] == bounded.cache_bytes[30]


def test_bootstrap_interval_brackets_the_pooled_value():
    est = _ratio([3.0, 5.0, 9.0, 1.0], [10.0, 10.0, 10.0, 10.0])
    assert est.value == pytest.approx(0.45) and est.low <= est.value <= est.high
    assert est.low >= 0.1 and est.high <= 0.9
    same = _ratio([3.0, 5.0], [10.0, 10.0], [3.0, 5.0], [10.0, 10.0])
    assert (same.value, same.low, same.high) == (1.0, 1.0, 1.0)


def test_methods_and_budgets_are_checked():
    assert [m.name for m in methods(("window",), ("88%",))] == ["full", "window @ 88%"]
    with pytest.raises(ValueError, match="policy must be one of"):
        methods(("lru",))
    with pytest.raises(ValueError, match="budget must be one of 75%, 88%; got '50%'"):
        methods(budgets=("50%",))
    with pytest.raises(ValueError, match="capacity must exceed sinks \\+ window = 68"):
        budget_config("window", 68)


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


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """Two sequences, `memory` (the shipped scorer) and `window` at 88%, all protocols."""
    out = tmp_path_factory.mktemp("quality")
    torch.manual_seed(0)
    result = evaluate(
        load_embedded_model(), out, sequences=2, policies=("memory", "window"), budgets=("88%",),
        settings=EvalSettings(batch=2, prompt_length=1984), progress=False,
    )  # fmt: skip
    return out, result


def test_small_eval_run_writes_tables_plots_and_per_sequence_sums(small_run):
    out, result = small_run
    saved = json.loads((out / "quality.json").read_text())
    assert list(saved["methods"]) == ["full", "memory @ 88%", "window @ 88%"]
    for record in saved["methods"].values():
        tf = record["teacher_forced"]
        assert len(tf["correct"]) == 2 and tf["count"] == [2048.0, 2048.0]
        assert record["continuation"]["count"] == [64.0, 64.0]
        assert record["compression"]["count"] == [64.0, 64.0]
    full = saved["methods"]["full"]
    # Long-range targets are a property of the text: the same for every method.
    assert (
        saved["methods"]["window @ 88%"]["teacher_forced"]["lr_count"]
        == full["teacher_forced"]["lr_count"]
    )
    assert full["continuation"]["agree"] == [64.0, 64.0]
    summary = result["summary"]
    assert summary["full"]["retention"].value == 1.0
    assert 0.5 < summary["memory @ 88%"]["retention"].value <= 1.05
    memory = (
        full["continuation"]["cache_bytes"],
        saved["methods"]["memory @ 88%"]["continuation"]["cache_bytes"],
    )
    assert memory[0] and memory[1] and max(memory[1].values()) < min(memory[0].values())
    document = (out / "quality.md").read_text()
    assert "| KVpop memory | 88% |" in document and "## Targets" in document
    for png in ("quality_retention.png", "quality_memory.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_only_rewrites_from_saved_results_and_joins_kvpress(small_run, capsys):
    out, result = small_run
    press = {
        "results": {
            "snapkv": {
                "88%": {
                    "sequences": [
                        {"source": s, "accuracy": 0.5, "nll": 2.0, "long_range_correct": 1,
                         "long_range_count": 4}
                        for s in result["sequences"]
                    ]
                }
            },
            "tova": {"88%": {"error": "RuntimeError: no"}},
        }
    }  # fmt: skip
    (out / "kvpress.json").write_text(json.dumps(press))
    assert main(["eval", "--report-only", "--out", str(out), "--no-plots"]) == 0
    document = (out / "quality.md").read_text()
    assert "| kvpress snapkv | 88% | 0.500" in document
    assert "kvpress tova at 88%: failed: RuntimeError: no" in document
    summary, notes = summarize_kvpress(press, json.loads((out / "quality.json").read_text()))
    assert summary[("snapkv", "88%")]["compression_lr_accuracy"].value == 0.25


def test_cli_refuses_report_only_without_results_and_bad_choices(tmp_path, capsys):
    assert main(["eval", "--report-only", "--out", str(tmp_path)]) == 2
    assert "quality.json not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--policies", "lru"])


def test_missing_scorer_is_named():
    with pytest.raises(FileNotFoundError, match="no trained memory scorer for capacity 512"):
        build_model(tiny_qwen3(), Method("memory", "75%"), scorer_root="/nonexistent")
