"""A toy API, the whole of a new dialect in one module (tests/test_extensions.py adds it to an app's APIs).

POST /v1/toy {"say": "...", "stream": false} answers {"toy": "the answer", "end": "stop", "tokens": N};
streamed, SSE items `piece` ({"text": ...}) then `end`. Errors under /v1/toy, before a response starts
(a body that fails validation, a wrong key, an engine refusal) or after, are {"toy_error": {"status", "why"}}.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from edgeinfer.options import SamplingParams
from edgeinfer.request import ChatInput, Turn
from edgeinfer.server.api import Api
from edgeinfer.server.output import Done, Event, TextDelta
from edgeinfer.server.run import run_chat
from edgeinfer.server.state import authorized, server_state


class ToyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    say: str
    model: str = "default"
    stream: bool = False
    max_tokens: int = Field(16, ge=1)


def shape(status: int, message: str, type_: str = "", param: str | None = None, code: str | None = None) -> dict:
    return {"toy_error": {"status": status, "why": message}}


class ToyDialect:
    terminal = None

    def __init__(self, model: str, prompt_tokens: int) -> None:
        self.model = model

    def start(self, n: int) -> list[dict[str, str]]:
        return []

    def on(self, ev: Event) -> list[dict[str, str]]:
        return [{"event": "piece", "data": json.dumps({"text": ev.text})}] if isinstance(ev, TextDelta) else []

    def end(self, done: list[Done]) -> list[dict[str, str]]:
        return [{"event": "end", "data": json.dumps({"end": done[0].reason})}]

    def error_event(self, message: str, code: str) -> dict[str, str]:
        return {"event": "toy_error", "data": json.dumps(shape(500, message))}

    def response(self, done: list[Done], events: list[Event]) -> dict[str, Any]:
        text = "".join(ev.text for ev in events if isinstance(ev, TextDelta))
        return {"toy": text, "end": done[0].reason, "tokens": done[0].finish.stats.completion_tokens}

    def error_response(self, status: int, message: str, code: str) -> JSONResponse:
        return JSONResponse(shape(status, message), status_code=status)


router = APIRouter(dependencies=[Depends(authorized)])


@router.post("/v1/toy")
async def toy(request: Request, body: ToyBody) -> Any:
    # The translation into the internal request: no other API's body is built on the way.
    req = ChatInput(body.model, [Turn("user", body.say)], SamplingParams(max_tokens=body.max_tokens))
    return await run_chat(request, server_state(request), req, ToyDialect, body.stream)


API = Api("toy", router, paths=("/v1/toy",), error_shape=shape)
