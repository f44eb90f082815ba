"""The engine as every command runs it: its model's vocabulary shows the tags of every known tool-call family and
thinking block as text (the engine itself knows no format)."""

from __future__ import annotations

from edgeinfer.engine.engine import Engine
from edgeinfer.formats import reasoning, select
from edgeinfer.options import EngineConfig


def shown_tags() -> list[str]:
    """The texts of tool-call syntax and thinking tags a vocabulary may hold as special tokens."""
    calls = [m for f in select.KNOWN.values() for m in f.markers]
    return calls + [tag for t in reasoning.KNOWN for tag in (t.open, t.close)]


def make_engine(config: EngineConfig) -> Engine:
    """The one factory the CLI, the server, the benchmark and the tests use."""
    return Engine(config, shown_tags())
