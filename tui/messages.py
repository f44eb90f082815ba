"""Messages from the stats sources to the dashboard: a snapshot arrived, or the feed is down and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message


@dataclass
class StatsUpdate(Message):
    """One engine snapshot (the dict `Engine.snapshot()` returns, or its JSON over the socket)."""

    snapshot: dict[str, Any]


@dataclass
class FeedDown(Message):
    """No snapshots are coming; `problem` is a sentence for a person, `hint` what to do about it."""

    problem: str
    hint: str = ""
