"""A chat request's tools, through the model family's format (edgeinfer.formats): the prompt's
messages and the grammar that holds the answer to the format and the tools' schemas.

A template that writes tools itself gets them (`tools=` in the render) and the call history
in its family's shape; for one that does not (SmolLM2's), the tools and the call syntax are
described in a system message and earlier calls are written into the text. With `required`
or a named tool the whole answer is calls; with `auto` the text is free until the model opens
a call, and from there the call is held to the schemas.
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.formats.base import ToolFormat, ToolSpec
from edgeinfer.formats.generic import describe
from edgeinfer.options import Grammar
from edgeinfer.server.schema import ChatRequest, NamedToolChoice, Tool


def specs(tools: list[Tool] | None) -> list[ToolSpec]:
    return [
        ToolSpec(
            t.function.name,
            t.function.description,
            t.function.parameters if t.function.parameters is not None else {"type": "object"},
        )
        for t in tools or []
    ]


def chat_messages(req: ChatRequest, fmt: ToolFormat, native: bool) -> list[dict[str, Any]]:
    """The request's messages as the template takes them.

    native (the template renders tools): the history whole, in the family's shape: an assistant
    message's `tool_calls` and a tool message's `tool_call_id` (and the called function's `name`).
    Otherwise earlier calls are written into the text in the family's syntax and their results as
    user messages, and the tools are described in a system message."""
    out: list[dict[str, Any]] = []
    called: dict[str, str] = {}  # call id -> function name, for the results that answer them
    for m in req.messages:
        role = "system" if m.role == "developer" else m.role
        text = m.text()
        if native:
            message: dict[str, Any] = {"role": role, "content": text}
            if m.tool_calls:
                message["tool_calls"] = [
                    fmt.history_call(c.id, c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls
                ]
                fmt.seen_ids.update(fmt.history_id(c.id) for c in m.tool_calls)
                called.update((c.id, c.function.name) for c in m.tool_calls)
            if role == "tool":
                message["tool_call_id"] = fmt.history_id(m.tool_call_id or "")
                if name := m.name or called.get(m.tool_call_id or ""):
                    message["name"] = name
            out.append(message)
            continue
        if m.tool_calls:
            calls = fmt.write_calls([(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls])
            text = f"{text}\n{calls}" if text else calls
        if role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if uses_tools(req) and not native:
        system = described(req, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def described(req: ChatRequest, fmt: ToolFormat) -> str:
    """The system text that teaches a model whose template knows no tools the tools and fmt's syntax."""
    return describe(specs(req.tools), fmt.write_calls([("<function name>", {"<argument>": "<value>"})]))


def has_tool_history(req: ChatRequest) -> bool:
    """Whether earlier calls or their results are in the messages (the template then matters even without tools)."""
    return any(m.tool_calls or m.role == "tool" for m in req.messages)


def uses_tools(req: ChatRequest) -> bool:
    return bool(req.tools) and req.tool_choice != "none"


def tools_grammar(req: ChatRequest, fmt: ToolFormat) -> Grammar | None:
    """The Lark grammar (llguidance's dialect) that holds the answer to the format and the tools' schemas."""
    if not uses_tools(req):
        return None
    choice = req.tool_choice or "auto"
    offered = specs(req.tools)
    if isinstance(choice, NamedToolChoice):
        offered = [t for t in offered if t.name == choice.function.name]
    # A named tool is one call; otherwise up to MAX_CALLS when parallel calls are allowed.
    parallel = bool(req.parallel_tool_calls) and not isinstance(choice, NamedToolChoice)
    fmt_grammar = req.response_format.grammar() if req.response_format is not None else None
    answer = fmt.answer_rule(json.loads(fmt_grammar.source) if fmt_grammar is not None else None)
    source = fmt.grammar(offered, required=choice != "auto", parallel=parallel, answer=answer)
    # Built here from checked parts; it may exceed the cap on a client's own grammar.
    return Grammar.model_construct(kind="lark", source=source, origin="tools")
