"""Long-range recall items built from standard-library code, for the embedded model.

An item is real code from the corpus with a few lines planted in it and a question at the end
whose answer is only in the planted lines, far back:

- ``lookup``: ``QZWKRT = 4821`` early; the prompt ends ``assert QZWKRT == `` → ``4821``;
- ``multi_key``: eight such definitions, one of them asked for;
- ``chain``: ``xkqpv = 4821`` … ``mtrwaz = xkqpv`` … ``assert mtrwaz == `` → ``xkqpv == 4821``,
  next to a second chain with another value: the answer writes out both hops, the name the
  alias stands for and then that name's value, as a model reasoning step by step would;
- ``call``: ``def hvqzrk():`` / ``return 4821`` early; the prompt ends ``assert hvqzrk() == ``.

Names (six random letters) and values (four digits) are drawn from the item's own seed and occur
nowhere else in the item, so neither the code around them nor the model's knowledge of the
standard library can give the answer away. The definition that holds the answer ends at least
half the context before the question (1024 bytes at 2048). Prompt plus answer is exactly the
context length, so items of one length stack into a batch. The benchmark asks at 1024 and 2048
bytes; 256 and 512 exist for training, where a short distance makes the lookup easier to find.

Items of the ``"train"`` split take their code from the training files; ``"held_out"`` items take
it from the held-out files; ``"validation"`` items take it from the standard library's test
folder, which the corpus leaves out: code the model never saw that no benchmark asks about, for
choosing among trained scorers. The split's name is part of every item's seed, so the splits
share neither text nor random draws whatever seeds the caller passes.
"""

from __future__ import annotations

import functools
import keyword
import random
import string
from dataclasses import dataclass

from kvpop_compile.embedded.corpus import read_bytes, split_files, validation_files

SPLITS = ("train", "held_out", "validation")
TASKS = ("lookup", "multi_key", "chain", "call")
CONTEXT_LENGTHS = (1024, 2048)
"""The lengths the benchmark asks at."""
TRAINING_LENGTHS = (256, 512, 1024, 2048)
"""Every length an item can have: the shorter ones teach the lookup where the answer is near."""
MULTI_KEYS = 8
"""Definitions in a ``multi_key`` item, one of them asked for (4 at 256 bytes, where 8 would not
fit in the first half of the context)."""
NAME_LETTERS = 6
VALUE_DIGITS = 4


@dataclass(frozen=True)
class RecallItem:
    """One question: greedy decoding of ``prompt`` should produce ``answer`` next.

    ``len(prompt) + len(answer) == context_length``; both are UTF-8 bytes (the model's tokens).
    """

    prompt: bytes
    answer: bytes
    task: str
    context_length: int
    evidence: tuple[tuple[int, int], ...]
    """Byte spans ``[start, end)`` of the prompt's planted lines the answer follows from, in
    prompt order: the asked definition, or for ``chain`` the source and the alias line."""

    @property
    def value_span(self) -> tuple[int, int]:
        """Byte span ``[start, end)`` of the asked value's digits in the prompt (the answer ends
        with them, and they occur once, in the first evidence line): what a cache must hold for
        the value to be copied."""
        value = self.answer[-VALUE_DIGITS:]
        start = self.prompt.find(value)
        if start < 0:
            raise ValueError(
                f"the prompt of this {self.task} item does not hold its answer's value {value!r}"
            )
        return start, start + VALUE_DIGITS


@functools.lru_cache(maxsize=len(SPLITS))
def split_text(split: str) -> bytes:
    """All files of ``split`` (one of :data:`SPLITS`) concatenated in sorted order."""
    _check_split(split)
    if split == "validation":
        files = validation_files()
    else:
        train, held_out = split_files()
        files = train if split == "train" else held_out
    return b"".join(read_bytes(f) for f in files)


