"""Long-range recall items: deterministic, split-separated, exact lengths, answers only far back.

Every item is read back independently of the generator: its family's ``bind`` and ``ask``
templates (``item.templates``: a generated family has no name to look them up by) become
regular expressions, the question gives the asked key, the planted bindings give the keys and
values, and what is left of the prompt must be one stretch of the text the item was planted in.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import re
import string
import subprocess
import sys
from dataclasses import dataclass

import pytest

from kvpop_compile.embedded import recall_syntax
from kvpop_compile.embedded.corpus import split_files, validation_files
from kvpop_compile.embedded.recall import (
    CONTEXT_LENGTHS,
    MULTI_KEYS,
    SPLITS,
    TASKS,
    TRAINING_LENGTHS,
    UNIQUE_VALUE,
    RecallItem,
    assemble,
    make_item,
    recall_items,
    split_text,
)
from kvpop_compile.embedded.recall_syntax import (
    _ACCESSORS,
    _ASK_LEADS,
    _ASK_SEPARATORS,
    ALPHABETS,
    FAMILIES,
    FAMILY_SPLITS,
    GENERATED_SHARE,
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


def _regex(template: str, key: str, value: str) -> str:
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


def _key_pattern(family: Family) -> str:
    return _letters_pattern(family.upper)


def _letters_pattern(upper: bool) -> str:
    letters = "A-Z" if upper else "a-z"
    return f"[{letters}]{{{NAME_LETTERS}}}"


def _value_pattern(alphabet: Alphabet) -> str:
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


def _planted_count(task: str, length: int) -> int:
    return {"lookup": 1, "multi_key": KEYS_PER_MULTI_KEY[length], "chain": 4}[task]


def _cut(body: bytes, bindings: tuple[Binding, ...]) -> bytes:
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
    upper = re.fullmatch(("\n" + _regex(ask, _letters_pattern(True), "")).encode(), it.question)
    return Family(GENERATED, bind, ask, upper=upper is not None)


def read_item(it: RecallItem, text: bytes) -> Reading:
    """``it`` parsed with its family's templates. Lines of ``text`` itself can match a binding
    template (``        self.lineno = 1``); the planted ones are those whose removal leaves one
    stretch of ``text``, as the generator cuts it."""
    family, alphabet = item_family(it), ALPHABET[it.alphabet]
    key = _key_pattern(family)
    asked = re.fullmatch(("\n" + _regex(family.ask, key, "")).encode(), it.question)
    assert asked, (family.name, it.question)
    # A chain's alias binding holds a key where the others hold a value.
    value = f"{_value_pattern(alphabet)}|{key}" if it.task == "chain" else _value_pattern(alphabet)
    pattern = re.compile(("^" + _regex(family.bind, key, value) + "\n").encode(), re.M)
    body = it.prompt[: len(it.prompt) - len(it.question)]
    found = [
        Binding(m["key"], m["value"], m.span(), m.span("value")) for m in pattern.finditer(body)
    ]
    planted = _planted_count(it.task, it.context_length)
    for bindings in itertools.combinations(found, planted):
        code = _cut(body, bindings)
        if len(found) == planted or code in text:
            decoys = len(found) - planted
            return Reading(family, alphabet, asked["key"], bindings, code, decoys)
    raise AssertionError(f"{it.family}: {planted} planted bindings expected, found {found}")


# --- Items ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def items():
    """``{(split, families, task, length): [(item, reading), ...]}``."""
    texts = {split: split_text(split) for split in ("train", "held_out")}
    out = {}
    for split, families, task, n in itertools.product(
        texts, FAMILY_SPLITS, TASKS, TRAINING_LENGTHS
    ):
        batch = recall_items(split, task, n, COUNT, seed=3, families=families)
        out[split, families, task, n] = [(it, read_item(it, texts[split])) for it in batch]
    return out


def _all(items):
    return [pair for batch in items.values() for pair in batch]


def test_same_arguments_give_the_same_bytes(items):
    for (split, families, task, n), batch in items.items():
        first = [it for it, _ in batch]
        assert recall_items(split, task, n, COUNT, seed=3, families=families) == first
        assert make_item(split, task, n, 3, COUNT - 1, families) == first[-1]
        assert recall_items(split, task, n, 2, seed=3, start=1, families=families) == first[1:3]


_DIGEST = (
    "import hashlib\n"
    "from kvpop_compile.embedded.recall import TASKS, recall_items\n"
    "from kvpop_compile.embedded.recall_syntax import FAMILY_SPLITS\n"
    "h = hashlib.sha256()\n"
    "for families in FAMILY_SPLITS:\n"
    "    for task in TASKS:\n"
    "        for item in recall_items('held_out', task, 1024, 2, families=families):\n"
    "            h.update(repr(item).encode())\n"
    "print(h.hexdigest())\n"
)


def _digest_in_fresh_process(hash_seed: str) -> str:
    """The digest of ``_DIGEST``'s items made in a new process with ``PYTHONHASHSEED``."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", _DIGEST], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_items_do_not_depend_on_the_process_string_hash():
    # A set's order follows the per-process string hash: keys or families ordered through one
    # would make the "same" held-out items differ from one run of a benchmark to the next.
    here = hashlib.sha256()
    for families in FAMILY_SPLITS:
        for task in TASKS:
            for item in recall_items("held_out", task, 1024, 2, families=families):
                here.update(repr(item).encode())
    other = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # not this process's
    assert _digest_in_fresh_process(other) == here.hexdigest()


