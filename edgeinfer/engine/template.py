"""Chat messages to a prompt, through the model's own Jinja chat template from its GGUF.

The templates are written for the environment Hugging Face's transformers renders them in, so the prompt
is the one the model was trained on only in that environment: a sandbox with trim_blocks and lstrip_blocks,
the loopcontrols extension, a `tojson` that writes JSON as is (no HTML escaping, non-ASCII kept),
`raise_exception`, `strftime_now`, and the `{% generation %}` block (its content, as written).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgeinfer.errors import ModelLoadError, RequestError
from edgeinfer.llamacpp import Model

ROLES = ("system", "user", "assistant", "tool")

# Used only when a model ships no template: the layout whose turn markers its vocabulary holds as special tokens
# (a base model was trained with them even if its GGUF names no template), else ChatML written as text.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Gemma's turns: user and model, a system prompt at the head of the first user turn.
GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% set ns.system = ns.system + m.content + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{% if m.role != 'assistant' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}{{ m.content }}<end_of_turn>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# (the turn's opening marker, its end marker, the layout), most common first.
FALLBACKS = (
    ("<|im_start|>", "<|im_end|>", CHATML),
    ("<start_of_turn>", "<end_of_turn>", GEMMA),
    ("<|start_header_id|>", "<|eot_id|>", LLAMA3),
)

# The names a message's reasoning may come under; templates read the first (Qwen3, DeepSeek-R1) or
# `thinking` (gpt-oss), so a message carrying one carries both, as transformers passes it.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _Refused(jinja2.TemplateError):
    """The template called raise_exception: its message is meant for the user as is."""


def _raise_exception(message: str) -> None:
    raise _Refused(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own filter is for HTML: it writes <, >, & and ' as \u003c and so on, and escapes non-ASCII.
    # A prompt is not HTML; the model was trained on what json.dumps writes with these arguments.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks the answer for training masks; renders as its content."""

    tags = {"generation"}  # noqa: RUF012 -- Jinja's Extension declares it so

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        # A call block, so that what the body sets stays inside it, as in transformers.
        return nodes.CallBlock(self.call_method("_content"), [], [], body).set_lineno(lineno)

    def _content(self, caller: Any) -> str:
        return caller()


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without the type itself (its attributes) in reach."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    @staticmethod
    def fromkeys(keys: Any, value: Any = None) -> dict[Any, Any]:
        return dict.fromkeys(keys, value)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace, refusing names that begin with an underscore (a way into Python's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # `self` may be a name in kwargs, as in Jinja's
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.sandbox.SecurityError(f"a namespace attribute may not begin with an underscore ({name!r})")


def environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment chat templates are written for (the one transformers renders them in)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


class ChatTemplate:
    """Renders a list of {role, content} messages with a model's template."""

    def __init__(self, source: str | None, bos: str = "", eos: str = "", stops: tuple[str, ...] = ()) -> None:
        self.source = source or CHATML
        self.fallback = False  # the model carries no template: a layout chosen from its vocabulary (fallback())
        # Text that ends the answer though the vocabulary does not end generation on it: the end marker of a
        # fallback layout written as text (added to every request's stop strings).
        self.stops = stops
        try:
            self._tmpl = environment().from_string(self.source)
        except jinja2.TemplateError as e:
            raise ModelLoadError(f"the model's chat template does not parse ({e})") from None
        self.bos, self.eos = bos, eos

    @classmethod
    def for_model(cls, model: Model) -> ChatTemplate:
        """The template a model carries in its GGUF (ChatML if none), with its BOS and EOS texts."""
        vocab = model.vocab

        def text(token: int) -> str:
            return vocab.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

        bos, eos = text(vocab.bos), text(vocab.eos)
        source = model.chat_template()
        if source:
            return cls(source, bos=bos, eos=eos)
        layout, stops = fallback(vocab)
        template = cls(layout, bos=bos, eos=eos, stops=stops)
        template.fallback = True
        return template

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[Any] | None = None
    ) -> str:
        """The prompt text. A system message after the first (Claude Code sends one) is taken in place; a template
        that refuses it there gets it at the head of the next user message instead."""
        check_messages(messages)
        try:
            return self._render(messages, add_generation_prompt, tools)
        except RequestError:
            folded = fold_system(messages)
            if folded is messages:
                raise
            return self._render(folded, add_generation_prompt, tools)

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[Any] | None) -> str:
        try:
            return self._tmpl.render(
                messages=template_messages(messages),
                tools=tools or None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos,
                eos_token=self.eos,
            )
        except _Refused as e:
            raise RequestError(f"the model's chat template refused these messages: {e.message}", "messages") from None
        except Exception as e:  # the template is code: what it raises is its refusal
            # Python errors from inside the sandbox (a string's .items(), a missing key, an unsafe access):
            # the request's messages are not in the shape this template was written for.
            raise RequestError(
                f"the model's chat template refused these messages: it failed with {type(e).__name__}: {e}; "
                "send the messages in the shape this model's template accepts",
                "messages",
            ) from None

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the template writes a request's tools into the prompt itself (many do not)."""
        probe = [{"role": "user", "content": "hi"}]
        tool = {"type": "function", "function": {"name": "probe_tool_x", "description": "", "parameters": {}}}
        try:
            return "probe_tool_x" in self.render(probe, tools=[tool])
        except RequestError:
            return False


def fallback(vocab: Any) -> tuple[str, tuple[str, ...]]:
    """The layout for a model whose GGUF carries no template, and the stop strings it needs: the first layout
    whose markers are special tokens of the vocabulary (its end marker a stop unless the vocabulary ends
    generation on it), else ChatML as text with <|im_end|> a stop string."""
    for opening, end, layout in FALLBACKS:
        start, stop = vocab.special_token(opening), vocab.special_token(end)
        if start is not None and stop is not None:
            return layout, () if vocab.is_eog(stop) else (end,)
    return CHATML, ("<|im_end|>",)


def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each system message after the first message put at the head of the user message that follows it (or,
    with none after it, of the one before); messages itself when there is none such."""
    if not any(m.get("role") == "system" for m in messages[1:]):
        return messages
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for i, m in enumerate(messages):
        if i > 0 and m.get("role") == "system":
            pending.append(m.get("content") or "")
            continue
        if pending and m.get("role") == "user":
            m = {**m, "content": "\n\n".join([*pending, m.get("content") or ""])}
            pending = []
        out.append(m)
    if pending:
        users = [i for i, m in enumerate(out) if m.get("role") == "user"]
        at = users[-1] if users else len(out) - 1
        out[at] = {**out[at], "content": "\n\n".join([out[at].get("content") or "", *pending])}
    return out


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to a template: keys whose value is None left out (templates test
    whether a key is defined, and would write "None"), and reasoning under each of its names."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in REASONING_FIELDS if k in m), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def check_messages(messages: list[dict[str, Any]]) -> None:
    if not messages:
        raise RequestError("messages is empty; send at least one message", "messages")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}].role is {m.get('role')!r}; use one of {', '.join(ROLES)}", "messages")
        if not isinstance(m.get("content"), str):
            raise RequestError(f"messages[{i}].content must be a string", "messages")
