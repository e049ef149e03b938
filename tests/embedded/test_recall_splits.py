"""Recall items keep their splits apart: families, value alphabets and text, each drawn only from
its own split; validation items take the code the corpus leaves out."""

from __future__ import annotations

import itertools
import re

import pytest
from recall_reader import (
    ALPHABET,
    COUNT,
    FAMILY,
    GENERATED,
    all_pairs,
    check_family,
    read_item,
    value_pattern,
)

from kvpop_compile.embedded.corpus import split_files, validation_files
from kvpop_compile.embedded.recall import (
    CONTEXT_LENGTHS,
    TASKS,
    TRAINING_LENGTHS,
    recall_items,
    split_text,
)
from kvpop_compile.embedded.recall_syntax import (
    _ACCESSORS,
    _ASK_LEADS,
    _ASK_SEPARATORS,
    ALPHABETS,
    FAMILIES,
    GENERATED_SHARE,
)


def test_families_come_from_their_split(items):
    for (_, families, _, _), batch in items.items():
        for it, r in batch:
            assert it.families == families
            check_family(it, r, families)
            allowed = ALPHABETS[families] + (() if families == "train" else ALPHABETS["train"])
            assert r.alphabet in allowed


def test_family_splits_use_their_families_and_alphabets(many_lookups):
    for families, batch in many_lookups.items():
        # Every family of the split fits a short lookup, and 200 items draw each of them; only
        # training items are in generated families too.
        generated = {GENERATED} if families == "train" else set()
        assert {it.family for it in batch} == {f.name for f in FAMILIES[families]} | generated
        seen = [ALPHABET[it.alphabet] for it in batch]
        for it, alphabet in zip(batch, seen, strict=True):
            assert re.fullmatch(value_pattern(alphabet).encode(), it.answer), it
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
    named += [it for it, _ in all_pairs(items) if it.family != GENERATED]
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
    generated = [(it, r) for it, r in all_pairs(items) if it.family == GENERATED]
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
