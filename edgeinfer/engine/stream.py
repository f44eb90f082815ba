"""A stream's one record, from submit to its Finish event: its status, its tokens, its sampler and
grammar, what the caller reads; and the group of n streams one request made.

Plain dataclasses: the scheduler, the engine, the emitter and speculation each read and
write their own fields of a Stream; no behaviour beyond a few derived figures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the caller's side of a stream; the scheduler never reads it
    from edgeinfer.engine.grammar import GrammarState
    from edgeinfer.engine.handle import StreamHandle
    from edgeinfer.engine.text import TextStream
    from edgeinfer.events import TokenLogprob
    from edgeinfer.llamacpp import Sampler
    from edgeinfer.options import SamplingParams
    from edgeinfer.speculative.drafting import Drafting


class Status(enum.IntEnum):
    """Ordered so that `status >= Status.STOPPED` means finished."""

    WAITING = 0
    RUNNING = 1
    STOPPED = 2  # end-of-generation token or stop string
    LENGTH = 3  # max_tokens or the context reached
    CANCELLED = 4
    ERROR = 5

    @property
    def finished(self) -> bool:
        return self >= Status.STOPPED

    @property
    def reason(self) -> str:
        """How a finished stream ended, as its Finish event says it: stop, length, cancelled or error."""
        return _REASONS[self]


_REASONS = {Status.STOPPED: "stop", Status.LENGTH: "length", Status.CANCELLED: "cancelled", Status.ERROR: "error"}


@dataclass(slots=True, eq=False)
class Stream:
    """One generation stream, from submit to its Finish event: one sequence id in the KV cache while it runs.

    The scheduler makes it (Scheduler.add) and owns the fields up to share_len; the engine sets
    the caller's side at submit, before the stream is scheduled; the emitter and speculation read
    and update their own fields."""

    id: int
    group: Group
    index: int  # position within its group (0..n-1)
    tokens: list[int]  # prompt + generated; the KV holds tokens[:n_computed]
    n_prompt: int
    max_new: int  # generated tokens at most
    status: Status = Status.WAITING
    seq: int = -1  # llama.cpp sequence id, -1 before admission
    n_computed: int = 0
    n_cached: int = 0  # prompt tokens reused from retained KV instead of computed
    fork_pending: bool = False  # waits for its group's leader to finish the prompt
    cancel_requested: bool = False
    share_src: Stream | None = None  # a live stream whose prompt prefix this one copies once computed
    share_len: int = 0
    # The caller's side, set by the engine at submit (unset in the scheduler's own tests).
    handle: StreamHandle = field(init=False)
    params: SamplingParams = field(init=False)
    sampler: Sampler = field(init=False)
    text: TextStream = field(init=False)  # the generated text, its stop strings and UTF-8
    t_submit: float = field(init=False)  # time.perf_counter() seconds, as the t_ below
    t_first: float = 0.0  # the first token's time, 0.0 before it
    t_last: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    grammar: GrammarState | None = None  # the stream's grammar, if its request has one
    error: str | None = None  # why the stream ended with an error, when the step found out
    # Speculation (edgeinfer.speculative): its state where the stream drafts, and its counts.
    drafting: Drafting | None = None
    n_drafted: int = 0
    n_accepted: int = 0

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.n_prompt


@dataclass(slots=True, eq=False)
class Group:
    """The streams of one request: `n` completions of one prompt."""

    prompt: list[int]
    n: int
    max_new: int
    reserve: int  # KV cells this request can occupy at most
    retain: bool = True  # save the KV of a finished single stream for prefix reuse
    streams: list[Stream] = field(default_factory=list)
    n_live: int = 0
    preempted: bool = False  # a stream put back to wait for room; it resumes where it was
