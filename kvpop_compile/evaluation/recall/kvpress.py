"""kvpress's presses in the recall report.

``benchmarks/kvpress_eval.py --recall`` asks the recall benchmark's held-out items of SnapKV,
ExpectedAttention, TOVA, KNorm and StreamingLLM in kvpress's own environment and writes
``kvpress_recall.json``: per press, budget and protocol, 1.0 or 0.0 per item by group, named as
the benchmark names them (``"held_out/chain@2048"``, :func:`~.protocol.group_key`). Placed beside
``recall.json``, its presses join the report, in each family group's table: exact match with
95% bootstrap intervals over items, and retention against this run's full attention on the same
items with the same draws. Item ``i`` of a group is the same item in both runs (one seeded
stream), so when the runs asked different numbers of items, both are cut to the first ones. A
file whose groups are none of this run's (items of another generator, without family groups)
is not compared.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..methods import BUDGETS, FULL, NO_PRESS
from ..statistics import Estimate, ratio
from .protocol import RECALL_SEED

KVPRESS_RECALL = "kvpress_recall.json"


def load_kvpress_recall(folder: str | Path) -> dict | None:
    """The saved ``kvpress_recall.json`` in ``folder``, or None when there is none."""
    path = Path(folder) / KVPRESS_RECALL
    return json.loads(path.read_text()) if path.is_file() else None


def kvpress_method(press: str, budget: str) -> str:
    """The report's name of ``press`` at ``budget`` (``"kvpress snapkv @ 88%"``)."""
    return f"kvpress {press} @ {budget}"


def _shared(exact: list, reference: list) -> tuple[list, list]:
    """Both lists cut to the items both runs asked (the first ones of the group's stream)."""
    n = min(len(exact), len(reference))
    return exact[:n], reference[:n]


def group_figures(groups: dict, full: dict) -> dict[str, Estimate]:
    """``{group: exact match, "<group> retention": against full attention}`` of one press,
    budget and protocol, on the groups this run's full attention (``full``) also has."""
    figures = {}
    for group, exact in groups.items():
        if group not in full:
            continue
        exact, reference = _shared(exact, full[group])
        ones = [1.0] * len(exact)
        figures[group] = ratio(exact, ones)
        if sum(reference) > 0:
            figures[f"{group} retention"] = ratio(exact, ones, reference, ones)
    return figures


def full_attention_check(groups: dict, full: dict, protocol: str) -> str:
    """A note comparing kvpress's run without a press to this run's full attention."""
    theirs = mine = agree = count = 0
    for group, exact in groups.items():
        if group not in full:
            continue
        exact, reference = _shared(exact, full[group])
        theirs, mine = theirs + sum(exact), mine + sum(reference)
        agree += sum(a == b for a, b in zip(exact, reference, strict=True))
        count += len(exact)
    return (
        f"kvpress without a press (its own full attention, {protocol} protocol) answers "
        f"{theirs:.0f} of {count} shared items exactly, this run's full attention {mine:.0f}; "
        f"they agree on {agree}"
    )


def summarize_kvpress_recall(kvpress: dict, results: dict) -> tuple[dict, list[str]]:
    """The presses' figures (:func:`group_figures`) by report name and protocol, and notes.

    Returns ``({"kvpress <press> @ <budget>": {protocol: figures}}, notes)``. A failed run
    gives a note instead of figures, press ``none`` the :func:`full_attention_check`, and items
    drawn with another seed, or a run on other model weights (``model_sha256``, when this
    run's results record one), leave the presses out.
    """
    seed = kvpress.get("seed", RECALL_SEED)
    if seed != results.get("seed", RECALL_SEED):
        ours = results.get("seed", RECALL_SEED)
        return {}, [f"kvpress recall: not compared (its items have seed {seed}, this run's {ours})"]
    weights = results.get("model_sha256")
    if weights is not None and kvpress.get("model_sha256") != weights:
        return {}, [
            f"kvpress recall: not compared ({KVPRESS_RECALL} was run on model weights "
            f"{kvpress.get('model_sha256')}, this run on {weights}: rerun "
            "benchmarks/kvpress_eval.py --recall)"
        ]
    other_budgets = _other_budgets(kvpress)
    if other_budgets is not None:
        return {}, [other_budgets]
    full = results["methods"][FULL]
    unmatched = _unmatched_groups(kvpress, results)
    if unmatched is not None:
        return {}, [unmatched]
    summary: dict[str, dict] = {}
    notes = [_about(kvpress, results)]
    for press, budgets in kvpress.get("results", {}).items():
        for budget, protocols in budgets.items():
            for protocol, groups in protocols.items():
                if "error" in groups:
                    notes.append(f"kvpress {press} at {budget} ({protocol}): failed: "
                                 f"{groups['error']}")  # fmt: skip
                    continue
                reference = full.get(protocol, {})
                if press == NO_PRESS:
                    notes.append(full_attention_check(groups, reference, protocol))
                    continue
                figures = group_figures(groups, reference)
                if figures:
                    summary.setdefault(kvpress_method(press, budget), {})[protocol] = figures
    return summary, notes


