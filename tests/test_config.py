import math

import pytest

from kvpop_compile import KVpopConfig, ScorerKind


def test_defaults_and_capacity():
    config = KVpopConfig()
    assert config.scorer is ScorerKind.MEMORY
    assert config.capacity == config.sinks + config.window + config.topk == 4096


def test_scorer_given_as_string_becomes_enum():
    assert KVpopConfig(scorer="h2o").scorer is ScorerKind.H2O
    assert ScorerKind.H2O.attention_fed and not ScorerKind.MLP.attention_fed
    assert ScorerKind.MEMORY.learned and not ScorerKind.WINDOW.learned


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window must be an integer >= 1, got 0"),
        ({"sinks": -1}, "sinks must be an integer >= 0, got -1"),
        ({"topk": -3}, "topk must be an integer >= 0, got -3"),
        ({"window": 2.5}, "window must be an integer >= 1, got 2.5"),
        ({"window": True}, "window must be an integer >= 1, got True"),
        ({"lam": -0.1}, "lam must be a finite number >= 0, got -0.1"),
        ({"lam": math.inf}, "lam must be a finite number >= 0, got inf"),
        ({"lam": "0.1"}, "lam must be a finite number >= 0, got '0.1'"),
        ({"scorer": "lru"}, "scorer must be one of memory, mlp, window, random, knorm, h2o, tova"),
        ({"scorer_hidden": 0}, "scorer_hidden must be an integer >= 1, got 0"),
        ({"memory_dim": 0}, "memory_dim must be an integer >= 1, got 0"),
        ({"memory_value_dim": 0}, "memory_value_dim must be an integer >= 1, got 0"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"prefill_block": 0}, "prefill_block must be an integer >= 1, got 0"),
        ({"priority_span": -1}, "priority_span must be an integer >= 0, got -1"),
        (
            {"priority_span": 2, "scorer": "h2o"},
            "priority_span=2 spreads a score fixed when a token leaves the window; scorer 'h2o' "
            "rescores its pool every step: use priority_span=0 with it",
        ),
    ],
)
def test_bad_values_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        KVpopConfig(**kwargs)
