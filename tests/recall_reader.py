"""Reading a recall item back independently of its generator: its family's ``bind`` and ``ask``
templates (``item.templates``: a generated family has no name to look them up by) become
regular expressions, the question gives the asked key, the planted bindings give the keys and
values, and what is left of the prompt must be one stretch of the text the item was planted in.
"""

from __future__ import annotations

import itertools
import random
import re
import string
from dataclasses import dataclass

from kvpop_compile.embedded.recall import (
    UNIQUE_VALUE,
    RecallItem,
)
from kvpop_compile.embedded.recall_syntax import (
    ALPHABETS,
    FAMILIES,
    FAMILY_SPLITS,
    NAME_LETTERS,
    Alphabet,
    Family,
)

COUNT = 4  # items per (split, families, task, length) in the property checks; each is a few ms
FAMILY = {f.name: f for split in FAMILY_SPLITS for f in FAMILIES[split]}
ALPHABET = {a.name: a for split in FAMILY_SPLITS for a in ALPHABETS[split]}
KEYS_PER_MULTI_KEY = {256: 2, 512: 4, 1024: 8, 2048: 8}  # min(MULTI_KEYS, length // 128)
GENERATED = "generated"  # the name of every generated training family
NAMED_ELSEWHERE = [f for split in ("validation", "held_out") for f in FAMILIES[split]]


# --- Reading an item back -------------------------------------------------------------------


def regex(template: str, key: str, value: str) -> str:
    """``template`` (a ``str.format`` template over ``key`` and ``value``) as a regular
    expression: its text literally, the first ``{key}`` a group ``key`` of pattern ``key`` and
    any later one the same text again, ``{value}`` a group ``value`` of pattern ``value``."""
    out, named = [], False
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(re.escape(literal))
        if field == "key":
            out.append("(?P=key)" if named else f"(?P<key>{key})")
            named = True
        elif field == "value":
            out.append(f"(?P<value>{value})")
    return "".join(out)


def key_pattern(family: Family) -> str:
    return letters_pattern(family.upper)


def letters_pattern(upper: bool) -> str:
    letters = "A-Z" if upper else "a-z"
    return f"[{letters}]{{{NAME_LETTERS}}}"


def value_pattern(alphabet: Alphabet) -> str:
    chars = f"[{re.escape(alphabet.chars)}]{{{alphabet.low},{alphabet.high}}}"
    return re.escape(alphabet.prefix) + chars


@dataclass(frozen=True)
class Binding:
    """One planted binding read from a prompt: its key and value, and the byte spans
    ``[start, end)`` in the prompt of the whole binding (its lines) and of the value."""

    key: bytes
    value: bytes
    span: tuple[int, int]
    value_span: tuple[int, int]


@dataclass(frozen=True)
class Reading:
    """An item read back: the asked key, the planted bindings in prompt order, and the code,
    the prompt without them and without the question."""

    family: Family
    alphabet: Alphabet
    asked: bytes
    bindings: tuple[Binding, ...]
    code: bytes
    decoys: int
    """Lines of the text itself that match the binding template, told apart from the planted
    ones."""

    def bound(self, key: bytes) -> Binding:
        (binding,) = [b for b in self.bindings if b.key == key]
        return binding


def planted_count(task: str, length: int) -> int:
    return {"lookup": 1, "multi_key": KEYS_PER_MULTI_KEY[length], "chain": 4}[task]


def cut(body: bytes, bindings: tuple[Binding, ...]) -> bytes:
    parts, at = [], 0
    for b in bindings:
        parts.append(body[at : b.span[0]])
        at = b.span[1]
    return b"".join(parts) + body[at:]


def item_family(it: RecallItem) -> Family:
    """The family ``it`` was written in, from its own templates: a named family's must be that
    family's; a generated family writes all keys of an item in one case, the question's."""
    if it.family != GENERATED:
        family = FAMILY[it.family]
        assert it.templates == (family.bind, family.ask), (it.family, it.templates)
        return family
    bind, ask = it.templates
    upper = re.fullmatch(("\n" + regex(ask, letters_pattern(True), "")).encode(), it.question)
    return Family(GENERATED, bind, ask, upper=upper is not None)


