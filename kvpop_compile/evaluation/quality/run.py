"""The quality benchmark's run and files: :func:`evaluate` (held-out standard-library
sequences) and :func:`evaluate_sequences` (any sequences, such as a user's own text) run every
method through :func:`~.measure.run_eval`; :func:`write_report` writes ``quality.json``,
``quality.md`` (the tables with 95% intervals and the targets of :mod:`.report`) and the PNG
plots (:mod:`.plots`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...atomic import atomic_write
from ..data import SEQUENCE_LENGTH, Sequence, held_out_sequences
from ..methods import BUDGETS, POLICIES, capacities, method_notes, methods
from .measure import EvalSettings, run_eval
from .report import (
    markdown_tables,
    quality_targets,
    report_footer,
    summarize,
    summarize_kvpress,
)

KVPRESS_RESULTS = "kvpress.json"
RESULT_KEYS = (
    "model", "data", "tokenizer", "run_notes", "sequences", "length", "prompt_length",
    "long_range_window", "protocols", "methods", "seconds", "versions",
)  # fmt: skip


def evaluate(
    original,
    out_dir: str | Path,
    *,
    sequences: int = 64,
    policies=POLICIES,
    budgets=tuple(BUDGETS),
    settings: EvalSettings | None = None,
    scorer_root: str | Path | None = None,
    sequence_length: int = SEQUENCE_LENGTH,
    model_name: str = "the embedded model",
    plots: bool = True,
    progress: bool = True,
) -> dict:
    """Run the benchmark on ``original`` (an untransformed Qwen3) and write its results.

    Writes ``quality.json``, ``quality.md`` and, with ``plots`` (needs matplotlib),
    ``quality_retention.png`` and ``quality_memory.png`` into ``out_dir``; a
    ``kvpress.json`` already there (``benchmarks/kvpress_eval.py``) joins the
    prompt-compression table. Returns the results dict (as in ``quality.json``).
    """
    data = held_out_sequences(sequences, length=sequence_length)
    return evaluate_sequences(
        original, out_dir, data, policies=policies, budgets=budgets, settings=settings,
        scorer_root=scorer_root, model_name=model_name, plots=plots, progress=progress,
    )  # fmt: skip


def evaluate_sequences(
    original,
    out_dir: str | Path,
    data: list[Sequence],
    *,
    policies=POLICIES,
    budgets=tuple(BUDGETS),
    settings: EvalSettings | None = None,
    scorer_root: str | Path | None = None,
    model_name: str = "the embedded model",
    about: dict | None = None,
    plots: bool = True,
    progress: bool = True,
    priority_span: int | None = None,
) -> dict:
    """:func:`evaluate` on the sequences ``data`` (each of ``length + 1`` tokens; budgets
    scale with ``length``). ``about`` describes data other than the held-out files, for the
    report: ``data`` (what was read), ``tokenizer`` (the tokenizer that made the ids, None for
    UTF-8 bytes) and ``run_notes`` (a list of lines). ``priority_span`` spreads the scores of
    the policies that fix them when a token leaves the window (``KVpopConfig.priority_span``;
    None: the span each trained scorer was saved with)."""
    if not data:
        raise ValueError("no sequences to evaluate")
    length = data[0].ids.numel() - 1
    results = run_eval(
        original, data, methods(policies, budgets, length, priority_span, scorer_root),
        settings=settings,
        scorer_root=scorer_root, progress=progress,
    )  # fmt: skip
    results["model"] = model_name
    results.update(about or {})
    return write_report(results, out_dir, plots=plots)


def write_report(results: dict, out_dir: str | Path, *, plots: bool = True) -> dict:
    """Write ``quality.json``, ``quality.md`` and the plots for ``results`` (a :func:`run_eval`
    dict) into ``out_dir``; returns ``results`` with ``summary``, ``kvpress_summary``,
    ``notes`` and ``document`` (the markdown) added. Rerun it on a saved ``quality.json`` to
    redraw after ``benchmarks/kvpress_eval.py`` has written ``kvpress.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {k: results[k] for k in RESULT_KEYS if k in results}
    summary = summarize(results)
    kvpress, notes = {}, []
    kvpress_file = out / KVPRESS_RESULTS
    if kvpress_file.is_file():
        kvpress, notes = summarize_kvpress(json.loads(kvpress_file.read_text()), results)
    notes = method_notes(results["methods"]) + notes
    text = json.dumps(results, indent=1) + "\n"
    atomic_write(out / "quality.json", lambda p: Path(p).write_text(text))
    document = _document(results, summary, kvpress, notes)
    atomic_write(out / "quality.md", lambda p: Path(p).write_text(document))
    if plots:
        from .plots import plot_cache_memory, plot_retention

        atomic_write(
            out / "quality_retention.png",
            lambda p: plot_retention(results, summary, kvpress, Path(p)),
        )
        if "continuation" in results["protocols"]:
            atomic_write(out / "quality_memory.png", lambda p: plot_cache_memory(results, Path(p)))
    return {
        **results, "summary": summary, "kvpress_summary": kvpress, "notes": notes,
        "document": document,
    }  # fmt: skip


def _document(results: dict, summary: dict, kvpress: dict, notes: list[str]) -> str:
    n = len(results["sequences"])
    window = results["long_range_window"]
    run = {r["budget"] for r in results["methods"].values()}
    kept = capacities(results["length"])
    budgets = ", ".join(f"{b} ({c} tokens kept)" for b, c in kept.items() if b in run)
    tokenizer = results.get("tokenizer")  # None: the ids are UTF-8 bytes
    if "data" in results:
        ids = "as UTF-8 bytes" if tokenizer is None else f"with {tokenizer}"
        what = f"{n} sequences of {results['length']} tokens from {results['data']}, read {ids}"
    else:
        what = (
            f"{n} held-out sequences of {results['length']} tokens (standard-library files "
            "never trained on)"
        )
    if tokenizer is None:
        long_range = (
            "Long-range targets are the bytes that complete an identifier last seen more than "
            f"{window} tokens earlier."
        )
    else:
        long_range = (
            "Long-range targets (identifiers completed byte by byte) are found in byte tokens "
            "only: this tokenizer's run has no long-range figures."
        )
    lines = [
        "# Quality benchmark",
        "",
        f"`kvpop-compile eval` on {results['model']}: {what}, budgets {budgets} per layer and "
        f"KV head with 4 sinks and a window of {window} inside them (a learned policy: the "
        "window its scorer was saved with, where a note says so). Figures are pooled over "
        "sequences, with 95% bootstrap intervals over sequences in brackets; retention is the "
        "method's top-1 accuracy as a percentage of full attention's on the same targets. "
        f"{long_range} Continuation: {results['length'] - results['prompt_length']} greedy "
        f"tokens after a {results['prompt_length']}-token prompt, compared position by "
        "position with full attention's.",
        "",
        markdown_tables(results, summary, kvpress),
    ]
    targets = quality_targets(results, summary, kvpress)
    if targets:
        lines += ["## Targets", "", *targets, ""]
    lines += report_footer(results, [*results.get("run_notes", []), *notes])
    return "\n".join(lines)
