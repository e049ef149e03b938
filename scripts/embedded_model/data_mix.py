"""What a training step reads: text windows, copy rows and recall items mixed into long rows."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from kvpop_compile.embedded.corpus import read_bytes
from kvpop_compile.embedded.recall import RecallItem, make_item

if TYPE_CHECKING:
    from .training_loop import Progress

SHORT_LEN, LONG_LEN = 512, 2048
COPY_LEN = 256  # row length of the copy steps
COPY_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


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


class RecallMix:
    """Replaces a share of the 2048-byte training rows with recall items from training files.

    Items are drawn in order from the training split's streams (seed ``args.seed``), so a run
    never repeats an item; ``state``/``load_state`` carry the position across a resume.
    """

    def __init__(self, fraction: float, lengths: list[int], tasks: list[str], seed: int):
        self.fraction, self.lengths, self.tasks, self.seed = fraction, lengths, tasks, seed
        self.rng = random.Random(f"recall-mix/{seed}")
        self.next_index = 0

    def rows(self, ids: torch.Tensor, done: Progress) -> torch.Tensor:
        """Overwrite some rows of ``ids`` (batch, LONG_LEN + 1) in place.

        Returns two masks over the targets ``ids[:, 1:]``, each (batch, LONG_LEN): the bytes of
        the questions and answers, and the answers' bytes alone.
        """
        questions = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
        answers = torch.zeros_like(questions)
        for row in range(ids.shape[0]):
            if self.rng.random() >= self.fraction:
                continue
            length = self.rng.choice(self.lengths)
            data, start = b"", 0
            for _ in range(LONG_LEN // length):
                item = self._item(self.rng.choice(self.tasks), length)
                # Target j predicts byte j + 1, so the answer's bytes are targets from the
                # prompt's last byte on. A question starts on its own line, and is the only
                # part of the prompt after its last newline.
                first = start + len(item.prompt) - 1
                answers[row, first : first + len(item.answer)] = True
                asked = start + item.prompt.rindex(b"\n")
                questions[row, asked : first + len(item.answer)] = True
                data += item.prompt + item.answer
                start += length
                done.recall_items += 1
            # The row holds LONG_LEN + 1 bytes; a newline ends the last answer as code would.
            ids[row] = torch.frombuffer(bytearray(data + b"\n"), dtype=torch.uint8).long()
        return questions, answers

    def _item(self, task: str, length: int) -> RecallItem:
        self.next_index += 1
        return make_item("train", task, length, self.seed, self.next_index - 1)

    def state(self) -> dict:
        return {"rng": self.rng.getstate(), "next_index": self.next_index}

    def load_state(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.next_index = state["next_index"]
