"""Syntax families and value alphabets of the recall items: split whole, keys then values,
values of their alphabet, draws that follow the documented odds; generated training families
made of the documented pieces, with none of the validation or held-out families' marks."""

from __future__ import annotations

import collections
import itertools
import keyword
import random
import re
import string

import pytest

from kvpop_compile.embedded.recall_syntax import (
    _ACCESSORS,
    _ASK_LEADS,
    _ASK_SEPARATORS,
    _INDENTS,
    _KEY_QUOTES,
    _LEADS,
    _SEPARATORS,
    _TRAILS,
    _VALUE_QUOTES,
    ALPHABETS,
    FAMILIES,
    FAMILY_SPLITS,
    GENERATED_SHARE,
    NAME_LETTERS,
    REPEAT_SHARE,
    Alphabet,
    Family,
    check_family_split,
    draw_alphabet,
    draw_family,
    draw_keys,
    draw_values,
    family_names,
    generated_family,
)

GENERATED = "generated"  # the name of every generated training family
NAMED_ELSEWHERE = [f for split in ("validation", "held_out") for f in FAMILIES[split]]
ALL_FAMILIES = [f for split in FAMILY_SPLITS for f in FAMILIES[split]]
ALL_ALPHABETS = [a for split in FAMILY_SPLITS for a in ALPHABETS[split]]
# Generated families held to the same checks as the named ones: these 40 draws include ones
# asked by repeat, with an indent, with braces and with keys in capitals (checked below).
SOME_GENERATED = [generated_family(random.Random(f"generated/{i}")) for i in range(40)]


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


FAMILY_IDS = [f.name for f in ALL_FAMILIES] + [f"{GENERATED}-{i}" for i in range(40)]


@pytest.mark.parametrize("family", ALL_FAMILIES + SOME_GENERATED, ids=FAMILY_IDS)
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


def _render(template: str, key: str) -> str:
    """``template`` with ``{key}`` written as ``key`` and doubled braces as single ones."""
    return template.replace("{key}", key).replace("{{", "{").replace("}}", "}")


@pytest.mark.parametrize("family", ALL_FAMILIES + SOME_GENERATED, ids=FAMILY_IDS)
def test_a_question_is_one_line_that_names_the_key(family):
    key = "QZWKRT" if family.upper else "qzwkrt"
    question = family.question(key)
    assert question.startswith("\n") and question.count("\n") == 1
    # No field but the key: any other brace is a doubled, literal one.
    fields = {field for _, field, _, _ in string.Formatter().parse(family.ask)}
    assert key in question and fields <= {"key", None}
    assert question == "\n" + _render(family.ask, key)


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
    # Training draws are of a named training family or a generated one; the others of their
    # split's named families only.
    rng = random.Random(split)
    drawn = collections.Counter(draw_family(rng, split) for _ in range(1000))
    named = {f for f in drawn if f.name != GENERATED}
    assert named == set(FAMILIES[split])
    assert bool(set(drawn) - named) == (split == "train")


def _within(count: int, n: int, share: float) -> bool:
    """Whether a binomial ``count`` of ``n`` draws at ``share`` is within four and a half
    standard deviations of its mean."""
    return abs(count - n * share) <= 4.5 * (n * share * (1 - share)) ** 0.5


def _asks_by_repeat(family: Family) -> bool:
    return family.ask == family.bind.split("{value}")[0].lstrip()


def test_generated_families_are_their_share_of_training_draws_and_repeats_theirs():
    rng = random.Random("shares")
    drawn = [draw_family(rng, "train") for _ in range(2000)]
    generated = [f for f in drawn if f.name == GENERATED]
    # 1000 +- 100 of 2000 at GENERATED_SHARE = 0.5; about 333 +- 70 of those at REPEAT_SHARE.
    assert _within(len(generated), len(drawn), GENERATED_SHARE), len(generated)
    repeats = sum(_asks_by_repeat(f) for f in generated)
    # An accessor question can also be the binding's prefix (``{key} = `` for ``{key} = 7``),
    # rarely: within the bound.
    assert _within(repeats, len(generated), REPEAT_SHARE), (repeats, len(generated))
    # A family's key case is drawn at even odds too.
    assert _within(sum(f.upper for f in generated), len(generated), 0.5)


def _alternatives(pieces) -> str:
    return "(?:" + "|".join(re.escape(p) for p in pieces) + ")"


# A generated binding is an indent, a lead, the key in a pair of quotes, a separator, the value
# in a pair of quotes and a trail; a question in words is an ask lead, an accessor and an ask
# separator.
_BIND = re.compile(
    _alternatives(_INDENTS)
    + _alternatives(_LEADS)
    + _alternatives(a + "{key}" + b for a, b in _KEY_QUOTES)
    + _alternatives(_SEPARATORS)
    + _alternatives(a + "{value}" + b for a, b in _VALUE_QUOTES)
    + _alternatives(_TRAILS)
)
_ASK = re.compile(
    _alternatives(_ASK_LEADS) + _alternatives(_ACCESSORS) + _alternatives(_ASK_SEPARATORS)
)


def test_the_generated_families_checked_like_named_ones_are_of_every_kind():
    repeats = [f for f in SOME_GENERATED if _asks_by_repeat(f)]
    assert any(f.bind[0] in " \t" for f in repeats)
    assert any("{{" in f.bind or "}}" in f.bind for f in SOME_GENERATED)
    assert {f.upper for f in SOME_GENERATED} == {False, True}


def test_generated_families_are_made_of_the_documented_pieces():
    rng = random.Random("pieces")
    for _ in range(2000):
        family = generated_family(rng)
        assert family.name == GENERATED
        assert _BIND.fullmatch(family.bind), family.bind
        assert _ASK.fullmatch(family.ask) or _asks_by_repeat(family), family