def read_item(it: RecallItem, text: bytes) -> Reading:
    """``it`` parsed with its family's templates. Lines of ``text`` itself can match a binding
    template (``        self.lineno = 1``); the planted ones are those whose removal leaves one
    stretch of ``text``, as the generator cuts it."""
    family, alphabet = item_family(it), ALPHABET[it.alphabet]
    key = key_pattern(family)
    asked = re.fullmatch(("\n" + regex(family.ask, key, "")).encode(), it.question)
    assert asked, (family.name, it.question)
    # A chain's alias binding holds a key where the others hold a value.
    value = f"{value_pattern(alphabet)}|{key}" if it.task == "chain" else value_pattern(alphabet)
    pattern = re.compile(("^" + regex(family.bind, key, value) + "\n").encode(), re.M)
    body = it.prompt[: len(it.prompt) - len(it.question)]
    found = [
        Binding(m["key"], m["value"], m.span(), m.span("value")) for m in pattern.finditer(body)
    ]
    planted = planted_count(it.task, it.context_length)
    for bindings in itertools.combinations(found, planted):
        code = cut(body, bindings)
        if len(found) == planted or code in text:
            decoys = len(found) - planted
            return Reading(family, alphabet, asked["key"], bindings, code, decoys)
    raise AssertionError(f"{it.family}: {planted} planted bindings expected, found {found}")


def all_pairs(items):
    return [pair for batch in items.values() for pair in batch]


def check_question(it: RecallItem, r: Reading) -> None:
    """The prompt ends with the family's question for a planted key: the alias for a chain,
    else one of the keys bound to a value."""
    assert it.prompt.endswith(r.family.question(r.asked.decode()).encode())
    assert it.question == r.family.question(r.asked.decode()).encode()
    assert it.question.count(b"\n") == 1
    keys = [b.key for b in r.bindings]
    assert r.asked in keys, (r.asked, keys)


def check_answer(it: RecallItem, r: Reading) -> None:
    """The answer follows from the planted bindings: the asked key's value, or for a chain the
    source the alias holds, the family's question for it, and the source's value."""
    value = r.bound(r.asked).value
    if it.task == "chain":
        source = value
        value = r.bound(source).value
        expected = source + r.family.question(source.decode()).encode() + value
    else:
        expected = value
    assert it.answer == expected
    assert re.fullmatch(value_pattern(r.alphabet).encode(), value)


def asked_binding(it: RecallItem, r: Reading) -> Binding:
    """The binding whose value the answer ends with."""
    asked = r.bound(r.asked)
    return r.bound(asked.value) if it.task == "chain" else asked


def check_evidence(it: RecallItem, r: Reading) -> None:
    """Evidence is the asked binding (a chain's source and alias bindings, in that order), whole
    lines from a line start; ``value_span`` is the asked value in the first; the last ends at
    least half a context before the question."""
    holder = asked_binding(it, r)
    spans = [holder.span] + ([r.bound(r.asked).span] if it.task == "chain" else [])
    assert list(it.evidence) == spans
    for start, end in it.evidence:
        assert start == 0 or it.prompt[start - 1 : start] == b"\n"
        assert it.prompt[end - 1 : end] == b"\n"
    assert it.value_span == holder.value_span
    assert it.prompt[slice(*it.value_span)] == holder.value
    assert it.evidence[0][0] < it.value_span[0] < it.value_span[1] < it.evidence[0][1]
    question = len(it.prompt) - len(it.question)
    assert question - it.evidence[-1][1] >= it.context_length // 2


def check_family(it: RecallItem, r: Reading, families: str) -> None:
    """The item's family is one of split ``families``, or for ``train`` a generated one that is
    no validation or held-out family and writes none of their bindings."""
    if it.family == GENERATED:
        assert families == "train", (families, it.templates)
        assert r.family.bind not in {f.bind for f in NAMED_ELSEWHERE}, it.templates
    else:
        assert r.family in FAMILIES[families]
    assert it.templates == (r.family.bind, r.family.ask)


WORDS = (
    "the river ran past a stone wall and under the old bridge while lanterns swung in wind "
    "over roofs of slate where gulls sat and watched boats come home at dusk"
).split()


DECOY_KEYS = ("harbor", "meadow", "walrus", "canyon")


def prose(size: int) -> bytes:
    """``size`` bytes or more of made-up sentences, one to a line, words of :data:`WORDS`;
    every fourth line a binding of a random family, as a user's own text may hold: the reader
    must tell those from the planted ones."""
    rng, lines, total = random.Random(11), [], 0
    families = [f for split in FAMILY_SPLITS for f in FAMILIES[split]]
    while total < size:
        if len(lines) % 4 == 3:
            family, key = rng.choice(families), rng.choice(DECOY_KEYS)
            line = family.binding(key.upper() if family.upper else key, str(rng.randint(1, 99)))
        else:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
            line = words.capitalize() + ".\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()


def check_unique(it: RecallItem, r: Reading) -> None:
    """Keys, and values of ``UNIQUE_VALUE`` characters or more, occur in the prompt only in the
    planted bindings and the question."""
    planted = b"".join(it.prompt[slice(*b.span)] for b in r.bindings) + it.question
    values = [b.value for b in r.bindings if len(b.value) >= UNIQUE_VALUE]
    for word in [b.key for b in r.bindings] + values:
        assert it.prompt.count(word) == planted.count(word), word
