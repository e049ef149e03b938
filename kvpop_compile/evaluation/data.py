"""The quality benchmark's sequences: windows of held-out standard-library files.

(A user's own text becomes sequences in :mod:`.own_data`.)

Held-out files (see :mod:`kvpop_compile.embedded.corpus`) were never trained on. Each file
gives up to ``per_file`` consecutive windows of ``length + 1`` bytes (inputs and their next-byte
targets), taken from its start; files shorter than one window give none. Files are visited in
sorted order, so the same arguments give the same sequences on every machine with the same
standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import require_int
from ..embedded.corpus import encode, read_bytes, split_files, validation_files

SEQUENCE_LENGTH = 2048
"""Tokens per benchmark sequence (the embedded model's context)."""
PROMPT_LENGTH = 1536
"""Prompt tokens in the continuation and prompt-compression protocols; the rest is scored."""


def default_prompt_length(length: int) -> int:
    """The prompt of a ``length``-token sequence: the same share as :data:`PROMPT_LENGTH` of
    :data:`SEQUENCE_LENGTH` (three quarters)."""
    require_int("length", length, 1)
    return length * PROMPT_LENGTH // SEQUENCE_LENGTH


@dataclass(frozen=True)
class Sequence:
    """One benchmark sequence: ``ids`` is (length + 1,) int64 tokens of ``source``.

    ``byte_tokens``: the ids are UTF-8 bytes (a byte-level model), so long-range targets
    (:mod:`.quality.long_range`, which reads identifiers in bytes) can be found in them.
    """

    source: str  # relative path of the file, with the window's offset in it
    ids: torch.Tensor
    byte_tokens: bool = True


def file_windows(
    names: list[str],
    count: int | None = None,
    length: int = SEQUENCE_LENGTH,
    per_file: int = 2,
    root: str | Path | None = None,
) -> list[Sequence]:
    """Up to ``count`` sequences (all when None) of ``length + 1`` bytes of the files ``names``
    (relative to the standard library ``root``), up to ``per_file`` from each, in order; an
    empty list when no file is long enough."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"count must be a positive integer or None, got {count!r}")
    require_int("length", length, 2)
    require_int("per_file", per_file, 1)
    sequences = []
    for name in names:
        data = read_bytes(name, root)
        # Consecutive windows share one byte: the last target of one is the first input of the
        # next, so no byte of the file between them goes unscored.
        for w in range(per_file):
            start = w * length
            if start + length + 1 > len(data):
                break
            window = data[start : start + length + 1]
            sequences.append(Sequence(f"{name}@{start}", encode(window)))
            if count is not None and len(sequences) == count:
                return sequences
    return sequences


def held_out_sequences(
    count: int | None = None,
    length: int = SEQUENCE_LENGTH,
    per_file: int = 2,
    root: str | Path | None = None,
) -> list[Sequence]:
    """Up to ``count`` sequences (all when None) of ``length + 1`` held-out bytes."""
    sequences = file_windows(split_files(root)[1], count, length, per_file, root)
    if not sequences:
        raise RuntimeError(f"no held-out file is longer than {length} bytes")
    return sequences


def validation_sequences(
    count: int | None = None,
    length: int = SEQUENCE_LENGTH,
    per_file: int = 2,
    root: str | Path | None = None,
) -> list[Sequence]:
    """Up to ``count`` sequences of ``length + 1`` bytes of the standard library's test folder
    (:func:`~kvpop_compile.embedded.corpus.validation_files`): text to choose among trained
    scorers on, never trained on and never asked about by a benchmark."""
    sequences = file_windows(validation_files(root), count, length, per_file, root)
    if not sequences:
        raise RuntimeError(f"no validation file is longer than {length} bytes")
    return sequences
