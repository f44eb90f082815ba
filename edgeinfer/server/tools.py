"""A chat request's tools, through the model family's format (edgeinfer.formats): the prompt's
messages and the grammar that holds the answer to the format and the tools' schemas.

A template that writes tools itself gets them (`tools=` in the render) and the call history
in its family's shape; for one that does not (SmolLM2's), the tools and the call syntax are
described in a system message and earlier calls are written into the text, their results in the
family's own result block. With `required` or a named tool the whole answer is calls; with `auto`
the text is free until the model opens a call, and from there the call is held to the schemas.
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.formats.base import ToolFormat, ToolSpec
from edgeinfer.formats.generic import describe
from edgeinfer.options import Grammar
from edgeinfer.request import ChatInput


def specs(req: ChatInput) -> list[ToolSpec]:
    return [t.spec() for t in req.tools]


def chat_messages(req: ChatInput, fmt: ToolFormat, native: bool) -> list[dict[str, Any]]:
    """The request's turns as the template takes them.

    native (the template renders tools): the history whole, in the family's shape: an assistant
    message's `tool_calls` and a tool message's `tool_call_id` (and the called function's `name`).
    Otherwise earlier calls are written into the text in the family's syntax and their results as
    user messages, and the tools are described in a system message."""
    out: list[dict[str, Any]] = []
    called: dict[str, str] = {}  # call id -> function name, for the results that answer them
    for t in req.turns:
        role, text = t.role, t.text
        if native:
            message: dict[str, Any] = {"role": role, "content": text}
            if t.calls:
                message["tool_calls"] = [fmt.history_call(c.id, c.name, c.arguments) for c in t.calls]
                fmt.seen_ids.update(fmt.history_id(c.id) for c in t.calls)
                called.update((c.id, c.name) for c in t.calls)
            if role == "tool":
                message["tool_call_id"] = fmt.history_id(t.call_id or "")
                if name := t.name or called.get(t.call_id or ""):
                    message["name"] = name
            out.append(message)
            continue
        if t.calls:
            calls = fmt.write_calls([(c.name, c.arguments) for c in t.calls])
            text = f"{text}\n{calls}" if text else calls
        if role == "tool":
            role, text = "user", fmt.write_result(text)
        out.append({"role": role, "content": text})
    if req.uses_tools and not native:
        system = described(req, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def described(req: ChatInput, fmt: ToolFormat) -> str:
    """The system text that teaches a model whose template knows no tools the tools and fmt's syntax."""
    return describe(specs(req), fmt.write_calls([("<function name>", {"<argument>": "<value>"})]))


def tools_grammar(req: ChatInput, fmt: ToolFormat) -> Grammar | None:
    """The Lark grammar (llguidance's dialect) that holds the answer to the format and the tools' schemas."""
    if not req.uses_tools:
        return None
    offered = [t for t in specs(req) if req.forced is None or t.name == req.forced]
    # A forced tool is one call; otherwise up to MAX_CALLS when parallel calls are allowed.
    fmt_grammar = req.answer_format
    answer = fmt.answer_rule(json.loads(fmt_grammar.source) if fmt_grammar is not None else None)
    required = req.tool_choice == "required"
    source = fmt.grammar(offered, required=required, parallel=req.parallel_calls, answer=answer)
    # Built here from checked parts; it may exceed the cap on a client's own grammar.
    return Grammar.model_construct(kind="lark", source=source, origin="tools")
