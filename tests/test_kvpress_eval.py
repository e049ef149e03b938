"""The kvpress driver's summary: per-sequence figures, long-range slicing and failed presses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.kvpress_eval import sequence_figures, summarise
from kvpop_compile.atomic import atomic_write
from kvpop_compile.embedded.corpus import encode
from kvpop_compile.evaluation.data import Sequence
from kvpop_compile.evaluation.long_range import long_range_targets

# "alpha_name" at byte 0 and again at byte 130: bytes 131..139 complete it from memory (its
# previous occurrence is more than 64 bytes back), so they are the only long-range targets.
TEXT = b"alpha_name" + b"." * 120 + b"alpha_name" + b"." * 20
IDS = encode(TEXT)  # (160,)
OTHER = encode(TEXT.replace(b"alpha_name", b"omega_name", 1))  # no name is repeated
PROMPT = 100  # scored targets are bytes 101..159: 59 of them, long-range at indices 30..38
SCORED = len(TEXT) - PROMPT - 1
LONG_RANGE = range(131 - PROMPT - 1, 140 - PROMPT - 1)


def _outcome(hit_indices, nll: float = 0.5) -> dict:
    correct = [int(i in hit_indices) for i in range(SCORED)]
    return {"correct": [correct], "nll": [[nll] * SCORED]}


def test_figures_of_one_sequence():
    hits = set(range(10)) | {30, 31, 32, 33}  # four of the nine long-range targets
    outcome = _outcome(hits, nll=0.25)
    figures = sequence_figures(IDS, outcome["correct"][0], outcome["nll"][0], PROMPT)
    assert figures == {
        "accuracy": pytest.approx(14 / SCORED),
        "nll": pytest.approx(0.25),
        "long_range_correct": 4,
        "long_range_count": 9,
    }


@given(st.integers(0, len(TEXT) - 2))
def test_long_range_targets_are_restricted_to_the_scored_bytes(prompt):
    scored = len(TEXT) - prompt - 1
    figures = sequence_figures(IDS, [1] * scored, [0.0] * scored, prompt)
    # Long-range bytes are 131..139; scored targets start at byte prompt + 1.
    expected = min(9, max(0, 139 - prompt))
    assert figures["long_range_count"] == figures["long_range_correct"] == expected
    assert figures["accuracy"] == 1.0


def test_wrong_number_of_targets_is_rejected():
    with pytest.raises(ValueError, match="expected 59 scored targets"):
        sequence_figures(IDS, [1] * 58, [0.0] * 58, PROMPT)


def test_summary_keeps_failed_presses_as_errors():
    sequences = [Sequence("a.py@0", IDS), Sequence("b.py@0", OTHER)]
    hit = _outcome(set(LONG_RANGE))
    miss = _outcome(set())
    worker = {
        "versions": {"kvpress": "0.5.5", "transformers": "5.2.0", "torch": "2.13.0"},
        "results": {
            "snapkv": {"75%": {"correct": hit["correct"] + miss["correct"],
                               "nll": hit["nll"] + [[1.5] * SCORED]},
                       "88%": {"error": "AssertionError: too short"}},
            "tova": {"75%": {"error": "RuntimeError: boom"}},
        },
    }  # fmt: skip
    summary = summarise(worker, sequences, PROMPT)
    assert summary["versions"] == worker["versions"]
    snapkv = summary["results"]["snapkv"]["75%"]
    first, second = snapkv["sequences"]
    assert first == {"source": "a.py@0", "accuracy": pytest.approx(9 / SCORED),
                     "nll": pytest.approx(0.5), "long_range_correct": 9,
                     "long_range_count": 9}  # fmt: skip
    assert second["long_range_count"] == second["long_range_correct"] == 0
    assert snapkv["accuracy"] == pytest.approx(4.5 / SCORED)
    assert snapkv["nll"] == pytest.approx(1.0)
    assert snapkv["long_range_accuracy"] == 1.0
    assert summary["results"]["snapkv"]["88%"] == {"error": "AssertionError: too short"}
    assert summary["results"]["tova"] == {"75%": {"error": "RuntimeError: boom"}}
    assert summary["errors"] == [
        "snapkv 88%: AssertionError: too short",
        "tova 75%: RuntimeError: boom",
    ]


def test_summary_rejects_a_result_for_other_sequences():
    worker = {"versions": {}, "results": {"knorm": {"75%": _outcome(set())}}}
    with pytest.raises(ValueError, match="1 results for 2 sequences"):
        summarise(worker, [Sequence("a", IDS), Sequence("b", IDS)], PROMPT)


def test_summary_is_written_atomically(tmp_path):
    path = tmp_path / "results" / "kvpress.json"
    path.parent.mkdir()
    for value in (1, 2):
        atomic_write(path, lambda tmp, v=value: Path(tmp).write_text(json.dumps({"a": v})))
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["kvpress.json"]


def test_fixture_long_range_targets():
    assert not long_range_targets(OTHER, 64).any()
    assert torch.equal(long_range_targets(IDS, 64).nonzero()[:, 0], torch.arange(131, 140))
