"""The engine: many streams of one model packed into one llama_decode per step.

Engine, StreamHandle and make_engine load llama.cpp; they are imported on first use, so
that the light parts (the scheduler, the stats model) can be read without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeinfer.engine.engine import Engine, make_engine
    from edgeinfer.engine.handle import StreamHandle

__all__ = ["Engine", "StreamHandle", "make_engine"]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "make_engine"):
        import importlib

        return getattr(importlib.import_module("edgeinfer.engine.engine"), name)
    if name == "StreamHandle":
        from edgeinfer.engine.handle import StreamHandle

        return StreamHandle
    raise AttributeError(name)
