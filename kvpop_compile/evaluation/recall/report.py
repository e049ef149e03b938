"""Summaries of the recall protocol: exact-match accuracy per method, protocol, family group,
task and length, with 95% bootstrap intervals over items, retention against full attention (the
same draws for both), and the recall targets judged on them, each retention target with its
interval. Trained-family and held-out-family rows are printed apart, and judged by targets of
their own. kvpress's presses join from a ``kvpress_recall.json`` beside ``recall.json``
(:mod:`.kvpress`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ...atomic import atomic_write
from ...embedded.recall import TASKS
from ...embedded.recall_syntax import FAMILY_SPLITS
from ...fingerprints import weights_sha256
from ..data import SEQUENCE_LENGTH
from ..methods import BUDGETS, FULL, method_notes
from ..statistics import Estimate, ratio
from .kvpress import load_kvpress_recall, summarize_kvpress_recall
from .protocol import (
    RECALL_SEED,
    RecallSettings,
    recall_settings_record,
    run_recall,
    split_group_key,
)

HEURISTICS = ("window", "random", "knorm", "h2o", "tova")
GROUP_NAMES = {
    "train": "trained families",
    "validation": "validation families",
    "held_out": "held-out families",
}
"""How the report names each family group (:data:`~kvpop_compile.embedded.recall_syntax.
FAMILY_SPLITS`)."""
TARGET_LENGTH = 2048
"""The length in bytes full attention's targets, and memory's in the prefill protocol, are at."""
LEAD_POINTS = 30.0
"""Points of exact match `memory` at 88% must lead the best heuristic by, on every judged group."""


@dataclass(frozen=True)
class Floors:
    """One family group's targets: full attention's exact match, and `memory`'s retention of
    full attention's exact matches by budget."""

    full: float
    kept: dict[str, float]


TARGETS = {
    "train": Floors(full=0.90, kept={"75%": 0.95, "88%": 0.90}),
    "held_out": Floors(full=0.80, kept={"75%": 0.90, "88%": 0.85}),
}
"""The family groups the targets judge, and their floors; a validation group has none."""


def summarize_recall(results: dict) -> dict[str, dict[str, dict[str, Estimate]]]:
    """``{method: {protocol: {group: accuracy}}}``, and ``"<group> retention"`` entries for
    every method but full attention."""
    full = results["methods"][FULL]
    summary: dict = {}
    for name, record in results["methods"].items():
        per_protocol = {}
        for protocol in results["protocols"]:
            figures = {}
            for group, exact in record.get(protocol, {}).items():
                ones = [1.0] * len(exact)
                figures[group] = ratio(exact, ones)
                reference = full.get(protocol, {}).get(group)
                if name != FULL and reference is not None and sum(reference) > 0:
                    figures[f"{group} retention"] = ratio(exact, ones, reference, ones)
            per_protocol[protocol] = figures
        summary[name] = per_protocol
    return summary


def _cell_order(cell: str) -> tuple:
    """``"task@length"`` in the order of :data:`~kvpop_compile.embedded.recall.TASKS`, then by
    length; an unknown task after them, by name."""
    task, _, length = cell.rpartition("@")
    known = TASKS.index(task) if task in TASKS else len(TASKS)
    return known, task, int(length) if length.isdigit() else 0


def _family_order(families: str | None) -> tuple:
    """Family groups in :data:`FAMILY_SPLITS` order; a group without a family last."""
    if families in FAMILY_SPLITS:
        return 0, FAMILY_SPLITS.index(families), ""
    return (1, 0, families) if families is not None else (2, 0, "")


def family_tables(results: dict, protocol: str) -> dict[str | None, list[str]]:
    """The family groups any method of ``results`` has under ``protocol``, in report order,
    each with its ``task@length`` cells in report order (None: groups without a family)."""
    cells: dict[str | None, set[str]] = {}
    for record in results["methods"].values():
        for group in record.get(protocol, {}):
            families, cell = split_group_key(group)
            cells.setdefault(families, set()).add(cell)
    ordered = sorted(cells, key=_family_order)
    return {f: sorted(cells[f], key=_cell_order) for f in ordered}


def _group(families: str | None, cell: str) -> str:
    return cell if families is None else f"{families}/{cell}"


def _table_title(protocol: str, families: str | None) -> str:
    if families is None:
        return f"### {protocol} protocol, exact match %"
    return f"### {protocol} protocol, {GROUP_NAMES.get(families, families)}: exact match %"


