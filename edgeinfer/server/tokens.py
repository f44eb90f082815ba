"""llama-server's token endpoints: /tokenize, /detokenize and /apply-template, in its shapes (tools/server README).

Every body is checked strictly: a wrong type, an unknown field or an impossible value is a 400
in OpenAI's error shape naming the field, before any work is done.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field, field_validator

from edgeinfer.engine import Engine
from edgeinfer.errors import RequestError
from edgeinfer.prepare import chat_text
from edgeinfer.server.api import Api
from edgeinfer.server.pool import loaded
from edgeinfer.server.schema import MAX_PROMPT_IDS, ChatRequest, StrictBody, utf8_text
from edgeinfer.server.state import authorized, server_state

router = APIRouter(dependencies=[Depends(authorized)])

TokenIds = Annotated[list[int], Field(max_length=MAX_PROMPT_IDS)]


class TokenizeRequest(StrictBody):
    """POST /tokenize (llama-server): text to token ids, optionally with each token's text."""

    content: str
    add_special: bool = False  # BOS (and the like) where the model's tokenizer adds them
    parse_special: bool = True  # "<|im_start|>" in the text is that special token, not its characters
    with_pieces: bool = False
    model: str = "default"  # which served model's vocabulary

    @field_validator("content")
    @classmethod
    def _valid(cls, v: str) -> str:
        return utf8_text(v, "content")


class DetokenizeRequest(StrictBody):
    """POST /detokenize (llama-server): token ids to text."""

    tokens: TokenIds
    model: str = "default"  # which served model's vocabulary


class ApplyTemplateRequest(ChatRequest):
    """POST /apply-template (llama-server): a chat completions body; model may be left out, nothing is generated."""

    model: str = "default"


@router.post("/tokenize")
async def tokenize(request: Request, req: TokenizeRequest) -> dict[str, Any]:
    async with server_state(request).lease(req.model) as slot:
        # Off the event loop: a body of megabytes is millions of tokens.
        return {"tokens": await asyncio.to_thread(_tokens, loaded(slot), req)}


def _tokens(engine: Engine, req: TokenizeRequest) -> list[int] | list[dict[str, Any]]:
    ids = engine.vocab.tokenize(req.content, req.add_special, req.parse_special)
    if not req.with_pieces:
        return ids
    return [{"id": t, "piece": _piece(engine.vocab.piece(t, special=True))} for t in ids]


def _piece(data: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (part of a character), as llama-server gives."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


@router.post("/detokenize")
async def detokenize(request: Request, req: DetokenizeRequest) -> dict[str, str]:
    async with server_state(request).lease(req.model) as slot:
        engine = loaded(slot)
        _check_ids(req.tokens, engine.vocab.n_tokens, "tokens")
        return {"content": await asyncio.to_thread(engine.vocab.detokenize, req.tokens, True)}


def _check_ids(ids: list[int], n_vocab: int, param: str) -> None:
    at = next((i for i, t in enumerate(ids) if not 0 <= t < n_vocab), None)
    if at is not None:
        raise RequestError(f"{param}[{at}] is {ids[at]}, outside this model's vocabulary (0 to {n_vocab - 1})", param)


@router.post("/apply-template")
async def apply_template(request: Request, req: ApplyTemplateRequest) -> dict[str, str]:
    """The prompt text the same body sent to /v1/chat/completions renders to, tools included."""
    async with server_state(request).lease(req.model) as slot:
        return {"prompt": await asyncio.to_thread(chat_text, loaded(slot), req.to_input())}


API = Api("tokens", router)  # llama-server's /tokenize, /detokenize, /apply-template; errors in OpenAI's shape
