"""Messages from the stats sources to the dashboard: a snapshot arrived, or the feed is down and why."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message

from edgeinfer.engine.stats import EngineStats


@dataclass
class StatsUpdate(Message):
    """One engine snapshot (what `Engine.snapshot()` returns, or its JSON over the socket read back)."""

    snapshot: EngineStats
    # A server of several models: each one's id and whether it is in memory (the snapshot is one of them).
    served: list[tuple[str, bool]] = field(default_factory=list)


@dataclass
class FeedDown(Message):
    """No snapshots are coming; `problem` is a sentence for a person, `hint` what to do about it."""

    problem: str
    hint: str = ""