def recall_markdown(results: dict, summary: dict, kvpress: dict | None = None) -> str:
    """One table per protocol and family group: methods (then kvpress's presses, ``kvpress``
    as :func:`~.kvpress.summarize_kvpress_recall` gives them) as rows, ``task@length``
    exact match as columns."""
    parts = []
    for protocol in results["protocols"]:
        named = [(name, summary[name][protocol]) for name in results["methods"]]
        named += [(n, p[protocol]) for n, p in (kvpress or {}).items() if protocol in p]
        for families, cells in family_tables(results, protocol).items():
            rows = ["| method | " + " | ".join(cells) + " |", "|---" * (len(cells) + 1) + "|"]
            for name, figures in named:
                shown = [figures.get(_group(families, cell)) for cell in cells]
                rows.append(
                    f"| {name} | " + " | ".join(c.format(100, 1) if c else "" for c in shown) + " |"
                )
            parts.append(f"{_table_title(protocol, families)}\n\n" + "\n".join(rows))
    return "\n\n".join(parts)


def heuristic_rivals(summary: dict, kvpress: dict, protocol: str, group: str) -> dict:
    """``{name: estimate}`` of every heuristic at 88% on ``group``: the project's
    (:data:`HEURISTICS`) and kvpress's presses (named ``kvpress <press>``)."""
    rivals = {
        h: summary[f"{h} @ 88%"][protocol][group]
        for h in HEURISTICS
        if f"{h} @ 88%" in summary and group in summary[f"{h} @ 88%"].get(protocol, {})
    }
    for name, per_protocol in kvpress.items():
        if name.endswith(" @ 88%") and group in per_protocol.get(protocol, {}):
            rivals[name.removesuffix(" @ 88%")] = per_protocol[protocol][group]
    return rivals


def at_least(value: float, floor: float) -> bool:
    """``value >= floor`` for figures that are ratios of item counts: compared to 12 decimals,
    so that a ratio equal to its floor (85 of 100 against 0.85) is never short by a rounding
    error of its float, while any true shortfall (at least one over the square of the items
    counted) still counts."""
    return round(value - floor, 12) >= 0


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


def _judged(results: dict, protocol: str) -> list[tuple[str, str, str]]:
    """``(families, cell, group)`` of the groups under ``protocol`` that targets may judge:
    those of a family group with targets (:data:`TARGETS`) that full attention has."""
    tables = family_tables(results, protocol)
    return [
        (families, cell, _group(families, cell))
        for families in TARGETS
        for cell in tables.get(families, [])
        if _group(families, cell) in results["methods"][FULL].get(protocol, {})
    ]


def _full_targets(summary: dict, judged, protocol: str, at: int) -> list[str]:
    lines = []
    for families, cell, group in judged:
        if not cell.endswith(f"@{at}"):
            continue
        floor, estimate = TARGETS[families].full, summary[FULL][protocol][group]
        lines.append(
            f"- full attention ≥ {floor:.0%} on {GROUP_NAMES[families]}, {cell} ({protocol}): "
            f"{_verdict(at_least(estimate.value, floor))} — {100 * estimate.value:.1f}%"
        )
    return lines


def _retention_targets(summary: dict, judged, protocol: str, in_scope) -> list[str]:
    lines = []
    for budget in ("75%", "88%"):
        figures = summary.get(f"memory @ {budget}", {}).get(protocol, {})
        for families, cell, group in judged:
            estimate = figures.get(f"{group} retention")
            if estimate is None or not in_scope(cell):
                continue
            floor = TARGETS[families].kept[budget]
            # The verdict is the target's, on the measured figure; the interval (the same
            # draws of items for both methods) says whether another sample of items could
            # turn it, which a target judged within a few items of its floor needs.
            interval = (
                f"95% interval {100 * estimate.low:.1f}-{100 * estimate.high:.1f}%"
                if math.isfinite(estimate.low) and math.isfinite(estimate.high)
                # Resamples in which full attention answers none of the items have no ratio.
                else "no interval: full attention answers too few of these items"
            )
            lines.append(
                f"- `memory` at {budget} keeps ≥ {floor:.0%} of full attention on "
                f"{GROUP_NAMES[families]}, {cell} ({protocol}): "
                f"{_verdict(at_least(estimate.value, floor))} — {100 * estimate.value:.1f}% "
                f"({interval})"
            )
    return lines


