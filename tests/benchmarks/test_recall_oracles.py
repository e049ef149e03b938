"""The oracle benchmark's text mode: an oracle fills the pool by the score it is given."""

import re

import pytest
from script_support import load_script

from kvpop_compile.embedded import load_embedded_model

recall_oracles = load_script("benchmarks/recall_oracles.py")


def test_a_recency_oracle_keeps_what_the_window_keeps(monkeypatch):
    # With a recency term far larger than any score, the max-target oracle ranks tokens by
    # position alone: exactly StreamingLLM's sinks + most recent tokens.
    monkeypatch.setattr(recall_oracles, "RECENCY", (1000.0,))
    model = load_embedded_model()
    model.config._attn_implementation = "eager"
    table = recall_oracles.text_oracles(model, 1)
    rows = {
        cells[0]: [float(c) for c in cells[1:]]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| policy")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {"window", "mean target", "max target", "max target + 1000.0 t"}
    assert rows["max target + 1000.0 t"] == rows["window"]
    assert rows["max target"] != rows["window"]  # the oracle's own scores do reach the pool
    assert all(50 < value < 110 for values in rows.values() for value in values)
    assert re.search(r"\| policy \| 75% \(512 kept\) \| 88% \(256 kept\) \|", table)
    with pytest.raises(SystemExit):
        recall_oracles.main(["--sequences", "x"])
