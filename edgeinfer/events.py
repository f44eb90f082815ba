"""What a stream hands its caller: Chunk events while it runs, one Finish at the end."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class TokenLogprob:
    """The sampled token's log-probability under the model, and the most likely alternatives."""

    token: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]  # (token, text, logprob), most likely first


@dataclass(slots=True)
class Chunk:
    """New text of one stream; `text` may be empty while bytes or a possible stop string are held."""

    index: int  # which of the request's n streams
    text: str  # valid UTF-8, never part of a stop string
    token_ids: list[int]
    t: float  # seconds since the request was submitted
    logprob: TokenLogprob | None = None  # when the request asked for logprobs


@dataclass(slots=True)
class StreamStats:
    """Per-stream figures, in tokens and seconds."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV was reused rather than computed
    completion_tokens: int
    ttft_s: float | None  # submit to first sampled token
    decode_tps: float | None  # tokens/s after the first token
    total_s: float
    draft_tokens: int = 0  # tokens drafted for this stream by speculation
    draft_accepted: int = 0  # of those, the ones the model confirmed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Finish:
    """The end of a stream."""

    index: int
    finish_reason: str  # stop | length | cancelled | error
    text: str  # the whole generated text (stop string excluded)
    token_ids: list[int]  # every sampled token, end-of-generation token included
    stats: StreamStats
    logprobs: list[TokenLogprob] | None = None
    error: str | None = None  # set when finish_reason is "error"
    stop_sequence: str | None = None  # the request's stop string that ended it (finish_reason "stop")
