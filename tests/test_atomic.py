"""``kvpop_compile.atomic``: files and folders appear whole, with the modes plain ones get."""

import os
import stat
from pathlib import Path

import pytest

from kvpop_compile.atomic import atomic_write, replace_folder


@pytest.fixture(autouse=True)
def _umask_022():
    """A common umask, under which a plain file is 0644 and a folder 0755 (under 077 they would
    be as private as ``tempfile`` makes them, and the mode checks below could not fail)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_written_file_has_the_mode_a_plain_open_gives(tmp_path):
    path = tmp_path / "a.json"
    atomic_write(path, lambda tmp: Path(tmp).write_text("{}"))
    assert path.read_text() == "{}"
    assert _mode(path) == 0o644


def test_a_replaced_folder_is_whole_and_has_the_mode_a_plain_mkdir_gives(tmp_path):
    target = tmp_path / "scorer"
    replace_folder(target, lambda staging: (staging / "old").write_text("1"))
    replace_folder(target, lambda staging: (staging / "new").write_text("2"))
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert _mode(target) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scorer"]  # no staging left behind


def test_a_failed_build_leaves_the_old_folder_as_it_was(tmp_path):
    target = tmp_path / "scorer"
    replace_folder(target, lambda staging: (staging / "old").write_text("1"))

    def fail(staging: Path) -> None:
        (staging / "half").write_text("")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_folder(target, fail)
    assert sorted(p.name for p in target.iterdir()) == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scorer"]
