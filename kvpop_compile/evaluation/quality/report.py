"""The quality report's content: every figure of a run pooled over sequences, with 95%
bootstrap intervals over sequences (:mod:`kvpop_compile.evaluation.statistics`), paired
differences between methods, kvpress's presses beside this run's full attention, the tables,
and the targets judged on them.

A pooled figure is a ratio of sums over sequences (e.g. correct / count), so sequences with
more long-range targets weigh more there; retention resamples the method and full attention
with the same draw, so their shared per-sequence difficulty cancels.
"""

from __future__ import annotations

from ..methods import BUDGETS, FULL, KEPT_FRACTION, NO_PRESS
from ..statistics import Estimate, ratio, ratio_difference

FIGURES = {
    # figure: (protocol, numerator, denominator, relative to full attention)
    "accuracy": ("teacher_forced", "correct", "count", False),
    "retention": ("teacher_forced", "correct", "count", True),
    "nll": ("teacher_forced", "nll", "count", False),
    "lr_accuracy": ("teacher_forced", "lr_correct", "lr_count", False),
    "lr_retention": ("teacher_forced", "lr_correct", "lr_count", True),
    "agreement": ("continuation", "agree", "count", False),
    "first_difference": ("continuation", "first_difference", None, False),
    "compression_accuracy": ("compression", "correct", "count", False),
    "compression_retention": ("compression", "correct", "count", True),
    "compression_lr_accuracy": ("compression", "lr_correct", "lr_count", False),
    "compression_lr_retention": ("compression", "lr_correct", "lr_count", True),
}


def summarize(results: dict) -> dict[str, dict[str, Estimate]]:
    """Method name -> figure name -> estimate, for the figures its protocols allow (long-range
    ones only where the run found long-range targets: in byte tokens)."""
    methods = results["methods"]
    full = methods[FULL]
    summary = {}
    for name, record in methods.items():
        figures = {}
        for figure, (protocol, num, den, relative) in FIGURES.items():
            if protocol not in record:
                continue
            data = record[protocol]
            if num not in data:
                continue
            denominator = data[den] if den else [1.0] * len(data[num])
            if relative:
                ref = full[protocol]
                figures[figure] = ratio(data[num], denominator, ref[num], ref[den])
            else:
                figures[figure] = ratio(data[num], denominator)
        summary[name] = figures
    return summary


def paired_difference(results: dict, method: str, other: str, figure: str) -> Estimate:
    """``method``'s ``figure`` minus ``other``'s on the same sequences, with the 95% interval
    of the difference: both are resampled with the same draws, so the difficulty of a sequence,
    shared by the two methods, cancels (a paired bootstrap). ``method`` and ``other`` are keys
    of ``results["methods"]``; ``figure`` a key of :data:`FIGURES` with a denominator."""
    if figure not in FIGURES or FIGURES[figure][2] is None:
        allowed = sorted(f for f, spec in FIGURES.items() if spec[2] is not None)
        raise ValueError(f"figure must be one of {allowed}, got {figure!r}")
    protocol, num, den, relative = FIGURES[figure]
    records = results["methods"]
    for name in (method, other):
        if name not in records or num not in records[name].get(protocol, {}):
            raise ValueError(f"no {figure!r} for method {name!r} in these results")
    ref = records[FULL][protocol] if relative else {num: None, den: None}
    a, b = records[method][protocol], records[other][protocol]
    return ratio_difference(a[num], a[den], b[num], b[den], ref[num], ref[den])


def _cell(figures: dict, figure: str, scale: float = 1.0, digits: int = 3) -> str:
    return figures[figure].format(scale, digits) if figure in figures else "—"


LABELS = {
    "memory": "KVpop memory",
    "mlp": "KVpop mlp",
    "window": "window (StreamingLLM)",
    "h2o": "h2o (H2O)",
    "tova": "tova (TOVA)",
    "knorm": "knorm (K-norm)",
    "random": "random",
}


def method_label(record: dict) -> tuple[str, str]:
    """A results record's row label in a report: ``(method, compression)``."""
    if record["policy"] is None:
        return "full attention", "0%"
    return LABELS[record["policy"]], record["budget"]