def _lead_targets(summary: dict, kvpress: dict, judged, protocol: str, in_scope) -> list[str]:
    lines = []
    memory = summary.get("memory @ 88%", {}).get(protocol, {})
    # The target counts kvpress's presses among the heuristics: where none ran in this
    # protocol, the verdict is over the project's heuristics alone, and the line says so.
    pressed = any(protocol in per_protocol for per_protocol in kvpress.values())
    unpressed = "" if pressed else f"; kvpress's presses not run in the {protocol} protocol"
    for families, cell, group in judged:
        estimate = memory.get(group)
        rivals = heuristic_rivals(summary, kvpress, protocol, group)
        if estimate is None or not rivals or not in_scope(cell):
            continue
        best = max(rivals, key=lambda h: rivals[h].value)
        margin = 100 * (estimate.value - rivals[best].value)
        lines.append(
            f"- `memory` at 88% ≥ {LEAD_POINTS:.0f} points ahead of the best heuristic on "
            f"{GROUP_NAMES[families]}, {cell} ({protocol}): "
            f"{_verdict(at_least(margin, LEAD_POINTS))} — {100 * estimate.value:.1f}% against "
            f"{best}'s {100 * rivals[best].value:.1f}% ({margin:+.1f} points){unpressed}"
        )
    return lines


def recall_targets(
    results: dict, summary: dict, at: int = TARGET_LENGTH, kvpress: dict | None = None
) -> list[str]:
    """The recall targets, each met or missed with its figures, for the trained and the
    held-out family groups apart (:data:`TARGETS`), wherever the report has the rows a target
    needs: full attention's exact match at ``at`` bytes; ``memory``'s retention at 75% and 88%
    and its lead at 88% over the best heuristic (:data:`LEAD_POINTS`; the project's and
    kvpress's presses, ``kvpress`` as in :func:`recall_markdown`) at ``at`` bytes in the
    prefill protocol and, since a question after a generated stretch needs room in the model's
    positions, at every length the decode protocol ran."""
    lines = []
    for protocol in results["protocols"]:
        judged = _judged(results, protocol)

        def in_scope(cell: str, protocol=protocol) -> bool:
            return protocol == "decode" or cell.endswith(f"@{at}")

        lines += _full_targets(summary, judged, protocol, at)
        lines += _retention_targets(summary, judged, protocol, in_scope)
        lines += _lead_targets(summary, kvpress or {}, judged, protocol, in_scope)
    return lines


def _no_targets(results: dict) -> str:
    """Why the report judges no target."""
    if not any(
        split_group_key(group)[0] is not None
        for protocol in results["protocols"]
        for group in results["methods"][FULL].get(protocol, {})
    ):
        return (
            "- none: these results have no family groups (items of an earlier generator); "
            "rerun `kvpop-compile eval --recall`"
        )
    return (
        f"- none here: the targets are at {TARGET_LENGTH} bytes in the prefill protocol and "
        "wherever the decode protocol ran, on trained and held-out families"
    )


GROUP_MEANINGS = {
    "train": "the binding and question syntaxes and value alphabets the model and the scorers "
    "were trained on",
    "validation": "the ones trained scorers are chosen on",
    "held_out": "syntaxes and alphabets no training step and no choice among trained scorers saw",
}


def _asked(results: dict) -> str:
    """What the run asked, for the report's first paragraph."""
    lengths = ", ".join(str(n) for n in results["lengths"])
    families = results.get("families")
    if not families:
        return f"{results['items']} held-out items per task and length ({lengths} bytes)"
    groups = " and ".join(
        f"{GROUP_NAMES.get(f, f)} ({GROUP_MEANINGS[f]})" if f in GROUP_MEANINGS else f
        for f in families
    )
    return (
        f"{results['items']} items of held-out code per family group, task and length "
        f"({lengths} bytes), in {groups}"
    )


def _budgets(results: dict) -> str:
    """How much a budget compresses at each length other than the benchmark's, for the report's
    first paragraph; empty when every item has the benchmark's length. A budget keeps a fixed
    number of tokens (:data:`~..methods.BUDGETS`), so it compresses a shorter prompt less, and
    the decode protocol's stretch adds positions before the question."""
    shorter = [n for n in results["lengths"] if n != SEQUENCE_LENGTH]
    if not shorter:
        return ""
    pairs = [f'{capacity} at "{budget}"' for budget, capacity in BUDGETS.items()]
    kept = " and ".join([pairs[0].replace(" at ", " tokens at ", 1), *pairs[1:]])

    def compressions(positions: int) -> str:
        return " and ".join(f"{100 * (1 - c / positions):.0f}%" for c in BUDGETS.values())

    decode = "decode" in results.get("protocols", ["prefill", "decode"])

    def at(n: int) -> str:
        prompt = f"at {n} bytes they compress the prompt by {compressions(n)}"
        if not decode:
            return prompt
        reached = n + results["stretch"][str(n)]
        return f"{prompt}, and the {reached} positions decode reaches by {compressions(reached)}"

    lengths = "; ".join(at(n) for n in shorter)
    return (
        f" Budgets are named by the compression of a {SEQUENCE_LENGTH}-token context: each layer "
        f"and KV head keeps {kept} at every length ({lengths})."
    )


