"""The demo's picture: per layer, which positions of the text the KVpop cache holds at the end.

Each panel is the whole sequence (prompt and KVpop's continuation) laid out as text, one cell
per token, a new row at each newline. A cell is coloured by what holds it at the end — sink,
window or pool — with the colour's strength the share of the layer's KV heads that hold it;
evicted tokens stay blank.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .atomic import atomic_write

COLUMNS = 96  # cells per row before a long line wraps
MAX_PANELS = 8  # layers drawn at most (evenly spaced) so that large models stay legible
PANEL_COLUMNS = 2
KINDS = (("sink", (0.55, 0.25, 0.75)), ("window", (0.2, 0.65, 0.3)), ("pool", (0.95, 0.55, 0.1)))


def held_by_kind(positions: torch.Tensor, seen: int, sinks: int, window: int) -> torch.Tensor:
    """Share of heads holding each position, by kind: (3, seen) for sink, window, pool.

    ``positions`` (H, C) are one layer's cached positions (-1 for an empty slot)."""
    share = torch.zeros(len(KINDS), seen)
    heads = positions.shape[0]
    for row in positions:
        kept = row[row >= 0]
        kind = torch.where(
            kept < sinks, 0, torch.where(kept >= seen - window, 1, 2)
        )  # sink, window, pool
        share[kind, kept] += 1.0 / heads
    return share


def _layout(pieces: list[str]) -> list[tuple[int, int]]:
    """(row, column) of each token's cell: a new row after a newline or at COLUMNS."""
    cells, row, col = [], 0, 0
    for piece in pieces:
        if col >= COLUMNS:
            row, col = row + 1, 0
        cells.append((row, col))
        col += 1
        if "\n" in piece:
            row, col = row + 1, 0
    return cells


def _glyph(piece: str) -> str:
    piece = piece.replace("\n", "").replace("\t", " ")
    char = piece[:1]
    return char if char.isprintable() and char not in " $\\" else ""


def plot_kept_positions(result, path: Path) -> Path:
    """Draw ``result`` (a :class:`~kvpop_compile.demo.DemoResult`) to ``path`` (PNG)."""
    from .evaluation.plots import pyplot

    plt = pyplot()

    setup, config = result.setup, result.setup.config
    ids = torch.cat([setup.prompt[0], result.kvpop.tokens[0]])
    seen = ids.numel() - 1  # the last generated token was never fed back
    pieces = [setup.text(ids[i : i + 1]) for i in range(seen)]
    cells = _layout(pieces)
    rows = cells[-1][0] + 1
    layers = result.kvpop.cache.layers
    if len(layers) <= MAX_PANELS:
        chosen = list(range(len(layers)))
    else:
        chosen = torch.linspace(0, len(layers) - 1, MAX_PANELS).round().long().tolist()
    columns = min(PANEL_COLUMNS, len(chosen))
    grid_rows = -(-len(chosen) // columns)
    fig, axes = plt.subplots(
        grid_rows, columns, squeeze=False,
        figsize=(0.1 * COLUMNS * columns + 1, (0.16 * rows + 0.6) * grid_rows + 1),
    )  # fmt: skip
    for ax in axes.flat[len(chosen) :]:
        ax.axis("off")
    prompt_length = setup.prompt.shape[1]
    for ax, index in zip(axes.flat, chosen, strict=False):
        positions = layers[index].state.positions[0]  # (H, C), first sequence
        share = held_by_kind(positions, seen, config.sinks, config.window)
        image = torch.ones(rows, COLUMNS, 3)
        for t, (r, c) in enumerate(cells):
            for k, (_, colour) in enumerate(KINDS):
                if share[k, t] > 0:
                    strength = 0.35 + 0.65 * float(share[k, t])
                    image[r, c] = 1 - strength * (1 - torch.tensor(colour))
        ax.imshow(image.numpy(), aspect="auto", interpolation="nearest")
        for t, (r, c) in enumerate(cells):
            glyph = _glyph(pieces[t])
            if glyph:
                grey = "black" if t >= prompt_length else "0.3"
                ax.text(c, r, glyph, ha="center", va="center", fontsize=5.5, family="monospace",
                        color=grey)  # fmt: skip
        kept = int((positions >= 0).sum(-1).max())
        ax.set_title(f"layer {index}: {kept} of {seen} positions per head", fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [plt.matplotlib.patches.Patch(color=colour, label=name) for name, colour in KINDS]
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=9)
    fig.suptitle(
        f"KVpop cache at the end: {config.sinks} sinks + {config.window} window + {config.topk} "
        f"pool, {config.scorer.value} scorer (pale: held by some of the KV heads; grey text: "
        "prompt)",
        fontsize=11, x=0.01, ha="left",
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
    return path
