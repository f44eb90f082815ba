"""A chat request made ready for the engine: the prompt, the sampling with its grammar, and how to read the answer.

`prepare` takes the internal request (edgeinfer.request.ChatInput) and a loaded model (its
ModelFacts): the family's tool-call format from the model's template (or --tool-format); the turns
rendered with the template, tools and call history in the family's shape where the template writes
them, else the tools and the call syntax described in a system message and earlier calls written into
the text; the grammar (the tools' calls, the answer's format, or the client's own), with a thinking
block first where the model thinks; the model's recommended sampling for what the client left out;
and an AnswerShape that says how to read the answer. The server (server/run.py) and `edgeinfer chat`
call it; nothing here reads a wire schema. With `required` or a named tool the whole answer is calls;
with `auto` the text is free until the model opens a call, and from there the call is held to the schemas.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeinfer.formats import reasoning
from edgeinfer.formats.base import ToolFormat, ToolSpec
from edgeinfer.formats.generic import describe
from edgeinfer.formats.reasoning import Thinking
from edgeinfer.formats.select import format_class
from edgeinfer.options import Grammar, SamplingParams
from edgeinfer.request import ChatInput

if TYPE_CHECKING:
    from edgeinfer.engine import Engine


@dataclass(frozen=True, slots=True)
class AnswerShape:
    """How to read a choice's text: its thinking block, then the format of its tool calls."""

    calls: ToolFormat | None = None  # the family's format, when the request offered tools
    thinking: Thinking | None = None  # the tags thinking is split from the answer at (None: not split)
    started: bool = False  # the prompt opened the thinking block
    # A base model's turn (no chat template: it never ends one) ends at this many tokens: the server's end of
    # the turn, reported as "stop", not as the client's max_tokens reached.
    turn_end: int | None = None


PLAIN = AnswerShape()


def tool_format(engine: Engine, req: ChatInput) -> tuple[ToolFormat, bool]:
    """The family's format for req's tools (from the model's template, or --tool-format), and whether the
    template writes tools and the call history itself (native) rather than having them described."""
    facts = engine.facts
    template = facts.template
    cls = format_class(template.source, template.renders_tools, facts.tool_format)
    fmt = cls(specs(req))
    fmt.token_of = facts.special_token  # its grammar names the tags this vocabulary holds as special tokens
    return fmt, cls.native and template.renders_tools


def template_input(
    engine: Engine, req: ChatInput, fmt: ToolFormat, native: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages, and the tools where the template writes them, that req gives the model's template."""
    # A template that renders tools takes the tools, and the tool history whole (even with tool_choice "none").
    native = native and (req.uses_tools or req.has_tool_history)
    messages = chat_messages(req, fmt, native)
    offered = [t.as_template_takes_it() for t in req.tools] if native and req.uses_tools else None
    return messages, offered


def chat_text(engine: Engine, req: ChatInput) -> str:
    """The prompt text req renders to (POST /apply-template shows it): what prepare tokenizes."""
    messages, offered = template_input(engine, req, *tool_format(engine, req))
    return engine.facts.template.render(messages, add_generation_prompt=True, tools=offered)


def prepare(engine: Engine, req: ChatInput) -> tuple[list[int], SamplingParams, AnswerShape]:
    """The prompt (messages, and tools where the template writes them), the sampling, grammar included,
    and how to read the answer (its thinking, its calls)."""
    fmt, native = tool_format(engine, req)
    text = engine.chat_text(*template_input(engine, req, fmt, native))
    prompt = engine.chat_tokens(text)
    grammar = tools_grammar(req, fmt) or req.answer_format or req.grammar
    if req.uses_tools:
        if req.answer_format is not None:
            engine.grammars.compile(req.answer_format)
        for t in req.tools:  # each schema on its own, so that an error names its tool
            if t.parameters is not None:
                engine.grammars.compile(Grammar(kind="json_schema", source=json.dumps(t.parameters), origin=t.origin))
    facts = engine.facts
    budget = reasoning.budget_of(req.reasoning_budget, facts.reasoning_budget)
    thinks = reasoning.plan(facts.template.source, text, grammar, budget, facts.reasoning_format)
    shape = AnswerShape(calls=fmt if req.uses_tools else None, thinking=thinks.shown, started=thinks.started)
    params = model_defaults(
        req.sampling.model_copy(update={"grammar": thinks.grammar}), req.named, facts.sampling_defaults
    )
    if facts.template.stops:  # a fallback layout's end marker, written as text
        params = params.model_copy(update={"stop": [*params.stop, *facts.template.stops]})
    limit = facts.turn_limit
    if limit is not None and (params.max_tokens is None or params.max_tokens > limit):
        # A model with no chat template is a base model: it does not end its turns, so the server does.
        params = params.model_copy(update={"max_tokens": limit})
        shape = dataclasses.replace(shape, turn_end=limit)
    return prompt, params, shape


def model_defaults(params: SamplingParams, named: Iterable[str], recommended: dict[str, Any]) -> SamplingParams:
    """params with the model's recommended sampling (its GGUF's general.sampling.*) for the fields the request
    left out (named: the ones it set)."""
    named = set(named)
    unset = {k: v for k, v in recommended.items() if k not in named}
    return params.model_copy(update=unset) if unset else params


# --- the tools, through the family's format -------------------------------------------


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
