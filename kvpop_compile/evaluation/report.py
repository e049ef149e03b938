"""Summaries of a benchmark run: pooled means with 95% bootstrap intervals, tables and plots.

A pooled figure is a ratio of sums over sequences (e.g. correct / count), so sequences with
more long-range targets weigh more there. Its interval resamples *sequences* with replacement
(percentile bootstrap, seeded); retention resamples the method and full attention with the
same draw, so their shared per-sequence difficulty cancels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .methods import FULL, KEPT_FRACTION

RESAMPLES = 2000
NO_PRESS = "none"  # kvpress run without compression, by benchmarks/kvpress_eval.py


@dataclass(frozen=True)
class Estimate:
    """A pooled figure and its 95% interval."""

    value: float
    low: float
    high: float

    def format(self, scale: float = 1.0, digits: int = 3) -> str:
        v, lo, hi = (x * scale for x in (self.value, self.low, self.high))
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


@functools.lru_cache(maxsize=8)
def _draws(n: int, seed: int = 0) -> torch.Tensor:
    """(RESAMPLES, n) sequence indices drawn with replacement, the same for every figure."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (RESAMPLES, n), generator=generator)


def _ratio_draws(num, den, ref_num=None, ref_den=None) -> tuple[float, torch.Tensor]:
    """``sum(num) / sum(den)``, divided by the reference's when given, and its value under
    each of the :data:`RESAMPLES` draws of sequences ``(RESAMPLES,)``."""
    num, den = torch.tensor(num, dtype=torch.float64), torch.tensor(den, dtype=torch.float64)
    draws = _draws(num.numel())

    def stat(n, d):
        return n.sum(-1) / d.sum(-1)

    value, boot = stat(num, den), stat(num[draws], den[draws])
    if ref_num is not None:
        rn = torch.tensor(ref_num, dtype=torch.float64)
        rd = torch.tensor(ref_den, dtype=torch.float64)
        value, boot = value / stat(rn, rd), boot / stat(rn[draws], rd[draws])
    return float(value), boot


def _interval(value: float, boot: torch.Tensor) -> Estimate:
    low, high = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return Estimate(value, low, high)


def _ratio(num, den, ref_num=None, ref_den=None) -> Estimate:
    """``sum(num) / sum(den)``, divided by the reference's when given, with its interval."""
    return _interval(*_ratio_draws(num, den, ref_num, ref_den))


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
                figures[figure] = _ratio(data[num], denominator, ref[num], ref[den])
            else:
                figures[figure] = _ratio(data[num], denominator)
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
    value_a, boot_a = _ratio_draws(a[num], a[den], ref[num], ref[den])
    value_b, boot_b = _ratio_draws(b[num], b[den], ref[num], ref[den])
    return _interval(value_a - value_b, boot_a - boot_b)


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


def _label(record: dict) -> tuple[str, str]:
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
        policy, budget = _label(record)
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
    rows = [(_label(r), summary[n]) for n, r in methods.items() if "compression" in r]
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
                "compression_accuracy": _ratio(num, den),
                "compression_retention": _ratio(num, den, ref["correct"], ref["count"]),
                "compression_lr_accuracy": _ratio(lr_num, lr_den),
                "compression_lr_retention": _ratio(
                    lr_num, lr_den, ref["lr_correct"], ref["lr_count"]
                ),
            }
            if len(rows) < len(ours):
                notes.append(
                    f"kvpress {press} at {budget}: {len(rows)} of this run's {len(ours)} "
                    "sequences (its run had fewer)"
                )
    return summary, notes
