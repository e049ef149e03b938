"""Training text: read files, tokenize, pack into fixed-length sequences, split off a held-out
part. Deterministic: the same inputs give the same sequences in the same order."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..optional import import_extra

Tokenizer = Callable[[str], Sequence[int]]
TEXT_SUFFIXES = (".txt", ".py")


def read_texts(data: str | os.PathLike | Sequence[str]) -> list[str]:
    """Texts from a folder of ``.txt``/``.py`` files (recursively, sorted by path), a ``.jsonl``
    file of ``{"text": ...}`` records, an Arrow dataset with a ``text`` column (an ``.arrow``
    file, or a folder of them such as ``datasets.Dataset.save_to_disk`` writes), or a list of
    strings."""
    if not isinstance(data, (str, os.PathLike)):
        expected = "data must be a path (a folder, a .jsonl or .arrow file) or a list of strings"
        try:
            texts = list(data)
        except TypeError:
            raise TypeError(f"{expected}; got {type(data).__name__}") from None
        wrong = [text for text in texts if not isinstance(text, str)]
        if wrong:
            raise TypeError(
                f"{expected}; got a {type(data).__name__} holding {type(wrong[0]).__name__}"
            )
        if not texts:
            raise ValueError("data is an empty list of texts")
        return texts
    path = Path(data)
    if path.is_file() and path.suffix == ".arrow":
        return read_arrow([path])
    if path.is_dir() and any(path.glob("*.arrow")):
        return read_arrow(sorted(path.glob("*.arrow")))
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
        if not files:
            raise ValueError(f"no .txt or .py files in {path}")
        return [f.read_text(encoding="utf-8", errors="replace") for f in files]
    if path.suffix == ".jsonl" and path.is_file():
        texts = [
            _record_text(line, f"{path}:{number}")
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip()
        ]
        if not texts:
            raise ValueError(f"{path} has no records")
        return texts
    raise ValueError(
        f"data must be a folder of .txt/.py files, a .jsonl file, an Arrow dataset (.arrow file "
        f"or a folder of them) or a list of texts; got {path}"
    )


def _record_text(line: str, where: str) -> str:
    """The ``text`` of one JSONL record, refused with ``ValueError`` naming ``where`` unless the
    line is a JSON object whose ``text`` is a string."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or "text" not in record:
        raise ValueError(f"{where} is not a JSON object with a 'text'")
    text = record["text"]
    if not isinstance(text, str):
        raise ValueError(
            f"{where}: 'text' must be a string, got {type(text).__name__} {text!r:.60}"
        )
    return text


def read_arrow(files: Sequence[Path]) -> list[str]:
    """The ``text`` column of Arrow IPC files, in order (stream format, as Hugging Face
    ``datasets`` writes, or file format). Needs ``pyarrow`` (the ``arrow`` extra)."""
    pa = import_extra("pyarrow", purpose="reading an Arrow dataset", needs="pyarrow", extra="arrow")
    texts: list[str] = []
    for file in files:
        try:
            with pa.memory_map(str(file)) as source:
                try:
                    table = pa.ipc.open_stream(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    table = pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid as error:
            raise ValueError(f"{file} is not an Arrow IPC file: {error}") from None
        if "text" not in table.column_names:
            raise ValueError(f"{file} has no 'text' column; its columns: {table.column_names}")
        column = table.column("text")
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise ValueError(f"{file}: the 'text' column holds {column.type}, not strings")
        texts.extend(text for text in column.to_pylist() if text is not None)
    if not texts:
        raise ValueError(f"the Arrow dataset {files[0].parent} has no texts")
    return texts


def byte_tokenizer(text: str) -> list[int]:
    """UTF-8 bytes as token ids (for byte-vocabulary models)."""
    return list(text.encode("utf-8"))


def pack(
    texts: Sequence[str], tokenizer: Tokenizer, seq_len: int, separator: int | None = None
) -> torch.Tensor:
    """Concatenate the tokenized texts (``separator`` between them) and cut ``(S, seq_len)``
    sequences; the incomplete tail is dropped."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text))
        if separator is not None:
            ids.append(separator)
    count = len(ids) // seq_len
    if count == 0:
        raise ValueError(
            f"the data has {len(ids)} tokens, fewer than one sequence of seq_len={seq_len}"
        )
    return torch.tensor(ids[: count * seq_len], dtype=torch.int64).view(count, seq_len)


def split(sequences: torch.Tensor, eval_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``eval_fraction`` of the sequences (at least one) are held out."""
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if len(sequences) < 2:
        raise ValueError(
            f"need at least 2 sequences to hold one out, got {len(sequences)}; add data or "
            "shorten seq_len"
        )
    held_out = max(1, round(len(sequences) * eval_fraction))
    return sequences[:-held_out], sequences[-held_out:]
