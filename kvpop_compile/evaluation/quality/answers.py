"""Exact-match answers to a user's own questions (``kvpop-compile eval --data records.jsonl``).

Each record's prompt enters the cache (compressed to the budget by the policy, as in the recall
protocol's ``prefill`` way of asking, :mod:`kvpop_compile.evaluation.recall.protocol`), then as
many tokens as the answer has are decoded greedily; the item counts when every one equals the
answer's. Full attention and every policy at every budget answer the same items, kept per item
(1 or 0), so the report's bootstrap resamples items and retention compares each method with full
attention on the same draws, as the recall report does
(:func:`kvpop_compile.evaluation.recall.report.summarize_recall`).

Items run in batches of equal prompt and answer lengths (no padding); items of different
lengths run apart.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ...atomic import atomic_write
from ...config import require_int
from ..methods import SINKS, WINDOW, Method, build_model, check_scorers, method_notes
from ..own_data import AnswerItem
from ..protocols import model_cache
from ..recall.protocol import feed_tokens, greedy_tokens
from ..recall.report import summarize_recall
from .measure import versions
from .report import method_label, report_footer

PROTOCOL = "prefill"
GROUP = "answers"


@torch.no_grad()
def greedy_answer(model: nn.Module, prompts: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` greedy tokens (B, steps) after ``prompts`` (B, P), which enter the model's own
    cache (bounded for a transformed model) first."""
    cache = model_cache(model)
    return greedy_tokens(model, feed_tokens(model, prompts, cache), cache, steps)


def _batches(items: list[AnswerItem], batch: int) -> list[list[int]]:
    """Indices of ``items`` in batches of at most ``batch`` that share prompt and answer
    lengths, in the order the lengths first appear."""
    by_length: dict[tuple[int, int], list[int]] = {}
    for index, item in enumerate(items):
        by_length.setdefault((item.prompt.numel(), item.answer.numel()), []).append(index)
    return [
        indices[start : start + batch]
        for indices in by_length.values()
        for start in range(0, len(indices), batch)
    ]


def run_answers(
    original: nn.Module,
    items: list[AnswerItem],
    methods: list[Method],
    *,
    batch: int = 16,
    scorer_root: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Every method on ``items``: ``{"methods": {name: {"policy", "budget", "prefill":
    {"answers": [1.0/0.0 per item]}}}, ...}`` (JSON-ready, the recall results' shape).
    The first method must be full attention (the reference)."""
    require_int("batch", batch, 1)
    if not methods or methods[0].policy is not None:
        raise ValueError("the first method must be full attention (the reference)")
    if not items:
        raise ValueError("no items to answer")
    check_scorers(methods, scorer_root)
    batches = _batches(items, batch)
    bar = tqdm(
        total=len(methods) * len(batches), disable=not progress, desc="answers", unit="batch"
    )
    started = time.perf_counter()
    results = {}
    for method in methods:
        bar.set_postfix_str(method.name)
        model = build_model(original, method, scorer_root)
        exact = [0.0] * len(items)
        for indices in batches:
            prompts = torch.stack([items[i].prompt for i in indices])  # (B, P)
            answers = torch.stack([items[i].answer for i in indices])  # (B, A)
            tokens = greedy_answer(model, prompts, answers.shape[1])
            for i, match in zip(indices, (tokens == answers).all(dim=1).tolist(), strict=True):
                exact[i] = float(match)
            bar.update()
        results[method.name] = {**method.record(), PROTOCOL: {GROUP: exact}}
    bar.close()
    return {
        "items": [item.source for item in items],
        "prompt_tokens": [item.prompt.numel() for item in items],
        "answer_tokens": [item.answer.numel() for item in items],
        "length": methods[0].length,
        "capacities": {m.budget: m.capacity for m in methods if m.budget is not None},
        "protocols": [PROTOCOL],
        "methods": results,
        "seconds": time.perf_counter() - started,
        "versions": versions(),
    }


def answers_markdown(results: dict, summary: dict) -> str:
    """One table: methods as rows, exact match and retention (% of full attention's exact
    matches on the same items) with 95% intervals."""
    lines = [
        "| method | compression | exact match % | retention % |",
        "|---|---|---|---|",
    ]
    for name, record in results["methods"].items():
        figures = summary[name][PROTOCOL]
        policy, budget = method_label(record)
        cells = [figures.get(key) for key in (GROUP, f"{GROUP} retention")]
        shown = " | ".join(c.format(100, 1) if c is not None else "—" for c in cells)
        lines.append(f"| {policy} | {budget} | {shown} |")
    return "\n".join(lines) + "\n"


def _document(results: dict, summary: dict) -> str:
    prompts = results["prompt_tokens"]
    n = len(prompts)
    budgets = ", ".join(f"{b} ({c} tokens kept)" for b, c in results["capacities"].items())
    compressed = ", ".join(
        f"{sum(p > c for p in prompts)} of {n} longer than the {b} budget's {c}"
        for b, c in results["capacities"].items()
    )
    tokenizer = results["tokenizer"]
    ids = "as UTF-8 bytes" if tokenizer is None else f"with {tokenizer}"
    lines = [
        "# Your own questions",
        "",
        f"`kvpop-compile eval` on {results['model']}: {n} prompt/answer records from "
        f"{results['data']}, read {ids}. Each prompt enters the "
        "cache, then the answer's length in tokens is decoded greedily; an item counts when "
        "every token equals the answer's. Budgets are sized for "
        f"{results['length']}-token contexts: {budgets} per layer and KV head, with "
        f"{SINKS} sinks and a window of {WINDOW} inside them (a learned policy: the window its "
        "scorer was saved with, where a note says so). Prompts are "
        f"{min(prompts)}–{max(prompts)} tokens (median {statistics.median(prompts):g}); "
        f"{compressed} (only those lose anything to eviction). Figures are exact matches in %, "
        "with 95% bootstrap intervals over items in brackets; retention is a method's exact "
        "matches as a share of full attention's (— where full attention answers none).",
        "",
        answers_markdown(results, summary),
    ]
    notes = method_notes(results["methods"]) + results.get("run_notes", [])
    lines += report_footer(results, notes)
    return "\n".join(lines)


def evaluate_answers(
    original: nn.Module,
    out_dir: str | Path,
    items: list[AnswerItem],
    *,
    methods: list[Method],
    batch: int = 16,
    scorer_root: str | Path | None = None,
    model_name: str = "the embedded model",
    data: str = "",
    tokenizer: str | None = None,
    notes: list[str] | tuple[str, ...] = (),
    progress: bool = True,
) -> dict:
    """Run :func:`run_answers` and write ``answers.json`` and ``answers.md`` into ``out_dir``;
    returns the results with ``summary`` and ``document`` (the markdown) added. ``data`` says
    what was read, ``tokenizer`` which tokenizer made the ids (None: UTF-8 bytes) and ``notes``
    what the report should add."""
    results = run_answers(
        original, items, methods, batch=batch, scorer_root=scorer_root, progress=progress
    )
    results.update(model=model_name, data=data, tokenizer=tokenizer, run_notes=list(notes))
    summary = summarize_recall(results)
    document = _document(results, summary)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1) + "\n"
    atomic_write(out / "answers.json", lambda p: Path(p).write_text(text))
    atomic_write(out / "answers.md", lambda p: Path(p).write_text(document))
    return {**results, "summary": summary, "document": document}
