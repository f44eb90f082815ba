"""OpenAI's Responses API, `POST /v1/responses` and GET/DELETE `/v1/responses/{id}`: a thin translation.

A request becomes the internal request, edgeinfer.request.ChatInput (instructions a system turn,
`message` items turns, `function_call` items an assistant's calls with their call ids,
`function_call_output` items tool turns answering a call id) and runs through the same
path as chat completions: one packed batch, grammar, prefix cache. The answer comes back as
the neutral event stream, which responses_render.py turns into a Response object or the typed
SSE events; responses_store.py keeps finished responses for `previous_response_id`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fastapi import APIRouter, Depends, Request

from edgeinfer.errors import ContextLengthError, RequestError
from edgeinfer.formats.reasoning import EFFORT_BUDGET
from edgeinfer.options import Grammar, SamplingParams
from edgeinfer.request import ChatInput, PastCall, Role, Tool, Turn
from edgeinfer.server.api import Api
from edgeinfer.server.lenient import ignored_fields
from edgeinfer.server.responses_render import ResponsesDialect
from edgeinfer.server.responses_schema import (
    FormatJsonSchema,
    FormatText,
    NamedFunction,
    ResponsesRequest,
    ToolSet,
    parse_items,
    parse_tool_choice,
    parse_tools,
)
from edgeinfer.server.responses_store import MAX_RESPONSES, ResponseStore, Stored
from edgeinfer.server.run import run_chat
from edgeinfer.server.state import authorized, server_state

# --- to the internal request ---------------------------------------------------------


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", p.get("refusal", "")) for p in content)


def turns_of(
    instructions: str | None, items: list[dict[str, Any]], first: int = 0, tools: ToolSet | None = None
) -> list[Turn]:
    """Checked items as the internal request's turns: function_call items join the assistant turn before them
    as its calls (a namespace's function under the name the model knows it by); function_call_output items
    become tool turns answering a call made earlier. `first` is the index of the request's own first item in
    `items` (earlier ones came from the store)."""
    turns: list[Turn] = [Turn("system", instructions)] if instructions else []
    calls: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role: Role = "system" if item["role"] == "developer" else item["role"]
            turns.append(Turn(role, _text(item["content"])))
        elif kind == "function_call":
            name = tools.internal(item.get("namespace"), item["name"]) if tools is not None else item["name"]
            call = PastCall(item["call_id"], name, json.loads(item["arguments"]))
            if turns and turns[-1].role == "assistant":
                turns[-1] = dataclasses.replace(turns[-1], calls=(*turns[-1].calls, call))
            else:
                turns.append(Turn("assistant", "", (call,)))
            calls.add(item["call_id"])
        elif kind == "function_call_output":
            if item["call_id"] not in calls:
                where = f"input[{i - first}]"
                raise RequestError(
                    f"{where} is the output of call {item['call_id']!r}, which matches no earlier function_call; "
                    "send the function_call item before its output (or previous_response_id)",
                    f"{where}.call_id",
                )
            turns.append(Turn("tool", _text(item["output"]), call_id=item["call_id"]))
    if not any(t.role != "system" for t in turns):
        raise RequestError("input is empty: send a string or at least one message item", "input")
    return turns


def to_input(req: ResponsesRequest, toolset: ToolSet, items: list[dict[str, Any]], first: int) -> ChatInput:
    """The internal request (edgeinfer.request): errors name this API's fields."""
    choice = parse_tool_choice(req.tool_choice, toolset.functions)
    tools = [Tool(t.name, t.description, t.parameters, "tools", t.strict) for t in toolset.functions]
    fmt = req.text.format if req.text else None
    answer_format = None
    if isinstance(fmt, FormatJsonSchema):
        answer_format = Grammar(kind="json_schema", source=json.dumps(fmt.schema_), origin="text.format.schema")
    elif fmt is not None and fmt.type == "json_object":
        answer_format = Grammar(kind="json_schema", source='{"type": "object"}', origin="text.format")
    chosen = {k: getattr(req, k) for k in ("temperature", "top_p", "seed") if getattr(req, k) is not None}
    sampling = SamplingParams(max_tokens=req.max_output_tokens, ignore_eos=bool(req.ignore_eos), **chosen)
    effort = req.reasoning.effort if req.reasoning is not None else None
    forced = choice.name if isinstance(choice, NamedFunction) else None
    return ChatInput(
        model=req.model,
        turns=turns_of(req.instructions, items, first, toolset),
        sampling=sampling,
        named=frozenset(chosen),
        tools=tools,
        tool_choice="required" if forced is not None else choice or "auto",  # type: ignore[arg-type]
        forced=forced,
        parallel_calls=bool(req.parallel_tool_calls) and forced is None,
        answer_format=answer_format,
        reasoning_budget=EFFORT_BUDGET[effort] if effort is not None else None,
    )


def echo(req: ResponsesRequest, chat: ChatInput) -> dict[str, Any]:
    """The request fields a Response object repeats, as applied (sampling defaults included)."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else FormatText(type="text")
    text: dict[str, Any] = {"format": fmt.model_dump(by_alias=True, exclude_none=True)}
    if req.text is not None and req.text.verbosity is not None:
        text["verbosity"] = req.text.verbosity
    choice: Any = req.tool_choice or "auto"
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "metadata": req.metadata or {},
        "parallel_tool_calls": chat.parallel_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": req.stored,
        "temperature": chat.sampling.temperature,
        "text": text,
        "tool_choice": choice,
        "tools": list(req.tools or []),  # as sent
        "top_p": chat.sampling.top_p,
        "truncation": req.truncation or "disabled",
        "user": req.user,
    }


OUR_NAMES = {"max_tokens": "max_output_tokens", "prompt": "input"}  # the engine's field -> this API's
UNSERVED = {
    "conversation": "is not served (there is no conversations API here); continue with previous_response_id",
    "prompt": "(a reusable prompt kept on OpenAI's servers) is not served here; send instructions and input",
}

# --- the endpoints --------------------------------------------------------------

router = APIRouter(dependencies=[Depends(authorized)])


class ResponseNotFound(RequestError):
    http_status = 404
    code = "not_found"


def store_of(request: Request) -> ResponseStore:
    """The app's response store, made at first use (it lives as long as the server)."""
    app_state = request.app.state
    store: ResponseStore | None = getattr(app_state, "responses", None)
    if store is None:
        store = app_state.responses = ResponseStore()
    return store


def _stored(request: Request, response_id: str, param: str | None = None) -> Stored:
    entry = store_of(request).get(response_id)
    if entry is None:
        raise ResponseNotFound(
            f"no response with id {response_id!r}: it was never stored (store: false), was deleted, "
            f"or was evicted (the server keeps the last {MAX_RESPONSES} responses) or the server restarted",
            param,
        )
    return entry


@router.post("/v1/responses")
async def create_response(request: Request, req: ResponsesRequest) -> Any:
    state = server_state(request)
    for name in ("conversation", "prompt"):
        if getattr(req, name) is not None:
            raise RequestError(f"{name} {UNSERVED[name]}", name)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = _stored(request, req.previous_response_id, "previous_response_id")
        history = [*prev.history, *prev.response["output"]]
    items = [*history, *parse_items(req.input)]
    tools = parse_tools(req.tools)
    state.ignored.note("responses", [*ignored_fields(req), *(f"tools[].{kind}" for kind in tools.left_out)])
    chat = to_input(req, tools, items, len(history))
    store = store_of(request)
    keep = (lambda response: store.put(response, items)) if req.stored else None
    shown = echo(req, chat)

    def dialect(model: str, _: int) -> ResponsesDialect:
        return ResponsesDialect(model, shown, keep, tools.origin)

    try:
        return await run_chat(request, state, chat, dialect, req.stream)
    except ContextLengthError as e:  # its words and code are what clients act on: only the field is renamed
        e.param = OUR_NAMES["prompt"]
        raise
    except RequestError as e:  # the engine's door names its own fields: say them as this API does
        if e.param in OUR_NAMES:
            raise RequestError(str(e).replace(e.param, OUR_NAMES[e.param], 1), OUR_NAMES[e.param]) from None
        raise


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> dict[str, Any]:
    return _stored(request, response_id).response


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    _stored(request, response_id)
    store_of(request).delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(
    request: Request, response_id: str, limit: int = 20, order: str = "desc", after: str | None = None
) -> dict[str, Any]:
    """The items the response answered (earlier responses' in its chain included), as OpenAI lists them."""
    if not 1 <= limit <= 100:
        raise RequestError("limit must be between 1 and 100", "limit")
    if order not in ("asc", "desc"):
        raise RequestError('order must be "asc" or "desc"', "order")
    items = list(_stored(request, response_id).history)
    if order == "desc":
        items.reverse()
    if after is not None:
        at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
        if at is None:
            raise RequestError(f"after: no item {after!r} in this response's input", "after")
        items = items[at + 1 :]
    page = items[:limit]
    first, last = (page[0].get("id"), page[-1].get("id")) if page else (None, None)
    return {"object": "list", "data": page, "first_id": first, "last_id": last, "has_more": len(items) > limit}


API = Api("responses", router)  # OpenAI's Responses API; errors in OpenAI's shape
