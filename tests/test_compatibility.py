"""The transformers releases the library supports (compatibility.py, pyproject.toml) and the
cache keyword: a forward continues the bounded cache exactly whichever name the cache is passed
under, and on every supported release (CI runs the model tests on the lowest one too)."""

import inspect
import re
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import prompt, tiny_qwen3
from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

import kvpop_compile as kc
from kvpop_compile.compatibility import (
    TRANSFORMERS_BELOW,
    TRANSFORMERS_LOWEST,
    require_supported_transformers,
)
from kvpop_compile.kv_cache import CACHE_ARGUMENT

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
TIGHT = kc.KVpopConfig(sinks=2, window=4, topk=6, scorer="memory")  # capacity 12


@pytest.mark.parametrize("version", ["5.0.0", "5.16.0", "4.57.6", "6.0.0", "6.1"])
def test_a_release_outside_the_range_is_refused_by_name(version):
    with pytest.raises(ImportError, match=rf"transformers {version} is installed.*>=5\.16\.1,<6"):
        require_supported_transformers(version)


@pytest.mark.parametrize("version", ["5.16.1", "5.19.0", "5.25.0", "5.99"])
def test_a_release_inside_the_range_is_accepted(version):
    require_supported_transformers(version)


def test_the_declared_range_is_the_checked_one():
    # A regular expression, not tomllib: Python 3.10, which the project supports, has none.
    declared = re.findall(r'^\s*"(transformers[<>=!~].*?)",', PYPROJECT.read_text(), re.M)
    assert declared == [f"transformers>={TRANSFORMERS_LOWEST},<{TRANSFORMERS_BELOW}"]
    require_supported_transformers(transformers.__version__)  # the installed one


def test_the_cache_keyword_is_the_installed_forwards_own():
    assert CACHE_ARGUMENT in inspect.signature(Qwen3Model.forward).parameters


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_a_forward_continues_the_cache_under_either_keyword(keyword):
    """A prompt split in two forwards, the second handed the cache under ``keyword`` and no
    positions, gives the one-shot logits: the model counts on from what the cache holds."""
    model = kc.transform(tiny_qwen3(), TIGHT)
    ids = prompt(length=20)
    with torch.no_grad():
        whole = model(ids).logits[:, -1]
        cache = kc.new_cache(model)
        model(ids[:, :9], cache=cache)
        rest = model(ids[:, 9:], **{keyword: cache}).logits[:, -1]
    torch.testing.assert_close(rest, whole, rtol=1e-5, atol=1e-5)


def test_rows_of_different_lengths_continue_from_their_own_length():
    """A left-padded batch, then a second chunk without a mask: each row counts its positions
    from its own tokens, as it does alone (the longest row's count would shift the others)."""
    model = kc.transform(tiny_qwen3(), TIGHT)
    ids, rest = prompt(seed=1, length=10), prompt(seed=2, length=7)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # row 1 holds 6 tokens, row 0 holds 10
    cache = kc.new_cache(model)
    kc.prefill(model, ids, cache, attention_mask=mask, chunk=4)
    batch = kc.prefill(model, rest, cache, chunk=3)
    for row, start in ((0, 0), (1, 4)):
        alone = kc.new_cache(model)
        kc.prefill(model, ids[row : row + 1, start:], alone, chunk=4)
        expected = kc.prefill(model, rest[row : row + 1], alone, chunk=3)
        torch.testing.assert_close(batch[row : row + 1], expected, rtol=1e-5, atol=1e-5)
