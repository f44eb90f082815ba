"""The one check of a request at the engine's door: can it ever be served as given, and how long may it run?

The server and the Python API both submit through Engine.submit, which calls this;
the scheduler then trusts the request (it asserts, it does not re-check).
"""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import ContextLengthError, RequestError
from edgeinfer.options import SamplingParams


def check_request(tokens: list[int], n: int, params: SamplingParams, engine: Any) -> int:
    """The tokens each of the n streams may generate; RequestError naming the parameter if none can be served."""
    parallel = engine.config.parallel
    if not tokens:
        raise RequestError("the prompt is empty", "prompt")
    n_vocab = engine.vocab.n_tokens
    if any(not 0 <= t < n_vocab for t in tokens):
        raise RequestError(f"the prompt has token ids outside the vocabulary (0..{n_vocab - 1})", "prompt")
    if not 1 <= n <= parallel:
        raise RequestError(f"n={n} streams asked for; this engine runs 1 to {parallel} (--parallel)", "n")
    if engine.per_seq:
        # Each stream holds the prompt and its reply in its own share of the context.
        n_ctx, where = engine.n_ctx_stream, "a stream's share of the context"
        fix = "raise --ctx-size, lower --parallel, or use --kv-layout unified"
        room = n_ctx - len(tokens)
    else:
        # The prompt's cells are shared; each stream needs its own for its reply.
        n_ctx, where, fix = engine.n_ctx, "the context", "raise --ctx-size"
        room = (n_ctx - len(tokens)) // n
    if room < 1:
        # The words Anthropic's API uses (Claude Code reads the figures and compacts), OpenAI's code (Codex acts on it).
        raise ContextLengthError(len(tokens), n_ctx, f"{where} holds {n_ctx}: {fix}")
    # A max_tokens beyond the room is a bound, not a promise: the answer ends at the context's end with
    # finish "length", as llama-server's does (agents ask for 32,000 whatever the model holds).
    return min(room, params.max_tokens if params.max_tokens is not None else engine.default_max_tokens)
