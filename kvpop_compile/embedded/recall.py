"""Long-range recall items: real text with a few lines planted in it and a question at the end
whose answer is only in the planted lines, far back.

Three tasks, each written in one of many syntax families (:mod:`.recall_syntax`):

- ``lookup``: one binding early (``QZWKRT = 4821``, ``<qzwkrt>4821</qzwkrt>``, …); the prompt
  ends with the family's question (``assert QZWKRT == ``, ``<qzwkrt>``) → the value;
- ``multi_key``: two to eight bindings of one family (``length // 128``, at most eight), one
  of them asked for;
- ``chain``: ``src`` bound to a value, later ``alias`` bound to ``src``, next to a second chain;
  asked for ``alias``, the answer writes the hop, a new line, the question for ``src`` and its
  value (``assert b == a`` / ``assert a == 4821``), as a model reasoning step by step would.

Keys (six random letters) occur nowhere else in the item, and values of four characters or more
neither, so neither the text around them nor the model's knowledge can give the answer away. The
binding that holds the answer ends at least half the context before the question (1024 bytes at
2048). Prompt plus answer is exactly the context length. The benchmark asks at 1024 and 2048
bytes; 256 and 512 exist for training, where a short distance makes the lookup easier to find.

Two splits name an item: ``split`` the text it is planted in, ``families`` its syntaxes and
value alphabets (:data:`~.recall_syntax.FAMILY_SPLITS`). Text of the ``"train"`` split comes
from the training files, ``"held_out"`` from the held-out files, ``"validation"`` from the
standard library's test folder, which the corpus leaves out: code the model never saw that no
benchmark asks about, for choosing among trained scorers. Both names are part of every item's
seed, so the splits share neither text nor random draws whatever seeds the caller passes.
:func:`assemble` plants items in any text, for training on one's own data.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from kvpop_compile.embedded.corpus import read_bytes, split_files, validation_files
from kvpop_compile.embedded.recall_syntax import (
    Family,
    check_family_split,
    draw_alphabet,
    draw_family,
    draw_keys,
    draw_values,
)

SPLITS = ("train", "held_out", "validation")
"""The text an item is planted in."""
TASKS = ("lookup", "multi_key", "chain")
CONTEXT_LENGTHS = (1024, 2048)
"""The lengths the benchmark asks at."""
TRAINING_LENGTHS = (256, 512, 1024, 2048)
"""Every length an item can have: the shorter ones teach the lookup where the answer is near."""
MULTI_KEYS = 8
"""Bindings in a ``multi_key`` item, one of them asked for (``length // 128`` below 1024 bytes,
where eight would not fit in the first half of the context)."""
_DRAWS = 1000
UNIQUE_VALUE = 4
"""A value this long or longer occurs only where it is planted; a shorter one (``7``, ``abc``)
may also occur in the text, which is no help: the question is about the key."""


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
    """Byte spans ``[start, end)`` of the prompt's planted bindings the answer follows from, in
    prompt order: the asked binding, or for ``chain`` the source and the alias binding."""
    value_span: tuple[int, int]
    """Byte span ``[start, end)`` of the asked value in the prompt, inside the first evidence
    span: what a cache must hold for the value to be copied."""
    family: str = "assignment"
    """The syntax family's name (:data:`~.recall_syntax.FAMILIES`)."""
    alphabet: str = "decimal"
    """The value alphabet's name (:data:`~.recall_syntax.ALPHABETS`)."""
    families: str = "train"
    """The family split the family and alphabet were drawn from."""
    templates: tuple[str, str] = ("{key} = {value}", "assert {key} == ")
    """The family's binding and question templates (:class:`~.recall_syntax.Family`): a
    generated family has no name to look them up by."""

    @property
    def question(self) -> bytes:
        """The prompt's last line, with the newline before it."""
        return self.prompt[self.prompt.rindex(b"\n") :]


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
    split: str,
    task: str,
    context_length: int,
    count: int,
    seed: int = 0,
    start: int = 0,
    families: str = "train",
) -> list[RecallItem]:
    """Items ``start .. start + count - 1`` of the stream named by (split, families, task,
    length, seed)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return [make_item(split, task, context_length, seed, start + i, families) for i in range(count)]


def make_item(
    split: str, task: str, context_length: int, seed: int, index: int, families: str = "train"
) -> RecallItem:
    """Item number ``index`` of one stream; the same arguments give the same bytes everywhere."""
    _check_split(split)
    check_family_split(families)
    # A string seed goes through SHA-512 in ``random``: stable across runs and platforms, and
    # different for every split, so no seed can make a training item equal a held-out one.
    rng = random.Random(f"{split}/{families}/{task}/{context_length}/{seed}/{index}")
    return assemble(split_text(split), task, context_length, rng, families)


def assemble(
    text: bytes, task: str, context_length: int, rng: random.Random, families: str = "train"
) -> RecallItem:
    """One item of ``task`` planted in a window of ``text`` (any UTF-8 text of at least
    ``4 * context_length`` bytes with line breaks), drawn with ``rng``."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if context_length not in TRAINING_LENGTHS:
        raise ValueError(f"context_length must be one of {TRAINING_LENGTHS}, got {context_length}")
    breaks = text.count(b"\n")
    if len(text) < 4 * context_length or breaks < 2:
        raise ValueError(
            f"text must hold at least {4 * context_length} bytes and line breaks to plant "
            f"{context_length}-byte items in, got {len(text)} bytes with "
            f"{breaks} line breaks"
        )
    # Almost always one pass; a redraw when the text happens to hold a key or value, or when
    # the drawn family's bindings do not fit in half the context (long ones at 256 and 512).
    for _ in range(_DRAWS):
        plan = _PLANS[task](rng, context_length, families)
        item = _plant(rng, text, task, context_length, plan)
        if item is not None:
            return item
    raise ValueError(
        f"no {task} item of {context_length} bytes fits in {_DRAWS} draws from the "
        f"{families!r} families: their bindings need more than half the context"
    )


