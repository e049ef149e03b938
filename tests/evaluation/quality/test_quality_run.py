"""The quality benchmark end to end: a small run, its tables, plots and per-sequence sums, and
its report rewritten from saved results."""

from __future__ import annotations

import json

import pytest
import torch

from kvpop_compile.cli import main
from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.evaluation import EvalSettings, evaluate
from kvpop_compile.evaluation.quality.report import summarize_kvpress


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


def test_the_retention_plot_draws_the_panels_the_run_measured_with_every_method_named(small_run):
    from kvpop_compile.evaluation.quality.plots import PANELS, retention_figure
    from kvpop_compile.evaluation.quality.report import summarize

    _, result = small_run
    every = {k: result[k] for k in ("methods", "sequences")}
    teacher_forced = {**every, "methods": {
        name: {k: v for k, v in record.items() if k not in ("continuation", "compression")}
        for name, record in every["methods"].items()
    }}  # fmt: skip
    for results, titles in ((every, [title for _, title in PANELS]),
                            (teacher_forced, [title for _, title in PANELS[:2]])):  # fmt: skip
        fig = retention_figure(results, summarize(results), {})
        assert [ax.get_title() for ax in fig.axes] == titles
        labels = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
        assert labels == ["memory", "window"]  # full attention is the 100% every line is of
        for ax in fig.axes:
            assert [line.get_label() for line in ax.containers] == ["memory", "window"]
    nothing = {**every, "methods": {"full": teacher_forced["methods"]["full"]}}
    with pytest.raises(ValueError, match="no method has a retention figure to plot"):
        retention_figure(nothing, summarize(nothing), {})


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
