"""One internal request for every chat-shaped API: a ChatInput rendered, submitted and answered.

Chat completions, Responses and Messages each translate their body into a ChatInput
(edgeinfer.request) and call run_chat with a factory for their Dialect; so grammar, tools,
speculation and the prefix cache are the same whichever API asked. Nothing here reads a wire schema.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import Request

from edgeinfer.engine import Engine
from edgeinfer.formats import reasoning
from edgeinfer.formats.base import ToolFormat
from edgeinfer.formats.select import format_class
from edgeinfer.options import Grammar, SamplingParams
from edgeinfer.request import ChatInput
from edgeinfer.server import tools
from edgeinfer.server.output import AnswerShape
from edgeinfer.server.state import ServerState
from edgeinfer.server.streaming import Dialect, respond, submit

DialectFactory = Callable[[str, int], Dialect]  # called with the model's id and the rendered prompt's length in tokens


def tool_format(engine: Engine, req: ChatInput) -> tuple[ToolFormat, bool]:
    """The family's format for req's tools (from the model's template, or --tool-format), and whether the
    template writes tools and the call history itself (native) rather than having them described."""
    facts = engine.facts
    template = facts.template
    cls = format_class(template.source, template.renders_tools, facts.tool_format)
    fmt = cls(tools.specs(req))
    fmt.token_of = facts.special_token  # its grammar names the tags this vocabulary holds as special tokens
    return fmt, cls.native and template.renders_tools


def template_input(
    engine: Engine, req: ChatInput, fmt: ToolFormat, native: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages, and the tools where the template writes them, that req gives the model's template."""
    # A template that renders tools takes the tools, and the tool history whole (even with tool_choice "none").
    native = native and (req.uses_tools or req.has_tool_history)
    messages = tools.chat_messages(req, fmt, native)
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
    grammar = tools.tools_grammar(req, fmt) or req.answer_format or req.grammar
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


async def run_chat(
    request: Request, state: ServerState, req: ChatInput, dialect_factory: DialectFactory, stream: bool
) -> Any:
    """Find the model (loading it if need be), render and tokenize the prompt (off the event loop), submit
    req.n streams, and answer in the factory's dialect. Bad input raises an EdgeInferError (a 4xx) before
    anything is sent."""
    async with state.lease(req.model) as slot:
        engine = slot.engine
        assert engine is not None  # a leased slot stays loaded
        # Templating and tokenizing take time in proportion to the prompt: off the event loop.
        prompt, params, shape = await asyncio.to_thread(prepare, engine, req)
        handles = await submit(engine, prompt, params, req.n)
        return await respond(request, state, handles, dialect_factory(slot.name, len(prompt)), stream, shape)


def model_defaults(params: SamplingParams, named: Iterable[str], recommended: dict[str, Any]) -> SamplingParams:
    """params with the model's recommended sampling (its GGUF's general.sampling.*) for the fields the request
    left out (named: the ones it set)."""
    named = set(named)
    unset = {k: v for k, v in recommended.items() if k not in named}
    return params.model_copy(update=unset) if unset else params
