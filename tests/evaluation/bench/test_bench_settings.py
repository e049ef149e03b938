"""What ``kvpop-compile bench`` measures: context lengths with a ``k`` suffix, and settings that
sort what they are given and refuse what they cannot run."""

import pytest

from kvpop_compile.evaluation.bench.settings import BenchSettings, context_label, parse_contexts


@pytest.mark.parametrize(
    ("text", "contexts"),
    [("8k,32k", (8192, 32768)), ("1000, 4096", (1000, 4096)), ("2K", (2048,)), ("1", (1,))],
)
def test_contexts_parse_with_a_k_suffix(text, contexts):
    assert parse_contexts(text) == contexts
    assert [context_label(n) for n in contexts] == [
        f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in contexts
    ]


@pytest.mark.parametrize("text", ["", "8q", "0", "-1k", "1.5k", "k", "8k,,32k"])
def test_contexts_that_are_not_token_counts_are_refused(text):
    with pytest.raises(ValueError, match="is not a token count: give whole numbers >= 1"):
        parse_contexts(text)


def test_settings_sort_contexts_and_methods_and_refuse_bad_ones():
    settings = BenchSettings(contexts=(64, 32, 64), methods=("eager", "dynamic"))
    assert settings.contexts == (32, 64) and settings.methods == ("dynamic", "eager")
    with pytest.raises(ValueError, match="methods must be a non-empty sequence of dynamic, "):
        BenchSettings(contexts=(32,), methods=("flash",))
    with pytest.raises(ValueError, match="warmup must be an integer >= 1, got 0"):
        BenchSettings(contexts=(32,), warmup=0)
    with pytest.raises(ValueError, match="each context must be an integer >= 1, got 0"):
        BenchSettings(contexts=(0,))


def test_a_per_layer_budget_is_refused_by_name():
    from kvpop_compile.config import KVpopConfig

    per_layer = KVpopConfig(sinks=4, window=(8, 8), topk=(20, 100))
    with pytest.raises(ValueError, match=r"keeps one budget in every layer; kvpop_config keeps "
                                         r"\[32, 112\] slots"):  # fmt: skip
        BenchSettings(contexts=(64,), kvpop_config=per_layer)