def test_other_seeds_indices_and_splits_give_other_items(items):
    for (split, families, task, n), batch in items.items():
        prompts = {it.prompt for it, _ in batch}
        assert len(prompts) == COUNT
        other = recall_items(split, task, n, COUNT, seed=4, families=families)
        assert not {it.prompt for it in other} & prompts
    for task, n in itertools.product(TASKS, TRAINING_LENGTHS):
        # The same seed and index in another text or family split: another item, and another
        # stretch of text (both split names are part of the seed).
        named = {(s, f): items[s, f, task, n] for s in ("train", "held_out") for f in FAMILY_SPLITS}
        assert len({it.prompt for b in named.values() for it, _ in b}) == len(named) * COUNT
        codes = {r.code for b in named.values() for _, r in b}
        assert len(codes) == len(named) * COUNT


def test_prompt_and_answer_fill_the_context_exactly(items):
    for (_, families, task, n), batch in items.items():
        for it, _ in batch:
            assert (it.task, it.context_length, it.families) == (task, n, families)
            assert len(it.prompt) + len(it.answer) == n


def _check_question(it: RecallItem, r: Reading) -> None:
    """The prompt ends with the family's question for a planted key: the alias for a chain,
    else one of the keys bound to a value."""
    assert it.prompt.endswith(r.family.question(r.asked.decode()).encode())
    assert it.question == r.family.question(r.asked.decode()).encode()
    assert it.question.count(b"\n") == 1
    keys = [b.key for b in r.bindings]
    assert r.asked in keys, (r.asked, keys)


def test_the_question_is_the_last_line_and_the_familys_own(items):
    for it, r in _all(items):
        _check_question(it, r)


def _check_answer(it: RecallItem, r: Reading) -> None:
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
    assert re.fullmatch(_value_pattern(r.alphabet).encode(), value)


def test_the_answer_is_read_from_the_planted_bindings(items):
    for it, r in _all(items):
        _check_answer(it, r)


def _holder(it: RecallItem, r: Reading) -> Binding:
    """The binding whose value the answer ends with."""
    asked = r.bound(r.asked)
    return r.bound(asked.value) if it.task == "chain" else asked


def _check_evidence(it: RecallItem, r: Reading) -> None:
    """Evidence is the asked binding (a chain's source and alias bindings, in that order), whole
    lines from a line start; ``value_span`` is the asked value in the first; the last ends at
    least half a context before the question."""
    holder = _holder(it, r)
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


