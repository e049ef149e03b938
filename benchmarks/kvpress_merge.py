"""Join recall files of kvpress's presses, run on the same items, into one.

``benchmarks/kvpress_eval.py --recall`` writes one file per run; runs of other presses or
budgets on the same items, model and kvpress join here (``kvpress_eval.py --merge`` calls it), a
later run's press, budget and protocol replacing an earlier one's.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvpop_compile.atomic import atomic_write

# What makes two recall runs on the same items, model and kvpress: they must agree on these.
SAME_RUN = ("protocol", "items", "tasks", "families", "lengths", "protocols", "seed", "stretch",
            "decode_interval", "checkpoint_sha256", "model_sha256", "versions")  # fmt: skip


def merge_recall_summaries(summaries: list[dict]) -> dict:
    """One recall summary from ``summaries`` of runs on the same items (:data:`SAME_RUN`), in
    order: a later run's press, budget and protocol replaces an earlier one's; the budgets
    asked are joined per length, the errors are those of the merged results, and the elapsed
    times add up. ``ValueError`` naming the first field two runs disagree on."""
    if not summaries:
        raise ValueError("nothing to merge: give at least one recall summary")
    first = summaries[0]
    for index, summary in enumerate(summaries[1:], start=1):
        for field in SAME_RUN:
            if summary.get(field) != first.get(field):
                raise ValueError(
                    f"run {index} differs from run 0 in {field!r} ({summary.get(field)!r} "
                    f"against {first.get(field)!r}): only runs on the same items, model and "
                    "kvpress merge"
                )
    merged = {field: first.get(field) for field in SAME_RUN}
    results: dict[str, dict] = {}
    means: dict[str, dict] = {}
    budgets: dict[str, dict] = {}
    for summary in summaries:
        for press, by_budget in summary["results"].items():
            for budget, by_protocol in by_budget.items():
                for protocol, outcome in by_protocol.items():
                    results.setdefault(press, {}).setdefault(budget, {})[protocol] = outcome
                    kept = means.setdefault(press, {}).setdefault(budget, {})
                    kept.pop(protocol, None)
                    if "error" not in outcome:
                        kept[protocol] = summary["exact_match"][press][budget][protocol]
        for length, asked in summary["budgets"].items():
            budgets.setdefault(length, {}).update(asked)
    errors = [
        f"{press} {budget} {protocol}: {outcome['error']}"
        for press, by_budget in results.items()
        for budget, by_protocol in by_budget.items()
        for protocol, outcome in by_protocol.items()
        if "error" in outcome
    ]
    elapsed = round(sum(summary["elapsed_s"] for summary in summaries), 1)
    return {**merged, "results": results, "exact_match": means, "errors": errors,
            "budgets": budgets, "elapsed_s": elapsed}  # fmt: skip


def merge_files(paths: list[Path], out: Path) -> None:
    """:func:`merge_recall_summaries` of the recall files ``paths`` into ``out``, atomically."""
    merged = merge_recall_summaries([json.loads(Path(path).read_text()) for path in paths])
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps(merged, indent=1)))
    print(f"wrote {out}: {len(paths)} runs merged")
