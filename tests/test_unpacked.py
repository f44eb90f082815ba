"""edgeinfer.cli.unpacked: which of the one-file binary's unpacked builds are removed, without a binary."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from edgeinfer.cli import unpacked
from edgeinfer.cli.unpacked import ABANDONED_S, MARK, STALE_S, hold, prune

pytestmark = pytest.mark.pure

DAY = 24 * 3600.0


def build(apps: Path, name: str, started_ago: float, now: float, mark: bool = True) -> Path:
    folder = apps / name
    (folder / "edgeinfer").mkdir(parents=True)
    (folder / "edgeinfer" / "edgeinfer").write_bytes(b"\x7fELF")
    if mark:
        (folder / MARK).touch()
        os.utime(folder / MARK, (now - started_ago, now - started_ago))
    os.utime(folder, (now - started_ago, now - started_ago))
    return folder


def test_stale_builds_go_and_recent_ones_stay(tmp_path):
    now = time.time()
    current = build(tmp_path, "cur", 0, now)
    stale = build(tmp_path, "old", STALE_S + 60, now)
    unmarked = build(tmp_path, "older", 3 * DAY, now, mark=False)  # unpacked before builds were marked
    recent = build(tmp_path, "other", STALE_S - 60, now)  # another binary used today
    removed = prune(tmp_path, current, now)
    assert sorted(removed) == ["old", "older"]
    assert not stale.exists() and not unmarked.exists()
    assert current.exists() and recent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cur", "other"]  # no trash left behind


def test_a_running_build_stays_however_old(tmp_path):
    now = time.time()
    current = build(tmp_path, "cur", 0, now)
    running = build(tmp_path, "running", 30 * DAY, now)
    fd = os.open(running / MARK, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # what a process of that build holds for its life
        assert prune(tmp_path, current, now) == []
        assert (running / "edgeinfer" / "edgeinfer").exists()
    finally:
        os.close(fd)
    assert prune(tmp_path, current, now) == ["running"]  # once it has exited


def test_the_running_build_is_never_removed_even_when_its_mark_is_old(tmp_path):
    now = time.time()
    current = build(tmp_path, "cur", 10 * DAY, now)
    assert prune(tmp_path, current, now) == []
    assert current.exists()


def test_interrupted_unpacks_and_removals_are_cleared(tmp_path):
    now = time.time()
    current = build(tmp_path, "cur", 0, now)
    abandoned = build(tmp_path, ".cur.Xy12ab", ABANDONED_S + 60, now, mark=False)
    unpacking = build(tmp_path, ".new.Zz34cd", 5, now, mark=False)  # another start unpacking now
    trash = build(tmp_path, ".trash-old-123", 0, now)
    (tmp_path / "stray-file").write_text("")
    assert prune(tmp_path, current, now) == []
    assert not abandoned.exists() and not trash.exists()
    assert unpacking.exists() and (tmp_path / "stray-file").exists()


def test_hold_marks_the_build_started_now(tmp_path):
    folder = build(tmp_path, "cur", 3 * DAY, time.time())
    fd = hold(folder)
    try:
        assert time.time() - (folder / MARK).stat().st_mtime < 60
        other = os.open(folder / MARK, os.O_RDONLY)
        try:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
            except BlockingIOError:
                taken = False
            assert not taken, "the running build's lock could be taken exclusively"
        finally:
            os.close(other)
    finally:
        unpacked._held.remove(fd)
        os.close(fd)


def test_outside_the_binary_nothing_happens(tmp_path):
    now = time.time()
    stale = build(tmp_path, "old", 3 * DAY, now)
    current = build(tmp_path, "cur", 60, now)
    unpacked.on_start({"EDGEINFER_APP_DIR": str(current)})  # not frozen: a virtualenv install
    time.sleep(0.2)  # where a prune thread would have started
    assert (current / MARK).stat().st_mtime < now - 30  # not touched
    assert stale.exists() and not unpacked._held
