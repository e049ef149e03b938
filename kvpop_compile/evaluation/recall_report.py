"""Summaries of the recall protocol: exact-match accuracy per method, protocol, task and length,
with 95% bootstrap intervals over items, retention against full attention (the same draws for
both), and the issue's targets judged on them, each retention target with its interval.
kvpress's presses join from a ``kvpress_recall.json`` beside ``recall.json``
(:mod:`.recall_kvpress`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import atomic_write
from .methods import FULL, method_notes
from .recall_kvpress import load_kvpress_recall, summarize_kvpress_recall
from .report import Estimate, _ratio

HEURISTICS = ("window", "random", "knorm", "h2o", "tova")


def summarize_recall(results: dict) -> dict[str, dict[str, dict[str, Estimate]]]:
    """``{method: {protocol: {"task@length": accuracy}}}``, and ``"<group> retention"``
    entries for every method but full attention."""
    full = results["methods"][FULL]
    summary: dict = {}
    for name, record in results["methods"].items():
        per_protocol = {}
        for protocol in results["protocols"]:
            figures = {}
            for group, exact in record.get(protocol, {}).items():
                ones = [1.0] * len(exact)
                figures[group] = _ratio(exact, ones)
                reference = full.get(protocol, {}).get(group)
                if name != FULL and reference is not None and sum(reference) > 0:
                    figures[f"{group} retention"] = _ratio(exact, ones, reference, ones)
            per_protocol[protocol] = figures
        summary[name] = per_protocol
    return summary


def recall_markdown(results: dict, summary: dict, kvpress: dict | None = None) -> str:
    """One table per protocol: methods (then kvpress's presses, ``kvpress`` as
    :func:`~.recall_kvpress.summarize_kvpress_recall` gives them) as rows, ``task@length``
    exact match as columns."""
    parts = []
    for protocol in results["protocols"]:
        groups = sorted({g for record in results["methods"].values()
                         for g in record.get(protocol, {})})  # fmt: skip
        if not groups:
            continue
        header = "| method | " + " | ".join(groups) + " |"
        rows = [header, "|---" * (len(groups) + 1) + "|"]
        named = [(name, summary[name][protocol]) for name in results["methods"]]
        named += [(n, p[protocol]) for n, p in (kvpress or {}).items() if protocol in p]
        for name, figures in named:
            cells = [figures.get(g) for g in groups]
            rows.append(
                f"| {name} | " + " | ".join(c.format(100, 1) if c else "" for c in cells) + " |"
            )
        parts.append(f"### {protocol} protocol, exact match %\n\n" + "\n".join(rows))
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


def _judged_groups(protocol: str, at: int):
    """Whether ``memory``'s targets judge a group of ``protocol``: every length the decode
    protocol ran, ``at`` bytes in the prefill protocol."""
    return lambda group: protocol == "decode" or f"@{at}" in group


def recall_targets(
    results: dict, summary: dict, at: int = 2048, kvpress: dict | None = None
) -> list[str]:
    """The recall targets, each met or missed with its figure: full attention's at ``at``
    bytes; ``memory``'s at ``at`` bytes in the prefill protocol and, since a question after a
    generated stretch needs room in the model's positions, at every length the decode protocol
    ran. The heuristics ``memory`` must lead include kvpress's presses (``kvpress``, as in
    :func:`recall_markdown`)."""
    lines = []
    full = summary.get(FULL, {})
    for protocol in results["protocols"]:
        in_scope = _judged_groups(protocol, at)

        for group, estimate in sorted(full.get(protocol, {}).items()):
            if group.endswith(f"@{at}"):
                verdict = "met" if estimate.value >= 0.9 else "missed"
                lines.append(
                    f"- full attention ≥ 90% on {group} ({protocol}): {verdict} — "
                    f"{100 * estimate.value:.1f}%"
                )
        for budget, floor in (("75%", 0.95), ("88%", 0.90)):
            name = f"memory @ {budget}"
            for group, estimate in sorted(summary.get(name, {}).get(protocol, {}).items()):
                if not group.endswith("retention") or not in_scope(group):
                    continue
                verdict = "met" if estimate.value >= floor else "missed"
                # The verdict is the target's, on the measured figure; the interval (the same
                # draws of items for both methods) says whether another sample of items could
                # turn it, which a target judged within a few items of its floor needs.
                lines.append(
                    f"- `memory` at {budget} keeps ≥ {floor:.0%} of full attention on {group} "
                    f"({protocol}): {verdict} — {100 * estimate.value:.1f}% (95% interval "
                    f"{100 * estimate.low:.1f}-{100 * estimate.high:.1f}%)"
                )
        memory = summary.get("memory @ 88%", {}).get(protocol, {})
        for group, estimate in sorted(memory.items()):
            if group.endswith("retention") or not in_scope(group):
                continue
            rivals = heuristic_rivals(summary, kvpress or {}, protocol, group)
            if not rivals:
                continue
            best = max(rivals, key=lambda h: rivals[h].value)
            margin = 100 * (estimate.value - rivals[best].value)
            verdict = "met" if margin >= 15 else "missed"
            lines.append(
                f"- `memory` at 88% ≥ 15 points ahead of the best heuristic on {group} "
                f"({protocol}): {verdict} — {100 * estimate.value:.1f}% against {best}'s "
                f"{100 * rivals[best].value:.1f}% ({margin:+.1f} points)"
            )
    return lines


def recall_document(results: dict, kvpress: dict | None = None) -> str:
    """The recall report's markdown for ``results`` (as :func:`~.recall.run_recall` returns
    them, with ``model``), joined with kvpress's saved recall results when given."""
    summary = summarize_recall(results)
    kvpress_summary, notes = {}, []
    if kvpress is not None:
        kvpress_summary, notes = summarize_kvpress_recall(kvpress, results)
    notes = method_notes(results["methods"]) + notes
    model_name = results.get("model", "the embedded model")
    lengths = ", ".join(str(n) for n in results["lengths"])
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
        f"{results['items']} held-out items per task and length ({lengths} bytes) on "
        f"{model_name}; exact match of the greedy answer, with 95% bootstrap intervals over "
        f"items.{decode}",
        recall_markdown(results, summary, kvpress_summary),
        "## Targets\n\n"
        + "\n".join(
            targets
            or [
                "- none at these lengths: the targets are at 2048 bytes in the prefill protocol "
                "and wherever the decode protocol ran"
            ]
        ),
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
    ``expected`` (:func:`~.recall.recall_settings_record` plus ``model`` and
    ``model_sha256``, the fingerprint of its weights); ``ValueError``
    naming the first setting that differs otherwise, since its items would not be this run's."""
    from .recall import RECALL_SEED

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
    """Run the recall protocol (:func:`~.recall.run_recall`) and write its report
    (:func:`write_recall_report`); returns the results with ``document`` (the markdown).

    ``recall.json`` is rewritten (atomically) after every method, so a cut-off run loses at
    most the method it was on. With ``resume``, the methods of a ``recall.json`` already in
    ``out_dir`` are kept and not rerun when it was run with the same settings and model
    (:func:`resumable_methods`); the report then has its methods and this run's.
    """
    from .fingerprints import weights_sha256
    from .recall import RecallSettings, recall_settings_record, run_recall

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
