"""Names attn-mt derives from a file's name (its temp files', a partial translation's) fit the
file system whenever the file's own name does: a name of any length the file system takes is
written atomically, and a killed writer's temp files of it are still found and removed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attn_mt import fileio


@pytest.mark.parametrize("length", [1, 100, 200, 240, 250, 255])
def test_a_name_of_any_length_the_file_system_takes_is_written(tmp_path: Path, length: int):
    out = tmp_path / ("n" * length)
    fileio.write_output(out, "whole\n")
    assert out.read_text() == "whole\n" and [p.name for p in tmp_path.iterdir()] == [out.name]
    temp = fileio.temp_prefix(out) + "abcdefgh.staging"
    assert len(temp.encode()) <= fileio.name_max(tmp_path)


def test_a_dead_writers_temp_file_of_a_long_name_is_removed(tmp_path: Path) -> None:
    out = tmp_path / ("é" * 120)  # 240 bytes of UTF-8: the temp name is cut, never mid-character
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    stem = fileio.temp_prefix(out).rsplit(f"-{os.getpid()}-", 1)[0]
    stale = tmp_path / f"{stem}-{dead}-abcdefgh.tmp"
    stale.write_text("cut")
    alive = tmp_path / (fileio.temp_prefix(out) + "abcdefgh.tmp")  # this process's own
    alive.write_text("mine")
    fileio.remove_stale_temps(out)
    assert not stale.exists() and alive.exists()
    assert stale.name.encode().decode("utf-8")  # whole characters only


def test_fitted_names_stay_apart() -> None:
    """Two long names that share their start get different shortened names, each in room."""
    first, second = "x" * 300 + "a", "x" * 300 + "b"
    assert fileio.fitted(first, 100) != fileio.fitted(second, 100)
    assert all(len(fileio.fitted(name, 100).encode()) <= 100 for name in (first, second))
    assert fileio.fitted("short", 100) == "short"


def test_a_write_error_names_the_file(tmp_path: Path) -> None:
    """An error writing (here: /dev/full's) names the file, where several are written at once."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with (
        pytest.raises(OSError) as failed,
        fileio.atomic_write(tmp_path / "out.txt") as handle,
    ):
        os.dup2(os.open("/dev/full", os.O_WRONLY), handle.fileno())
        handle.write(b"x" * 10)
    assert failed.value.filename == str(tmp_path / "out.txt")
