"""A user's own model and data for the quality benchmark (``kvpop-compile eval --model --data``).

- The model is a local Qwen3 checkpoint folder; its text becomes ids with the checkpoint's own
  tokenizer when the folder has tokenizer files, and as UTF-8 bytes when it has none and the
  model is byte-level (vocabulary 256). Any other model without a tokenizer is refused: its ids
  would mean nothing.
- Text (a file, or every text file under a folder) becomes benchmark sequences: the documents
  are tokenized in order, joined by the tokenizer's end-of-text token (two newlines where it
  has none) and cut into consecutive windows of ``length + 1`` tokens, as the held-out
  sequences are (:mod:`.data`). Joining rather than windowing each file keeps short files: a
  folder of notes gives as many sequences as its text allows.
- A ``.jsonl`` file of ``{"prompt": ..., "answer": ...}`` records becomes question items for
  the exact-match protocol (:mod:`.quality.answers`).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config import require_int
from ..embedded.corpus import encode as encode_bytes
from .data import SEQUENCE_LENGTH, Sequence

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which any one means a checkpoint folder carries its own tokenizer."""
BYTE_VOCABULARY = 256
ANSWERS_SUFFIX = ".jsonl"
RECORD_FIELDS = ("prompt", "answer")


def load_checkpoint(folder: str | Path) -> nn.Module:
    """The Qwen3 (or Qwen3-MoE) checkpoint in local ``folder``, float32, in eval mode.

    Nothing is downloaded. Raises ``ValueError`` for another architecture (before its weights
    load) and ``OSError`` for a folder without weights.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..transform import SUPPORTED_MODEL_TYPES

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{folder} holds a {type(config).__name__} (model_type {config.model_type!r}); the "
            f"benchmark runs Qwen3 models (model_type {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    return model.eval()


@dataclass(frozen=True)
class TextTokenizer:
    """Text -> token ids for one model: a transformers tokenizer, or UTF-8 bytes when
    ``tokenizer`` is None. ``name`` says which, for the report."""

    name: str
    tokenizer: object | None = None

    @property
    def byte_tokens(self) -> bool:
        return self.tokenizer is None

    def encode(self, text: str) -> torch.Tensor:
        """The ids of ``text``, (N,) int64, without special tokens (the benchmark adds none)."""
        if not text:  # no ids (torch.frombuffer refuses an empty buffer)
            return torch.zeros(0, dtype=torch.long)
        if self.tokenizer is None:
            return encode_bytes(text)
        # verbose=False: a document longer than the tokenizer's model_max_length is expected
        # here (it is cut into windows afterwards), not worth a warning.
        ids = self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def separator(self) -> torch.Tensor:
        """The ids put between two documents: the end-of-text token, or two newlines."""
        eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        return torch.tensor([eos]) if eos is not None else self.encode("\n\n")


UTF8_BYTES = TextTokenizer("UTF-8 bytes")


def model_tokenizer(folder: str | Path, vocab_size: int) -> TextTokenizer:
    """The tokenizer of the checkpoint in ``folder`` (a model of ``vocab_size`` ids).

    Its own tokenizer files when it has any (loaded offline); UTF-8 bytes for a byte-level
    model without them. Raises ``ValueError`` for any other model without tokenizer files, for
    tokenizer files that do not load, and for a tokenizer with more ids than the model has.
    """
    folder = Path(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        if vocab_size == BYTE_VOCABULARY:
            return UTF8_BYTES
        raise ValueError(
            f"{folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)}) and a vocab_size "
            f"of {vocab_size}; only a byte-level model (vocab_size {BYTE_VOCABULARY}) reads "
            "text without one: save the model's tokenizer into the folder "
            "(tokenizer.save_pretrained)"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as error:  # transformers and tokenizers raise many types for bad files
        raise ValueError(f"the tokenizer files in {folder} could not be loaded: {error}") from None
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer in {folder} has {len(tokenizer)} tokens but the model's vocab_size "
            f"is {vocab_size}: the tokenizer and the weights do not belong together"
        )
    return TextTokenizer(f"the tokenizer in {folder}", tokenizer)


def is_answers(path: str | Path) -> bool:
    """Whether ``--data path`` holds prompt/answer records (a ``.jsonl`` file) rather than text."""
    path = Path(path)
    return path.is_file() and path.suffix == ANSWERS_SUFFIX


def _files(path: Path) -> list[Path]:
    """The file ``path``, or every file under the folder ``path`` (recursive, sorted by path;
    hidden files and folders such as ``.git`` left out)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path} does not exist; give a text file, a folder of text files or a .jsonl of "
            "prompt/answer records"
        )
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if not files:
        raise ValueError(f"no text files in {path}: the folder is empty")
    return files


def _read_text(file: Path) -> str | None:
    """The UTF-8 text of ``file``, or None when it is binary (holds a NUL byte) or not UTF-8."""
    data = file.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class TextData:
    """Benchmark sequences cut from a user's text: ``description`` says what was read (for
    the report) and ``notes`` what was left out."""

    sequences: list[Sequence]
    description: str
    notes: list[str]


