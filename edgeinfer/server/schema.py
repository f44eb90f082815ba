"""The wire schema: OpenAI-compatible request bodies, validated strictly (unknown fields are errors)."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from edgeinfer import request as internal
from edgeinfer.formats.reasoning import EFFORT_BUDGET
from edgeinfer.options import (
    MAX_GRAMMAR_CHARS,
    MAX_LOGIT_BIAS,
    SAMPLING_FIELDS,
    Grammar,
    SamplingFields,
    SamplingParams,
)

# Every list in a request is bounded, so that no body within the size cap (--max-body-mb)
# makes the server loop over millions of items. stop is bounded in edgeinfer.options.
MAX_MESSAGES = 4096  # messages per chat request
MAX_PARTS = 256  # content parts per message
MAX_PROMPT_IDS = 262_144  # token ids in a completions prompt; the context check comes later
MAX_TOOLS = 128  # tools per request
MAX_TOOL_CALLS = 128  # tool calls in one assistant message


def _surrogate_at(value: Any, path: str) -> str | None:
    """The path to the first string holding a lone UTF-16 surrogate (valid JSON, not valid text)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "the body"
        return None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _surrogate_at(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def lone_surrogate_message(where: str) -> str:
    return f"{where} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape); send valid Unicode"


class StrictBody(BaseModel):
    """A body checked strictly: unknown fields refused, no coercion between types."""

    # strict: true is not 1, "1" is not 1, 1.0 is not a token id.
    model_config = ConfigDict(extra="forbid", strict=True)


def utf8_text(value: str, name: str) -> str:
    """value, or a ValueError naming the field where it holds a lone surrogate (not encodable text)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(lone_surrogate_message(name)) from None
    return value


def valid_text(data: Any) -> Any:
    """A body's every string is valid Unicode, or a 400 naming where it is not (a request model's validator)."""
    where = _surrogate_at(data, "")
    if where:
        raise PydanticCustomError("lone_surrogate", lone_surrogate_message(where))
    return data


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str = Field(min_length=1, max_length=64)
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    """A call the assistant made earlier in the conversation."""

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall

    @field_validator("function")
    @classmethod
    def _json_arguments(cls, f: FunctionCall) -> FunctionCall:
        try:
            json.loads(f.arguments)
        except json.JSONDecodeError as e:
            raise ValueError(f"function.arguments of {f.name!r} is not JSON text ({e})") from None
        return f


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(max_length=MAX_PARTS)] | None = None
    name: str | None = None
    tool_call_id: str | None = Field(None, min_length=1, max_length=256)
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)] | None = None

    @model_validator(mode="after")
    def _tool_fields(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"


def _schema_size(schema: Any) -> Any:
    size = len(json.dumps(schema))
    if size > MAX_GRAMMAR_CHARS:
        raise ValueError(f"the schema is {size} characters of JSON; at most {MAX_GRAMMAR_CHARS} are accepted")
    return schema


class FunctionDef(_Strict):
    name: str = Field(pattern=TOOL_NAME, description="letters, digits, _ and -; at most 64")
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # every call is held to its schema either way

    _size = field_validator("parameters")(_schema_size)


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(True, alias="schema")
    strict: bool | None = None  # the schema is enforced either way

    _size = field_validator("schema_")(_schema_size)


class ResponseFormat(_Strict):
    """OpenAI's response_format: text, any JSON object, or JSON that validates against a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _needs_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs a json_schema object: {"name": ..., "schema": {...}}')
        return self

    def grammar(self) -> Grammar | None:
        if self.type == "json_object":
            return Grammar(kind="json_schema", source='{"type": "object"}', origin="response_format")
        if self.type == "json_schema" and self.json_schema is not None:
            source = json.dumps(self.json_schema.schema_)
            return Grammar(kind="json_schema", source=source, origin="response_format.json_schema.schema")
        return None


class _Sampling(SamplingFields):
    """Fields shared by both endpoints. The sampling settings, their ranges and defaults are
    edgeinfer.options.SamplingFields' own; errors name the field as the client sent it."""

    model: str = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    grammar: str | None = Field(
        None, min_length=1, max_length=MAX_GRAMMAR_CHARS, description="edgeinfer: a Lark grammar the output follows"
    )
    logit_bias: Annotated[dict[str, float], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    # Accepted, and change nothing on a local server (IGNORED: counted, logged once; docs/apis.md).
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None  # edgeinfer caches prompts by their tokens, whatever the key
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    moderation: Any = None
    cache_prompt: bool | None = None  # llama-server's: edgeinfer always reuses a kept prefix
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {
            "user",
            "store",
            "metadata",
            "service_tier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "prompt_cache_options",
            "safety_identifier",
            "moderation",
            "cache_prompt",
        }
    )

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        return valid_text(data)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_shape(cls, v: Any) -> Any:
        # Before the engine's own check, which would take an object's keys (or fail on a number).
        if v is None or isinstance(v, str | list):
            return v
        kind = {dict: "an object", bool: "a boolean", int: "a number", float: "a number"}.get(type(v), type(v).__name__)
        raise ValueError(f"stop must be a string or a list of strings, not {kind}")

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys are token ids as strings; {key!r} is not one")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias[{key}] is {bias}; biases run from -100 to 100")
        return v

    def sampling(self, max_tokens: int | None, logprobs: int | None, grammar: Grammar | None = None) -> SamplingParams:
        """The engine's SamplingParams (already checked: the fields are the same declarations)."""
        values = self.model_dump(include=set(SAMPLING_FIELDS))
        if grammar is None and self.grammar is not None:
            grammar = Grammar(kind="lark", source=self.grammar)
        bias = {int(k): v for k, v in (self.logit_bias or {}).items()}
        return SamplingParams.model_construct(
            **values, max_tokens=max_tokens, logprobs=logprobs, grammar=grammar, logit_bias=bias
        )


