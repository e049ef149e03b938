"""What a cache holds of a recall item: the per-head readings and the misses benchmark."""

import pytest
import torch
from script_support import load_script

from kvpop_compile.embedded import load_embedded_model
from kvpop_compile.embedded.recall import TASKS, recall_items
from kvpop_compile.evaluation.methods import Method, build_model
from kvpop_compile.evaluation.recall.kept import heads_holding_evidence, heads_holding_span
from kvpop_compile.evaluation.recall.protocol import RECALL_SEED

recall_misses = load_script("benchmarks/recall_misses.py")


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
    for start, end in ((5, 5), (-1, 3)):
        with pytest.raises(ValueError, match=rf"span \[{start}, {end}\) is not a span"):
            heads_holding_span(positions, start, end)
    with pytest.raises(ValueError, match="evidence is empty"):
        heads_holding_evidence(positions, [])


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


@pytest.fixture(scope="module")
def model():
    return load_embedded_model()


def test_a_cache_that_evicts_nothing_holds_every_value_in_every_head(model):
    # 256-byte items under the 512-token budget: nothing leaves the cache, so every head of
    # every layer holds the value and the planted lines, item by item through the batch.
    window = build_model(model, Method("window", "75%"))
    heads, layers = model.config.num_key_value_heads, model.config.num_hidden_layers
    for task in TASKS:
        # Items of several prompt and answer lengths: batches by answer length, read in order.
        batch = recall_items("held_out", task, 256, 8, RECALL_SEED)
        assert len({len(i.answer) for i in batch}) > 1 and len({len(i.prompt) for i in batch}) > 1
        readings = recall_misses.read_items(window, batch)
        assert [r.index for r in readings] == list(range(8))
        assert all(r.value_heads == [heads] * layers for r in readings)
        assert all(r.evidence_heads == [heads] * layers for r in readings)
        assert [r.expected for r in readings] == [i.answer for i in batch]


def test_the_window_heuristic_never_holds_a_value_far_back(tmp_path):
    # A window cache holds sinks and recent bytes only; the value sits half a context back,
    # so no head of any layer can hold it, whatever the model answers.
    out = tmp_path / "misses.md"
    text = recall_misses.main(
        ["--policy", "window", "--budget", "88%", "--task", "lookup", "--length", "1024",
         "--items", "1", "--out", str(out)]
    )  # fmt: skip
    assert out.read_text() == text
    assert "What window @ 88% holds once it has answered: lookup@1024" in text
    rows = [line for line in text.splitlines() if line.startswith(("| answered", "| missed"))]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert sum(int(c[1]) for c in cells) == 1
    # Every item that has one: no pair holds its value.
    assert all(c[2:] == ["–", "–"] or c[2:] == ["0.0", c[1]] for c in cells)
    with pytest.raises(SystemExit):
        recall_misses.main(["--items", "0"])