def markdown_tables(results: dict, summary: dict, kvpress: dict | None = None) -> str:
    """The benchmark's tables: teacher-forced (all and long-range), continuation, compression."""
    methods = results["methods"]
    unit = "byte" if results.get("tokenizer") is None else "token"
    lines = [
        f"| method | compression | top-1 accuracy | retention % | NLL (nats/{unit}) | "
        "long-range accuracy | long-range retention % | continuation agreement % | "
        "first difference (tokens) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, record in methods.items():
        f = summary[name]
        policy, budget = method_label(record)
        lines.append(
            f"| {policy} | {budget} | {_cell(f, 'accuracy')} | {_cell(f, 'retention', 100, 1)} | "
            f"{_cell(f, 'nll')} | {_cell(f, 'lr_accuracy')} | {_cell(f, 'lr_retention', 100, 1)} "
            f"| {_cell(f, 'agreement', 100, 1)} | {_cell(f, 'first_difference', 1, 0)} |"
        )
    if not any("compression" in r for r in methods.values()):
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "Prompt compression: the first "
        f"{results['prompt_length']} tokens compressed to the budget, the next "
        f"{results['length'] - results['prompt_length']} scored.",
        "",
        "| method | compression | top-1 accuracy | retention % | long-range accuracy | "
        "long-range retention % |",
        "|---|---|---|---|---|---|",
    ]
    rows = [(method_label(r), summary[n]) for n, r in methods.items() if "compression" in r]
    for name, figures in (kvpress or {}).items():
        rows.append(((f"kvpress {name[0]}", name[1]), figures))
    for (policy, budget), f in rows:
        lines.append(
            f"| {policy} | {budget} | {_cell(f, 'compression_accuracy')} | "
            f"{_cell(f, 'compression_retention', 100, 1)} | "
            f"{_cell(f, 'compression_lr_accuracy')} | "
            f"{_cell(f, 'compression_lr_retention', 100, 1)} |"
        )
    return "\n".join(lines) + "\n"


def report_footer(results: dict, notes: list[str]) -> list[str]:
    """The closing lines of a report: its notes, then how long the run took and on what."""
    lines = ["## Notes", "", *(f"- {note}" for note in notes), ""] if notes else []
    v = results["versions"]
    return [
        *lines,
        f"Run: {results['seconds'] / 60:.1f} minutes; kvpop_compile {v['kvpop_compile']}, torch "
        f"{v['torch']}, transformers {v['transformers']}, Python {v['python']}.",
        "",
    ]


def budget_compression(budget: str) -> float:
    """The compression a budget label names, as a fraction (``"88%"`` -> 0.875)."""
    return 1.0 - 1.0 / KEPT_FRACTION[budget]


def summarize_kvpress(kvpress: dict, results: dict) -> tuple[dict, list[str]]:
    """Figures for the kvpress presses, relative to this run's full attention (prompt
    compression), on the sequences both runs share. Returns ``({(press, budget): figures},
    notes)``; a press that failed gives a note instead of figures."""
    if "compression" not in results["methods"][FULL]:
        return {}, ["kvpress: not compared (this run did not include the compression protocol)"]
    ours = {source: i for i, source in enumerate(results["sequences"])}
    full = results["methods"][FULL]["compression"]
    summary, notes = {}, []
    scored = results["length"] - results["prompt_length"]
    for press, budgets in kvpress.get("results", {}).items():
        for budget, data in budgets.items():
            if "error" in data:
                notes.append(f"kvpress {press} at {budget}: failed: {data['error']}")
                continue
            rows = [r for r in data["sequences"] if r["source"] in ours]
            if press == NO_PRESS:  # kvpress's own full attention: a check of the protocol
                mine = sum(full["correct"][ours[r["source"]]] for r in rows)
                theirs = sum(r["accuracy"] for r in rows) * scored
                notes.append(
                    f"kvpress without a press (its own full attention) predicts "
                    f"{theirs:.0f} targets right on the shared sequences, this run's full "
                    f"attention {mine:.0f}"
                )
                continue
            if not rows:
                notes.append(f"kvpress {press} at {budget}: no sequence in common with this run")
                continue
            index = [ours[r["source"]] for r in rows]
            num = [r["accuracy"] * scored for r in rows]
            den = [float(scored)] * len(rows)
            lr_num = [float(r["long_range_correct"]) for r in rows]
            lr_den = [float(r["long_range_count"]) for r in rows]
            keys = ("correct", "count", "lr_correct", "lr_count")
            ref = {k: [full[k][i] for i in index] for k in keys}
            summary[(press, budget)] = {
                "compression_accuracy": ratio(num, den),
                "compression_retention": ratio(num, den, ref["correct"], ref["count"]),
                "compression_lr_accuracy": ratio(lr_num, lr_den),
                "compression_lr_retention": ratio(
                    lr_num, lr_den, ref["lr_correct"], ref["lr_count"]
                ),
            }
            if len(rows) < len(ours):
                notes.append(
                    f"kvpress {press} at {budget}: {len(rows)} of this run's {len(ours)} "
                    "sequences (its run had fewer)"
                )
    return summary, notes


