"""Tool calls for templates that know them and for those that do not: the prompt, the grammar, the answer.

The wire format is one for every model (Hermes-style, the one Qwen and many fine-tunes use):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template that writes tools itself gets them (`tools=` in the render); for one that does
not (SmolLM2's), the tools and this format are described in a system message. The grammar
enforces the format and each tool's `parameters` schema: with `required` or a named tool
the whole answer is calls; with `auto` the text is free until the model writes
`<tool_call>`, and from there the call is held to the schemas (a lazy grammar: free text is
any text without the opening, or text up to it and then calls). The answer is parsed back
into OpenAI's `tool_calls`; while streaming, text that might be the start of a call is held
back until it is known not to be.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from edgeinfer.engine.grammar import JSON_OPTIONS, closed
from edgeinfer.options import Grammar
from edgeinfer.server.schema import ChatRequest, NamedToolChoice, Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 8  # calls in one answer (a small model left free repeats one call until max_tokens)


def describe_tools(tools: list[Tool]) -> str:
    """The system text that teaches a model without tool support the tools and the format."""
    lines = [
        "You can call functions to help answer. To call one, write exactly:",
        OPEN,
        '{"name": "<function name>", "arguments": {<arguments as JSON>}}',
        CLOSE,
        "Call several by writing several such blocks. The functions:",
    ]
    for t in tools:
        f = t.function
        params = json.dumps(f.parameters or {"type": "object", "properties": {}})
        lines.append(f"- {f.name}: {f.description or 'no description'} Arguments (JSON Schema): {params}")
    return "\n".join(lines)


def chat_messages(req: ChatRequest, template_renders_tools: bool) -> list[dict[str, Any]]:
    """The request's messages as the template takes them.

    A template that renders tools gets the history whole, as such templates expect it: an assistant
    message's `tool_calls` ([{id, type, function: {name, arguments as a dict}}]) and a tool message's
    `tool_call_id` (and the called function's `name`). For one that does not, earlier calls and their
    results are written into the text in the wire format (the model reads them as it writes calls)."""
    out: list[dict[str, Any]] = []
    called: dict[str, str] = {}  # call id -> function name, for the results that answer them
    for m in req.messages:
        role = "system" if m.role == "developer" else m.role
        text = m.text()
        if template_renders_tools:
            message: dict[str, Any] = {"role": role, "content": text}
            if m.tool_calls:
                message["tool_calls"] = [
                    _history_call(c.id, c.function.name, c.function.arguments) for c in m.tool_calls
                ]
                called.update((c.id, c.function.name) for c in m.tool_calls)
            if role == "tool":
                message["tool_call_id"] = m.tool_call_id
                if name := m.name or called.get(m.tool_call_id or ""):
                    message["name"] = name
            out.append(message)
            continue
        if m.tool_calls:
            calls = [wire_call(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls]
            text = "\n".join([text, *calls]) if text else "\n".join(calls)
        if role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if uses_tools(req) and not template_renders_tools:
        assert req.tools is not None
        system = describe_tools(req.tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _history_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    # Templates read arguments as a mapping (`arguments | tojson`, `arguments.items()`), not JSON text.
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.loads(arguments)}}


def has_tool_history(req: ChatRequest) -> bool:
    """Whether earlier calls or their results are in the messages (the template then matters even without tools)."""
    return any(m.tool_calls or m.role == "tool" for m in req.messages)


def wire_call(name: str, arguments: Any) -> str:
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def uses_tools(req: ChatRequest) -> bool:
    return bool(req.tools) and req.tool_choice != "none"


def tools_grammar(req: ChatRequest) -> Grammar | None:
    """The Lark grammar (llguidance's dialect) that holds the answer to the format and the tools' schemas."""
    if not uses_tools(req):
        return None
    assert req.tools is not None
    choice = req.tool_choice or "auto"
    tools = req.tools
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
    call = json.dumps(call_schema(tools))
    # A named tool is one call; otherwise up to MAX_CALLS when parallel calls are allowed.
    parallel = req.parallel_tool_calls and not isinstance(choice, NamedToolChoice)
    more = f'\nmore: ("\\n<tool_call>" body)~0..{MAX_CALLS - 1}' if parallel else '\nmore: ""'
    body = f'body: "\\n" %json {call} "\\n</tool_call>"'
    if choice == "auto":
        # Free text may come before a call; the stop string ends it and is the call's opening.
        free = 'start: answer | prose body more\nprose[stop="<tool_call>"]: /(?s:.*)/'
        json_answer = 'start: answer | "<tool_call>" body more'  # a response_format answer, or calls
        answer = _answer_rule(req)
        rules = [free if answer.startswith("answer: PLAIN") else json_answer, answer, body + more]
    else:
        rules = ['start: "<tool_call>" body more', body + more]
    # Built here from checked parts; it may exceed the cap on a client's own grammar.
    return Grammar.model_construct(kind="lark", source="\n".join(rules) + "\n", origin="tools")


def _answer_rule(req: ChatRequest) -> str:
    """What an answer without a call may be: any text without the opening, or the response_format's JSON."""
    fmt = req.response_format.grammar() if req.response_format is not None else None
    if fmt is not None:
        schema = json.loads(fmt.source)
        if isinstance(schema, dict):
            schema = closed({**schema, "x-guidance": JSON_OPTIONS})
        return f"answer: %json {json.dumps(schema)}"
    return "answer: PLAIN\nPLAIN: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/"


def call_schema(tools: list[Tool]) -> dict[str, Any]:
    """One call: {"name": one of the tools, "arguments": that tool's parameters}. Each tool's schema moves
    under $defs, its own references rewritten to follow it, so that `#/$defs/...` inside it still resolve."""
    defs: dict[str, Any] = {}
    options = []
    for i, t in enumerate(tools):
        key = f"tool{i}"
        params = t.function.parameters if t.function.parameters is not None else {"type": "object"}
        defs[key] = _rebase(copy.deepcopy(params), f"#/$defs/{key}")
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": {"$ref": f"#/$defs/{key}"}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return closed({**schema, "$defs": defs, "x-guidance": JSON_OPTIONS})


def _rebase(value: Any, base: str) -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
                value[k] = base + v[1:]
            else:
                _rebase(v, base)
    elif isinstance(value, list):
        for v in value:
            _rebase(v, base)
    return value


# --- the answer -----------------------------------------------------------------


def parse_calls(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """(the text before the first call, or None; the calls as (name, arguments as JSON text)). No call: (text, []).

    Called only by edgeinfer.server.output, which turns the calls into neutral ToolCall events."""
    start = text.find(OPEN)
    if start < 0:
        return text, []
    decoder = json.JSONDecoder()
    calls = []
    pos = start
    while pos >= 0:
        body_at = pos + len(OPEN)
        body_at += len(text[body_at:]) - len(text[body_at:].lstrip())
        try:
            obj, end = decoder.raw_decode(text, body_at)
        except json.JSONDecodeError:
            break
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            break
        calls.append((obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
        pos = text.find(OPEN, end)
    if not calls:
        return text, []
    before = text[:start].strip()
    return before or None, calls


@dataclass(slots=True)
class CallWatch:
    """One streamed choice's text: what may go out as content now, holding back what may open a call."""

    text: str = ""
    sent: int = 0
    in_call: bool = False

    def feed(self, delta: str) -> str:
        if self.in_call:
            return ""
        self.text += delta
        at = self.text.find(OPEN)
        if at >= 0:
            self.in_call = True
            end = at
        else:
            end = len(self.text) - _partial_open(self.text)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out

    def rest(self) -> str:
        """What was held back, once the stream ended without a call."""
        out, self.sent = self.text[self.sent :], len(self.text)
        return "" if self.in_call else out


def _partial_open(text: str) -> int:
    """Length of the longest tail of text that is a beginning of the opening tag."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
