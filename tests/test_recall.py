"""Long-range recall items: deterministic, split-separated, exact lengths, answers only far back."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
import sys

import pytest

from kvpop_compile.embedded.corpus import split_files, validation_files
from kvpop_compile.embedded.recall import (
    CONTEXT_LENGTHS,
    MULTI_KEYS,
    TASKS,
    TRAINING_LENGTHS,
    make_item,
    recall_items,
    split_text,
)

COUNT = 6  # items per (task, length) in the property checks; each is a few ms


@pytest.fixture(scope="module")
def items():
    return {
        (split, task, n): recall_items(split, task, n, COUNT, seed=3)
        for split in ("train", "held_out")
        for task in TASKS
        for n in TRAINING_LENGTHS
    }


def test_same_arguments_give_the_same_bytes(items):
    for (split, task, n), batch in items.items():
        assert recall_items(split, task, n, COUNT, seed=3) == batch
        assert make_item(split, task, n, 3, COUNT - 1) == batch[-1]
        assert recall_items(split, task, n, 2, seed=3, start=2) == batch[2:4]


def _items_digest(hash_seed: str) -> str:
    """A digest of some held-out items made in a fresh process with ``PYTHONHASHSEED``."""
    code = (
        "import hashlib\n"
        "from kvpop_compile.embedded.recall import TASKS, recall_items\n"
        "h = hashlib.sha256()\n"
        "for task in TASKS:\n"
        "    for item in recall_items('held_out', task, 1024, 3):\n"
        "        h.update(repr(item).encode())\n"
        "print(h.hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_items_do_not_depend_on_the_process_string_hash():
    # Names were once ordered through a set, whose order follows the per-process string hash:
    # the "same" held-out items then differed from one run of a benchmark to the next.
    digests = {_items_digest(seed) for seed in ("1", "2", "3")}
    assert len(digests) == 1, digests
    assert len(next(iter(digests))) == len(hashlib.sha256().hexdigest())


def test_other_seeds_and_indices_give_other_items(items):
    for (split, task, n), batch in items.items():
        assert len({it.prompt for it in batch}) == COUNT
        other = recall_items(split, task, n, COUNT, seed=4)
        assert not {it.prompt for it in other} & {it.prompt for it in batch}


def test_prompt_and_answer_fill_the_context_exactly(items):
    for (_, task, n), batch in items.items():
        for it in batch:
            assert it.task == task and it.context_length == n
            assert len(it.prompt) + len(it.answer) == n
            value = rb"[1-9][0-9]{3}"
            assert re.fullmatch(rb"[a-z]{6} == " + value if task == "chain" else value, it.answer)


def test_questions_have_the_documented_form(items):
    forms = {
        "lookup": rb"\nassert [A-Z]{6} == ",
        "multi_key": rb"\nassert [A-Z]{6} == ",
        "chain": rb"\nassert [a-z]{6} == ",
        "call": rb"\nassert [a-z]{6}\(\) == ",
    }
    for (_, task, _), batch in items.items():
        for it in batch:
            assert re.search(forms[task] + rb"\Z", it.prompt), it.prompt[-40:]


def _value(it) -> bytes:
    """The four digits the answer ends with."""
    return it.answer[-4:]


def test_evidence_is_the_planted_lines_and_ends_half_a_context_before_the_question(items):
    for (_, task, n), batch in items.items():
        for it in batch:
            lines = [it.prompt[start:end] for start, end in it.evidence]
            assert len(lines) == (2 if task == "chain" else 1)
            assert all(line.endswith(b"\n") for line in lines)
            assert all(s == 0 or it.prompt[s - 1 : s] == b"\n" for s, _ in it.evidence)
            # The value occurs once, in the first evidence line (the source, for a chain).
            assert it.prompt.count(_value(it)) == 1 and _value(it) in lines[0]
            question = it.prompt.rindex(b"\n")
            assert question - it.evidence[-1][1] >= n // 2


def test_value_span_is_the_asked_value_inside_the_first_evidence_line(items):
    for batch in items.values():
        for it in batch:
            start, end = it.value_span
            assert it.prompt[start:end] == _value(it)
            # Every planted source line ends "= 4821\n" (lookup, multi_key, chain) or
            # "return 4821\n" (call): the value's last digit is the line's last byte but one.
            first_start, first_end = it.evidence[0]
            assert first_start < start and end == first_end - 1
    broken = dataclasses.replace(batch[0], answer=b"0000")
    with pytest.raises(ValueError, match="does not hold its answer's value b'0000'"):
        _ = broken.value_span


def test_the_asked_name_is_defined_once_and_asked_once(items):
    for (_, task, _), batch in items.items():
        for it in batch:
            name = re.search(rb"([A-Za-z]{6})\(?\)? == \Z", it.prompt).group(1)
            assert it.prompt.count(name) == 2  # definition (or alias) and question
            if task == "lookup":
                assert it.prompt.count(name + b" = " + it.answer + b"\n") == 1
            if task == "call":
                assert b"def " + name + b"():\n    return " + it.answer + b"\n" in it.prompt


def test_multi_key_plants_distinct_definitions_one_asked(items):
    for (_, task, n), batch in items.items():
        if task != "multi_key":
            continue
        keys = MULTI_KEYS if n >= 512 else MULTI_KEYS // 2
        for it in batch:
            planted = re.findall(rb"^([A-Z]{6}) = ([0-9]{4})$", it.prompt, flags=re.M)
            assert len(planted) == keys
            assert len({v for _, v in planted}) == keys
            asked = it.prompt.rsplit(b"assert ", 1)[1].split(b" ")[0]
            assert dict(planted)[asked] == it.answer


def test_chain_needs_both_hops(items):
    for it in items["train", "chain", 2048] + items["held_out", "chain", 1024]:
        alias = re.search(rb"assert ([a-z]{6}) == \Z", it.prompt).group(1)
        source = re.search(rb"^" + alias + rb" = ([a-z]{6})$", it.prompt, flags=re.M).group(1)
        value = re.search(rb"^" + source + rb" = ([0-9]{4})$", it.prompt, flags=re.M).group(1)
        assert it.answer == source + b" == " + value
        assert [it.prompt[a:b] for a, b in it.evidence] == [
            source + b" = " + value + b"\n",
            alias + b" = " + source + b"\n",
        ]
        # A second chain with another value: the value line alone does not give the answer.
        others = re.findall(rb"^[a-z]{6} = ([0-9]{4})$", it.prompt, flags=re.M)
        assert len(others) == 2 and others.count(value) == 1


_PLANTED = re.compile(rb"^(?:[A-Za-z]{6} = \w+|def [a-z]{6}\(\):|    return [0-9]{4})\n", re.M)


def _code(it) -> list[bytes]:
    """The stretches of real code in an item: the prompt cut at its planted lines, question off."""
    body = it.prompt[: it.prompt.rindex(b"\n")]
    return [part for part in _PLANTED.split(body) if part]


def test_code_comes_from_its_own_split_only(items):
    train, held_out = split_text("train"), split_text("held_out")
    for (split, _, n), batch in items.items():
        own, other = (train, held_out) if split == "train" else (held_out, train)
        parts = [part for it in batch for part in _code(it)]
        assert all(part in own for part in parts)
        # Short lines and licence headers recur across files; most long stretches do not.
        long = [part for part in parts if len(part) >= n // 4]
        assert len(long) >= len(batch)
        assert sum(part not in other for part in long) > len(long) / 2


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
    for task in TASKS:
        items = recall_items("validation", task, 2048, 4, seed=99)
        parts = [part for it in items for part in _code(it)]
        assert all(part in text for part in parts)
        # Licence headers and short lines recur; most long stretches are the test suite's own.
        long = [part for part in parts if len(part) >= 512]
        assert len(long) >= len(items)
        assert sum(part not in corpus for part in long) > len(long) / 2


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


def test_train_and_held_out_items_never_coincide():
    for task in TASKS:
        train = recall_items("train", task, 1024, 8, seed=0)
        held = recall_items("held_out", task, 1024, 8, seed=0)
        assert not {it.prompt for it in train} & {it.prompt for it in held}
        assert [it.answer for it in train] != [it.answer for it in held]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"split": "test"}, "split must be one of"),
        ({"task": "needle"}, "task must be one of"),
        ({"context_length": 4096}, "context_length must be one of"),
        ({"context_length": 1000}, "context_length must be one of"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {"split": "train", "task": "lookup", "context_length": 1024} | kwargs
    with pytest.raises(ValueError, match=match):
        make_item(args["split"], args["task"], args["context_length"], 0, 0)
    with pytest.raises(ValueError, match="count must be >= 0"):
        recall_items("train", "lookup", 1024, -1)
