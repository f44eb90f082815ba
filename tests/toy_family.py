"""A toy tool-call family, the whole of a new family in one module (tests/test_extensions.py registers it).

Its template writes tools as `[[tools]] ...` and the model writes each call as `[[call]]` and a JSON object
{"name": ..., "arguments": {...}}. Its calls come whole once complete (no next_object: the default).
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.formats.base import MAX_CALLS, Call, ToolFormat, ToolSpec, call_from_json, call_schema, json_objects

OPEN = "[[call]]"


class Toy(ToolFormat):
    name = "toy"
    opening = OPEN

    @classmethod
    def detect(cls, template: str) -> bool:
        return "[[tools]]" in template

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(OPEN + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in calls)

    def grammar(self, tools: list[ToolSpec], required: bool, parallel: bool, answer: str) -> str:
        call = f"%json {json.dumps(call_schema(tools))}"
        more = f"more: ({self.lit(OPEN)} {call})~0..{MAX_CALLS - 1}" if parallel else 'more: ""'
        return f"{self.start('body more', required, answer)}\nbody: {call}\n{more}\n"

    def parse(self, text: str, final: bool) -> tuple[str | None, list[Call]]:
        start = text.find(OPEN)
        if start < 0:
            return text, []
        calls: list[Call] = []
        at = start
        while at >= 0:
            found = json_objects(text, at + len(OPEN))[:1]
            call = call_from_json(found[0][0], ("arguments", "parameters")) if found else None
            if call is None:
                break
            calls.append(call)
            at = text.find(OPEN, found[0][2])
        return text[:start].strip() or None, calls
