"""Long-range recall items: deterministic, exact lengths, the question and the answer their
family's own, answers only far back (read back by :mod:`recall_reader`, not the generator)."""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import subprocess
import sys

import pytest
from recall_reader import (
    COUNT,
    GENERATED,
    KEYS_PER_MULTI_KEY,
    all_pairs,
    check_answer,
    check_evidence,
    check_question,
    check_unique,
    prose,
    read_item,
)

from kvpop_compile.embedded.recall import (
    MULTI_KEYS,
    TASKS,
    TRAINING_LENGTHS,
    assemble,
    make_item,
    recall_items,
)
from kvpop_compile.embedded.recall_syntax import (
    FAMILY_SPLITS,
)


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


def test_the_question_is_the_last_line_and_the_familys_own(items):
    for it, r in all_pairs(items):
        check_question(it, r)


def test_the_answer_is_read_from_the_planted_bindings(items):
    for it, r in all_pairs(items):
        check_answer(it, r)


def test_evidence_and_value_span_are_the_asked_binding_far_back(items):
    for it, r in all_pairs(items):
        check_evidence(it, r)


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
    text = prose(8 * 1024)
    it = assemble(text, "lookup", 1024, random.Random(f"train/train/lookup/1024/0/{index}"))
    assert (it.family, it.answer) == (family, value)
    start, end = it.evidence[0]
    assert it.prompt[start:end] == binding
    span = (start + binding.rindex(value), start + binding.rindex(value) + len(value))
    assert it.value_span == span == read_item(it, text).bindings[0].value_span


def test_keys_and_long_values_occur_only_where_planted(items):
    for it, r in all_pairs(items):
        check_unique(it, r)


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