# A learned policy against the heuristic it must not fall below on plain text.
PAIRED_TARGETS = (("memory", "window"), ("mlp", "random"))


def quality_targets(results: dict, summary: dict, kvpress: dict) -> list[str]:
    """The targets for the learned policies, each met or missed with the figure (the paired
    ones of :func:`paired_targets` last)."""
    lines = []
    wanted = {"75%": 0.99, "88%": 0.97}
    for budget, floor in wanted.items():
        name = f"memory @ {budget}"
        if name not in summary or "retention" not in summary[name]:
            continue
        r = summary[name]["retention"]
        verdict = "met" if r.value >= floor else "missed"
        lines.append(
            f"- `memory` retains >= {floor:.0%} of full-attention top-1 accuracy at {budget}: "
            f"{100 * r.value:.1f}% [{100 * r.low:.1f}, {100 * r.high:.1f}] — {verdict}"
        )
    for budget in BUDGETS:
        mine = summary.get(f"memory @ {budget}")
        if mine is None:
            continue
        for figure, what in (
            ("retention", "all positions"),
            ("lr_retention", "long-range positions"),
            ("compression_retention", "prompt compression"),
        ):
            if figure not in mine:
                continue
            rivals = {
                n: f[figure]
                for n, f in summary.items()
                if n.endswith(f"@ {budget}") and not n.startswith("memory") and figure in f
            }
            if figure == "compression_retention":
                rivals.update(
                    {f"kvpress {p}": f[figure] for (p, b), f in kvpress.items() if b == budget}
                )
            if not rivals:
                continue
            best_name, best = max(rivals.items(), key=lambda item: item[1].value)
            margin = 100 * (mine[figure].value - best.value)
            verdict = "met" if margin > 0 else "missed"
            lines.append(
                f"- `memory` beats every other method at {budget}, {what}: "
                f"{100 * mine[figure].value:.1f}% against the best other, {best_name}, "
                f"{100 * best.value:.1f}% ({margin:+.1f} points) — {verdict}"
            )
    return lines + paired_targets(results)


def paired_targets(results: dict) -> list[str]:
    """Each learned policy keeps at least its heuristic's retention: the paired 95% interval
    of the difference reaches 0 or above (the difference is not shown to be negative)."""
    lines = []
    for mine, rival in PAIRED_TARGETS:
        for budget in BUDGETS:
            a, b = f"{mine} @ {budget}", f"{rival} @ {budget}"
            if a not in results["methods"] or b not in results["methods"]:
                continue
            for figure, what in (("retention", "all"), ("lr_retention", "long-range")):
                try:
                    d = paired_difference(results, a, b, figure)
                except ValueError:  # no long-range targets in this run's tokens
                    continue
                verdict = "met" if d.high >= 0 else "missed"
                lines.append(
                    f"- `{mine}` keeps at least `{rival}`'s retention at {budget}, {what} "
                    f"targets: difference {100 * d.value:+.1f} points, paired 95% interval "
                    f"[{100 * d.low:+.2f}, {100 * d.high:+.2f}] — {verdict}"
                )
    return lines