@dataclass(frozen=True)
class _Plan:
    """What a task plants: (low, high, binding) entries, the question, its answer, the words
    that must occur only where planted (keys, long values), which planted entries (indices) the
    answer follows from, the asked value and where it is: (entry index, byte offset in it)."""

    planted: list[tuple[float, float, str]]
    question: str
    answer: str
    unique: list[str]
    evidence: tuple[int, ...]
    value: str
    value_at: tuple[int, int]
    family: Family
    alphabet: str
    families: str


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _plant(
    rng: random.Random, text: bytes, task: str, context_length: int, plan: _Plan
) -> RecallItem | None:
    """Real text with ``plan.planted`` bindings and ``plan.question`` at the end, or None to
    redraw.

    Each of ``plan.planted`` is (low, high, binding): it goes at the start of a text line drawn
    uniformly in ``[low, high]`` of the reach, the share of the text where the last binding may
    sit so that the rest of the text before the question is at least half the context. Entries
    keep their list order. A word of ``plan.unique`` found anywhere but where it was planted
    rejects the draw.
    """
    lines = [line.encode() for _, _, line in plan.planted]
    tail, answer = plan.question.encode(), plan.answer.encode()
    filler_len = context_length - len(tail) - len(answer) - sum(len(b) for b in lines)
    reach = filler_len - context_length // 2  # bindings end >= half a context before the end
    if reach < 0:
        return None
    offset = rng.randrange(len(text) - 2 * filler_len)
    offset = text.find(b"\n", offset) + 1  # start on a line of its own
    code = text[offset : offset + filler_len]
    if len(code) < filler_len:
        return None
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
    planted = b"".join(lines) + tail
    if any(prompt.count(w.encode()) != planted.count(w.encode()) for w in plan.unique):
        return None
    evidence = tuple(sorted(spans[i] for i in plan.evidence))
    entry, at_byte = plan.value_at
    value_start = spans[entry][0] + at_byte
    value_span = (value_start, value_start + len(plan.value.encode()))
    return RecallItem(
        prompt,
        answer,
        task,
        context_length,
        evidence,
        value_span,
        plan.family.name,
        plan.alphabet,
        plan.families,
        (plan.family.bind, plan.family.ask),
    )


def _binding_at(family: Family, key: str) -> int:
    """Byte offset of the value in ``family``'s binding of ``key``: the length of what the
    template writes before it (searching for the value's text could find it inside the
    template's own words, ``lts`` in ``defaults``)."""
    return len(family.bind.split("{value}")[0].format(key=key).encode())


def _unique(keys: list[str], values: list[str]) -> list[str]:
    return keys + [v for v in values if len(v) >= UNIQUE_VALUE]


def _lookup(rng: random.Random, length: int, families: str) -> _Plan:
    return _keyed(rng, 1, families, "lookup")


def _multi_key(rng: random.Random, length: int, families: str) -> _Plan:
    return _keyed(rng, min(MULTI_KEYS, length // 128), families, "multi_key")


def _keyed(rng: random.Random, keys: int, families: str, task: str) -> _Plan:
    family, alphabet = draw_family(rng, families), draw_alphabet(rng, families)
    names = draw_keys(rng, keys, family.upper)
    values = draw_values(rng, keys, alphabet)
    bindings = [family.binding(k, v) for k, v in zip(names, values, strict=True)]
    asked = rng.randrange(keys)
    return _Plan(
        planted=[(0.0, 1.0, b) for b in bindings],
        question=family.question(names[asked]),
        answer=values[asked],
        unique=_unique(names, values),
        evidence=(asked,),
        value=values[asked],
        value_at=(asked, _binding_at(family, names[asked])),
        family=family,
        alphabet=alphabet.name,
        families=families,
    )


def _chain(rng: random.Random, length: int, families: str) -> _Plan:
    family, alphabet = draw_family(rng, families), draw_alphabet(rng, families)
    src, alias, other, other_alias = draw_keys(rng, 4, family.upper)
    value, other_value = draw_values(rng, 2, alphabet)
    source = family.binding(src, value)
    # Sources in the first half of the reach, aliases after them; the asked chain and the
    # distractor are drawn the same way, so position does not tell them apart.
    planted = [
        (0.0, 0.5, source),
        (0.0, 0.5, family.binding(other, other_value)),
        (0.5, 1.0, family.binding(alias, src)),
        (0.5, 1.0, family.binding(other_alias, other)),
    ]
    return _Plan(
        planted=planted,
        question=family.question(alias),
        answer=src + family.question(src) + value,
        unique=_unique([src, alias, other, other_alias], [value, other_value]),
        evidence=(0, 2),
        value=value,
        value_at=(0, _binding_at(family, src)),
        family=family,
        alphabet=alphabet.name,
        families=families,
    )


_PLANS = {"lookup": _lookup, "multi_key": _multi_key, "chain": _chain}
