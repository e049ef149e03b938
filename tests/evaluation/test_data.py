"""The held-out sequences: consecutive windows of standard-library files never trained on."""

import pytest

from kvpop_compile.embedded import is_held_out
from kvpop_compile.embedded.corpus import read_bytes
from kvpop_compile.evaluation.data import held_out_sequences


def test_sequences_are_consecutive_windows_of_held_out_files():
    sequences = held_out_sequences(5, length=1024, per_file=3)
    assert len(sequences) == 5
    for s in sequences:
        name, start = s.source.split("@")
        assert is_held_out(name) and s.ids.shape == (1025,)
        data = read_bytes(name)
        assert bytes(s.ids.tolist()) == data[int(start) : int(start) + 1025]
    with pytest.raises(ValueError, match="count must be a positive integer or None, got 0"):
        held_out_sequences(0)
