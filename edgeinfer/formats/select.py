"""Which family's format a model gets: the one its chat template was written for, as llama.cpp's chat layer picks it."""

from __future__ import annotations

from edgeinfer.errors import ConfigError
from edgeinfer.formats.base import ToolFormat
from edgeinfer.formats.generic import Generic
from edgeinfer.formats.hermes import Hermes
from edgeinfer.formats.llama3 import Llama3
from edgeinfer.formats.mistral import Mistral
from edgeinfer.formats.qwen3_coder import Qwen3Coder

# Most specific first: the first whose detect() knows the template wins (Qwen3-Coder's template also
# names <tool_call>, so it comes before Hermes).
FAMILIES: list[type[ToolFormat]] = [Qwen3Coder, Mistral, Llama3, Hermes]
_BUILT_IN: list[type[ToolFormat]] = [*FAMILIES, Generic]
KNOWN: dict[str, type[ToolFormat]] = {f.name: f for f in _BUILT_IN}


def register_family(family: type[ToolFormat]) -> type[ToolFormat]:
    """Add a family (a ToolFormat subclass in a module of its own): its detect() is asked before the built-in
    families' (a new family is the more specific), its markers are shown as text by engines made after this,
    and its name is a known format. Usable as a class decorator."""
    if family.name in KNOWN:
        raise ValueError(f"a tool format named {family.name!r} is already registered")
    FAMILIES.insert(0, family)
    KNOWN[family.name] = family
    return family


def format_class(template: str, renders_tools: bool, override: str = "auto") -> type[ToolFormat]:
    """The family for a chat template: override when it names one, else the one the template shows.

    A template that renders tools in a syntax none of the families knows gets Hermes (the most
    common); one that renders no tools gets Generic (tools described in a system message)."""
    if override != "auto":
        if override not in KNOWN:
            raise ConfigError(f"--tool-format {override}: not a known format; use one of auto, {', '.join(KNOWN)}")
        return KNOWN[override]
    if not renders_tools:
        return Generic
    return next((f for f in FAMILIES if f.detect(template)), Hermes)
