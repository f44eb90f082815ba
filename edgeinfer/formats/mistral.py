"""Mistral's tool calls (Nemo 2407 and the models of its tokenizer version): one list after a tag,

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"}]

Each call carries an id of 9 letters and digits. The template writes the tools (before the last
user message), an assistant's calls in this syntax with their ids, and a result as
`[TOOL_RESULTS]{"content": ..., "call_id": ...}[/TOOL_RESULTS]`; it refuses any call id or
tool_call_id that is not 9 characters long. So a client's ids (OpenAI's `call_...`, Anthropic's
`toolu_...`) are mapped to 9 alphanumerics, stably: the same id always maps to the same one, so a
call and its result still match. The grammar asks for the id too (as llama.cpp's does), since
the model sees them in its history; an id the model leaves out is made by new_id.

Later Mistral templates (Small 3.2, Devstral, Magistral) write `[TOOL_CALLS]name[ARGS]{...}`
instead: a different syntax, not detected as this one.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from typing import Any

from edgeinfer.formats.base import MAX_CALLS, Call, ToolFormat, ToolSpec, call_from_json, call_schema

OPEN = "[TOOL_CALLS]"
ID_LENGTH = 9
_ALNUM = string.ascii_letters + string.digits
_ID = re.compile(f"[A-Za-z0-9]{{{ID_LENGTH}}}")
ID_SCHEMA = {"type": "string", "pattern": f"^[a-zA-Z0-9]{{{ID_LENGTH}}}$"}


class Mistral(ToolFormat):
    name = "mistral"
    opening = OPEN
    markers = (OPEN,)

    @classmethod
    def detect(cls, template: str) -> bool:
        # llama.cpp's test; [ARGS] and [CALL_ID] belong to the later syntax (see the module's docstring).
        return OPEN in template and "[ARGS]" not in template and "[CALL_ID]" not in template

    def history_id(self, call_id: str) -> str:
        if _ID.fullmatch(call_id):
            return call_id  # already one the template takes (one this server gave out, say)
        # 9 base-62 digits of a hash of the client's id: stable across requests, and 62^9 (about 10^16) apart.
        n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
        digits = []
        for _ in range(ID_LENGTH):
            n, d = divmod(n, len(_ALNUM))
            digits.append(_ALNUM[d])
        return "".join(digits)

    def new_id(self) -> str:
        return "".join(secrets.choice(_ALNUM) for _ in range(ID_LENGTH))

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        # As the template writes them back: the function's JSON, its id last, ", " between calls.
        items = [json.dumps({"name": n, "arguments": a, "id": self.new_id()}, ensure_ascii=False) for n, a in calls]
        return f"{OPEN}[{', '.join(items)}]"

    # --- the grammar -------------------------------------------------------------

    def grammar(self, tools: list[ToolSpec], required: bool, parallel: bool, answer: str) -> str:
        items = f"items: %json {json.dumps(calls_schema(tools, MAX_CALLS if parallel else 1))}"
        return f"{self.start('items', required, answer)}\n{items}\n"

    # --- the answer --------------------------------------------------------------

    def parse(self, text: str, final: bool) -> tuple[str | None, list[Call]]:
        start = text.find(OPEN)
        if start < 0:
            return text, []
        decoder = json.JSONDecoder()
        calls: list[Call] = []
        at = start
        while at >= 0:
            pos = _skip(text, at + len(OPEN))
            many = text.startswith("[", pos)  # the list; a lone object is read too
            pos = _skip(text, pos + 1) if many else pos
            while pos < len(text):
                try:
                    obj, pos = decoder.raw_decode(text, pos)
                except json.JSONDecodeError:
                    break  # the end, or (streaming) a call not complete yet
                call = _call(obj)
                if call is None:
                    break
                if call.id is not None and any(c.id == call.id for c in calls):
                    call.id = None  # one id for two calls cannot tell their results apart: new_id makes one
                calls.append(call)
                pos = _skip(text, pos)
                if not many or not text.startswith(",", pos):
                    break
                pos = _skip(text, pos + 1)
            at = text.find(OPEN, pos)
        if not calls:
            return text, []
        before = text[:start].strip()
        return before or None, calls


def calls_schema(tools: list[ToolSpec], max_calls: int) -> dict[str, Any]:
    """The JSON Schema of the list after [TOOL_CALLS]: 1 to max_calls calls, each with its 9-character id."""
    schema = call_schema(tools)
    defs, guidance = schema.pop("$defs"), schema.pop("x-guidance")
    for call in schema.get("anyOf", [schema]):
        call["properties"]["id"] = ID_SCHEMA
        call["required"].append("id")
    array = {"type": "array", "items": schema, "minItems": 1, "maxItems": max_calls}
    return {**array, "$defs": defs, "x-guidance": guidance}


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _call(obj: Any) -> Call | None:
    """A call from one JSON object the model wrote; None when it is not one."""
    return call_from_json(obj, ("arguments", "parameters"), {})
