"""Syntax families and value alphabets of the recall items: split whole, keys then values,
values of their alphabet, draws that follow the documented odds."""

from __future__ import annotations

import collections
import itertools
import keyword
import random
import re
import string

import pytest

from kvpop_compile.embedded.recall_syntax import (
    ALPHABETS,
    FAMILIES,
    FAMILY_SPLITS,
    NAME_LETTERS,
    Alphabet,
    check_family_split,
    draw_alphabet,
    draw_family,
    draw_keys,
    draw_values,
    family_names,
)

ALL_FAMILIES = [f for split in FAMILY_SPLITS for f in FAMILIES[split]]
ALL_ALPHABETS = [a for split in FAMILY_SPLITS for a in ALPHABETS[split]]


def test_every_split_has_families_and_alphabets():
    assert FAMILY_SPLITS == ("train", "validation", "held_out")
    assert tuple(FAMILIES) == tuple(ALPHABETS) == FAMILY_SPLITS
    assert all(FAMILIES[s] and ALPHABETS[s] for s in FAMILY_SPLITS)
    for split in FAMILY_SPLITS:
        assert family_names(split) == tuple(f.name for f in FAMILIES[split])


def test_no_family_name_template_or_alphabet_is_shared_between_splits():
    for one, other in itertools.combinations(FAMILY_SPLITS, 2):
        for part in ("name", "bind", "ask"):
            ours = {getattr(f, part) for f in FAMILIES[one]}
            theirs = {getattr(f, part) for f in FAMILIES[other]}
            assert not ours & theirs, (one, other, part, ours & theirs)
        assert not {a.name for a in ALPHABETS[one]} & {a.name for a in ALPHABETS[other]}
    assert len({f.name for f in ALL_FAMILIES}) == len(ALL_FAMILIES)
    assert len({a.name for a in ALL_ALPHABETS}) == len(ALL_ALPHABETS)


@pytest.mark.parametrize("family", ALL_FAMILIES, ids=lambda f: f.name)
def test_a_binding_holds_the_key_then_the_value(family):
    key = "QZWKRT" if family.upper else "qzwkrt"
    for value in ("7305", "0x5eed", "mvq"):
        line = family.binding(key, value)
        # The template's text before ``{value}``, with the key in it, then the value.
        before, after = family.bind.split("{value}")
        head = before.format(key=key)
        assert line == head + value + after.format(key=key) + "\n"
        assert key in head and line.index(key) < len(head)
        assert line.count("\n") == family.bind.count("\n") + 1


@pytest.mark.parametrize("family", ALL_FAMILIES, ids=lambda f: f.name)
def test_a_question_is_one_line_that_names_the_key(family):
    key = "QZWKRT" if family.upper else "qzwkrt"
    question = family.question(key)
    assert question.startswith("\n") and question.count("\n") == 1
    assert key in question and "{" not in family.ask.replace("{key}", "")
    assert question == "\n" + family.ask.replace("{key}", key)


def test_every_split_asks_both_by_repeating_the_binding_and_in_words_of_its_own():
    # A question that repeats the binding's prefix is answered by copying; one in other words
    # needs the key found and the value after it read.
    for split in FAMILY_SPLITS:
        repeats = [
            f.binding("qzwkrt", "7305").startswith(f.question("qzwkrt")[1:])
            for f in FAMILIES[split]
        ]
        assert any(repeats) and not all(repeats), split


@pytest.mark.parametrize("alphabet", ALL_ALPHABETS, ids=lambda a: a.name)
def test_values_are_of_their_alphabet(alphabet):
    rng = random.Random(alphabet.name)
    values = [v for _ in range(400) for v in draw_values(rng, 5, alphabet)]
    bodies = [v[len(alphabet.prefix) :] for v in values]
    assert all(v.startswith(alphabet.prefix) for v in values)
    assert all(set(b) <= set(alphabet.chars) for b in bodies)
    lengths = collections.Counter(len(b) for b in bodies)
    # Every length from low to high is drawn (2000 values, at most eight lengths), no other.
    assert set(lengths) == set(range(alphabet.low, alphabet.high + 1))
    first = {b[0] for b in bodies}
    if alphabet.name == "decimal":
        # Read as the number it is: never a leading zero, though zeros occur after the first.
        assert first == set(alphabet.chars) - {"0"}
        assert any("0" in b for b in bodies)
    else:
        assert first == set(alphabet.chars)


