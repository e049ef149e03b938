"""Long-range recall sequences made from a user's own training text.

A scorer learns to keep what a later query attends to; ordinary text rarely asks about a line
2,000 tokens back, so a run on it alone learns mostly recency. This plants recall items
(:func:`kvpop_compile.embedded.recall.assemble`: a key bound to a value in one of the trained
syntax families, decoys, and a question at the end whose answer is the value) in windows of the
user's own text, tokenizes them with the run's tokenizer, and fills each sequence's start with
ordinary text, so the item's question is the sequence's last tokens. ``TrainSettings``'s
``recall_fraction`` is the share of training sequences made so.

:func:`stretched_sequences` asks items the decode way instead: the model's own greedy
continuation of the prompt stands between the binding and the question, as a long generation
would, so a scorer trained on them sees the tokens its model writes compete with the old line a
question will need.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch import nn

from ..config import require_int
from ..embedded.corpus import encode
from ..embedded.recall import TASKS, TRAINING_LENGTHS, RecallItem, assemble
from ..evaluation.recall.protocol import greedy_continuations
from .data import Tokenizer


def _item_ids(text: bytes, task: str, seq_len: int, tokenizer: Tokenizer, draw: str):
    """The token ids of the longest item of ``task`` whose tokens fit ``seq_len``, or None
    when not even the shortest fits. Each length is its own seeded draw (``draw/length``),
    so an item does not depend on the longer ones tried before it."""
    for length in sorted(TRAINING_LENGTHS, reverse=True):
        if len(text) < 4 * length:
            continue  # assemble needs four contexts of text to draw a window from
        item = assemble(text, task, length, random.Random(f"{draw}/{length}"))
        ids = tokenizer((item.prompt + item.answer).decode("utf-8", errors="replace"))
        if len(ids) <= seq_len:
            return ids
    return None


def recall_sequences(
    texts: Sequence[str],
    filler: torch.Tensor,
    tokenizer: Tokenizer,
    count: int,
    seed: int = 0,
) -> torch.Tensor:
    """``count`` sequences ``(count, seq_len)`` int64, each one recall item planted in the
    concatenated ``texts`` (tasks in turn, drawn with ``seed``), at the sequence's end, after
    the first tokens of an ordinary sequence of ``filler (S, seq_len)``.

    ``ValueError`` when the texts are too short to plant items in, or ``seq_len`` too short
    for the shortest item's tokens."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    seq_len = filler.shape[1]
    text = "\n".join(texts).encode("utf-8")
    shortest = min(TRAINING_LENGTHS)
    if len(text) < 4 * shortest or text.count(b"\n") < 2:
        raise ValueError(
            f"recall items need at least {4 * shortest} bytes of text with line breaks to plant "
            f"in; the data has {len(text)} bytes"
        )
    rows = []
    for index in range(count):
        draw = f"user-data/{seed}/{index}"
        task = TASKS[index % len(TASKS)]
        ids = _item_ids(text, task, seq_len, tokenizer, draw)
        if ids is None:
            raise ValueError(
                f"seq_len {seq_len} is shorter than the tokens of a {shortest}-byte {task} recall "
                "item; use a longer seq_len or recall_fraction=0"
            )
        row = random.Random(f"{draw}/filler").randrange(filler.shape[0])
        start = filler[row, : seq_len - len(ids)]
        rows.append(torch.cat([start, torch.tensor(ids, dtype=torch.int64)]))
    return torch.stack(rows) if rows else filler[:0].clone()


def stretched_sequences(
    model: nn.Module, items: Sequence[RecallItem], seq_len: int, batch: int = 16
) -> torch.Tensor:
    """The decode protocol's sequences as training data, ``(len(items), seq_len)`` int64 byte
    tokens: each item's prompt up to its question line (the line's leading newline included),
    the model's own greedy continuation of that, then the rest of the question and the answer,
    ``seq_len`` tokens in all, so the continuation is ``seq_len - len(prompt) - len(answer)``
    tokens long. ``model`` (a byte-vocabulary model, full attention) writes the continuations,
    ``batch`` items at a time.

    ``ValueError`` when an item leaves no room for a continuation in ``seq_len``."""
    require_int("seq_len", seq_len, 1)
    require_int("batch", batch, 1)
    for item in items:
        if len(item.prompt) + len(item.answer) >= seq_len:
            raise ValueError(
                f"a {item.task} item of {len(item.prompt) + len(item.answer)} bytes leaves no "
                f"room for a continuation in seq_len {seq_len}; use shorter items"
            )
    rows = []
    for first in range(0, len(items), batch):
        asked = items[first : first + batch]
        cuts = [len(i.prompt) - len(i.question) + 1 for i in asked]
        stretches = [seq_len - len(i.prompt) - len(i.answer) for i in asked]
        contexts = [encode(i.prompt[:cut]) for i, cut in zip(asked, cuts, strict=True)]
        written = greedy_continuations(model, contexts, max(stretches))  # (B, max stretch)
        for row, (item, cut, stretch) in enumerate(zip(asked, cuts, stretches, strict=True)):
            rest = encode(item.prompt[cut:] + item.answer)
            rows.append(torch.cat([contexts[row], written[row, :stretch], rest]))
    return torch.stack(rows) if rows else torch.zeros(0, seq_len, dtype=torch.long)
