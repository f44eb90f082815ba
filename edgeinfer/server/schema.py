"""The wire schema: OpenAI-compatible request bodies, validated strictly (unknown fields are errors)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from edgeinfer.options import SAMPLING_FIELDS, SamplingFields, SamplingParams

# Every list in a request is bounded, so that no body within the size cap (--max-body-mb)
# makes the server loop over millions of items. stop is bounded in edgeinfer.options.
MAX_MESSAGES = 4096  # messages per chat request
MAX_PARTS = 256  # content parts per message
MAX_PROMPT_IDS = 262_144  # token ids in a completions prompt; the context check comes later


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(max_length=MAX_PARTS)] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(SamplingFields):
    """Fields shared by both endpoints. The sampling settings, their ranges and defaults are
    edgeinfer.options.SamplingFields' own; errors name the field as the client sent it."""

    model: str = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        where = _surrogate_at(data, "")
        if where:
            raise PydanticCustomError(
                "lone_surrogate",
                f"{where} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape); send valid Unicode",
            )
        return data

    def sampling(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """The engine's SamplingParams (already checked: the fields are the same declarations)."""
        values = self.model_dump(include=set(SAMPLING_FIELDS))
        return SamplingParams.model_construct(**values, max_tokens=max_tokens, logprobs=logprobs)


class ChatRequest(_Sampling):
    """POST /v1/chat/completions"""

    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def to_sampling(self) -> SamplingParams:
        top = None
        if self.logprobs:
            top = self.top_logprobs or 0
        return self.sampling(self.max_completion_tokens or self.max_tokens, top)

    def chat_messages(self) -> list[dict[str, Any]]:
        # "developer" is OpenAI's newer name for the system role.
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


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