def test_evidence_and_value_span_are_the_asked_binding_far_back(items):
    for it, r in _all(items):
        _check_evidence(it, r)


@pytest.mark.parametrize(
    ("index", "family", "binding", "value"),
    [
        # ``vbljlk`` bound to ``ara`` in the docstring family: the value also occurs inside
        # ``:param``, before the key.
        (205670, "docstring", b"    :param vbljlk: defaults to ara\n", b"ara"),
        # A generated family whose lead word is the value, ``var``, and whose value is in
        # braces (doubled in the template).
        (45030, GENERATED, b"\tvar <ahtmtk>:{var} }\n", b"var"),
    ],
)
def test_value_span_is_the_value_not_an_earlier_copy_in_the_template(index, family, binding, value):
    # The draw of training item ``index`` (lookup, 1024 bytes, seed 0). The draw comes before
    # the text is read, so any text gives this binding. The value is its last occurrence.
    text = _prose(8 * 1024)
    it = assemble(text, "lookup", 1024, random.Random(f"train/train/lookup/1024/0/{index}"))
    assert (it.family, it.answer) == (family, value)
    start, end = it.evidence[0]
    assert it.prompt[start:end] == binding
    span = (start + binding.rindex(value), start + binding.rindex(value) + len(value))
    assert it.value_span == span == read_item(it, text).bindings[0].value_span


def _check_unique(it: RecallItem, r: Reading) -> None:
    """Keys, and values of ``UNIQUE_VALUE`` characters or more, occur in the prompt only in the
    planted bindings and the question."""
    planted = b"".join(it.prompt[slice(*b.span)] for b in r.bindings) + it.question
    values = [b.value for b in r.bindings if len(b.value) >= UNIQUE_VALUE]
    for word in [b.key for b in r.bindings] + values:
        assert it.prompt.count(word) == planted.count(word), word


def test_keys_and_long_values_occur_only_where_planted(items):
    for it, r in _all(items):
        _check_unique(it, r)