# What tells the validation and held-out families apart from training ones, generated or not:
# these strings, and ``the`` before `` is ``.
_MARKS = (":=", "=>", 'value="', "setdefault", "INSERT", "holds", "lookup(", "Settings.")
_MARKS += ("make_var", "table.get", '{"name"')
_THE_IS = re.compile(r"\bthe\b.* is ")


def _marks(text: str) -> list[str]:
    """The marks of validation and held-out families in ``text``."""
    return [m for m in _MARKS if m in text] + [m[0] for m in [_THE_IS.search(text)] if m]


def test_the_marks_are_in_validation_and_held_out_families_only():
    rendered = [(f, f.binding("qzwkrt", "4821") + f.question("qzwkrt")) for f in ALL_FAMILIES]
    marked = {f.name for f, text in rendered if _marks(text)}
    # The toml family has none: its value is in double quotes, which no generated one is.
    assert marked == {f.name for f in NAMED_ELSEWHERE} - {"toml"}, marked
    assert all('"' not in a + b for a, b in _VALUE_QUOTES)
    # Every mark is some family's: the list says what those families are told apart by.
    found = {m for _, text in rendered for m in _marks(text)}
    assert set(_MARKS) <= found and any(_THE_IS.fullmatch(m) for m in found), found


def test_no_generated_binding_or_question_has_a_mark_of_validation_or_held_out_families():
    # Every binding and every question in words the pieces can make, rendered: a mark could
    # also form where two pieces meet. A repeat question is part of a binding.
    parts = (_INDENTS, _LEADS, _KEY_QUOTES, _SEPARATORS, _VALUE_QUOTES, _TRAILS)
    for indent, lead, kq, separator, vq, trail in itertools.product(*parts):
        bind = f"{indent}{lead}{kq[0]}{{key}}{kq[1]}{separator}{vq[0]}{{value}}{vq[1]}{trail}"
        text = bind.format(key="qzwkrt", value="4821")
        assert not _marks(text), text
    for ask in itertools.product(_ASK_LEADS, _ACCESSORS, _ASK_SEPARATORS):
        text = "".join(ask).format(key="qzwkrt")
        assert not _marks(text), text
    rng = random.Random("marks")
    named = {(f.bind, f.ask) for f in NAMED_ELSEWHERE}
    for _ in range(2000):
        family = generated_family(rng)
        text = family.binding("qzwkrt", "4821") + family.question("qzwkrt")
        assert not _marks(text), text
        assert (family.bind, family.ask) not in named
        assert family.bind not in {f.bind for f in NAMED_ELSEWHERE}


class _Scripted(random.Random):
    """An rng whose ``choice`` from each scripted sequence returns that sequence's picks in
    turn, and whose ``random`` always returns ``uniform``."""

    def __init__(self, picks: dict, uniform: float):
        super().__init__(0)
        self._picks = {seq: iter(p) for seq, p in picks.items()}
        self._uniform = uniform

    def choice(self, seq):
        if seq not in self._picks:
            raise ValueError(f"no picks scripted from {seq!r}")
        return next(self._picks[seq])

    def random(self):
        return self._uniform


@pytest.mark.parametrize(
    ("uniform", "ask", "upper"),
    [(0.9, "assert {key} == ", False), (0.1, "{key}: ", True)],
    ids=["in-words", "repeat"],
)
def test_a_generated_family_writing_a_validation_binding_is_redrawn(uniform, ask, upper):
    # The first draw is ``    {key} = {value}``, the validation constant family's binding:
    # redrawn, whatever its question; the second, ``{key}: {value}``, is kept. A uniform of 0.1
    # asks by repeat and writes keys in capitals; 0.9 neither.
    (constant,) = [f for f in FAMILIES["validation"] if f.name == "constant"]
    assert constant.bind == "    {key} = {value}"
    picks = {
        _KEY_QUOTES: [("", ""), ("", "")],
        _VALUE_QUOTES: [("", ""), ("", "")],
        _INDENTS: ["    ", ""],
        _LEADS: ["", ""],
        _SEPARATORS: [" = ", ": "],
        _TRAILS: ["", ""],
        _ASK_LEADS: ["assert ", "assert "],
        _ACCESSORS: ["{key}", "{key}"],
        _ASK_SEPARATORS: [" == ", " == "],
    }
    family = generated_family(_Scripted(picks, uniform))
    assert family == Family(GENERATED, "{key}: {value}", ask, upper=upper)


def test_generated_templates_with_braces_write_single_braces():
    # Pieces with braces are doubled in the templates; written out they are single, the key
    # comes before the value, and a repeat question is the binding up to the value without
    # its indent.
    rng = random.Random("braces")
    families = [generated_family(rng) for _ in range(400)]
    braced = [f for f in families if "{{" in f.bind or "}}" in f.bind]
    assert len(braced) >= 60 and sum(map(_asks_by_repeat, braced)) >= 10
    written = re.compile(
        _alternatives(_INDENTS)
        + _alternatives(_LEADS)
        + _alternatives(a + "qzwkrt" + b for a, b in _KEY_QUOTES)
        + _alternatives(_SEPARATORS)
        + _alternatives(_render(a, "") + "4821" + _render(b, "") for a, b in _VALUE_QUOTES)
        + _alternatives(_render(t, "") for t in _TRAILS)
        + "\n"
    )
    for family in braced:
        line = family.binding("qzwkrt", "4821")
        assert written.fullmatch(line), line
        assert "{{" not in line and "}}" not in line
        assert line.index("qzwkrt") < line.index("4821")
        if _asks_by_repeat(family):
            assert family.question("qzwkrt") == "\n" + line[: line.index("4821")].lstrip()


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
