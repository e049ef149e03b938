"""Why a policy misses recall items: what its cache holds of the asked value once it answers.

    python benchmarks/recall_misses.py          # memory @ 75%, call, 64 held-out items, 2048 bytes
    python benchmarks/recall_misses.py --policy memory --budget 88% --task multi_key --out m.md

Each held-out item is answered greedily under the prefill protocol (as ``kvpop-compile eval
--recall`` does) and, once the answer is written, every layer's cache is read: how many KV heads
hold all the asked value's bytes (``RecallItem.value_span``; a head without them cannot copy the
value) and how many hold some of every planted line (the demo's measure). The report sums this
over the answered and the missed items, then lists the missed ones; it names a missed target's
cause rather than choosing anything, so it reads the held-out items the benchmark reads.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.harness import write_report  # noqa: E402
from kvpop_compile.embedded import load_embedded_model  # noqa: E402
from kvpop_compile.embedded.recall import CONTEXT_LENGTHS, TASKS, recall_items  # noqa: E402
from kvpop_compile.evaluation.methods import BUDGETS, POLICIES, build_model, methods  # noqa: E402
from kvpop_compile.evaluation.recall.kept import heads_holding_evidence, heads_holding_span  # noqa: E402
from kvpop_compile.evaluation.recall.protocol import RECALL_SEED, greedy_answers  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "recall_misses.md"
BATCH = 16


@dataclass(frozen=True)
class Reading:
    """One item as the policy answered it: ``value_heads`` and ``evidence_heads`` count, per
    layer, the KV heads holding every byte of the value and some of every planted line."""

    index: int
    expected: bytes
    answer: bytes
    value_heads: list[int]
    evidence_heads: list[int]

    @property
    def right(self) -> bool:
        return self.answer == self.expected


def read_items(model, items) -> list[Reading]:
    """Answer ``items`` (one task and length) with ``model`` and read its caches once the answer
    is written: each layer's ``positions (B, H, C)``, row ``b`` for item ``b`` of a batch. The
    readings are in ``items``' order."""
    readings = []
    # Items of one answer length share a batch, so that every row's cache is read just after
    # its own answer's last token was chosen.
    by_answer: dict[int, list[int]] = {}
    for index, item in enumerate(items):
        by_answer.setdefault(len(item.answer), []).append(index)
    for rows in [r[at : at + BATCH] for r in by_answer.values() for at in range(0, len(r), BATCH)]:
        batch = [items[i] for i in rows]
        tokens, cache = greedy_answers(model, batch, "prefill")
        for b, item in enumerate(batch):
            per_layer = [layer.state.positions[b] for layer in cache.layers]  # (H, C) each
            readings.append(Reading(
                rows[b], item.answer, bytes(tokens[b].tolist()),
                [int(heads_holding_span(p, *item.value_span).sum()) for p in per_layer],
                [int(heads_holding_evidence(p, item.evidence).sum()) for p in per_layer],
            ))  # fmt: skip
    return sorted(readings, key=lambda reading: reading.index)


def report(readings: list[Reading], heads: int, title: str) -> str:
    """A markdown report of ``readings``: a summary by outcome, then one row per missed item."""
    pairs = heads * len(readings[0].value_heads)  # (layer, head) pairs
    lines = [
        f"# {title}",
        "",
        "Once the answer is written, per item: the (layer, KV head) pairs holding every byte "
        f"of the asked value, out of {pairs}, and the items where no pair holds it; per missed "
        f"item, the heads of each layer (of {heads}) holding the value and holding some of "
        "every planted line. Written by `benchmarks/recall_misses.py`.",
        "",
        "| items | count | pairs holding the value (mean) | no pair holds the value |",
        "|---|---|---|---|",
    ]
    missed = [r for r in readings if not r.right]
    for label, group in (("answered", [r for r in readings if r.right]), ("missed", missed)):
        if not group:
            lines.append(f"| {label} | 0 | – | – |")
            continue
        mean = sum(sum(r.value_heads) for r in group) / len(group)
        unheld = sum(not any(r.value_heads) for r in group)
        lines.append(f"| {label} | {len(group)} | {mean:.1f} | {unheld} |")
    if missed:
        lines += [
            "",
            "| item | expected | answered | value held, by layer | planted line held, by layer |",
            "|---|---|---|---|---|",
        ]
        for r in missed:
            value = " ".join(f"{n}/{heads}" for n in r.value_heads)
            evidence = " ".join(f"{n}/{heads}" for n in r.evidence_heads)
            expected, shown = r.expected.decode(), r.answer.decode("utf-8", "replace")
            shown = shown.replace("\n", "\\n").replace("|", "\\|")  # one table cell
            lines.append(f"| {r.index} | `{expected}` | `{shown}` | {value} | {evidence} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="memory", choices=POLICIES)
    parser.add_argument("--budget", default="75%", choices=list(BUDGETS))
    parser.add_argument("--task", default="chain", choices=TASKS)
    parser.add_argument("--length", type=int, default=2048, choices=CONTEXT_LENGTHS)
    parser.add_argument("--items", type=int, default=64, help="held-out items (64)")
    parser.add_argument("--scorers", type=Path, help="trained scorers (default: the shipped)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="markdown file (default: in results/)")
    args = parser.parse_args(argv)
    if args.items < 1:
        parser.error(f"--items must be at least 1, got {args.items}")
    torch.set_num_threads(args.threads)
    model = load_embedded_model()
    # The recall benchmark's own method: its budgets keep 512 and 256 tokens whatever the item
    # length, and a learned policy runs at the window and score spread it was saved with.
    method = methods([args.policy], [args.budget], priority_span=None, scorer_root=args.scorers)[1]
    policy_model = build_model(model, method, args.scorers)
    items = recall_items("held_out", args.task, args.length, args.items, RECALL_SEED)
    readings = read_items(policy_model, items)
    right = sum(r.right for r in readings)
    title = (
        f"What {method.name} holds once it has answered: {args.task}@{args.length}, prefill, "
        f"{right}/{len(readings)} held-out items answered (window {method.window}, score "
        f"spread {method.priority_span})"
    )
    text = report(readings, model.config.num_key_value_heads, title)
    write_report(args.out or RESULTS, text)
    return text


if __name__ == "__main__":
    main()