def test_multi_key_plants_distinct_bindings_one_asked(items):
    assert MULTI_KEYS == 8
    for (_, _, task, n), batch in items.items():
        if task != "multi_key":
            continue
        for it, r in batch:
            keys, values = [b.key for b in r.bindings], [b.value for b in r.bindings]
            assert len(set(keys)) == len(keys) == KEYS_PER_MULTI_KEY[n] == min(8, n // 128)
            asked = [k for k in keys if it.question == r.family.question(k.decode()).encode()]
            assert asked == [r.asked]
            assert it.answer == dict(zip(keys, values, strict=True))[r.asked]
            for a, b in itertools.permutations(values, 2):
                assert not b.startswith(a), (a, b)


def test_chain_needs_both_hops(items):
    for (_, _, task, _), batch in items.items():
        if task != "chain":
            continue
        for it, r in batch:
            keys = {b.key for b in r.bindings}
            assert len(keys) == 4
            aliases = [b for b in r.bindings if b.value in keys]
            sources = [b for b in r.bindings if b.value not in keys]
            assert len(aliases) == len(sources) == 2
            # Two complete chains with different values; the asked alias holds one source.
            assert {a.value for a in aliases} == {s.key for s in sources}
            assert len({s.value for s in sources}) == 2
            assert r.bound(r.asked) in aliases and it.answer.startswith(r.bound(r.asked).value)
            # Sources come before aliases, so the second hop is read after the first.
            assert max(s.span[0] for s in sources) <= min(a.span[0] for a in aliases)


# --- Family and text splits -----------------------------------------------------------------


def _check_family(it: RecallItem, r: Reading, families: str) -> None:
    """The item's family is one of split ``families``, or for ``train`` a generated one that is
    no validation or held-out family and writes none of their bindings."""
    if it.family == GENERATED:
        assert families == "train", (families, it.templates)
        assert r.family.bind not in {f.bind for f in NAMED_ELSEWHERE}, it.templates
    else:
        assert r.family in FAMILIES[families]
    assert it.templates == (r.family.bind, r.family.ask)


def test_families_come_from_their_split(items):
    for (_, families, _, _), batch in items.items():
        for it, r in batch:
            assert it.families == families
            _check_family(it, r, families)
            allowed = ALPHABETS[families] + (() if families == "train" else ALPHABETS["train"])
            assert r.alphabet in allowed


@pytest.fixture(scope="module")
def many_lookups():
    """200 short ``lookup`` items of each family split."""
    return {f: recall_items("train", "lookup", 256, 200, seed=7, families=f) for f in FAMILY_SPLITS}


def test_family_splits_use_their_families_and_alphabets(many_lookups):
    for families, batch in many_lookups.items():
        # Every family of the split fits a short lookup, and 200 items draw each of them; only
        # training items are in generated families too.
        generated = {GENERATED} if families == "train" else set()
        assert {it.family for it in batch} == {f.name for f in FAMILIES[families]} | generated
        seen = [ALPHABET[it.alphabet] for it in batch]
        for it, alphabet in zip(batch, seen, strict=True):
            assert re.fullmatch(_value_pattern(alphabet).encode(), it.answer), it
        own = sum(a in ALPHABETS[families] for a in seen)
        if families == "train":
            assert own == len(batch)
            assert set(seen) == set(ALPHABETS["train"])
        else:
            # Their own alphabet or a training one at even odds: 100 of 200 expected, 70..130
            # is more than four standard deviations either side.
            assert all(a in ALPHABETS[families] + ALPHABETS["train"] for a in seen)
            assert 70 <= own <= 130, own
            assert set(seen) == set(ALPHABETS[families] + ALPHABETS["train"])


def test_about_half_of_training_items_are_in_generated_families(many_lookups, items):
    train = many_lookups["train"]
    generated = sum(it.family == GENERATED for it in train)
    # A binomial count: within four and a half standard deviations of its mean (100 +- 32 of
    # 200 at GENERATED_SHARE = 0.5), far from all or none.
    mean = len(train) * GENERATED_SHARE
    assert abs(generated - mean) <= 4.5 * (mean * (1 - GENERATED_SHARE)) ** 0.5, generated
    for families in ("validation", "held_out"):
        drawn = many_lookups[families] + [
            it for k, b in items.items() if k[1] == families for it, _ in b
        ]
        assert GENERATED not in {it.family for it in drawn}, families


def test_a_named_family_items_templates_are_its_familys(many_lookups, items):
    named = [it for b in many_lookups.values() for it in b if it.family != GENERATED]
    named += [it for it, _ in _all(items) if it.family != GENERATED]
    assert {it.family for it in named} == set(FAMILY)
    for it in named:
        assert it.templates == (FAMILY[it.family].bind, FAMILY[it.family].ask), it.family


_ACCESSOR_ASK = re.compile(
    "|".join(
        re.escape(lead + accessor + separator)
        for lead, accessor, separator in itertools.product(_ASK_LEADS, _ACCESSORS, _ASK_SEPARATORS)
    )
)


def test_a_generated_question_repeats_the_asked_binding_or_names_an_accessor(items):
    # A repeat is the asked binding's bytes up to its value, without the indent; any other
    # question is an accessor expression of the documented pieces.
    generated = [(it, r) for it, r in _all(items) if it.family == GENERATED]
    repeats = braces = 0
    for it, r in generated:
        asked = r.bound(r.asked)
        if it.question[1:] == it.prompt[asked.span[0] : asked.value_span[0]].lstrip():
            repeats += 1
        else:
            assert _ACCESSOR_ASK.fullmatch(r.family.ask), r.family.ask
        braces += "{{" in r.family.bind or "}}" in r.family.bind
    # A third of about 48 generated families ask by repeat, and about a quarter have braces.
    assert len(generated) >= 24 and repeats >= 4 and braces >= 4, (len(generated), repeats)


def test_code_comes_from_its_own_text_split_only(items):
    train, held_out = split_text("train"), split_text("held_out")
    for (split, _, _, n), batch in items.items():
        own, other = (train, held_out) if split == "train" else (held_out, train)
        assert all(r.code in own for _, r in batch)
        # A short stretch can be a licence header or a line that recurs in both splits; a long
        # one almost never is.
        if n >= 1024:
            assert sum(r.code not in other for _, r in batch) >= COUNT - 1


def _has_validation_text() -> bool:
    try:
        validation_files()
    except FileNotFoundError:
        return False
    return True


@pytest.mark.skipif(
    not _has_validation_text(),
    reason="this Python has no standard-library test suite, the validation items' code",
)
def test_validation_items_take_code_the_corpus_leaves_out():
    train, held_out = split_files()
    validation = validation_files()
    assert validation and all(f.startswith("test/") for f in validation)
    assert not set(validation) & (set(train) | set(held_out))  # outside the corpus, both sides
    text, corpus = split_text("validation"), split_text("train") + split_text("held_out")
    readings = [
        read_item(it, text)
        for task in TASKS
        for it in recall_items("validation", task, 2048, 3, seed=99, families="validation")
    ]
    assert all(r.code in text for r in readings)
    assert sum(r.code not in corpus for r in readings) >= len(readings) - 1


def test_validation_files_name_the_missing_test_suite(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"test suite is not in .* \(no test_grammar.py\)"):
        validation_files(tmp_path)
    (tmp_path / "test" / "support").mkdir(parents=True)  # Debian's stub, without the suite
    (tmp_path / "test" / "support" / "__init__.py").write_text("x = 1\n")
    with pytest.raises(FileNotFoundError, match="libpython3.X-testsuite"):
        validation_files(tmp_path)
    (tmp_path / "test" / "test_grammar.py").write_text("y = 2\n")
    assert validation_files(tmp_path) == ["test/support/__init__.py", "test/test_grammar.py"]


def test_the_benchmark_lengths_are_training_lengths():
    assert set(CONTEXT_LENGTHS) <= set(TRAINING_LENGTHS) and max(TRAINING_LENGTHS) == 2048


# --- Items in one's own text ----------------------------------------------------------------

_WORDS = (
    "the river ran past a stone wall and under the old bridge while lanterns swung in wind "
    "over roofs of slate where gulls sat and watched boats come home at dusk"
).split()


_DECOY_KEYS = ("harbor", "meadow", "walrus", "canyon")


def _prose(size: int) -> bytes:
    """``size`` bytes or more of made-up sentences, one to a line, words of :data:`_WORDS`;
    every fourth line a binding of a random family, as a user's own text may hold: the reader
    must tell those from the planted ones."""
    rng, lines, total = random.Random(11), [], 0
    families = [f for split in FAMILY_SPLITS for f in FAMILIES[split]]
    while total < size:
        if len(lines) % 4 == 3:
            family, key = rng.choice(families), rng.choice(_DECOY_KEYS)
            line = family.binding(key.upper() if family.upper else key, str(rng.randint(1, 99)))
        else:
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
            line = words.capitalize() + ".\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()


def test_assemble_plants_items_in_any_text():
    text, decoys = _prose(8 * 1024), 0
    for families, task, n in itertools.product(FAMILY_SPLITS, TASKS, (256, 1024)):
        for draw in range(3):
            it = assemble(text, task, n, random.Random(draw), families)
            assert it == assemble(text, task, n, random.Random(draw), families)
            assert (it.task, it.context_length, it.families) == (task, n, families)
            assert len(it.prompt) + len(it.answer) == n
            r = read_item(it, text)
            assert r.code in text
            _check_family(it, r, families)
            _check_question(it, r)
            _check_answer(it, r)
            _check_evidence(it, r)
            _check_unique(it, r)
            decoys += r.decoys
    assert decoys > 0  # the text's own bindings were in some items, and not taken as planted


def _hex_dump(size: int) -> bytes:
    """``size`` bytes or more of lines of sixteen random bytes written ``0x3f``: every short
    value of the hex alphabet (``0x`` and two digits) occurs in it, about every 1.3 KB."""
    rng, lines, total = random.Random(13), [], 0
    while total < size:
        line = " ".join(f"0x{rng.randrange(256):02x}" for _ in range(16)) + "\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()


def test_values_found_in_the_text_are_planted_where_the_text_lacks_them():
    text, short = _hex_dump(32 * 1024), 0
    for draw in range(60):
        it = assemble(text, "multi_key", 1024, random.Random(draw), "validation")
        r = read_item(it, text)
        _check_unique(it, r)
        short += sum(len(b.value) == UNIQUE_VALUE and b.value in text for b in r.bindings)
    # Hex values of two digits (one in seven, in half the items) are in the text: those items
    # had to be planted in a stretch without them (17 such values in these 60 items).
    assert short >= 10, short


def test_assemble_takes_text_of_four_contexts_or_more():
    text = _prose(4096)
    item = assemble(text[:4096], "lookup", 1024, random.Random(0))
    assert len(item.prompt) + len(item.answer) == 1024
    with pytest.raises(ValueError, match=re.escape("at least 4096 bytes") + ".*got 4095 bytes"):
        assemble(text[:4095], "lookup", 1024, random.Random(0))
    with pytest.raises(ValueError, match="line breaks"):
        assemble(b"x" * 5000, "lookup", 1024, random.Random(0))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("lookup", 1024, "test"), f"families must be one of {FAMILY_SPLITS}, got 'test'"),
        (("call", 1024, "train"), f"task must be one of {TASKS}, got 'call'"),
        (("lookup", 1000, "train"), f"context_length must be one of {TRAINING_LENGTHS}, got 1000"),
        (("lookup", 4096, "train"), f"context_length must be one of {TRAINING_LENGTHS}, got 4096"),
    ],
)
def test_assemble_names_a_bad_argument_and_what_is_allowed(args, message):
    task, n, families = args
    with pytest.raises(ValueError, match=re.escape(message)):
        assemble(_prose(16 * 1024), task, n, random.Random(0), families)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("test", "lookup", 1024, "train"), f"split must be one of {SPLITS}, got 'test'"),
        (("train", "lookup", 1024, "heldout"), f"families must be one of {FAMILY_SPLITS}"),
        (("train", "call", 1024, "train"), f"task must be one of {TASKS}, got 'call'"),
        (
            ("train", "lookup", 4096, "train"),
            f"context_length must be one of {TRAINING_LENGTHS}, got 4096",
        ),
    ],
)
def test_make_item_names_a_bad_argument_and_what_is_allowed(args, message):
    split, task, n, families = args
    with pytest.raises(ValueError, match=re.escape(message)):
        make_item(split, task, n, 0, 0, families)
    with pytest.raises(ValueError, match=re.escape(message)):
        recall_items(split, task, n, 1, families=families)


def test_a_negative_count_is_named():
    with pytest.raises(ValueError, match="count must be >= 0, got -1"):
        recall_items("train", "lookup", 1024, -1)


def test_a_family_too_long_for_the_context_is_named(monkeypatch):
    # Four bindings of this family take more than the 128 bytes a chain has at 256, and one
    # fits easily in the 256 a lookup has at 512.
    wide = Family("wide", "{key} = " + "x" * 100 + "{value}", "assert {key} == ")
    monkeypatch.setitem(recall_syntax.FAMILIES, "held_out", (wide,))
    assert make_item("train", "lookup", 512, 0, 0, "held_out").family == "wide"
    with pytest.raises(
        ValueError,
        match=re.escape(
            "no chain item of 256 bytes fits in 1000 draws from the 'held_out' families"
        ),
    ):
        make_item("train", "chain", 256, 0, 0, "held_out")
