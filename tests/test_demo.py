"""The README's main command: ``kvpop-compile demo``."""

import pytest

from kvpop_compile.cli import main
from kvpop_compile.demo import run_demo


def test_demo_reports_flat_cache_and_exact_output_without_eviction():
    lines = run_demo(tokens=96, capacity=32)
    sizes = [line for line in lines if line.strip().startswith("N=")]
    assert len(sizes) == 3
    kvpop = {line.split("KVpop")[1].strip() for line in sizes}
    assert len(kvpop) == 1  # the same size at every checkpoint
    exact = next(line for line in lines if "no eviction" in line)
    assert float(exact.split()[-1]) < 1e-5


def test_cli_rejects_bad_arguments(capsys):
    assert main(["demo", "--tokens", "1"]) == 2
    assert "tokens must be >= 2, got 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-such-command"])


def test_demo_rejects_too_small_a_capacity():
    with pytest.raises(ValueError, match="capacity must be >= 8, got 4"):
        run_demo(tokens=16, capacity=4)