def _other_budgets(kvpress: dict) -> str | None:
    """A note when kvpress kept other token counts than this benchmark's methods, which keep
    :data:`~..methods.BUDGETS` at every item length (a run that kept fewer tokens at a shorter
    length would sit beside rows that keep more), else None. A run of some of the budgets only
    is compared at those."""
    other = {
        length: kept
        for length, kept in kvpress.get("budgets", {}).items()
        if not kept or any(BUDGETS.get(budget) != count for budget, count in kept.items())
    }
    if not other:
        return None
    shown = "; ".join(f"at {length} bytes {kept}" for length, kept in sorted(other.items()))
    return (
        f"kvpress recall: not compared ({KVPRESS_RECALL} kept {shown} tokens per layer and KV "
        f"head, this run's methods {BUDGETS} at every length: rerun "
        "benchmarks/kvpress_eval.py --recall)"
    )


def _unmatched_groups(kvpress: dict, results: dict) -> str | None:
    """A note when none of kvpress's groups is one of this run's full attention's (its items
    were made by another generator, or named without family groups), else None."""
    theirs = {
        group
        for budgets in kvpress.get("results", {}).values()
        for protocols in budgets.values()
        for groups in protocols.values()
        for group in groups
        if group != "error"  # a failed run: its message, no groups
    }
    full = results["methods"][FULL]
    ours = {group for protocol in results["protocols"] for group in full.get(protocol, {})}
    if not theirs or theirs & ours:
        return None
    return (
        f"kvpress recall: not compared ({KVPRESS_RECALL} holds groups "
        f"{', '.join(sorted(theirs))}, none of this run's {', '.join(sorted(ours))}: rerun "
        "benchmarks/kvpress_eval.py --recall)"
    )


def _about(kvpress: dict, results: dict) -> str:
    """Where the kvpress rows come from and how they differ from this run's."""
    versions = kvpress.get("versions", {})
    line = (
        f"kvpress rows: `benchmarks/kvpress_eval.py --recall` ({KVPRESS_RECALL}), kvpress "
        f"{versions.get('kvpress', '?')} in its own environment (transformers "
        f"{versions.get('transformers', '?')}); each press compresses the prompt, less its last "
        "token, to the budget, and every answer token is chosen from the compressed cache"
    )
    if "decode" in kvpress.get("protocols", []):
        interval = kvpress.get("decode_interval")
        line += (
            f"; in the decode protocol kvpress compresses every {interval} forwards, so its cache "
            f"holds up to {interval} tokens over the budget between compressions"
        )
    if kvpress.get("families", results.get("families")) != results.get("families"):
        line += (
            f"; it asked the family groups {', '.join(kvpress.get('families') or [])}, this run "
            f"{', '.join(results.get('families') or [])}: its rows hold the groups both asked"
        )
    if kvpress.get("items") != results.get("items"):
        line += (
            f"; it asked {kvpress.get('items')} items per group, this run "
            f"{results.get('items')}: its rows and retention use the first "
            f"{min(kvpress.get('items') or 0, results.get('items') or 0)}"
        )
    return line
