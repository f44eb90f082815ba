"""Constrained decoding: a grammar per stream, as token masks from llguidance, with forced tokens riding along.

A request's grammar (a JSON Schema, a Lark grammar in llguidance's dialect, or a regex) is
compiled once at the engine's door; a schema it cannot enforce is a RequestError naming the
keyword and where it is, never an unconstrained answer. Each stream gets its own matcher.
At each row a constrained stream samples from, its mask limits the stream's own sampler
chain to the tokens the grammar allows (llguidance computes a mask in well under a tenth
of a millisecond here, so every row is masked rather than checked first). After the
token, the tokens the grammar forces (fixed keys, closing brackets, the end of text) are
appended at once: they enter the KV cache with the stream's next decode, in the same batch
item, so a fixed key costs no step of its own. Near the end of its budget a stream is held to
what it can still close (grammar_budget.py), so an answer cut by max_tokens still parses.
"""

from __future__ import annotations

import json
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.engine import datetimes
from edgeinfer.engine.grammar_budget import CLOSING_TAGS, SEARCH, WINDOW, Closer, Step, cost
from edgeinfer.errors import RequestError
from edgeinfer.llamacpp import Context, Sampler, Vocab
from edgeinfer.options import Grammar

MAX_DEPTH = 32  # nesting of a JSON Schema
# Compact separators: one fixed way to write JSON, so that more of it is forced, and no room
# for a small model to pad an answer with whitespace until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def guidance_tokenizer(vocab: Vocab) -> Any:
    """llguidance's tokenizer over this vocabulary (about half a second: build it once per model)."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    with warnings.catch_warnings():  # it asks llama-cpp-python for each token's attributes by a deprecated name
        warnings.simplefilter("ignore", DeprecationWarning)
        return lltokenizer_from_vocab(vocab.handle())


class GrammarFailed(Exception):
    """A stream's grammar could not go on (no token allowed, or a parser limit); the stream ends with this."""


COMPILED_KEPT = 256  # grammars a model keeps compiled (an agent session uses a handful)


class Grammars:
    """Compiles requests' grammars against one vocabulary; llguidance's tokenizer is built on first use."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._tokenizer: Any = None
        self._closer: Closer | None = None
        self._shortest: dict[str, int | None] = {}  # by compiled grammar: requests repeat their schemas and tools
        self._compiled: OrderedDict[tuple[str, str], str] = OrderedDict()  # by (kind, source), least recent first
        self._lock = threading.Lock()

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = guidance_tokenizer(self.vocab)
            return self._tokenizer

    def closer(self) -> Closer:
        """The closing paths' ranks over this vocabulary (about half a second: built once per model)."""
        with self._lock:
            if self._closer is None:
                pieces = [self.vocab.piece(t) for t in range(self.vocab.n_tokens)]
                tags = [self.vocab.tokenize(t, add_special=False, parse_special=True) for t in CLOSING_TAGS]
                self._closer = Closer(pieces, tags)
            return self._closer

    def compile(self, grammar: Grammar) -> str:
        """llguidance's form of the grammar, checked; RequestError (naming its origin) when it cannot be enforced.

        Each grammar is compiled once per model: an agent sends the same tools every turn, and a request's tool
        schemas, checked one by one at the door, are checked again inside its calls' grammar."""
        key = (grammar.kind, grammar.source)
        with self._lock:
            text = self._compiled.get(key)
            if text is not None:
                self._compiled.move_to_end(key)
                return text
        text = self._compile(grammar)
        with self._lock:
            self._compiled[key] = text
            if len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return text

    def _compile(self, grammar: Grammar) -> str:
        import llguidance

        param = grammar.origin
        schema: Any = None
        if grammar.kind == "json_schema":
            schema = parse_schema(grammar.source, param)
            text = llguidance.LLMatcher.grammar_from_json_schema(closed(schema), defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        elif grammar.kind == "lark":
            text = llguidance.LLMatcher.grammar_from_lark(grammar.source)
        else:
            text = llguidance.LLMatcher.grammar_from_regex(grammar.source)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, self.tokenizer())
        if failed:
            raise RequestError(explain(messages[0] if messages else "invalid grammar", schema, grammar.kind), param)
        return text

    def shortest(self, text: str) -> int | None:
        """Tokens in the closing path of a compiled grammar from its start: what the shortest answer takes, as
        far as the greedy path knows (None: more than SEARCH). A max_tokens below it cuts every answer."""
        import llguidance

        if text not in self._shortest:
            path = self.closer().path(llguidance.LLMatcher(self.tokenizer(), text, log_level=0), SEARCH)
            if len(self._shortest) >= 256:
                self._shortest.clear()
            self._shortest[text] = None if path is None else cost(path)
        return self._shortest[text]

    def states(self, text: str, n: int) -> list[GrammarState]:
        """One grammar state (its own matcher) per stream of a request, from a compiled grammar."""
        import llguidance

        tok, closer = self.tokenizer(), self.closer()
        # Checks start WINDOW tokens before the budget, or twice the shortest answer before it when that is more.
        window = max(WINDOW, 2 * (self.shortest(text) or 0))
        first = llguidance.LLMatcher(tok, text, log_level=0)
        return [
            GrammarState(first if i == 0 else first.deep_copy(), self.vocab.n_tokens, tok.eos_token, closer, window)
            for i in range(n)
        ]


