"""llama-server's utility endpoints: /tokenize, /detokenize, /apply-template, and OpenAI's /v1/embeddings.

The shapes are llama-server's (tools/server README) and OpenAI's (embeddings). Every body is
checked strictly: a wrong type, an unknown field or an impossible value is a 400 in OpenAI's
error shape naming the field, before any work is done.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from edgeinfer.engine import Engine
from edgeinfer.errors import RequestError
from edgeinfer.server.pool import Slot
from edgeinfer.server.run import chat_text
from edgeinfer.server.schema import MAX_PROMPT_IDS, ChatRequest, lone_surrogate_message
from edgeinfer.server.state import authorized, server_state

router = APIRouter(dependencies=[Depends(authorized)])


class _Strict(BaseModel):
    # strict: true is not 1, "1" is not 1, 1.0 is not a token id.
    model_config = ConfigDict(extra="forbid", strict=True)


def _text(value: str, name: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(lone_surrogate_message(name)) from None
    return value


TokenIds = Annotated[list[int], Field(max_length=MAX_PROMPT_IDS)]


class TokenizeRequest(_Strict):
    """POST /tokenize (llama-server): text to token ids, optionally with each token's text."""

    content: str
    add_special: bool = False  # BOS (and the like) where the model's tokenizer adds them
    parse_special: bool = True  # "<|im_start|>" in the text is that special token, not its characters
    with_pieces: bool = False
    model: str = "default"  # which served model's vocabulary

    @field_validator("content")
    @classmethod
    def _valid(cls, v: str) -> str:
        return _text(v, "content")


class DetokenizeRequest(_Strict):
    """POST /detokenize (llama-server): token ids to text."""

    tokens: TokenIds
    model: str = "default"  # which served model's vocabulary


class ApplyTemplateRequest(ChatRequest):
    """POST /apply-template (llama-server): a chat completions body; model may be left out, nothing is generated."""

    model: str = "default"


class EmbeddingsRequest(_Strict):
    """POST /v1/embeddings (OpenAI): one string, strings, token ids, or lists of token ids."""

    input: Any
    model: str = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # the model's own size only: a model's vectors cannot be shortened here
    user: str | None = None  # accepted; changes nothing on a local server

    @field_validator("input", mode="before")
    @classmethod
    def _inputs(cls, v: Any) -> list[str] | list[list[int]]:
        """The inputs as a list of strings or a list of token id lists, or a ValueError saying what is wrong."""
        if isinstance(v, str):
            if not v:
                raise ValueError("is an empty string; send text to embed")
            return [_text(v, "input")]
        if not isinstance(v, list):
            raise ValueError(f"must be a string, a list of strings or a list of token ids, not {_kind(v)}")
        if not v:
            raise ValueError("is an empty list; send at least one string or token id")
        if all(isinstance(x, str) for x in v):
            empty = next((i for i, x in enumerate(v) if not x), None)
            if empty is not None:
                raise ValueError(f"input[{empty}] is an empty string; send text to embed")
            return [_text(x, f"input[{i}]") for i, x in enumerate(v)]
        if all(_is_id(x) for x in v):
            return [v]
        if all(isinstance(x, list) for x in v):
            for i, ids in enumerate(v):
                bad = next((x for x in ids if not _is_id(x)), None)
                if bad is not None or not ids:
                    what = "is empty" if not ids else f"holds {_kind(bad)}"
                    raise ValueError(f"input[{i}] {what}; a list of token ids holds integers only")
            return v
        kinds = sorted({_kind(x) for x in v})
        what = f"mixes {' and '.join(kinds)}" if len(kinds) > 1 else f"is a list of {kinds[0].split()[-1]}s"
        raise ValueError(f"{what}; send strings only, token ids only, or lists of token ids")


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _kind(x: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return "null" if x is None else names.get(type(x), type(x).__name__)


@router.post("/tokenize")
async def tokenize(request: Request, req: TokenizeRequest) -> dict[str, Any]:
    async with server_state(request).lease(req.model) as slot:
        # Off the event loop: a body of megabytes is millions of tokens.
        return {"tokens": await asyncio.to_thread(_tokens, _engine(slot), req)}


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
        engine = _engine(slot)
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
        return {"prompt": await asyncio.to_thread(chat_text, _engine(slot), req)}


@router.post("/v1/embeddings")
async def embeddings(request: Request, req: EmbeddingsRequest) -> dict[str, Any]:
    state = server_state(request)
    async with state.lease(req.model) as slot:
        return await _embeddings(_engine(slot), slot.name, req)


def _engine(slot: Slot) -> Engine:
    assert slot.engine is not None  # a leased slot stays loaded
    return slot.engine


async def _embeddings(engine: Engine, model: str, req: EmbeddingsRequest) -> dict[str, Any]:
    emb = engine.embeddings
    if req.dimensions is not None and req.dimensions != emb.n_embd:
        raise RequestError(
            f"dimensions is {req.dimensions}; this model's embeddings have {emb.n_embd} (leave dimensions out)",
            "dimensions",
        )
    inputs = await asyncio.to_thread(_token_lists, engine, req.input)
    vectors = await emb.aembed(inputs)
    n_tokens = sum(map(len, inputs))
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)} for i, v in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


def _token_lists(engine: Engine, inputs: list[str] | list[list[int]]) -> list[list[int]]:
    """Strings tokenized as text (special-token names are not parsed), with BOS where the model adds it."""
    return [engine.vocab.tokenize(x, add_special=True) if isinstance(x, str) else x for x in inputs]


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":  # the float32 values' little-endian bytes, as OpenAI sends them
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()  # type: ignore[no-any-return]
