"""What a training step reads: text windows, copy rows and recall items mixed into long rows."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from kvpop_compile.embedded.corpus import read_bytes
from kvpop_compile.embedded.recall import RecallItem, make_item, split_text

from .progress import Progress

SHORT_LEN, LONG_LEN = 512, 2048
COPY_LEN = 256  # row length of the copy steps
COPY_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
STRETCH_ITEM_LEN = LONG_LEN // 2
"""Length of the item in a stretch row: the decode protocol asks at 1024 bytes, and the stretch
fills the rest of the row, as the protocol's generated tokens fill the model's positions."""
LOOP_UNIT = (2, 48)
"""Shortest and longest repeated unit of a stretch's loop, in bytes: greedy decoding of the
embedded model settles into a phrase (`` a string``) or a line (``self.build_dir = None``)."""
LOOP_SOURCE = 128
"""A loop's unit is cut from this many bytes before the loop starts, as greedy decoding repeats
what it has just read or written."""


def training_stream(files: list[str], seed: int) -> torch.Tensor:
    """All training files' bytes, concatenated in a seeded order: shape (total_bytes,), uint8."""
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    data = b"".join(read_bytes(files[i]) for i in order)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def copy_batch(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of one random string of 8-32 letters and digits repeated: (batch, length + 1) ids.

    Past its first period every byte is a copy of the byte one period back, and nothing but
    copying predicts it.
    """
    alphabet = torch.tensor(list(COPY_ALPHABET))
    rows = []
    for _ in range(batch):
        period = int(torch.randint(8, 33, (1,), generator=gen))
        piece = alphabet[torch.randint(0, len(alphabet), (period,), generator=gen)]
        rows.append(piece.repeat(length // period + 2)[: length + 1])
    return torch.stack(rows)


def sample_batch(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """``batch`` random windows of ``length + 1`` bytes: (batch, length + 1) int64 ids."""
    starts = torch.randint(0, stream.numel() - length - 1, (batch,), generator=gen)
    offsets = torch.arange(length + 1)
    return stream[starts[:, None] + offsets].long()


@dataclass
class RecallMasks:
    """Masks over the targets ``ids[:, 1:]`` of a batch, each (batch, LONG_LEN) bool."""

    questions: torch.Tensor
    """The bytes of the questions and their answers (weighted by ``--recall-weight``)."""
    answers: torch.Tensor
    """The answers' bytes alone (logged)."""
    stretch: torch.Tensor
    """The synthetic stretches' bytes, left out of the next-byte loss: a loop is not text the
    model should learn to write, only text it should learn to read past."""

    @classmethod
    def empty(cls, ids: torch.Tensor) -> RecallMasks:
        """All-false masks for ``ids`` (batch, LONG_LEN + 1)."""
        shape = (ids.shape[0], ids.shape[1] - 1)
        return cls(*(torch.zeros(shape, dtype=torch.bool) for _ in range(3)))

    def mark(self, row: int, prompt_end: int, item: RecallItem) -> None:
        """Mark ``item``'s question and answer, whose prompt ends at byte ``prompt_end`` of
        ``row``. Target j predicts byte j + 1, so the answer's bytes are targets from the
        prompt's last byte on. A question starts on its own line, and is the only part of the
        prompt after its last newline."""
        first = prompt_end - 1
        asked = first - (len(item.prompt) - 1 - item.prompt.rindex(b"\n"))
        self.answers[row, first : first + len(item.answer)] = True
        self.questions[row, asked : first + len(item.answer)] = True


class RecallMix:
    """Replaces a share of the 2048-byte training rows with recall items from training files.

    A ``stretch_fraction`` of those rows asks the way the decode protocol does: one item of
    :data:`STRETCH_ITEM_LEN` bytes whose question comes after a stretch standing for the
    model's own greedy text (:meth:`stretch`), so that a question asked after a long generated
    stretch is one the model has seen.

    Items are drawn in order from the training split's streams (seed ``args.seed``), so a run
    never repeats an item; ``state``/``load_state`` carry the position across a resume.
    """

    def __init__(
        self,
        fraction: float,
        lengths: list[int],
        tasks: list[str],
        seed: int,
        stretch_fraction: float = 0.0,
    ):
        self.fraction, self.lengths, self.tasks, self.seed = fraction, lengths, tasks, seed
        self.stretch_fraction = stretch_fraction
        self.rng = random.Random(f"recall-mix/{seed}")
        self.next_index = 0

    def rows(self, ids: torch.Tensor, done: Progress) -> RecallMasks:
        """Overwrite some rows of ``ids`` (batch, LONG_LEN + 1) in place; masks of what they
        hold."""
        masks = RecallMasks.empty(ids)
        for row in range(ids.shape[0]):
            if self.rng.random() >= self.fraction:
                continue
            # No draw at all without stretch rows: runs without them keep their item streams.
            if self.stretch_fraction and self.rng.random() < self.stretch_fraction:
                ids[row] = self._stretch_row(row, masks)
                done.recall_items += 1
                done.stretch_items += 1
                continue
            length = self.rng.choice(self.lengths)
            data, start = b"", 0
            for _ in range(LONG_LEN // length):
                item = self._item(self.rng.choice(self.tasks), length)
                masks.mark(row, start + len(item.prompt), item)
                data += item.prompt + item.answer
                start += length
                done.recall_items += 1
            # The row holds LONG_LEN + 1 bytes; a newline ends the last answer as code would.
            ids[row] = torch.frombuffer(bytearray(data + b"\n"), dtype=torch.uint8).long()
        return masks

    def _stretch_row(self, row: int, masks: RecallMasks) -> torch.Tensor:
        """One item's context, a stretch, then its question and answer: (LONG_LEN + 1,) ids;
        marks the row's question, answer and stretch targets in the masks."""
        item = self._item(self.rng.choice(self.tasks), STRETCH_ITEM_LEN)
        cut = item.prompt.rindex(b"\n") + 1  # the question is the prompt's last line
        # Any word of the question or answer in the stretch would give the answer away.
        words = re.findall(rb"\w+", item.prompt[cut:] + item.answer)
        filler = self.stretch(item.prompt[:cut], LONG_LEN - STRETCH_ITEM_LEN, words)
        data = item.prompt[:cut] + filler + item.prompt[cut:] + item.answer + b"\n"
        masks.stretch[row, cut - 1 : cut - 1 + len(filler)] = True
        masks.mark(row, len(item.prompt) + len(filler), item)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()

    def stretch(self, before: bytes, length: int, avoid: list[bytes]) -> bytes:
        """``length`` bytes standing for what greedy decoding writes after ``before``: a piece
        of training code of random length (0 to ``length``, from a line start), then a loop of
        one unit of :data:`LOOP_UNIT` bytes cut from the :data:`LOOP_SOURCE` bytes before it,
        cut off wherever the length ends (mid-line, as a generated stretch is). Redrawn while
        any of ``avoid`` occurs in it."""
        text = split_text("train")
        while True:
            code_len = self.rng.randrange(length + 1)
            offset = text.index(b"\n", self.rng.randrange(len(text) - 2 * length)) + 1
            code = text[offset : offset + code_len]
            source = (before + code)[-LOOP_SOURCE:]
            unit_len = self.rng.randint(*LOOP_UNIT)
            end = self.rng.randint(unit_len, len(source))
            unit = source[end - unit_len : end]
            filler = code + (unit * (length // unit_len + 1))[: length - code_len]
            if not any(word in filler for word in avoid):
                return filler

    def _item(self, task: str, length: int) -> RecallItem:
        self.next_index += 1
        return make_item("train", task, length, self.seed, self.next_index - 1)

    def state(self) -> dict:
        return {"rng": self.rng.getstate(), "next_index": self.next_index}

    def load_state(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.next_index = state["next_index"]