def recall_items(
    split: str, task: str, context_length: int, count: int, seed: int = 0, start: int = 0
) -> list[RecallItem]:
    """Items ``start .. start + count - 1`` of the stream named by (split, task, length, seed)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return [make_item(split, task, context_length, seed, start + i) for i in range(count)]


def make_item(split: str, task: str, context_length: int, seed: int, index: int) -> RecallItem:
    """Item number ``index`` of one stream; the same arguments give the same bytes everywhere."""
    _check_split(split)
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if context_length not in TRAINING_LENGTHS:
        raise ValueError(f"context_length must be one of {TRAINING_LENGTHS}, got {context_length}")
    # A string seed goes through SHA-512 in ``random``: stable across runs and platforms, and
    # different for every split, so no seed can make a training item equal a held-out one.
    rng = random.Random(f"{split}/{task}/{context_length}/{seed}/{index}")
    text = split_text(split)
    while True:  # almost always one pass; a redraw when the code happens to hold a name/value
        item = _assemble(rng, text, task, context_length, _PLANS[task](rng, context_length))
        if item is not None:
            return item


@dataclass(frozen=True)
class _Plan:
    """What a task plants: (low, high, line) entries, the question, its answer, how many
    times each name and value must occur in the prompt, and which planted entries (indices)
    the answer follows from."""

    planted: list[tuple[float, float, str]]
    question: str
    answer: str
    counts: dict[str, int]
    evidence: tuple[int, ...]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _names(rng: random.Random, n: int, upper: bool) -> list[str]:
    letters = string.ascii_uppercase if upper else string.ascii_lowercase
    # A list in draw order, not a set: a set's order follows the per-process string hash, and
    # an item must be the same in every process for its seed.
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(letters) for _ in range(NAME_LETTERS))
        if not keyword.iskeyword(name) and name not in names:
            names.append(name)
    return names


def _values(rng: random.Random, n: int) -> list[str]:
    low = 10 ** (VALUE_DIGITS - 1)
    return [str(v) for v in rng.sample(range(low, 10 * low), n)]


def _assemble(
    rng: random.Random, text: bytes, task: str, context_length: int, plan: _Plan
) -> RecallItem | None:
    """Real code with ``planted`` lines and ``question`` at the end, or None to redraw.

    Each of ``plan.planted`` is (low, high, line): the line goes at the start of a code line drawn
    uniformly in ``[low, high]`` of the code, fractions of how far the last planted line may sit
    so that the rest of the code before the question is at least half the context. Entries
    keep their list order. ``plan.counts`` gives how often each name or value must occur in the
    prompt; an item where the code happens to contain one of them is rejected.
    """
    lines = [line.encode() for _, _, line in plan.planted]
    tail, answer = plan.question.encode(), plan.answer.encode()
    filler_len = context_length - len(tail) - len(answer) - sum(len(b) for b in lines)
    offset = rng.randrange(len(text) - 2 * filler_len)
    offset = text.index(b"\n", offset) + 1  # start on a line of its own
    code = text[offset : offset + filler_len]
    reach = filler_len - context_length // 2  # planted lines end >= half a context before the end
    if reach < 0:
        raise ValueError(f"{task} plants too much for a context of {context_length} bytes")
    points = []
    for low, high, _ in plan.planted:
        p = int(reach * rng.uniform(low, high))
        points.append(code.rfind(b"\n", 0, p) + 1)  # back to a line start: still within reach
    # Sorting is stable, so lines drawn to the same point keep their order (source before alias).
    order = sorted(range(len(lines)), key=lambda i: points[i])
    body, at, spans = [], 0, {}
    for i in order:
        body.append(code[at : points[i]])
        start = sum(len(part) for part in body)
        spans[i] = (start, start + len(lines[i]))
        body.append(lines[i])
        at = points[i]
    body.append(code[at:])
    prompt = b"".join(body) + tail
    if any(prompt.count(word.encode()) != n for word, n in plan.counts.items()):
        return None
    evidence = tuple(sorted(spans[i] for i in plan.evidence))
    return RecallItem(prompt, answer, task, context_length, evidence)


def _lookup(rng: random.Random, length: int) -> _Plan:
    (name,), (value,) = _names(rng, 1, upper=True), _values(rng, 1)
    planted = [(0.0, 1.0, f"{name} = {value}\n")]
    return _Plan(planted, f"\nassert {name} == ", value, {name: 2, value: 1}, (0,))


def _multi_key(rng: random.Random, length: int) -> _Plan:
    keys = min(MULTI_KEYS, length // 64)
    names, values = _names(rng, keys, upper=True), _values(rng, keys)
    planted = [(0.0, 1.0, f"{n} = {v}\n") for n, v in zip(names, values, strict=True)]
    asked = rng.randrange(keys)
    counts = {n: 1 for n in names} | {v: 1 for v in values} | {names[asked]: 2}
    return _Plan(planted, f"\nassert {names[asked]} == ", values[asked], counts, (asked,))


def _chain(rng: random.Random, length: int) -> _Plan:
    src, alias, other, other_alias = _names(rng, 4, upper=False)
    value, other_value = _values(rng, 2)
    # Sources in the first half of the reach, aliases after them; the asked chain and the
    # distractor are drawn the same way, so position does not tell them apart.
    planted = [
        (0.0, 0.5, f"{src} = {value}\n"),
        (0.0, 0.5, f"{other} = {other_value}\n"),
        (0.5, 1.0, f"{alias} = {src}\n"),
        (0.5, 1.0, f"{other_alias} = {other}\n"),
    ]
    counts = {src: 2, alias: 2, other: 2, other_alias: 1, value: 1, other_value: 1}
    return _Plan(planted, f"\nassert {alias} == ", f"{src} == {value}", counts, (0, 2))


def _call(rng: random.Random, length: int) -> _Plan:
    (name,), (value,) = _names(rng, 1, upper=False), _values(rng, 1)
    planted = [(0.0, 1.0, f"def {name}():\n    return {value}\n")]
    return _Plan(planted, f"\nassert {name}() == ", value, {name: 2, value: 1}, (0,))


_PLANS = {"lookup": _lookup, "multi_key": _multi_key, "chain": _chain, "call": _call}
