"""Reasoning models' thinking: where a template opens a thinking block, splitting it from the answer, bounding it.

A model that reasons writes its thinking between two tags (`<think>` ... `</think>` for Qwen3,
QwQ and the DeepSeek-R1 distills), then its answer. Its chat template either opens the block
itself at the end of the prompt (QwQ's generation prompt ends in `<think>\\n`), or leaves the
model to open it. ReasoningSplit turns the streamed text into (reasoning, content) pieces as they
come, holding back only what may be part of a tag; `split` does the same for a whole answer, so a
streamed answer and a whole one split alike. `with_thinking` wraps the answer's grammar (or none)
in one that lets the model think first, and with a budget of N tokens closes the block when N are
spent (llguidance's `max_tokens` on the thinking's lexeme; the close tag is then forced).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from edgeinfer.options import Grammar

WHITESPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class Thinking:
    """How a model marks its thinking: the tags around the block."""

    open: str = "<think>"
    close: str = "</think>"


# The tag pairs of the families that think, as their published templates write them: Qwen3/QwQ/DeepSeek-R1
# distills and most others, ByteDance Seed-OSS, Mistral's Magistral, Cohere Command A/R7B, Kimi's ◁think▷.
KNOWN = (
    Thinking(),
    Thinking("<seed:think>", "</seed:think>"),
    Thinking("[THINK]", "[/THINK]"),
    Thinking("<|START_THINKING|>", "<|END_THINKING|>"),
    Thinking("◁think▷", "◁/think▷"),
)

# reasoning_effort (chat completions; Responses' reasoning.effort) as a thinking budget in tokens, the
# request's own reasoning_budget. A local model's context is small (8192 cells shared by 8 streams by
# default), so "high" is 4096, not the tens of thousands a hosted model thinks for.
EFFORT_BUDGET: dict[str, int] = {
    "none": 0,
    "minimal": 64,
    "low": 256,
    "medium": 1024,
    "high": 4096,
    "xhigh": 16384,
}


def thinking_of(template_source: str) -> Thinking | None:
    """The tags this chat template's model thinks in; None when the template shows no thinking block.

    A template that knows thinking names its close tag: to open the block in the generation prompt,
    or to cut earlier turns' thinking out of the history (the DeepSeek-R1 distills do only that)."""
    for tags in KNOWN:
        if tags.close in template_source:
            return tags
    return None


def thinking_for(reasoning_format: str, template_source: str) -> Thinking | None:
    """The tags answers are split at, by --reasoning-format: none leaves the thinking in the content;
    auto splits where the template thinks; deepseek splits always (`<think>` tags when the template names none)."""
    if reasoning_format == "none":
        return None
    tags = thinking_of(template_source)
    if tags is None and reasoning_format == "deepseek":
        return Thinking()
    return tags


def budget_of(requested: int | None, server_default: int) -> int | None:
    """The thinking budget in tokens a request gets: its own (None: the server's --reasoning-budget); -1 and
    None mean no bound."""
    budget = server_default if requested is None else requested
    return None if budget < 0 else budget


def opened(prompt_text: str, thinking: Thinking) -> bool:
    """The rendered prompt ends inside an open thinking block (the generation prompt opened it)."""
    at = prompt_text.rfind(thinking.open)
    return at >= 0 and prompt_text.find(thinking.close, at + len(thinking.open)) < 0


