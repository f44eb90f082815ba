"""Llama 3.1-3.3's tool calls: a JSON object at the very start of the answer, as Meta's templates teach it:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

Real models may write `<|python_tag|>` first, or "arguments" in place of "parameters", and vLLM
and SGLang read several calls separated by ";"; the parser takes all of these. The template
writes the tools itself (in the first user message unless `tools_in_user_message` is false),
an assistant's call as that JSON, and a `tool` message under the `ipython` role. It refuses more
than one call in an assistant message ("This model only supports single tool-calls at once!"),
so the grammar holds an answer to one call, parallel or not, as llama.cpp's does.

There is no opening tag: a call is an answer that begins `{"name":` (llama.cpp's lazy grammar
triggers on the same thing). Under `auto` the grammar takes a call or text that does not begin
with "{"; while streaming, text that may still become a call's opening is held back.
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.formats.base import Call, ToolFormat, ToolSpec, call_from_json, call_schema, partial_suffix

PYTHON_TAG = "<|python_tag|>"
IPYTHON_HEADER = "<|start_header_id|>ipython<|end_header_id|>"

# The beginnings of a call: `{"name":`, or `{"type": "function", "name":` (llama.cpp accepts both),
# whitespace free between the pieces. None stands for optional whitespace.
_PLAIN = ("{", None, '"name"', None, ":")
_TYPED = ("{", None, '"type"', None, ":", None, '"function"', None, ",", None, '"name"', None, ":")
_PARTIAL = -1


def _match(text: str, start: int, pieces: tuple[str | None, ...]) -> int | None:
    """Where an opening that begins at start ends; _PARTIAL when text ends inside one; None when it is none."""
    i = start
    for piece in pieces:
        if piece is None:
            while i < len(text) and text[i].isspace():
                i += 1
            continue
        n = min(len(piece), len(text) - i)
        if n <= 0:
            return _PARTIAL
        if text[i : i + n] != piece[:n]:
            return None
        if n < len(piece):
            return _PARTIAL
        i += n
    return i


def _opening(text: str, start: int) -> int | None:
    """_match for either beginning of a call: its end, _PARTIAL, or None."""
    found = [_match(text, start, p) for p in (_PLAIN, _TYPED)]
    complete = [i for i in found if i is not None and i != _PARTIAL]
    if complete:
        return complete[0]
    return _PARTIAL if _PARTIAL in found else None


def _first_visible(text: str) -> int:
    return len(text) - len(text.lstrip())


class Llama3(ToolFormat):
    name = "llama3"
    opening = PYTHON_TAG  # the one fixed opening; a call may also begin the answer without it
    markers = (PYTHON_TAG,)

    @classmethod
    def detect(cls, template: str) -> bool:
        # What llama.cpp's chat layer looks for; Functionary v3.1 (also on Llama 3.1) writes `<function=`.
        return IPYTHON_HEADER in template and "<function=" not in template

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        # As the template writes a call back into the history: `{"name": "...", "parameters": <tojson>}`.
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)

    # --- the grammar -------------------------------------------------------------

    def grammar(self, tools: list[ToolSpec], required: bool, parallel: bool, answer: str) -> str:
        # One call whether parallel or not: the template refuses more in the history (see the module's docstring).
        call = f"call: %json {json.dumps(call_schema(tools, 'name', 'parameters'))}"
        # Where the vocabulary holds <|python_tag|> as one special token (Llama 3.x's), a call may begin with it, as
        # real models sometimes write it; as text it is never asked for (llama.cpp's grammar leaves it out too).
        calls = f"call | {self.lit(PYTHON_TAG)} call" if self.special(PYTHON_TAG) else "call"
        if required:
            return f"start: {calls}\n{call}\n"
        return f"start: answer | {calls}\n{answer}\n{call}\n"

    def answer_rule(self, schema: Any | None) -> str:
        if schema is not None:
            return super().answer_rule(schema)
        # Free text that does not begin with "{" and holds no tag: an answer that does is a call, and held to
        # the schemas. (Not "does not begin like a call": llguidance's lexer looks one byte ahead, so the
        # text and the call must part at their first byte.)
        return "answer: PLAIN\n" + r"PLAIN: /(?s:.*)/ & ~/(?s:[ \t\n\r]*\{.*)/ & ~/(?s:.*<\|python_tag\|>.*)/"

    # --- the answer --------------------------------------------------------------

    def opening_at(self, text: str) -> int:
        start = _first_visible(text)
        if start < len(text) and _opening(text, start) not in (None, _PARTIAL):
            return start
        return text.find(PYTHON_TAG)

    def held(self, text: str) -> int:
        start = _first_visible(text)
        if start == len(text) or _opening(text, start) == _PARTIAL:
            return len(text)  # all of it may still be the beginning of a call
        return partial_suffix(text, PYTHON_TAG)

    def parse(self, text: str, final: bool) -> tuple[str | None, list[Call]]:
        at = self.opening_at(text)
        if at < 0:
            return text, []
        pos = at + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, at) else at
        decoder = json.JSONDecoder()
        calls: list[Call] = []
        while True:
            pos += _first_visible(text[pos:])
            try:
                obj, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break  # the end of the calls, or (streaming) one not complete yet
            found = [_call(o) for o in (obj if isinstance(obj, list) else [obj])]
            if not found or None in found:
                break
            calls.extend(c for c in found if c is not None)
            pos += _first_visible(text[pos:])
            if not text.startswith(";", pos):
                break
            pos += 1
        if not calls:
            return text, []
        before = text[:at].strip()
        return before or None, calls


def _call(obj: Any) -> Call | None:
    """A call from one JSON object the model wrote; None when it is not one."""
    return call_from_json(obj, ("parameters", "arguments"))
