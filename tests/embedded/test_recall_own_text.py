"""Recall items planted in any text a user gives (``assemble``), and the arguments ``assemble``
and ``make_item`` refuse."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from recall_reader import (
    check_answer,
    check_evidence,
    check_family,
    check_question,
    check_unique,
    prose,
    read_item,
)

from kvpop_compile.embedded import recall_syntax
from kvpop_compile.embedded.recall import (
    SPLITS,
    TASKS,
    TRAINING_LENGTHS,
    UNIQUE_VALUE,
    assemble,
    make_item,
    recall_items,
)
from kvpop_compile.embedded.recall_syntax import (
    FAMILY_SPLITS,
    Family,
)


def test_assemble_plants_items_in_any_text():
    text, decoys = prose(8 * 1024), 0
    for families, task, n in itertools.product(FAMILY_SPLITS, TASKS, (256, 1024)):
        for draw in range(3):
            it = assemble(text, task, n, random.Random(draw), families)
            assert it == assemble(text, task, n, random.Random(draw), families)
            assert (it.task, it.context_length, it.families) == (task, n, families)
            assert len(it.prompt) + len(it.answer) == n
            r = read_item(it, text)
            assert r.code in text
            check_family(it, r, families)
            check_question(it, r)
            check_answer(it, r)
            check_evidence(it, r)
            check_unique(it, r)
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
        check_unique(it, r)
        short += sum(len(b.value) == UNIQUE_VALUE and b.value in text for b in r.bindings)
    # Hex values of two digits (one in seven, in half the items) are in the text: those items
    # had to be planted in a stretch without them (17 such values in these 60 items).
    assert short >= 10, short


def test_assemble_takes_text_of_four_contexts_or_more():
    text = prose(4096)
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
        assemble(prose(16 * 1024), task, n, random.Random(0), families)


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
