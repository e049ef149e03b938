"""The demo's picture: which positions of the recall item each bounded cache holds when the
question is answered, per layer, with the planted lines the answer follows from marked.

One strip per (cache, layer), one pixel column per position of the prompt. A position is
coloured by what holds it — sink, window or pool — with the colour's strength the share of the
layer's KV heads that hold it; evicted positions stay blank. Red bands mark the lines the answer
follows from (``RecallItem.evidence``): a cache that lost one cannot answer from them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...atomic import atomic_write
from ..recall.kept import heads_holding_evidence

KINDS = (("sink", (0.55, 0.25, 0.75)), ("window", (0.2, 0.65, 0.3)), ("pool", (0.95, 0.55, 0.1)))
EVIDENCE_COLOUR = (0.85, 0.1, 0.1)


def held_by_kind(positions: torch.Tensor, seen: int, sinks: int, window: int) -> torch.Tensor:
    """Share of heads holding each position, by kind: ``(3, seen)`` for sink, window, pool.

    ``positions (H, C)`` are one layer's cached positions (-1 for an empty slot)."""
    share = torch.zeros(len(KINDS), seen)
    heads = positions.shape[0]
    for row in positions:
        kept = row[(row >= 0) & (row < seen)]
        kind = torch.where(
            kept < sinks, 0, torch.where(kept >= seen - window, 1, 2)
        )  # sink, window, pool
        share[kind, kept] += 1.0 / heads
    return share


def _strip(share: torch.Tensor) -> torch.Tensor:
    """``(1, seen, 3)`` RGB of one layer's shares (white where no head holds a position)."""
    image = torch.ones(share.shape[1], 3)
    for k, (_, colour) in enumerate(KINDS):
        strength = torch.where(share[k] > 0, 0.35 + 0.65 * share[k], 0.0)[:, None]
        image = torch.where(share[k, :, None] > 0, 1 - strength * (1 - torch.tensor(colour)), image)
    return image[None]


def plot_kept_positions(result, path: Path) -> Path:
    """Draw ``result`` (a :class:`~kvpop_compile.evaluation.demo.DemoResult`) to ``path`` (PNG)."""
    from ..plotting import pyplot

    plt = pyplot()
    example = result.example
    bounded = [c for c in result.contenders if c.config is not None]
    layers = len(example.caches[bounded[0].label].layers)
    fig, axes = plt.subplots(len(bounded) * layers, 1, squeeze=False,
                             figsize=(12, 0.55 * len(bounded) * layers + 1.4))  # fmt: skip
    for c_index, contender in enumerate(bounded):
        cache, config = example.caches[contender.label], contender.config
        answer = example.answers[contender.label]
        verdict = "right" if answer == example.item.answer else "wrong"
        for layer, state in enumerate(layer.state for layer in cache.layers):
            ax = axes[c_index * layers + layer, 0]
            positions = state.positions[0]  # (H, C), the one sequence
            seen = int(state.seen[0])
            share = held_by_kind(positions, seen, config.sinks, config.layer(layer).window)
            ax.imshow(_strip(share).numpy(), aspect="auto", interpolation="nearest")
            for start, end in example.item.evidence:
                ax.axvspan(start - 0.5, end - 0.5, color=EVIDENCE_COLOUR, alpha=0.25, lw=0)
            held = int(heads_holding_evidence(positions, example.item.evidence).sum())
            ax.set_yticks([])
            ax.set_ylabel(f"layer {layer}", rotation=0, ha="right", va="center", fontsize=8)
            ax.text(1.005, 0.5, f"evidence held by {held}/{positions.shape[0]} KV heads",
                    transform=ax.transAxes, va="center", fontsize=7)  # fmt: skip
            if layer == 0:
                ax.set_title(f"{contender.label}: answers {answer.decode('utf-8', 'replace')!r}"
                             f" ({verdict})", fontsize=10, loc="left")  # fmt: skip
            if c_index * layers + layer < len(bounded) * layers - 1:
                ax.set_xticks([])
    axes[-1, 0].set_xlabel("position in the prompt (bytes)")
    handles = [plt.matplotlib.patches.Patch(color=colour, label=name) for name, colour in KINDS]
    evidence = "the lines the answer follows from"
    handles.append(plt.matplotlib.patches.Patch(color=EVIDENCE_COLOUR, alpha=0.25, label=evidence))
    fig.legend(handles=handles, loc="upper right", ncol=4, fontsize=8)
    fig.suptitle(
        f"Recall item {example.index} ({example.item.task}, {example.item.family} syntax), "
        f"expected {example.item.answer.decode('utf-8', 'replace')!r}:\nwhat each cache holds at "
        "the answer (pale: some KV heads)",
        fontsize=10, x=0.01, ha="left",
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0, 0.86, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path
