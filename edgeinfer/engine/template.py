"""Chat messages to a prompt, through the model's own Jinja chat template from its GGUF."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgeinfer.errors import ModelLoadError, RequestError
from edgeinfer.llamacpp import Model

ROLES = ("system", "user", "assistant", "tool")

# Used only when a model ships no template: the ChatML layout most small models know.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise(message: str) -> None:
    raise RequestError(f"the chat template refused the messages: {message}", "messages")


class ChatTemplate:
    """Renders a list of {role, content} messages with a model's template."""

    def __init__(self, source: str | None, bos: str = "", eos: str = "") -> None:
        self.is_fallback = source is None
        self.source = source or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._tmpl = env.from_string(self.source)
        except jinja2.TemplateError as e:
            raise ModelLoadError(f"the model's chat template does not parse ({e})") from None
        self.bos, self.eos = bos, eos

    @classmethod
    def for_model(cls, model: Model) -> ChatTemplate:
        """The template a model carries in its GGUF (ChatML if none), with its BOS and EOS texts."""
        vocab = model.vocab

        def text(token: int) -> str:
            return vocab.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

        return cls(model.chat_template(), bos=text(vocab.bos), eos=text(vocab.eos))

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[Any] | None = None
    ) -> str:
        check_messages(messages)
        try:
            return self._tmpl.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos,
                eos_token=self.eos,
                tools=tools or None,
            )
        except jinja2.TemplateError as e:
            raise RequestError(f"the chat template failed on these messages ({e})", "messages") from None

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the template writes a request's tools into the prompt itself (many do not)."""
        probe = [{"role": "user", "content": "hi"}]
        tool = {"type": "function", "function": {"name": "probe_tool_x", "description": "", "parameters": {}}}
        try:
            return "probe_tool_x" in self.render(probe, tools=[tool])
        except RequestError:
            return False


def check_messages(messages: list[dict[str, Any]]) -> None:
    if not messages:
        raise RequestError("messages is empty; send at least one message", "messages")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}].role is {m.get('role')!r}; use one of {', '.join(ROLES)}", "messages")
        if not isinstance(m.get("content"), str):
            raise RequestError(f"messages[{i}].content must be a string", "messages")