def text_sequences(
    path: str | Path,
    tokenizer: TextTokenizer,
    length: int = SEQUENCE_LENGTH,
    count: int | None = None,
) -> TextData:
    """Up to ``count`` sequences (all the text gives when None) of ``length + 1`` tokens of the
    text at ``path``: a UTF-8 file, or a folder whose binary and non-UTF-8 files are skipped.

    Consecutive windows share one token (the last target of one is the first input of the
    next). Files are read in order only until ``count`` sequences are filled; empty files are
    skipped. Raises ``ValueError`` when ``path`` is an empty file, when no text file with text
    is found, or when the text is shorter than one sequence.
    """
    require_int("length", length, 2)
    if count is not None:
        require_int("count (or None)", count, 1)
    path = Path(path)
    files = _files(path)
    needed = None if count is None else count * length + 1
    parts: list[torch.Tensor] = []
    starts: list[int] = []  # where each document's ids begin in the joined ids
    names: list[str] = []
    total = skipped = empty = visited = 0
    for file in files:
        if needed is not None and total >= needed:
            break
        visited += 1
        text = _read_text(file)
        if text is None:
            if path.is_file():
                raise ValueError(f"{path} is not UTF-8 text; give a text file or a folder of them")
            skipped += 1
            continue
        if not text:
            if path.is_file():
                raise ValueError(f"{path} is empty (0 bytes): it has no text; give a file of text")
            empty += 1
            continue
        if parts:
            parts.append(tokenizer.separator())
            total += parts[-1].numel()
        ids = tokenizer.encode(text)
        starts.append(total)
        names.append(file.name if path.is_file() else str(file.relative_to(path)))
        parts.append(ids)
        total += ids.numel()
    if not names and not empty:
        raise ValueError(f"no text files in {path}: all {skipped} files are binary or not UTF-8")
    if not names:
        others = f", the other {skipped} binary or not UTF-8" if skipped else ""
        raise ValueError(f"no text in {path}: {empty} of its files are empty (0 bytes){others}")
    ids = torch.cat(parts)  # (total,)
    if total < length + 1:
        raise ValueError(
            f"{path} gives {total} tokens ({tokenizer.name}), fewer than one sequence needs: "
            f"{length + 1} for a length of {length}; give more text or a shorter length"
        )
    windows = (total - 1) // length
    if count is not None:
        windows = min(windows, count)
    sequences = []
    for w in range(windows):
        start = w * length
        document = bisect.bisect_right(starts, start) - 1
        source = f"{names[document]}@{start - starts[document]}"
        window = ids[start : start + length + 1].clone()
        sequences.append(Sequence(source, window, tokenizer.byte_tokens))
    notes = []
    if skipped:
        notes.append(f"{skipped} files in {path} skipped: binary or not UTF-8")
    if empty:
        notes.append(f"{empty} empty files in {path} skipped")
    if visited < len(files):
        notes.append(
            f"read the first {visited} of the {len(files)} files in {path} (sorted by path): "
            f"enough for {count} sequences"
        )
    files_read = "" if path.is_file() else f"{len(names)} text files in "
    description = f"{files_read}`{path}` ({total} tokens)"
    return TextData(sequences, description, notes)


@dataclass(frozen=True)
class AnswerItem:
    """One prompt/answer record: ``prompt`` (P,) and ``answer`` (A,) int64 token ids;
    ``source`` is ``file:line``."""

    source: str
    prompt: torch.Tensor
    answer: torch.Tensor


def _record(line: str, where: str) -> tuple[str, str]:
    """The prompt and answer of one JSONL line, refused with ``ValueError`` naming ``where``."""
    expected = "each line must be a JSON object with non-empty string 'prompt' and 'answer' fields"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not JSON ({error.msg}); {expected}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where} holds a JSON {type(record).__name__}; {expected}")
    for field in RECORD_FIELDS:
        if field not in record:
            raise ValueError(f"{where} has no {field!r} field; {expected}")
        value = record[field]
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}: {field!r} must be a non-empty string, got {value!r:.60}")
    return record["prompt"], record["answer"]


def answer_items(
    path: str | Path, tokenizer: TextTokenizer, max_positions: int
) -> list[AnswerItem]:
    """The records of the JSONL file ``path``, tokenized (blank lines skipped).

    The answer's ids are those that follow the prompt's when prompt and answer are tokenized
    together (what a model would have to generate); where the prompt's own ids are not a prefix
    of those (a token merged across the boundary), the answer is tokenized alone. Raises
    ``ValueError`` naming the line of a bad record or of one beyond ``max_positions`` tokens.
    """
    path = Path(path)
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        prompt_text, answer_text = _record(line, where)
        prompt = tokenizer.encode(prompt_text)
        whole = tokenizer.encode(prompt_text + answer_text)
        if whole.numel() > prompt.numel() and torch.equal(whole[: prompt.numel()], prompt):
            answer = whole[prompt.numel() :]
        else:
            answer = tokenizer.encode(answer_text)
        if prompt.numel() == 0 or answer.numel() == 0:
            raise ValueError(
                f"{where}: the prompt or the answer gives no tokens ({tokenizer.name})"
            )
        # The last answer token is chosen, never fed: it needs no position.
        positions = prompt.numel() + answer.numel() - 1
        if positions > max_positions:
            raise ValueError(
                f"{where}: prompt and answer take {positions} positions, beyond the model's "
                f"max_position_embeddings {max_positions}"
            )
        items.append(AnswerItem(f"{path.name}:{number}", prompt, answer))
    if not items:
        raise ValueError(f"{path} has no records; {RECORD_FIELDS[0]!r}/{RECORD_FIELDS[1]!r} "
                         "records expected, one JSON object a line")  # fmt: skip
    return items
