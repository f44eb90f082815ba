"""For chat templates that know no tools (SmolLM2's): the tools described in a system message,
calls written in the Hermes syntax, and earlier calls and their results written into the text."""

from __future__ import annotations

import json

from edgeinfer.formats.base import ToolSpec
from edgeinfer.formats.hermes import CLOSE, OPEN, Hermes


class Generic(Hermes):
    name = "generic"
    native = False

    @classmethod
    def detect(cls, template: str) -> bool:
        return False  # chosen when the template renders no tools, never by its text


def describe(tools: list[ToolSpec], example: str) -> str:
    """The system text that teaches a model without tool support the tools and how to call them."""
    lines = [
        "You can call functions to help answer. To call one, write exactly:",
        example,
        "Call several by writing several such blocks. The functions:",
    ]
    for t in tools:
        lines.append(
            f"- {t.name}: {t.description or 'no description'} Arguments (JSON Schema): {json.dumps(t.parameters)}"
        )
    return "\n".join(lines)


HERMES_EXAMPLE = f'{OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n{CLOSE}'
