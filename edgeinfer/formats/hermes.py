"""Hermes-style calls, the format of Qwen2.5, Hermes 2/3, QwQ and many fine-tunes:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Under `auto` the text is free until the model writes `<tool_call>`, and from there the call is
held to the schemas (a lazy grammar: free text is any text without the opening, or text up to
it and then calls).
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.formats.base import MAX_CALLS, Call, ToolFormat, ToolSpec, call_schema, json_objects
from edgeinfer.formats.partial import Scanner, tidy

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Hermes(ToolFormat):
    name = "hermes"
    opening = OPEN
    markers = (OPEN, CLOSE)

    @classmethod
    def detect(cls, template: str) -> bool:
        return OPEN in template

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join(
            f"{OPEN}\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n{CLOSE}" for n, a in calls
        )

    def grammar(self, tools: list[ToolSpec], required: bool, parallel: bool, answer: str) -> str:
        call = json.dumps(call_schema(tools))
        # Each tag as `<[id]>` where the vocabulary holds it as one special token (Qwen2.5's), else as text.
        again, closing = self.lit("\n", OPEN), self.lit("\n", CLOSE)
        more = f"\nmore: ({again} body)~0..{MAX_CALLS - 1}" if parallel else '\nmore: ""'
        body = f'body: "\\n" %json {call} {closing}' + more
        return f"{self.start('body more', required, answer)}\n{body}\n"

    def next_object(self, text: str, after: int) -> int:
        at = text.find(OPEN, after)
        if at < 0:
            return -1
        pos = at + len(OPEN)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        return pos if text.startswith("{", pos) else -1

    def parse(self, text: str, final: bool) -> tuple[str | None, list[Call]]:
        # A call is complete once its JSON object closes, streaming or not.
        start = text.find(OPEN)
        if start < 0:
            return text, []
        calls = []
        pos = start
        while pos >= 0:
            found = json_objects(text, pos + len(OPEN))
            if not found:
                break
            obj, begin, end = found[0]
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                break
            calls.append(Call(obj["name"], _arguments(text, begin, end, obj.get("arguments", {}))))
            pos = text.find(OPEN, end)
        if not calls:
            return text, []
        before = text[:start].strip()
        return before or None, calls


def _arguments(text: str, begin: int, end: int, value: Any) -> str:
    """A call's arguments as JSON text: as the model wrote an object, in the form they stream in (partial.tidy),
    so that a streamed call and a whole one say the same; otherwise its value written out."""
    s = Scanner(begin, ("arguments",)).feed(text[:end])
    if s.args_object and s.args_end > s.args_start:
        written = tidy(text[s.args_start : s.args_end])
        if json.loads(written) == value:
            return written
    return json.dumps(value, ensure_ascii=False)
