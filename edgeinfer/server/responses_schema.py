"""OpenAI's Responses API: the request body, and its items and tools checked one by one.

Items and tools are kept as sent (plain JSON) and parsed by parse_items and parse_tools, so that
an error names the item and says what to send instead, and so that the store keeps them in
the shape a client sends them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edgeinfer.errors import RequestError
from edgeinfer.server.responses_render import new_id
from edgeinfer.server.schema import MAX_MESSAGES, MAX_PARTS, MAX_TOOLS, FunctionDef, _schema_size

# Tools that run on OpenAI's servers (web_search_preview, computer_use_preview, ... by prefix).
HOSTED = ("web_search", "file_search", "computer_use", "code_interpreter", "mcp", "image_generation")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- the request body --------------------------------------------------------------


class FunctionTool(FunctionDef):
    """Responses' flat function tool: chat's function definition beside `type`, not under `function`."""

    type: Literal["function"]
    # Taken and ignored: every tool is offered at once, called by the model, its output unchecked.
    defer_loading: bool | None = None
    allowed_callers: list[Any] | None = None
    output_schema: dict[str, Any] | None = None


class ToolSet:
    """A request's tools as the model gets them: function tools, a namespace's functions among them (each
    offered by its own name, or namespace__name where two would share one), hosted tools left out."""

    def __init__(self) -> None:
        self.functions: list[FunctionTool] = []
        self.origin: dict[str, tuple[str | None, str]] = {}  # the model's name -> (namespace, the client's name)
        self.left_out: list[str] = []  # hosted tools' types

    def internal(self, namespace: str | None, name: str) -> str:
        """The name the model knows a client's function by."""
        return next((k for k, v in self.origin.items() if v == (namespace, name)), name)


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class FormatText(_Strict):
    type: Literal["text"]


class FormatJsonObject(_Strict):
    type: Literal["json_object"]


class FormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # the schema is enforced either way

    _size = field_validator("schema_")(_schema_size)


class TextConfig(_Strict):
    format: Annotated[FormatText | FormatJsonObject | FormatJsonSchema, Field(discriminator="type")] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted; the model has no such setting


class ReasoningConfig(_Strict):
    """effort bounds a reasoning model's thinking, as chat's reasoning_effort does (a budget in tokens); a model
    that does not think ignores it. summary is accepted: the thinking comes whole, never summarized."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(_Strict):
    """POST /v1/responses. Items and tools are kept as sent and parsed one by one (parse_items,
    parse_tools), so that an error names the item and what to send instead."""

    model: str = Field(min_length=1)
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)] = Field(
        default_factory=list, description="a string (one user message) or input items"
    )
    instructions: str | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    # Off unless asked, as in edgeinfer's chat completions: a small model left free repeats one call.
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None  # effort: a thinking budget
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = None  # edgeinfer: reproducible sampling
    ignore_eos: bool = False  # edgeinfer, as in chat completions: run to max_output_tokens (benchmarks)
    stream: bool = False
    store: bool | None = None  # None is true, as in OpenAI's API
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    # Accepted, and change nothing on a local server (IGNORED: counted, logged once).
    user: str | None = None
    client_metadata: dict[str, Any] | None = None  # Codex's ids for its turn, session and window
    background_options: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    background: Literal[False] | None = None  # no background mode: a response is made while its request waits
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    stream_options: dict[str, Any] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    context_management: list[Any] | None = None
    moderation: Any = None
    access_programs: Any = None
    # Not served: a 400 saying what to send instead (the route checks them).
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {
            "user",
            "client_metadata",
            "background_options",
            "include",
            "truncation",
            "service_tier",
            "background",
            "prompt_cache_key",
            "prompt_cache_retention",
            "safety_identifier",
            "top_logprobs",
            "max_tool_calls",
            "stream_options",
            "prompt_cache_options",
            "context_management",
            "moderation",
            "access_programs",
        }
    )

    @property
    def stored(self) -> bool:
        return self.store is not False


# --- input items --------------------------------------------------------------


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None
    parsed: Any = None  # the SDK's parse helpers add it to an output sent back as input; ignored


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: str


TEXT_PARTS: dict[str, type[BaseModel]] = {"input_text": InputText, "output_text": OutputText, "refusal": Refusal}
MEDIA_PARTS = {"input_image", "input_file", "input_audio"}


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_PARTS)]
    id: str | None = None
    status: str | None = None
    phase: str | None = None  # commentary or final answer, for OpenAI's own models: ignored


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    arguments: str  # JSON text
    id: str | None = None
    status: str | None = None
    namespace: str | None = None  # a namespace tool's function: the call names the function within it
    caller: Any = None
    parsed_arguments: Any = Field(None, exclude=True)  # added by the SDK's stream and parse helpers; ignored

    @field_validator("arguments")
    @classmethod
    def _json(cls, v: str) -> str:
        try:
            json.loads(v)
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments is not JSON text ({e}); send the call's arguments as a JSON string") from None
        return v


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_PARTS)]
    id: str | None = None
    status: str | None = None


class ReasoningItem(_Strict):
    """A reasoning model's earlier thinking: accepted, and not replayed to the model."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
