"""Anthropic's Messages request bodies, validated strictly, and their errors said in Anthropic's words.

Fields that steer Anthropic's own service (cache_control, metadata, service_tier, speed, ...) are
accepted and change nothing: edgeinfer caches prompts by their tokens whatever the request says.
Images, documents and server tools are refused with a message that names them, since the model
behind edgeinfer reads text and runs no tools of its own.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgeinfer.options import MAX_GRAMMAR_CHARS, MAX_STOP_CHARS, MAX_STOPS
from edgeinfer.server.schema import MAX_MESSAGES, MAX_PARTS, MAX_TOOLS, TOOL_NAME, valid_text

# The block types a message may hold here; earlier thinking is accepted and not replayed.
BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
# Blocks that carry media or Anthropic-run results: named in the error, since a text model cannot read them.
MEDIA_TYPES = ("image", "document", "search_result", "container_upload")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheControl(_Strict):
    """Anthropic's cache breakpoint: accepted; the prefix cache reuses any shared prefix without one."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    IGNORED: ClassVar[frozenset[str]] = frozenset({"cache_control", "citations"})
    citations: list[dict[str, Any]] | None = None  # accepted, not used


class ToolUseBlock(_Strict):
    """A call the assistant made earlier in the conversation."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(pattern=TOOL_NAME)
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    IGNORED: ClassVar[frozenset[str]] = frozenset({"cache_control", "caller", "toolset_name"})
    caller: dict[str, Any] | None = None  # sent back by SDKs that echo a response block; not used
    toolset_name: str | None = None


def _text_only(items: Any, what: str = "block", allowed: tuple[str, ...] = BLOCK_TYPES) -> Any:
    """Refuse media and unknown blocks by name before pydantic lists every union member's complaint."""
    if not isinstance(items, list):
        return items
    for j, item in enumerate(items):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in MEDIA_TYPES:
            raise ValueError(f"{what} {j} is {kind!r}; the model edgeinfer serves takes text only: send text blocks")
        if isinstance(kind, str) and kind not in allowed:
            raise ValueError(f"{what} {j} has type {kind!r}; the block types taken here are {', '.join(allowed)}")
    return items


class ToolResultBlock(_Strict):
    """What a client tool returned for one tool_use."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | Annotated[list[TextBlock], Field(max_length=MAX_PARTS)] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None
    IGNORED: ClassVar[frozenset[str]] = frozenset({"cache_control", "toolset_name"})
    toolset_name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return _text_only(v, allowed=("text",))

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "\n".join(b.text for b in self.content)
        # The template has no slot for a failed call: the model reads that it failed in the result itself.
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: CacheControl | None = None
    IGNORED: ClassVar[frozenset[str]] = frozenset({"cache_control"})


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]


class MessageParam(_Strict):
    # "system": Claude Code sends one inside messages (its environment notes), taken in place.
    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[Block], Field(max_length=MAX_PARTS)]
    output_config: dict[str, Any] | None = None  # Claude Code's, on that system message: ignored
    IGNORED: ClassVar[frozenset[str]] = frozenset({"output_config"})

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, v: Any) -> Any:
        return _text_only(v)

    @model_validator(mode="after")
    def _blocks_fit_role(self) -> MessageParam:
        for j, b in enumerate(self.content if isinstance(self.content, list) else []):
            if b.type == "tool_use" and self.role != "assistant":
                raise ValueError(f"block {j} is a tool_use block; only assistant messages make tool calls")
            if b.type == "tool_result" and self.role != "user":
                raise ValueError(f"block {j} is a tool_result block; tool results go in a user message")
            if self.role == "system" and b.type != "text":
                raise ValueError(f"block {j} is a {b.type} block; a system message holds text blocks")
        return self


class ToolDef(_Strict):
    """A client tool: the model may call it; the client runs it and sends a tool_result back."""

    name: str = Field(pattern=TOOL_NAME, description="letters, digits, _ and -; at most 64")
    description: str | None = Field(None, max_length=8192)  # the chat schema's bound on a tool description
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None  # every call is held to its schema either way
    eager_input_streaming: bool | None = None  # a call's input streams as written, either way
    # Deferred: not shown to the model until the client loads it (Anthropic's tool search); left out here.
    defer_loading: bool | None = None
    allowed_callers: list[Any] | None = None
    input_examples: list[Any] | None = None
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"cache_control", "strict", "eager_input_streaming", "allowed_callers", "input_examples"}
    )

    @model_validator(mode="before")
    @classmethod
    def _client_tool(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(
                f"{kind!r} is a server tool, run by Anthropic's service; edgeinfer offers client tools only "
                "(name, description, input_schema) that your code runs"
            )
        return data

    @field_validator("input_schema")
    @classmethod
    def _size(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(v)) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"the schema is over {MAX_GRAMMAR_CHARS} characters; send a smaller one")
        return v


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice {"type": "tool"} needs the name of the tool to call')
        if self.type != "tool" and self.name is not None:
            raise ValueError(
                f'tool_choice {{"type": "{self.type}"}} takes no name; use {{"type": "tool", "name": ...}}'
            )
        return self


class ThinkingConfig(_Strict):
    """Extended thinking: for a model whose template thinks, enabled with budget_tokens bounds its thinking (the
    close tag forced when spent), disabled closes the block at once; adaptive and between_tools leave the
    server's --reasoning-budget. A model that does not think ignores it. Unlike Anthropic, budget_tokens may
    be under 1024 or over max_tokens (max_tokens then cuts the thinking)."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    display: Literal["summarized", "omitted"] | None = None
    block_binding: Any = None
    IGNORED: ClassVar[frozenset[str]] = frozenset({"display", "block_binding"})


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # accepted; no such setting here
    format: JsonOutputFormat | None = None  # enforced like chat's response_format json_schema
    task_budget: Any = None
    IGNORED: ClassVar[frozenset[str]] = frozenset({"effort", "task_budget"})


