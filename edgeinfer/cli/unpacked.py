"""The one-file binary's unpacked builds: mark the running one in use, remove old ones.

The launcher (scripts/build_binary.py) unpacks each build once into a folder of its own under
`~/.cache/edgeinfer/app/<key>` and passes that folder as EDGEINFER_APP_DIR. Every copy that
runs holds a shared lock on `<folder>/.in-use` for its whole life and touches it, so its
modification time says when the build last started. A build that no process holds and that
has not started for STALE_S is removed at the next start of any build: an upgrade leaves the
old ~330 MiB behind for a day at most, and two binaries used in turn do not unpack each other
away. Removal renames the folder first (one atomic step), then deletes it on a daemon thread.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import threading
import time
from pathlib import Path

STALE_S = 24 * 3600.0  # a build not started for a day and not running is removed
ABANDONED_S = 3600.0  # an unpack interrupted an hour ago is dead (one takes seconds)
MARK = ".in-use"

_held: list[int] = []  # the lock's descriptor, open for the process's life


def on_start(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """In the one-file binary: hold this build's folder and prune old ones in the background."""
    here = environ.get("EDGEINFER_APP_DIR")
    if not getattr(sys, "frozen", False) or not here:
        return
    folder = Path(here)
    try:
        hold(folder)
    except OSError:
        return  # a read-only cache: nothing is removed either, so nothing is at risk
    threading.Thread(target=prune, args=(folder.parent, folder), name="edgeinfer-prune", daemon=True).start()


def hold(folder: Path) -> int:
    """Take a shared lock on the folder's mark and touch it; the lock lasts until the process exits."""
    fd = os.open(folder / MARK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.utime(fd)
    _held.append(fd)
    return fd


def prune(apps: Path, keep: Path, now: float | None = None) -> list[str]:
    """Remove builds under `apps` other than `keep` that are stale and not running; returns their names."""
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        entries = list(apps.iterdir())
    except OSError:
        return removed
    for entry in entries:
        try:
            if entry == keep or not entry.is_dir():
                continue
            if entry.name.startswith(".trash-"):
                shutil.rmtree(entry, ignore_errors=True)  # a removal cut short by an exit
            elif entry.name.startswith("."):
                if now - entry.stat().st_mtime > ABANDONED_S:
                    shutil.rmtree(entry, ignore_errors=True)  # an unpack cut short
            elif _last_started(entry) < now - STALE_S and _take(entry, apps):
                removed.append(entry.name)
        except OSError:
            continue  # another start removed it first, or permissions: leave it
    return removed


def _last_started(folder: Path) -> float:
    mark = folder / MARK
    return (mark if mark.exists() else folder).stat().st_mtime  # builds from before the mark


def _take(folder: Path, apps: Path) -> bool:
    """Rename the folder out of the way if no process holds it, then delete it."""
    fd = os.open(folder / MARK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # running now
        trash = apps / f".trash-{folder.name}-{os.getpid()}"
        folder.rename(trash)  # while locked: a new start of this build unpacks it afresh
    finally:
        os.close(fd)
    shutil.rmtree(trash, ignore_errors=True)
    return True
