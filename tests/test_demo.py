"""The README's main command: ``kvpop-compile demo``."""

import pytest

from kvpop_compile.cli import main
from kvpop_compile.demo import run_demo


def test_demo_holds_the_cache_flat_and_matches_full_cache_when_roomy():
    result = run_demo(tokens=120, capacity=32)
    full, bounded = result.full.cache_bytes, result.bounded.cache_bytes
    assert full.keys() == bounded.keys() and len(full) == 3
    assert len(set(bounded.values())) == 1  # the same size at every checkpoint
    sizes = list(full.values())
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]  # the full cache grows
    assert result.agreement(result.roomy) == 1.0
    assert any("KVpop budget: 4 sinks + 8 window + 20 pool" in line for line in result.report())


def test_cli_rejects_bad_arguments(capsys):
    assert main(["demo", "--tokens", "1"]) == 2
    assert "tokens must be >= 2, got 1" in capsys.readouterr().err
    assert main(["demo", "--scorer", "lru"]) == 2
    assert "scorer must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-such-command"])


def test_demo_rejects_too_small_a_capacity():
    with pytest.raises(ValueError, match="capacity must be >= 8, got 4"):
        run_demo(tokens=16, capacity=4)