class Metadata(_Strict):
    user_id: str | None = None


class MessagesBody(_Strict):
    """What POST /v1/messages and /v1/messages/count_tokens share."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | Annotated[list[TextBlock], Field(max_length=MAX_PARTS)] | None = None
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # Accepted, and change nothing on a local server (IGNORED: counted, logged once).
    cache_control: CacheControl | None = None
    speed: Literal["standard", "fast"] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    inference_geo: str | None = None
    context_management: dict[str, Any] | None = None  # Claude Code's (clear old thinking): there is none to clear
    diagnostics: Any = None
    betas: list[str] | None = None
    billing_policy: Any = None
    fallback_credit_token: str | None = None
    fallbacks: list[Any] | None = None
    thread: Any = None
    compaction: Any = None
    container: Any = None
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {
            "cache_control",
            "speed",
            "user_profile_id",
            "workspace_id",
            "inference_geo",
            "context_management",
            "diagnostics",
            "betas",
            "billing_policy",
            "fallback_credit_token",
            "fallbacks",
            "thread",
            "compaction",
            "container",
        }
    )

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        return valid_text(data)

    @field_validator("system", mode="before")
    @classmethod
    def _text_system(cls, v: Any) -> Any:
        return _text_only(v, "system block", ("text",))

    @model_validator(mode="after")
    def _tools_fit(self) -> MessagesBody:
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools share a name; each tool needs its own")
        choice = self.tool_choice
        if choice is not None and choice.type == "tool" and choice.name not in names:
            known = ", ".join(names) or "none"
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among tools (known: {known})")
        if choice is not None and choice.type == "any" and not names:
            raise ValueError('tool_choice {"type": "any"} needs at least one tool in tools')
        return self


class MessagesRequest(MessagesBody):
    """POST /v1/messages"""

    max_tokens: int = Field(ge=1)  # required, as in Anthropic's API
    stop_sequences: (
        Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOPS)]
        | None
    ) = None
    temperature: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    ignore_eos: bool = False  # edgeinfer's extension, as in chat completions: run to max_tokens (benchmarks)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    IGNORED: ClassVar[frozenset[str]] = MessagesBody.IGNORED | {"metadata", "service_tier"}


class CountTokensRequest(MessagesBody):
    """POST /v1/messages/count_tokens: the messages, system and tools whose prompt is counted."""
