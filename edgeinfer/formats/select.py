"""Which family's format a model gets: the one its chat template was written for, as llama.cpp's chat layer picks it."""

from __future__ import annotations

from edgeinfer.errors import ConfigError
from edgeinfer.formats.base import ToolFormat
from edgeinfer.formats.generic import Generic
from edgeinfer.formats.hermes import Hermes


def families() -> list[type[ToolFormat]]:
    """The formats, most specific first: the first whose detect() knows the template wins."""
    found: list[type[ToolFormat]] = []
    try:
        from edgeinfer.formats.qwen3_coder import Qwen3Coder

        found.append(Qwen3Coder)
    except ImportError:
        pass
    try:
        from edgeinfer.formats.mistral import Mistral

        found.append(Mistral)
    except ImportError:
        pass
    try:
        from edgeinfer.formats.llama3 import Llama3

        found.append(Llama3)
    except ImportError:
        pass
    return [*found, Hermes, Generic]


def format_class(template: str, renders_tools: bool, override: str = "auto") -> type[ToolFormat]:
    """The family for a chat template: override when it names one, else the one the template shows.

    A template that renders tools in a syntax none of the families knows gets Hermes (the most
    common); one that renders no tools gets Generic (tools described in a system message)."""
    known = {f.name: f for f in families()}
    if override != "auto":
        if override not in known:
            raise ConfigError(f"--tool-format {override}: not a known format; use one of auto, {', '.join(known)}")
        return known[override]
    if not renders_tools:
        return Generic
    return next((f for f in families() if f.detect(template)), Hermes)
