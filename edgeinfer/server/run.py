"""One internal request for every chat-shaped API: a ChatInput rendered, submitted and answered.

Chat completions, Responses and Messages each translate their body into a ChatInput
(edgeinfer.request) and call run_chat with a factory for their Dialect; so grammar, tools,
speculation and the prefix cache are the same whichever API asked. Nothing here reads a wire schema.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request

from edgeinfer.prepare import prepare
from edgeinfer.request import ChatInput
from edgeinfer.server.state import ServerState
from edgeinfer.server.streaming import Dialect, respond, submit

DialectFactory = Callable[[str, int], Dialect]  # called with the model's id and the rendered prompt's length in tokens


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