ITEMS: dict[str, type[Item]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def _validated(model: type[BaseModel], value: dict[str, Any], where: str) -> Any:
    """model.model_validate, its first error a RequestError naming the field under `where`."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        err = e.errors()[0]
        path = where + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"])
        if err["type"] == "missing":
            raise RequestError(f"{path} is required", path) from None
        if err["type"] == "extra_forbidden":
            raise RequestError(f"{path} is not a supported field", path) from None
        raise RequestError(f"{path}: {str(err['msg']).removeprefix('Value error, ')}", path) from None


def parse_items(value: str | list[dict[str, Any]], first: int = 0) -> list[dict[str, Any]]:
    """`input` as checked items in their plain JSON shape (what the store keeps); `first` numbers them
    in errors. A string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value, "id": new_id("msg")}]
    out = []
    for i, raw in enumerate(value, first):
        kind = raw.get("type", "message")  # a message may come without its type (the SDK's EasyInputMessage)
        model = ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            known = ", ".join(ITEMS)
            raise RequestError(f"input[{i}].type {kind!r} is not an item type served here; send one of {known}")
        item = _validated(model, raw, f"input[{i}]")
        if isinstance(item, MessageItem) and isinstance(item.content, list):
            for j, part in enumerate(item.content):
                _part(part, f"input[{i}].content[{j}]")
        if isinstance(item, FunctionCallOutputItem) and isinstance(item.output, list):
            for j, part in enumerate(item.output):
                _part(part, f"input[{i}].output[{j}]")
        if item.id is None and not isinstance(item, ReasoningItem):  # GET .../input_items lists items by id
            item.id = new_id(ID_PREFIX[item.type])
        out.append(item.model_dump(exclude_none=True, by_alias=True))
    return out


def _part(part: dict[str, Any], where: str) -> None:
    kind = part.get("type")
    if kind in MEDIA_PARTS:
        raise RequestError(f"{where} is {kind}: this model takes text only; send input_text parts", f"{where}.type")
    model = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(TEXT_PARTS)
        raise RequestError(f"{where}.type {kind!r} is not a content part type; send one of {known}", f"{where}.type")
    _validated(model, part, where)


def parse_tools(tools: list[dict[str, Any]] | None) -> ToolSet:
    """The request's function tools, a namespace's functions among them; hosted tools (web_search, ...),
    which run on OpenAI's servers, are left out, and the route notes that they were."""
    found: list[tuple[str | None, FunctionTool]] = []
    out = ToolSet()
    for i, raw in enumerate(tools or []):
        kind = raw.get("type")
        if kind == "function":
            found.append((None, _validated(FunctionTool, raw, f"tools[{i}]")))
        elif kind == "namespace":
            ns = _validated(Namespace, raw, f"tools[{i}]")
            for j, inner in enumerate(ns.tools):
                if inner.get("type") != "function":
                    raise RequestError(
                        f"tools[{i}].tools[{j}] is {inner.get('type')!r}: a namespace's functions are served, "
                        "not other tools",
                        f"tools[{i}].tools[{j}].type",
                    )
                found.append((ns.name, _validated(FunctionTool, inner, f"tools[{i}].tools[{j}]")))
        elif isinstance(kind, str) and kind.startswith(HOSTED):
            out.left_out.append(kind)
        elif not isinstance(kind, str):
            raise RequestError(f'tools[{i}].type is required: send "function"', f"tools[{i}].type")
        else:
            raise RequestError(
                f"tools[{i}] is {kind!r}, not served here: send function or namespace tools", f"tools[{i}].type"
            )
    plain = [t.name for ns, t in found if ns is None]
    if len(set(plain)) != len(plain):
        raise RequestError("tools: two tools share a name; each function needs its own", "tools")
    taken = set(plain)
    for ns, tool in found:
        name = tool.name
        if ns is not None and name in taken:  # a namespace's function named like another tool
            name = f"{ns}__{tool.name}"[:64]
            if name in taken:
                raise RequestError(f"tools: {ns}.{tool.name} and another tool share a name", "tools")
        taken.add(name)
        out.functions.append(tool if name == tool.name else tool.model_copy(update={"name": name}))
        out.origin[name] = (ns, tool.name)
    return out


class Namespace(_Strict):
    """Functions grouped under a name (Codex's multi-agent tools): each is offered to the model."""

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)]


def parse_tool_choice(choice: str | dict[str, Any] | None, tools: list[FunctionTool]) -> str | NamedFunction | None:
    if not isinstance(choice, dict):
        if choice == "required" and not tools:
            raise RequestError('tool_choice "required" needs at least one function in tools', "tool_choice")
        return choice
    kind = choice.get("type")
    if kind != "function":
        raise RequestError(
            f'tool_choice type {kind!r} is not served here; send "auto", "none", "required" '
            'or {"type": "function", "name": ...}',
            "tool_choice",
        )
    named = _validated(NamedFunction, choice, "tool_choice")
    if named.name not in {t.name for t in tools}:
        known = ", ".join(t.name for t in tools) or "none"
        raise RequestError(
            f"tool_choice names {named.name!r}, which is not among tools (known: {known})", "tool_choice"
        )
    return named  # type: ignore[no-any-return]
