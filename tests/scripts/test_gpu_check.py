"""``scripts/gpu_check.sh``'s own checks: it parses, and it refuses arguments it does not take
before it starts a step (CI runs its ``--dry-run`` whole, after the suite)."""

import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--fast",), "unknown argument '--fast' (allowed: --dry-run, --budget SECONDS)"),
        (("--budget", "5"), "--budget must be a whole number of seconds >= 30, got '5'"),
        (("--budget", "ten"), "--budget must be a whole number of seconds >= 30, got 'ten'"),
        (("--budget",), "--budget must be a whole number of seconds >= 30, got ''"),
    ],
)
def test_bad_arguments_are_refused_before_any_step(args, message):
    result = _run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "==" not in result.stdout  # no step started


def test_every_test_the_script_names_exists():
    # The GPU run collects these by path: a moved or renamed file would fail only on the GPU.
    named = re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", SCRIPT.read_text())
    assert len(named) >= 10, named
    root = SCRIPT.parents[1]
    missing = [
        f"{path}::{test}" if test else path
        for path, test in named
        if not (root / path).is_file() or (test and f"def {test}(" not in (root / path).read_text())
    ]
    assert not missing, missing