def recall_document(results: dict, kvpress: dict | None = None) -> str:
    """The recall report's markdown for ``results`` (as :func:`~.protocol.run_recall` returns
    them, with ``model``), joined with kvpress's saved recall results when given."""
    summary = summarize_recall(results)
    kvpress_summary, notes = {}, []
    if kvpress is not None:
        kvpress_summary, notes = summarize_kvpress_recall(kvpress, results)
    notes = method_notes(results["methods"]) + notes
    model_name = results.get("model", "the embedded model")
    stretch = ", ".join(f"{n}: {s}" for n, s in results["stretch"].items())
    targets = recall_targets(results, summary, kvpress=kvpress_summary)
    protocols = results.get("protocols", ["prefill", "decode"])
    decode = (
        f" Decode protocol: tokens generated before the question, by length: {stretch} (a "
        "length with no room for them is not run)."
        if "decode" in protocols
        else " Prefill protocol only (the prompt compressed); the decode protocol was not run."
    )
    parts = [
        "# Long-range recall",
        f"{_asked(results)}; on {model_name}, exact match of the greedy answer, with 95% "
        f"bootstrap intervals over items.{decode}{_budgets(results)}",
        recall_markdown(results, summary, kvpress_summary),
        "## Targets\n\n" + "\n".join(targets or [_no_targets(results)]),
    ]
    if notes:
        parts.append("## Notes\n\n" + "\n".join(f"- {note}" for note in notes))
    return "\n\n".join(parts)


def write_recall_report(results: dict, out_dir) -> dict:
    """Write ``recall.json`` and ``recall.md`` (joined with ``kvpress_recall.json`` when it is in
    ``out_dir``) into ``out_dir``; returns the results with ``document`` (the markdown)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    document = recall_document(results, load_kvpress_recall(out))
    text = json.dumps(results, indent=1) + "\n"
    atomic_write(out / "recall.json", lambda p: Path(p).write_text(text))
    atomic_write(out / "recall.md", lambda p: Path(p).write_text(document + "\n"))
    return {**results, "document": document}


def resumable_methods(saved: dict, expected: dict) -> dict:
    """The methods of ``saved`` (a ``recall.json``) when it was run with the settings in
    ``expected`` (:func:`~.protocol.recall_settings_record` plus ``model`` and
    ``model_sha256``, the fingerprint of its weights); ``ValueError``
    naming the first setting that differs otherwise, since its items would not be this run's."""
    for key, value in expected.items():
        theirs = saved.get(key, RECALL_SEED if key == "seed" else None)
        if theirs != value:
            raise ValueError(
                f"cannot resume: the saved recall.json was run with {key} {theirs!r}, this run "
                f"asks {key} {value!r}; give the saved run's settings, or another --out"
            )
    return dict(saved.get("methods", {}))


def evaluate_recall(
    original,
    out_dir,
    *,
    methods: list,
    settings=None,
    scorer_root=None,
    model_name: str = "the embedded model",
    progress: bool = True,
    resume: bool = False,
) -> dict:
    """Run the recall protocol (:func:`~.protocol.run_recall`) and write its report
    (:func:`write_recall_report`); returns the results with ``document`` (the markdown).

    ``recall.json`` is rewritten (atomically) after every method, so a cut-off run loses at
    most the method it was on. With ``resume``, the methods of a ``recall.json`` already in
    ``out_dir`` are kept and not rerun when it was run with the same settings and model
    (:func:`resumable_methods`); the report then has its methods and this run's.
    """
    out = Path(out_dir)
    settings = settings or RecallSettings()
    model = {"model": model_name, "model_sha256": weights_sha256(original)}
    expected = {
        **recall_settings_record(settings, original.config.max_position_embeddings),
        **model,
    }
    saved = out / "recall.json"
    done = resumable_methods(json.loads(saved.read_text()), expected) if (
        resume and saved.is_file()
    ) else None  # fmt: skip

    def save(partial: dict) -> None:
        out.mkdir(parents=True, exist_ok=True)
        text = json.dumps({**partial, **model}, indent=1) + "\n"
        atomic_write(saved, lambda p: Path(p).write_text(text))

    results = run_recall(
        original, methods, settings=settings, scorer_root=scorer_root, progress=progress,
        done=done, on_method=save,
    )  # fmt: skip
    results.update(model)
    return write_recall_report(results, out)
