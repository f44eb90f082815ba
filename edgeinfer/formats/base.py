"""The protocol every model family's tool-call format follows, and what the families share.

A format is one family's way of writing tool calls: how its chat template takes the tools and
the call history, the grammar that holds the model to its call syntax and each tool's schema,
and the parser that reads the calls back from the text, whole or as it streams. One object per
request (it knows the request's tools); the server, `edgeinfer chat` and `generate` use the
same objects. select.py picks the family from the model's chat template.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgeinfer.engine.grammar import JSON_OPTIONS, closed
from edgeinfer.formats.partial import Scanner, Tidy

MAX_CALLS = 8  # calls in one answer (a small model left free repeats one call until max_tokens)


@dataclass(slots=True)
class Call:
    """One call read from the model's text."""

    name: str
    arguments: str  # JSON text of an object
    id: str | None = None  # the id the model wrote, where its format has one


@dataclass(slots=True)
class CallPiece:
    """A call being written: the first piece of a call has its name (arguments ""), the next ones each the
    next text of its arguments. The whole Call follows once complete, its arguments these pieces joined."""

    call_index: int  # 0, 1, ... within the answer
    name: str | None
    arguments: str


@dataclass(slots=True)
class ToolSpec:
    """What a format needs of one offered tool."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})


class ToolFormat:
    """One family's tool-call format. Subclasses set name and opening and override what differs."""

    name: ClassVar[str] = ""
    opening: ClassVar[str] = ""  # the text that begins the calls, where the family has one
    native: ClassVar[bool] = True  # False: the template knows no tools; they are described in a system message
    # The texts of the call syntax that a vocabulary may hold as one special token (the engine shows those in output).
    markers: ClassVar[tuple[str, ...]] = ()
    # The keys a call object's arguments come under, where its arguments stream (next_object).
    arg_keys: ClassVar[tuple[str, ...]] = ("arguments",)

    def __init__(self, tools: list[ToolSpec] | None = None) -> None:
        self.tools = tools or []
        self.seen_ids: set[str] = set()  # the call ids of the request's history, as the template got them
        # The special token a text is in the model's vocabulary (Vocab.special_token); by default none is.
        self.token_of: Callable[[str], int | None] = _plain_text

    def call_id(self, call: Call) -> str:
        """The id a call goes out with: the model's own, unless it copied one from the history (then a new one)."""
        return call.id if call.id and call.id not in self.seen_ids else self.new_id()

    @classmethod
    def detect(cls, template: str) -> bool:
        """Whether this chat template (its Jinja source) was written for this family."""
        return False

    # --- the prompt -----------------------------------------------------------

    def history_call(self, call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One entry of an assistant message's tool_calls, as this family's template reads it.

        Templates read arguments as a mapping (`arguments | tojson`, `arguments.items()`), not JSON text."""
        return {"id": self.history_id(call_id), "type": "function", "function": {"name": name, "arguments": arguments}}

    def history_id(self, call_id: str) -> str:
        """A client's call id as this family's template accepts it (the same id for a call and its result)."""
        return call_id

    def new_id(self) -> str:
        """An id for a call the model made without one."""
        return f"call_{uuid.uuid4().hex[:24]}"

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """The text the model writes for these calls."""
        raise NotImplementedError

    def write_result(self, text: str) -> str:
        """A tool's result as the model reads it where the template knows no tool role (a user turn's text)."""
        return f"<tool_response>\n{text}\n</tool_response>"

    # --- the grammar -----------------------------------------------------------

    def grammar(self, tools: list[ToolSpec], required: bool, parallel: bool, answer: str) -> str:
        """Lark source (llguidance's dialect): with required, the whole answer is calls (one unless parallel);
        otherwise `start` is `answer` (the given rule) or free text and then calls."""
        raise NotImplementedError

    def start(self, calls: str, required: bool, answer: str) -> str:
        """The grammar's `start` for calls that begin with the family's opening (`calls`: the Lark after it).

        With required, the answer is the calls. Otherwise it is `answer` (the given rule) or calls: after free
        text (an `answer: PLAIN`) up to the first opening, as a lazy lexeme that ends there (not a stop string:
        one token may hold the opening's end and the calls' first byte, and what follows a stop string in its
        token is lost to the next rule); where the vocabulary holds the opening as one special token, after
        plain text and then that token (a regex cannot take a special token)."""
        opening = self.lit(self.opening)
        if required:
            return f"start: {opening} {calls}"
        if answer.startswith("answer: PLAIN") and self.special(self.opening):
            return f"start: answer | answer {opening} {calls}\n{answer}"
        if answer.startswith("answer: PLAIN"):
            return f"start: answer | prose {calls}\nprose[lazy]: /(?s:.*){re.escape(self.opening)}/\n{answer}"
        return f"start: answer | {opening} {calls}\n{answer}"  # a response_format answer, or calls

    def lit(self, *texts: str) -> str:
        """Lark for these texts in a row: one that is a special token of the vocabulary as llguidance's `<[id]>`
        (a quoted string matches text tokens only, never the token the model was trained to write), the others as
        one string literal each run."""
        parts: list[str] = []
        plain = ""
        for text in texts:
            token = self.token_of(text)
            if token is None:
                plain += text
                continue
            if plain:
                parts.append(lark_str(plain))
                plain = ""
            parts.append(f"<[{token}]>")
        if plain or not parts:
            parts.append(lark_str(plain))
        return " ".join(parts)

    def special(self, text: str) -> bool:
        """Whether text is one special token of the vocabulary (a regex cannot match it: grammars name it apart)."""
        return self.token_of(text) is not None

    def answer_rule(self, schema: Any | None) -> str:
        """The rule `answer`: an answer without calls, the response_format's JSON when there is one."""
        if schema is not None:
            if isinstance(schema, dict):
                schema = closed({**schema, "x-guidance": JSON_OPTIONS})
            return f"answer: %json {json.dumps(schema)}"
        if not self.opening:
            return "answer: /(?s:.*)/"
        return f"answer: PLAIN\nPLAIN: /(?s:.*)/ & ~/(?s:.*{_regex_escape(self.opening)}.*)/"

    # --- the answer ------------------------------------------------------------

    def parse(self, text: str, final: bool) -> tuple[str | None, list[Call]]:
        """(the text before the calls, stripped, None when empty; the complete calls). No call: (text, []).

        final=False while streaming: text may end inside a call, and only complete calls count."""
        raise NotImplementedError

    def next_object(self, text: str, after: int) -> int:
        """Where the next call object ("{") begins in text at or after `after`, for a family whose calls'
        arguments stream as they are written; -1 when none has begun (yet), and always for a family whose
        calls come whole once complete (the default)."""
        return -1

    def opening_at(self, text: str) -> int:
        """Where the calls begin in text; -1 when they do not (yet)."""
        return text.find(self.opening) if self.opening else -1

    def held(self, text: str) -> int:
        """How many characters at the end of text may begin an opening (held back while streaming)."""
        return partial_suffix(text, self.opening)


class CallStream:
    """One streamed choice's text: content as soon as it cannot begin a call, each call's arguments as they
    are written (CallPiece, where the family streams them: `pieces` gathers them until taken), and each call
    once complete."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self.sent = 0  # characters of text given out as content
        self.in_calls = False
        self.calls = 0  # calls given out
        self.pieces: list[CallPiece] = []
        self._scanners: list[Scanner] = []  # the call objects begun, in order
        self._tidy: dict[int, Tidy] = {}  # by call index: the calls whose arguments stream
        self._fed: dict[int, int] = {}  # by call index: where in text its arguments were read to

    def feed(self, delta: str) -> tuple[str, list[Call]]:
        self.text += delta
        if self.in_calls:
            return "", self._new_calls(final=False)
        at = self.fmt.opening_at(self.text)
        if at >= 0:
            self.in_calls = True
            end = at
        else:
            end = len(self.text) - self.fmt.held(self.text)
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out, self._new_calls(final=False) if self.in_calls else []

    def end(self, text: str | None = None) -> tuple[str, list[Call]]:
        """At the end of the stream: the calls not given out yet, or, when the text held none, the text held back.

        text: the whole text, when the caller has it (the engine's Finish); it is what the parse reads."""
        if text is not None and text.startswith(self.text[: self.sent]):
            self.text = text
        calls = self._new_calls(final=True)
        if self.calls == 0 and not self._tidy:  # a call that began streaming and was cut stays a call
            out, self.sent = self.text[self.sent :], len(self.text)
            return out, []
        return "", calls

    def streamed(self, call_index: int) -> str | None:
        """The arguments' text given out in pieces for this call; None when it was not streamed."""
        t = self._tidy.get(call_index)
        return "".join(t.out) if t is not None else None

    def take_pieces(self) -> list[CallPiece]:
        out, self.pieces = self.pieces, []
        return out

    def _new_calls(self, final: bool) -> list[Call]:
        self._stream_arguments()
        _, found = self.fmt.parse(self.text, final)
        fresh = found[self.calls :]
        self.calls = max(self.calls, len(found))
        return fresh

    def _stream_arguments(self) -> None:
        """The pieces of the calls being written (each text character is read once)."""
        while True:
            if not self._scanners or self._scanners[-1].done:
                after = self._scanners[-1].end if self._scanners else 0
                at = self.fmt.next_object(self.text, after)
                if at < 0:
                    return
                self._scanners.append(Scanner(at, self.fmt.arg_keys))
            k, s = len(self._scanners) - 1, self._scanners[-1].feed(self.text)
            if s.name is not None and s.args_object and k >= self.calls:
                if k not in self._tidy:
                    self._tidy[k], self._fed[k] = Tidy(), s.args_start
                    self.pieces.append(CallPiece(k, s.name, ""))
                upto = s.args_end if s.args_end >= 0 else len(self.text)
                if piece := self._tidy[k].feed(self.text[self._fed[k] : upto]):
                    self.pieces.append(CallPiece(k, None, piece))
                self._fed[k] = upto
            if not s.done:
                return


# --- helpers the families share --------------------------------------------------


def _plain_text(text: str) -> int | None:
    return None


def lark_str(s: str) -> str:
    """s as a Lark string literal."""
    return json.dumps(s, ensure_ascii=False)


def partial_suffix(text: str, opening: str) -> int:
    """Length of the longest tail of text that is a proper beginning of opening."""
    for n in range(min(len(opening) - 1, len(text)), 0, -1):
        if opening.startswith(text[-n:]):
            return n
    return 0


def _regex_escape(s: str) -> str:
    return "".join("\\" + c if c in r"\.^$|?*+()[]{}/" else c for c in s)


def call_schema(tools: list[ToolSpec], name_key: str = "name", args_key: str = "arguments") -> dict[str, Any]:
    """The JSON Schema of one call object: {name_key: one of the tools, args_key: that tool's parameters}.

    Each tool's schema moves under $defs, its own references rewritten to follow it, so that
    `#/$defs/...` inside it still resolve."""
    defs: dict[str, Any] = {}
    options = []
    for i, t in enumerate(tools):
        key = f"tool{i}"
        defs[key] = _rebase(copy.deepcopy(t.parameters), f"#/$defs/{key}")
        options.append(
            {
                "type": "object",
                "properties": {name_key: {"const": t.name}, args_key: {"$ref": f"#/$defs/{key}"}},
                "required": [name_key, args_key],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return closed({**schema, "$defs": defs, "x-guidance": JSON_OPTIONS})


def _rebase(value: Any, base: str) -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
                value[k] = base + v[1:]
            else:
                _rebase(v, base)
    elif isinstance(value, list):
        for v in value:
            _rebase(v, base)
    return value


def json_objects(text: str, start: int) -> list[tuple[Any, int, int]]:
    """The JSON values written one after another from start (whitespace between): (value, begin, end) each."""
    decoder = json.JSONDecoder()
    out = []
    pos = start
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        out.append((obj, pos, end))
        pos = end
    return out


def call_from_json(obj: Any, keys: tuple[str, str], default: Any = None) -> Call | None:
    """A call from one JSON object the model wrote: its name, its arguments under the first of keys present
    (an object, or JSON text of one; default when neither is), and its id where it wrote one. None when
    the object is not a call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(keys[0], obj.get(keys[1], default))
    if isinstance(args, str):  # some models write the arguments as JSON text
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    call_id = obj.get("id")
    return Call(obj["name"], json.dumps(args, ensure_ascii=False), call_id if isinstance(call_id, str) else None)
