"""Long-range targets: bytes completing an identifier last seen more than `window` bytes back."""

import pytest
import torch

from kvpop_compile.embedded.corpus import encode
from kvpop_compile.evaluation.quality.long_range import long_range_targets


def marked(text: bytes, window: int, **kw) -> bytes:
    ids = encode(text)
    return bytes(ids[long_range_targets(ids, window, **kw)].tolist())


def test_marks_the_completion_of_a_name_seen_beyond_the_window():
    gap = b" " * 40
    text = b"handler = 1" + gap + b"handler(2)"
    # The second `handler` starts 51 bytes after the first: beyond a window of 50, inside 51.
    assert marked(text, 50) == b"andler"  # the first byte is a guess, the rest is recall
    assert marked(text, 51) == b""


def test_the_most_recent_occurrence_decides():
    far, near = b" " * 100, b" " * 10
    text = b"value" + far + b"value" + near + b"value"
    ids = encode(text)
    mask = long_range_targets(ids, 50)
    second = text.index(b"value", 1)
    third = text.index(b"value", second + 1)
    assert mask[second + 1 : second + 5].all() and not mask[third:].any()


def test_first_occurrences_keywords_short_names_and_number_tails_are_not_counted():
    gap = b" " * 80
    text = b"return xy 0xfeed_cafe" + gap + b"return xy 0xfeed_cafe unique_name"
    assert marked(text, 10) == b""
    assert marked(b"abc" + gap + b"abc", 10, min_length=3) == b"bc"


def test_matches_identifiers_not_substrings():
    gap = b" " * 80
    # `names` contains `name` but is another identifier; `name` recurs only inside it.
    assert marked(b"name" + gap + b"names", 10) == b""


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="one-dimensional"):
        long_range_targets(torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="window must be an integer >= 0, got -1"):
        long_range_targets(encode(b"abc"), -1)
    with pytest.raises(ValueError, match="byte tokens"):
        long_range_targets(torch.tensor([300]), 4)
    with pytest.raises(ValueError, match="min_length must be an integer >= 2"):
        long_range_targets(encode(b"abc"), 4, min_length=1)
