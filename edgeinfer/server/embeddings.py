"""OpenAI's /v1/embeddings: one string, strings, token ids or lists of them, checked strictly, embedded by the
engine thread between steps (engine/embeddings.py), returned as floats or base64."""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import Field, field_validator

from edgeinfer.engine import Engine
from edgeinfer.errors import RequestError
from edgeinfer.server.api import Api
from edgeinfer.server.pool import loaded
from edgeinfer.server.schema import StrictBody, utf8_text
from edgeinfer.server.state import authorized, server_state

router = APIRouter(dependencies=[Depends(authorized)])


class EmbeddingsRequest(StrictBody):
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
            return [utf8_text(v, "input")]
        if not isinstance(v, list):
            raise ValueError(f"must be a string, a list of strings or a list of token ids, not {_kind(v)}")
        if not v:
            raise ValueError("is an empty list; send at least one string or token id")
        if all(isinstance(x, str) for x in v):
            empty = next((i for i, x in enumerate(v) if not x), None)
            if empty is not None:
                raise ValueError(f"input[{empty}] is an empty string; send text to embed")
            return [utf8_text(x, f"input[{i}]") for i, x in enumerate(v)]
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


@router.post("/v1/embeddings")
async def embeddings(request: Request, req: EmbeddingsRequest) -> dict[str, Any]:
    state = server_state(request)
    async with state.lease(req.model) as slot:
        return await _embeddings(loaded(slot), slot.name, req)


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


API = Api("embeddings", router)  # OpenAI's /v1/embeddings; errors in OpenAI's shape
