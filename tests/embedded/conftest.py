"""The recall items the tests of :mod:`kvpop_compile.embedded.recall` read back, made once per
session."""

from __future__ import annotations

import itertools

import pytest
from recall_reader import (
    COUNT,
    read_item,
)

from kvpop_compile.embedded.recall import (
    TASKS,
    TRAINING_LENGTHS,
    recall_items,
    split_text,
)
from kvpop_compile.embedded.recall_syntax import (
    FAMILY_SPLITS,
)


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def many_lookups():
    """200 short ``lookup`` items of each family split."""
    return {f: recall_items("train", "lookup", 256, 200, seed=7, families=f) for f in FAMILY_SPLITS}