class ChatRequest(_Sampling):
    """POST /v1/chat/completions"""

    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = False  # llama-server's default: small models repeat one call until max_tokens
    # How long a reasoning model may think, in tokens (edgeinfer.formats.reasoning.EFFORT_BUDGET maps an
    # effort to a budget); reasoning_budget, llama-server's --reasoning-budget per request, wins if both are
    # sent. None: the server's --reasoning-budget. Each API's translation fills reasoning_budget.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    reasoning_budget: Annotated[int, Field(ge=-1)] | None = Field(
        None, description="edgeinfer: thinking tokens at most (-1: no bound, 0: no thinking)"
    )
    # OpenAI's, taken and ignored: the model has no verbosity setting, nothing is predicted, it answers in text.
    verbosity: Literal["low", "medium", "high"] | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = Field(None, description='["text"]: audio output is not served')
    web_search_options: dict[str, Any] | None = None  # a hosted search: the model searches nothing here
    n_probs: Annotated[int, Field(ge=0)] | None = None  # llama-server's: logprobs and top_logprobs say it here
    IGNORED: ClassVar[frozenset[str]] = _Sampling.IGNORED | {
        "verbosity",
        "prediction",
        "modalities",
        "web_search_options",
        "n_probs",
    }

    @model_validator(mode="after")
    def _tools_fit(self) -> ChatRequest:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools share a name; each function needs its own")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            known = ", ".join(names) or "none"
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among tools (known: {known})")
        if choice == "required" and not names:
            raise ValueError('tool_choice "required" needs at least one tool in tools')
        if self.grammar is not None and (self.response_format is not None or names):
            raise ValueError("grammar cannot be combined with response_format or tools; send one of them")
        if self.reasoning_budget is None and self.reasoning_effort is not None:
            self.reasoning_budget = EFFORT_BUDGET[self.reasoning_effort]
        return self

    def to_sampling(self, grammar: Grammar | None = None) -> SamplingParams:
        top = None
        if self.logprobs:
            top = self.top_logprobs or 0
        return self.sampling(self.max_completion_tokens or self.max_tokens, top, grammar)

    def to_input(self) -> internal.ChatInput:
        """The internal request (edgeinfer.request): what run.run_chat runs, in no API's shape."""
        turns = [
            internal.Turn(
                "system" if m.role == "developer" else m.role,
                m.text(),
                tuple(
                    internal.PastCall(c.id, c.function.name, json.loads(c.function.arguments))
                    for c in m.tool_calls or ()
                ),
                m.tool_call_id,
                m.name,
            )
            for m in self.messages
        ]
        tools = [
            internal.Tool(
                t.function.name,
                t.function.description,
                t.function.parameters,
                f"tools[{i}].function.parameters",
                t.function.strict,
            )
            for i, t in enumerate(self.tools or [])
        ]
        choice: Literal["auto", "none", "required"] = "auto"
        forced = None
        if isinstance(self.tool_choice, NamedToolChoice):
            choice, forced = "required", self.tool_choice.function.name
        elif self.tool_choice is not None:
            choice = self.tool_choice
        return internal.ChatInput(
            model=self.model,
            turns=turns,
            sampling=self.to_sampling().model_copy(update={"grammar": None}),
            named=frozenset(self.model_fields_set),
            tools=tools,
            tool_choice=choice,
            forced=forced,
            parallel_calls=bool(self.parallel_tool_calls) and forced is None,
            answer_format=self.response_format.grammar() if self.response_format is not None else None,
            grammar=Grammar(kind="lark", source=self.grammar) if self.grammar is not None else None,
            reasoning_budget=self.reasoning_budget,
            n=self.n,
        )


class CompletionRequest(_Sampling):
    """POST /v1/completions"""

    prompt: str | list[int] | list[str]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: Literal[False] = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _bounded(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > MAX_PROMPT_IDS:
            raise ValueError(f"{len(v)} token ids is over the limit of {MAX_PROMPT_IDS}")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str | list[int] | list[str]) -> str | list[int] | list[str]:
        if isinstance(v, list) and v and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("only one prompt per request is supported; send one string")
        return v

    def prompt_input(self) -> str | list[int]:
        """The prompt as the engine takes it: text, or token ids."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            return str(p[0])
        return p  # type: ignore[return-value]

    def to_sampling(self) -> SamplingParams:
        return self.sampling(self.max_tokens, self.logprobs)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
