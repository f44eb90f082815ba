"""A call's JSON read as it streams: its name once written whole, its arguments' text as it grows.

The families that write a call as a JSON object (Hermes and the template-less Generic) hand the
text from the object's opening brace to a Scanner, which reads each character once, left to
right, as the text grows, without parsing values: it knows where it stands (inside a string or
not, how deep), which key of the call object it is in, and where the arguments' value begins and
ends. Arguments written as an object stream as they are written; arguments written as JSON text
(a string, as some models do) do not, and come whole once the call closes.

What streams is `tidy`'s form of the arguments: the model's text with the whitespace between
tokens dropped and one space after each `:` and `,` (json.dumps's separators), strings and
numbers as written. It only grows as the text grows, so what was sent is always a prefix of the
whole, and the whole call's arguments are the same text, streamed or not.
"""

from __future__ import annotations

import json

ARG_KEYS = ("arguments", "parameters")


class Scanner:
    """One call object's text, read from its opening brace as far as the text has grown."""

    def __init__(self, start: int, arg_keys: tuple[str, ...] = ARG_KEYS) -> None:
        self.arg_keys = arg_keys
        self.name: str | None = None  # once its string is complete
        self.args_start = -1  # where the arguments' value begins in the text (-1: not yet)
        self.args_end = -1  # just past it, once complete
        self.args_object = False  # the value is an object (streamable as written)
        self.end = -1  # just past the call object's closing brace, once closed
        self._i = start
        self._depth = 0
        self._key: str | None = None  # the last key read at depth 1
        self._expect_key = False
        self._string_start = -1
        self._value_key: str | None = None  # the key whose value is being read at depth 1

    @property
    def done(self) -> bool:
        return self.end >= 0

    def _in_args(self) -> bool:
        return self._value_key in self.arg_keys

    def feed(self, text: str) -> Scanner:
        """Read on to the end of text (the same text as before, grown)."""
        i, n = self._i, len(text)
        while i < n and self.end < 0:
            c = text[i]
            if self._string_start >= 0:  # inside a string
                if c == "\\":
                    i += 2
                    continue
                if c == '"':
                    self._close_string(text[self._string_start : i + 1], i)
                i += 1
                continue
            depth = self._depth
            if c == '"':
                self._string_start = i
                if depth == 1 and not self._expect_key and self._in_args() and self.args_start < 0:
                    self.args_start = i
            elif c in "{[":
                if depth == 1 and self._in_args() and self.args_start < 0:
                    self.args_start, self.args_object = i, c == "{"
                self._depth += 1
                if self._depth == 1:
                    self._expect_key = True
            elif c in "}]":
                self._depth -= 1
                if self._depth == 1 and self._in_args() and self.args_start >= 0 and self.args_end < 0:
                    self.args_end = i + 1
                if self._depth == 0:
                    if self.args_start >= 0 and self.args_end < 0:
                        self.args_end = i  # a bare value (a number, null) ended with the object
                    self.end = i + 1
            elif c == ":" and depth == 1:
                self._value_key = self._key
            elif c == "," and depth == 1:
                if self._in_args() and self.args_start >= 0 and self.args_end < 0:
                    self.args_end = i  # a bare value (a number, null) ended
                self._expect_key, self._value_key = True, None
            elif depth == 1 and self._in_args() and self.args_start < 0 and not c.isspace():
                self.args_start = i  # a bare value begins
            i += 1
        self._i = i
        return self

    def _close_string(self, raw: str, i: int) -> None:
        self._string_start = -1
        if self._depth != 1:
            return
        if self._expect_key:
            self._key = _loads(raw)
            self._expect_key = False
        elif self._value_key == "name" and isinstance(value := _loads(raw), str):
            self.name = value
        if self._in_args() and self.args_start >= 0 and self.args_end < 0:
            self.args_end = i + 1  # arguments written as a string end with it


class Tidy:
    """The model's JSON text in one fixed form, written as it grows (see the module's docstring)."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> str:
        """The tidy form of text, the next piece of the JSON."""
        out: list[str] = []
        for c in text:
            if self._in_string:
                out.append(c)
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
                out.append(c)
            elif c == ",":
                out.append(", ")
            elif c == ":":
                out.append(": ")
            elif not c.isspace():
                out.append(c)
        piece = "".join(out)
        self.out.append(piece)
        return piece


def tidy(text: str) -> str:
    """The whole of a JSON text in Tidy's form."""
    return Tidy().feed(text)


def _loads(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None
