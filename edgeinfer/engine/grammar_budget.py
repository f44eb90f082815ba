"""Closing a constrained answer within its budget: a short way the grammar lets it end, found on a copy.

A small model at temperature 0.8 can write inside a JSON string until max_tokens cuts it, and
a cut answer does not parse. Near the end of a stream's budget its guide asks, after each
sampled token, whether the structure can still be closed in the tokens left; when it cannot,
the token is refused and the stream takes the first token of its closing path instead.

The closing path is greedy, on a deep copy of the stream's matcher: at each state, among the
tokens the grammar allows, the one that ranks best for ending soon (tokens made only of `"`,
`]` and `}`; then whole short values: `0`, `""`, `null`, `false`, `[]`, `{}`; then letters and
digits, longest first, for a pattern or a minimum length; then other punctuation; whitespace
and escapes last), followed by the tokens the grammar forces after it, until the matcher
accepts. Its length counts every token, chosen and forced, as the stream's budget does (the
end of text is not counted: the stream ends on the budget with its text complete). Greedy
is not always the shortest, but it is deterministic, so following it one token at a time
gives the same path again, and the guide keeps it instead of computing it each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

WINDOW = 64  # tokens left at which a guide starts to check its samples (a path costs ~0.1 ms per token)
TOP = 48  # best-ranked tokens tested one by one before the whole vocabulary
SEARCH = 256  # tokens at most in a path computed when none is known (longer: no path, the stream runs free)

CLOSERS = frozenset(b'"]}')
VALUES = (b"null", b"false", b"true", b"[]", b"{}")  # whole short JSON values, best first
ALNUM = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
WHITESPACE = frozenset(b" \t\r\n")


def rank_of(piece: bytes) -> int:
    """How well a token of this text ends a structure soon; -1 never (special tokens, empty text).

    The grammar tells where a token may go, not what it does there: `]]` inside a string is
    text, and after a value it closes two arrays. So the ranks follow the states: where a `"`
    is allowed the stream is in a string (or before a value, where `""` is one whole value),
    and a token starting with `"` ends the string; where none is, `]` and `}` close; a whole
    short value fills a value's place; and where only a pattern or a minimum length is left,
    the longest letters and digits fill it in the fewest tokens. A leading space is the
    separator the grammar asks for before a value (` ""`, ` 0`), so tokens rank by what follows it."""
    if not piece:
        return -1
    n = min(len(piece), 30)
    text = piece.lstrip(b" ")
    if not text:
        return 500  # the separator alone, where no token carries it with a value
    if text == b'""':
        return 9000 - (text != piece)
    if text[:1] == b'"' and all(b in CLOSERS for b in text):
        return 8000 + n  # `"}}` ends a string and two objects
    if all(b in CLOSERS for b in text):
        return 7000 + n
    if text in VALUES:
        return 6000 - 10 * VALUES.index(text) - (text != piece)
    if text[:1] == b",":
        return 5000 + n  # the next item or key (a key is forced after it)
    if text.isdigit():
        return 4500 if text == b"1" else 4490 if text == b"0" else 4000  # after `,`: else numbers run to their bound
    if all(b in ALNUM for b in text):
        return 3000 + n
    if all(b in WHITESPACE for b in text):
        return 100  # never progress on its own
    if text[:1] in (b"-", b"+"):
        return 400  # a sign: a number that must go on
    if b"\\" in text or b"{" in text or b"[" in text:
        return 1000 + n  # opens an escape or a structure: only where nothing else may come
    return 2000 + n  # `:` `.` and the like


@dataclass(slots=True)
class Step:
    """One token of a closing path, chosen there, and the number of tokens it costs (it and those forced after it)."""

    token: int
    cost: int


# Closing tags of the tool-call formats that write values as raw text (Qwen3-Coder's XML), innermost first.
# Inside such a value every token is text, a quote too, so ranking tokens cannot end it: the tag, written
# whole, does. Tried only when the ranked path finds no end.
CLOSING_TAGS = ("</parameter>", "\n</parameter>", "</function>", "\n</function>", "</tool_call>", "\n</tool_call>")


class Closer:
    """Closing paths over one vocabulary: each token's rank, computed once per model.

    tags: the token ids of each of CLOSING_TAGS in this vocabulary."""

    def __init__(self, pieces: list[bytes], tags: list[list[int]] | None = None) -> None:
        self.tags = [t for t in tags or [] if t]
        self.n_vocab = len(pieces)
        ranks = np.array([rank_of(p) for p in pieces], dtype=np.int32)
        # Token ids best first, the never-chosen left out: the first allowed one in this order is the choice.
        self.order = np.argsort(-ranks, kind="stable")[: int((ranks >= 0).sum())].astype(np.int32)
        self._top = [int(t) for t in self.order[:TOP]]

    def best(self, matcher: Any, mask: np.ndarray) -> int | None:
        """The best-ranked token the matcher allows now (its mask computed into `mask`); None when none is."""
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if matcher.is_error():
            return None
        # Most states allow one of the first few (a quote, a bracket, a short value): test their bits alone.
        for t in self._top:
            if (mask[t >> 5] >> (t & 31)) & 1:
                return t
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[self.order]
        i = int(bits.argmax())
        return int(self.order[i]) if bits[i] else None

    def path(self, matcher: Any, limit: int) -> list[Step] | None:
        """The greedy closing path from the matcher's state, if it costs at most `limit` tokens; else None.

        Spends the matcher (pass a deep copy). An accepting state has the empty path. When the ranked
        path finds no end, a second one first writes a closing tag wherever the grammar takes one whole."""
        spare = matcher.deep_copy() if self.tags else None
        steps = self._path(matcher, limit, tags=False)
        if steps is None and spare is not None:
            steps = self._path(spare, limit, tags=True)
        return steps

    def _path(self, matcher: Any, limit: int, tags: bool) -> list[Step] | None:
        steps: list[Step] = []
        used = 0
        mask = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)  # per call: paths are found on several threads
        while not matcher.is_accepting():
            chosen = next((t for t in self.tags if matcher.validate_tokens(t) == len(t)), None) if tags else None
            if chosen is None:
                best = self.best(matcher, mask)
                if best is None:
                    return None
                chosen = [best]
            # A tag's tokens one by one, as the stream will take them; once the grammar forces tokens of its
            # own (the tag's rest, in its own tokens), the loop decides again from there.
            for token in chosen:
                if used >= limit or not matcher.consume_token(token):
                    return None
                forced = matcher.compute_ff_tokens()
                if forced and not matcher.consume_tokens(forced):
                    return None
                used += 1 + len(forced)
                if used > limit:
                    return None
                steps.append(Step(token, 1 + len(forced)))
                if forced:
                    break
        return steps


def cost(path: list[Step]) -> int:
    return sum(s.cost for s in path)
