"""The README's main command: ``kvpop-compile demo`` on the embedded model."""

import pytest

from kvpop_compile.cli import main
from kvpop_compile.demo import run_demo


def test_demo_holds_the_cache_flat_and_draws_what_it_kept(tmp_path):
    image = tmp_path / "kept.png"
    result = run_demo(tokens=40, prompt_tokens=300, image=image, progress=False)
    full, kvpop = result.full.cache_bytes, result.kvpop.cache_bytes
    assert full.keys() == kvpop.keys() and len(full) >= 4
    assert len(set(kvpop.values())) == 1  # the same size at every checkpoint
    sizes = list(full.values())
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]  # the full cache grows
    assert result.setup.config.capacity == 256 and result.setup.scorer is not None
    assert 0.0 <= result.agreement <= 1.0
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = "\n".join(result.report())
    assert "4 sinks + 64 window + 188 pool = 256" in report and "trained memory scorer" in report


def test_a_budget_that_holds_every_token_gives_the_full_cache_tokens():
    result = run_demo(
        tokens=30, prompt_tokens=100, policy="window", capacity=200, image=None, progress=False
    )
    assert result.agreement == 1.0 and result.first_difference == 30


def test_cli_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["demo", "--tokens", "1"])  # refused as it is parsed
    assert "argument --tokens: must be an integer >= 2, got '1'" in capsys.readouterr().err
    assert main(["demo", "--policy", "lru"]) == 2
    assert "scorer must be one of" in capsys.readouterr().err
    assert main(["demo", "--policy", "memory"]) == 2
    assert "--policy memory is learned: pass its trained scorer" in capsys.readouterr().err
    assert main(["demo", "--policy", "window", "--scorer", "x"]) == 2
    assert "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["demo", "--model", "/nonexistent/model"])
    assert "'/nonexistent/model' is not a folder" in capsys.readouterr().err
    assert main(["demo", "--tokens", "1500", "--prompt-tokens", "1024"]) == 2
    assert "exceeds the model's context of 2048" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-such-command"])