def _partial(text: str, tag: str) -> int:
    """How many characters at text's end are a proper beginning of tag (they may still become it)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplit:
    """One streamed choice's text split into thinking and answer as it comes.

    Before any answer text the model may open the block itself (after whitespace); once the answer
    has begun, or the block has closed, everything else is content (a later tag is the answer's).
    Whitespace around the thinking is dropped (the newline after the open tag, the one before the close,
    the blank lines between the close and the answer), as a whole answer's split drops it."""

    def __init__(self, thinking: Thinking, started: bool) -> None:
        self.thinking = thinking
        self.started = started
        self.inside = started  # within the block now
        self.decided = started  # known whether the answer opens a block (before: whitespace or part of the tag)
        self.fresh = True  # nothing of the thinking emitted yet: its leading whitespace is dropped
        self.after = False  # the block has closed and no content has come yet: whitespace is dropped
        self.buf = ""  # text held back

    @property
    def thinking_now(self) -> bool:
        """Whether the text fed next belongs to the thinking (so far as is known)."""
        return self.inside

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of this text that is safe to emit now; a possible tag is held back."""
        self.buf += text
        reasoning, content = "", ""
        while True:
            if not self.decided:
                head = self.buf.lstrip(WHITESPACE)
                if head.startswith(self.thinking.open):
                    self.buf = head[len(self.thinking.open) :]
                    self.inside = self.decided = True
                    continue
                if head == "" or self.thinking.open.startswith(head):
                    return reasoning, content  # whitespace, or the tag's beginning: wait
                self.decided = True
            if self.inside:
                at = self.buf.find(self.thinking.close)
                if at >= 0:
                    reasoning += self._thought(self.buf[:at].rstrip(WHITESPACE))
                    self.buf = self.buf[at + len(self.thinking.close) :]
                    self.inside, self.after = False, True
                    continue
                keep = _partial(self.buf, self.thinking.close)
                body = self.buf[: len(self.buf) - keep]
                keep += len(body) - len(body.rstrip(WHITESPACE))  # whitespace may be the close's
                reasoning += self._thought(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                return reasoning, content
            if self.after:
                self.buf = self.buf.lstrip(WHITESPACE)
                if not self.buf:
                    return reasoning, content
                self.after = False
            content += self.buf
            self.buf = ""
            return reasoning, content

    def _thought(self, text: str) -> str:
        if self.fresh:
            text = text.lstrip(WHITESPACE)
            self.fresh = not text
        return text

    def end(self) -> tuple[str, str]:
        """What was held back, at the end of the stream: a block never closed keeps its text as thinking
        (cut by max_tokens); a tag begun and never finished is text of its side."""
        held, self.buf = self.buf, ""
        if self.inside:
            return self._thought(held.rstrip(WHITESPACE)), ""
        if self.after:
            return "", ""
        return "", held


def split(text: str, thinking: Thinking, started: bool) -> tuple[str | None, str]:
    """A whole answer's (thinking, answer); thinking None when there is none. The same as streaming it."""
    s = ReasoningSplit(thinking, started)
    r1, c1 = s.feed(text)
    r2, c2 = s.end()
    return (r1 + r2) or None, c1 + c2


# --- the grammar --------------------------------------------------------------


def _lark_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _rx(s: str) -> str:
    """s as a literal inside Lark's /.../."""
    import llguidance

    return llguidance.regex_to_lark(re.escape(s), "")


def answer_rule(grammar: Grammar | None, name: str = "answer") -> str:
    """A Lark rule `name` for an answer held to grammar (free text when None), for embedding in a larger grammar:
    a JSON Schema as `%json` (closed, with the compact separators edgeinfer's schemas are decoded with), a Lark
    grammar as `%lark { ... }` (its own rule names apart), a regex as a terminal."""
    if grammar is None:
        return f"{name}: /(?s:.*)/"
    if grammar.kind == "json_schema":
        from edgeinfer.engine.grammar import JSON_OPTIONS, closed, parse_schema

        schema = closed(parse_schema(grammar.source, grammar.origin))
        if schema is True:
            schema = {}
        elif schema is False:
            schema = {"not": {}}
        return f"{name}: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}"
    if grammar.kind == "lark":
        return f"{name}: %lark {{\n{grammar.source}\n}}"
    import llguidance

    return f"{name}: /{llguidance.regex_to_lark(grammar.source)}/"


def with_thinking(grammar: Grammar | None, thinking: Thinking, budget: int | None, started: bool) -> Grammar | None:
    """A grammar that first lets the model think, then holds the answer to `grammar` (free when None).

    budget: tokens of thinking at most (None: no bound; 0: no thinking, the block closed at once). At the
    budget llguidance ends the thinking's lexeme and the close tag is forced. started: the prompt opened the
    block; else the model may open it first (or answer without thinking). None when nothing needs holding:
    no grammar and no budget.

    The thinking is one lexeme, so that max_tokens counts all of it: either text without the close tag
    (cut at the budget, then the tag forced) or text up to and including the first close tag (the model
    closed the block itself); both are matched together until one of them is ruled out."""
    if grammar is None and budget is None:
        return None
    close = thinking.close
    attrs = f"[max_tokens={budget}]" if budget else ""
    lines = [
        f"CLOSE: {_lark_str(close)}",
        f"closed{attrs}: THINK_CLOSED",
        f"THINK_CLOSED: /(?s:.*){_rx(close)}/ & ~/(?s:.*){_rx(close)}(?s:.+)/",
    ]
    if budget is None:
        lines.insert(1, "thought: closed")
    else:
        lines[1:1] = [
            "thought: cut CLOSE | closed",
            f"cut{attrs}: THINK_OPEN",
            f"THINK_OPEN: /(?s:.*)/ & ~/(?s:.*){_rx(close)}(?s:.*)/",
        ]
    if grammar is None:
        lines += [
            "after: answer",
            "answer: /(?s:.*)/",
            # A free answer that does not open a block of its own (which would think past the budget).
            "plain: PLAIN",
            f"PLAIN: /(?s:.*)/ & ~/[ \\t\\r\\n]*{_rx(thinking.open)}(?s:.*)/",
        ]
    else:  # a JSON answer after blank lines: its compact form allows no leading whitespace
        lines += ["after: GAP? answer", "GAP: /[ \\t\\r\\n]{1,8}/", answer_rule(grammar), "plain: answer"]
    if started:
        start = "start: CLOSE after" if budget == 0 else "start: thought after"
    else:
        start = "start: plain" if budget == 0 else "start: plain | OPEN thought after"
        lines.append(f"OPEN: /[ \\t\\r\\n]*{_rx(thinking.open)}/")
    source = "\n".join([start, *lines, ""])
    origin = grammar.origin if grammar is not None else "reasoning_budget"
    # model_construct: the answer's own grammar was checked; the wrapper may take it past the size bound.
    return Grammar.model_construct(kind="lark", source=source, origin=origin)


@dataclass(frozen=True, slots=True)
class ThinkingPlan:
    """How one request's answer thinks: the grammar with the thinking block first, and how the answer is read."""

    grammar: Grammar | None  # the request's grammar, after a thinking block (within the budget) where the model thinks
    shown: Thinking | None  # the tags the answer is split at (None: the thinking stays in the content)
    started: bool  # the prompt opened the block


def plan(template_source: str, prompt_text: str, grammar: Grammar | None, budget: int | None, fmt: str) -> ThinkingPlan:
    """The server's and `edgeinfer chat`'s one thinking set-up: where the template opens a block (or the model
    may), the grammar lets it think first, within budget; the answer is split at the tags unless fmt is none."""
    tags = thinking_of(template_source)
    started = tags is not None and opened(prompt_text, tags)
    if tags is not None:
        grammar = with_thinking(grammar, tags, budget, started)
    return ThinkingPlan(grammar, thinking_for(fmt, template_source), started)
