"""What a cache holds of a recall item: the per-head readings and the misses benchmark."""

import pytest
import torch

from benchmarks import recall_misses
from kvpop_compile.evaluation.kept import heads_holding_evidence, heads_holding_span


def test_a_head_holds_a_span_only_with_every_position_of_it():
    positions = torch.tensor([
        [0, 5, 6, 7, 8, -1],   # all of [5, 9)
        [0, 5, 6, 8, 9, 10],   # misses 7
        [-1, -1, -1, -1, -1, -1],
    ])  # fmt: skip
    assert heads_holding_span(positions, 5, 9).tolist() == [True, False, False]
    assert heads_holding_span(positions, 8, 9).tolist() == [True, True, False]
    # Some of every evidence line is enough for the evidence measure, not for the span's.
    assert heads_holding_evidence(positions, [(4, 6), (9, 11)]).tolist() == [False, True, False]
    with pytest.raises(ValueError, match=r"span \[5, 5\) is empty"):
        heads_holding_span(positions, 5, 5)


def test_the_report_sums_by_outcome_and_lists_each_miss():
    readings = [
        recall_misses.Reading(0, b"1234", b"1234", [2, 2, 1, 2], [2, 2, 2, 2]),
        recall_misses.Reading(1, b"5678", b"5678", [0, 1, 1, 0], [2, 1, 2, 2]),
        recall_misses.Reading(2, b"9012", b"7777", [0, 0, 0, 0], [1, 1, 2, 2]),
    ]
    text = recall_misses.report(readings, heads=2, title="t")
    assert "| answered | 2 | 4.5 | 0 |" in text  # (7 + 2) / 2 pairs
    assert "| missed | 1 | 0.0 | 1 |" in text
    assert "| 2 | `9012` | `7777` | 0/2 0/2 0/2 0/2 | 1/2 1/2 2/2 2/2 |" in text
    item_rows = [line for line in text.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert item_rows == []  # answered items get no row


def test_the_window_heuristic_never_holds_a_value_far_back(tmp_path):
    # A window cache holds sinks and recent bytes only; the value sits half a context back,
    # so no head of any layer can hold it, whatever the model answers.
    out = tmp_path / "misses.md"
    text = recall_misses.main(
        ["--policy", "window", "--budget", "88%", "--task", "lookup", "--length", "1024",
         "--items", "2", "--out", str(out)]
    )  # fmt: skip
    assert out.read_text() == text
    assert "What window @ 88% holds at the answer: lookup@1024" in text
    rows = [line for line in text.splitlines() if line.startswith(("| answered", "| missed"))]
    counts = [int(row.split("|")[2]) for row in rows]
    assert sum(counts) == 2
    assert all(row.endswith(" – | – |") or " 0.0 |" in row for row in rows)
    with pytest.raises(SystemExit):
        recall_misses.main(["--items", "0"])