@pytest.mark.parametrize("alphabet", ALL_ALPHABETS, ids=lambda a: a.name)
def test_values_of_one_draw_are_distinct_and_none_starts_another(alphabet):
    rng = random.Random(3)
    for _ in range(200):
        values = draw_values(rng, 8, alphabet)
        assert len(values) == 8
        for a, b in itertools.permutations(values, 2):
            assert not b.startswith(a), (a, b)


def test_values_follow_the_rng():
    decimal = ALPHABETS["train"][0]
    assert draw_values(random.Random(5), 6, decimal) == draw_values(random.Random(5), 6, decimal)
    assert draw_values(random.Random(5), 6, decimal) != draw_values(random.Random(6), 6, decimal)


def test_a_decimal_value_of_one_digit_is_never_zero():
    one = Alphabet("decimal", string.digits, 1, 1)
    assert {one.draw(random.Random(i)) for i in range(300)} == set("123456789")


@pytest.mark.parametrize("upper", [False, True])
def test_keys_are_distinct_words_of_six_letters_in_draw_order(upper):
    rng = random.Random(9)
    letters = string.ascii_uppercase if upper else string.ascii_lowercase
    keys = draw_keys(rng, 50, upper)
    assert len(set(keys)) == 50
    assert all(len(k) == NAME_LETTERS and set(k) <= set(letters) for k in keys)
    assert draw_keys(random.Random(9), 50, upper) == keys  # a list in draw order, every run


class _Spelling(random.Random):
    """An rng whose ``choice`` spells out ``text``, one character a call."""

    def __init__(self, text: str):
        super().__init__(0)
        self._chars = iter(text)

    def choice(self, seq):
        char = next(self._chars)
        if char not in seq:
            raise ValueError(f"{char!r} is not one of {seq!r}")
        return char


def test_keys_skip_python_keywords_and_repeats():
    assert keyword.iskeyword("lambda") and keyword.iskeyword("return")
    # Each drawn word in turn: a keyword, a new key, a keyword, the same key again, a new one.
    rng = _Spelling("lambda" + "qzwkrt" + "return" + "qzwkrt" + "mvqplx")
    assert draw_keys(rng, 2, upper=False) == ["qzwkrt", "mvqplx"]


@pytest.mark.parametrize("split", FAMILY_SPLITS)
def test_families_are_drawn_from_their_split_only(split):
    rng = random.Random(split)
    drawn = collections.Counter(draw_family(rng, split) for _ in range(1000))
    assert set(drawn) == set(FAMILIES[split])


def test_training_draws_use_training_alphabets_only():
    rng = random.Random(1)
    drawn = collections.Counter(draw_alphabet(rng, "train").name for _ in range(2000))
    # Two alphabets at even odds: 1000 each expected; 900..1100 is over four deviations.
    assert set(drawn) == {a.name for a in ALPHABETS["train"]}
    assert all(900 <= n <= 1100 for n in drawn.values()), drawn


@pytest.mark.parametrize("split", ["validation", "held_out"])
def test_a_held_out_split_draws_its_own_alphabet_half_of_the_time(split):
    rng = random.Random(split)
    drawn = [draw_alphabet(rng, split) for _ in range(2000)]
    assert set(drawn) == set(ALPHABETS[split] + ALPHABETS["train"])
    own = sum(a in ALPHABETS[split] for a in drawn)
    # Even odds: 1000 of 2000 expected; 900..1100 is over four standard deviations.
    assert 900 <= own <= 1100, own


@pytest.mark.parametrize(
    "call",
    [check_family_split, family_names, lambda s: draw_family(random.Random(0), s)]
    + [lambda s: draw_alphabet(random.Random(0), s)],
)
@pytest.mark.parametrize("bad", ["test", "heldout", "Train"])
def test_a_bad_family_split_is_named_with_the_allowed_ones(call, bad):
    message = f"families must be one of ('train', 'validation', 'held_out'), got {bad!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        call(bad)
