"""The engine: many streams of one model packed into one llama_decode per step.

Engine and StreamHandle load llama.cpp; they are imported on first use, so that the light parts
(the scheduler, the stats model) can be read without it. edgeinfer.runtime.make_engine makes an Engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeinfer.engine.engine import Engine
    from edgeinfer.engine.handle import StreamHandle

__all__ = ["Engine", "StreamHandle"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        import importlib

        return getattr(importlib.import_module("edgeinfer.engine.engine"), name)
    if name == "StreamHandle":
        from edgeinfer.engine.handle import StreamHandle

        return StreamHandle
    raise AttributeError(name)