@dataclass(slots=True)
class GrammarState:
    """One stream's grammar state: the mask of its next token, and what the grammar forces after a token."""

    matcher: Any
    n_vocab: int
    eos: int
    closer: Closer | None = None  # None: never held to its budget
    window: int = WINDOW  # tokens left from which samples are checked
    bitmask: np.ndarray = field(init=False)
    forced: int = 0  # tokens appended without sampling, for stats
    path: list[Step] | None = None  # the closing path from the matcher's state, when known (near the budget)
    steered: bool = False  # a sampled token was refused for the closing path: its end is the budget's

    def __post_init__(self) -> None:
        self.bitmask = np.full((self.n_vocab + 31) // 32, -1, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows next, as booleans by token id."""
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        if self.matcher.is_error():
            raise GrammarFailed(self.matcher.get_error())
        return np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")[: self.n_vocab].astype(bool)

    def advance(self, token: int) -> list[int]:
        """Consume a sampled token; return the tokens the grammar forces after it (the end of text included)."""
        forced = self._consume(self.matcher, token)
        self.forced += len(forced)
        return forced

    def _consume(self, matcher: Any, token: int) -> list[int]:
        if token == self.eos:
            return []
        if not matcher.consume_token(token):
            raise GrammarFailed(matcher.get_error() or "the grammar refused a token")
        forced: list[int] = list(matcher.compute_ff_tokens())
        if forced and not matcher.consume_tokens(forced):
            raise GrammarFailed(matcher.get_error())
        if matcher.is_stopped():  # complete, and nothing may follow: end the stream now
            forced.append(self.eos)
        return forced

    def step(self, sample: Callable[[], int], accept: Callable[[int], None], left: int) -> list[int]:
        """The next token, then those the grammar forces; `left`: the tokens the stream may still emit.

        Far from the budget, the sampled token. Within `window` tokens of it, a sampled token after
        which the structure cannot close in the tokens left is refused (it stays in the sampler's
        penalty history), and the stream takes its closing path's first token instead; with no
        room to spare it takes that token without sampling. Each check is a closing path computed
        on a copy of the matcher, at most `left` tokens long; the one found is kept for the next."""
        if self.closer is None or left > self.window:
            self.path = None
            token = sample()
            return [token, *self.advance(token)]
        path = self.path
        if path is None:  # entering the window: where the structure stands now
            path = self.path = self.closer.path(self.matcher.deep_copy(), max(SEARCH, left))
        if path is None:  # no known way to close: the stream runs free, as a cut answer did before
            self.closer = None
            token = sample()
            return [token, *self.advance(token)]
        if cost(path) >= left:  # no room to spare
            accept(path[0].token if path else self.eos)
            return self._follow(path, steered=True)
        token = sample()
        if token == self.eos:  # the model's own end (allowed only where the structure is complete)
            return [token]
        if path and token == path[0].token:
            return self._follow(path)
        trial = self.matcher.deep_copy()
        forced = self._consume(trial, token)
        spent = 1 + len(forced) - (forced[-1:] == [self.eos])
        after = self.closer.path(trial.deep_copy(), left - spent) if spent <= left else None
        if after is None:
            accept(path[0].token if path else self.eos)
            return self._follow(path, steered=True)
        self.matcher, self.path = trial, after
        self.forced += len(forced)
        return [token, *forced]

    def _follow(self, path: list[Step], steered: bool = False) -> list[int]:
        """Take the closing path's first token (the end of text when the structure is complete)."""
        self.steered |= steered
        if not path:
            return [self.eos]
        self.path = path[1:]
        token = path[0].token
        return [token, *self.advance(token)]


def next_tokens(grammar: GrammarState | None, sampler: Sampler, ctx: Context, row: int, left: int) -> list[int]:
    """A stream's next tokens from output row `row`: the sampled one (or its closing path's, near the budget),
    then those its grammar forces (the sampler records them too). left: tokens left in the stream's budget.
    GrammarFailed when the grammar cannot go on."""
    if grammar is None:
        return [sampler.sample(ctx, row)]

    def sample() -> int:
        allowed = grammar.allowed()
        if not allowed.any():
            raise GrammarFailed("it allows no token here")
        return sampler.sample_masked(ctx, row, allowed)

    tokens = grammar.step(sample, sampler.accept, left)
    for t in tokens[1:]:
        sampler.accept(t)
    return tokens


# --- JSON Schema at the door --------------------------------------------------


def parse_schema(source: str, param: str) -> Any:
    """The schema as JSON, checked against the JSON Schema meta-schema and the nesting bound."""
    import jsonschema

    try:
        schema = json.loads(source)
    except json.JSONDecodeError as e:
        raise RequestError(f"the schema is not valid JSON ({e})", param) from None
    if not isinstance(schema, dict | bool):
        raise RequestError("the schema must be a JSON object", param)
    depth = _depth(schema)
    if depth > MAX_DEPTH:
        raise RequestError(f"the schema nests {depth} levels deep; at most {MAX_DEPTH} are accepted", param)
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/" + "/".join(str(p) for p in e.absolute_path)
        raise RequestError(f"the schema is not a valid JSON Schema at {where}: {e.message}", param) from None
    return schema


DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})  # their values are data, not schemas
MAX_SAFE_INT = 2**53 - 1  # what a 64-bit float (JavaScript's number) holds exactly
DECIMALS = 1e-9


