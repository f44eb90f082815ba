"""The one check of a request at the engine's door: can it ever be served as given, and how long may it run?

The server and the Python API both submit through Engine.submit, which calls this;
the scheduler then trusts the request (it asserts, it does not re-check).
"""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import RequestError
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
        raise RequestError(f"the prompt is {len(tokens)} tokens; {where} holds {n_ctx} ({fix})", "prompt")
    if params.max_tokens is None:
        return min(room, engine.default_max_tokens)
    if params.max_tokens > room:
        each = f" for each of {n} streams" if n > 1 else ""
        raise RequestError(
            f"max_tokens is {params.max_tokens}, but only {room} tokens fit after the {len(tokens)}-token prompt "
            f"in {where} of {n_ctx} cells{each} ({fix}, or lower max_tokens)",
            "max_tokens",
        )
    return params.max_tokens