def closed(schema: Any) -> Any:
    """A copy of the schema that a small model cannot run away in; every answer to it answers the original.

    Objects that list their properties and say nothing of others take no others (OpenAI's strict
    mode asks for this explicitly; a small model otherwise adds keys freely). Numbers without
    bounds are held to what a 64-bit float carries: integers within +-2^53, at most 9 decimals
    (left free, a small model writes digits until max_tokens).
    """
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = datetimes.exact({k: v if k in DATA_KEYWORDS else closed(v) for k, v in schema.items()})
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    kinds = out.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if "integer" in kinds or "number" in kinds:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -MAX_SAFE_INT
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = MAX_SAFE_INT
        if "number" in kinds and "multipleOf" not in out:
            out["multipleOf"] = DECIMALS
    return out


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def explain(message: str, schema: Any, kind: str) -> str:
    """llguidance's complaint, with the path of the keyword it names when it is a schema's."""
    first = message.strip().splitlines()[0] if message.strip() else message
    if kind != "json_schema":
        return f"the {kind} grammar is not valid: {message.strip()}"
    keys = re.findall(r'"([^"]+)"', first) if "Unimplemented keys" in first else []
    if keys:
        where = _path_of(schema, keys[0], "")
        return (
            f"the schema uses {keys[0]!r} at {where or '/'}, which edgeinfer cannot enforce; "
            "remove it or check that value after parsing"
        )
    return f"the schema cannot be enforced: {first}"


def _path_of(value: Any, key: str, path: str) -> str | None:
    """JSON Pointer of the first object that has `key` (the schema keyword llguidance named)."""
    if isinstance(value, dict):
        if key in value:
            return path or "/"
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = _path_of(v, key, f"{path}/{k}")
        if found:
            return found
    return None
