"""Embeddings beside generation: token lists to unit vectors, in a second llama.cpp context run between steps.

The context (edgeinfer/llamacpp/embed.py) has embeddings on and the model's pooling, shares the
engine's loaded Model, and is made on the first request. Its decodes run on the engine thread,
between two steps, so they never overlap a step's llama_decode (all llama.cpp work stays on that
thread, as for generation). A request's inputs are packed into as few decodes as the context
holds, one sequence each: one decode when they fit (max_tokens tokens, MAX_SEQS inputs), and one
decode per pass of the engine loop otherwise, so that running streams keep stepping in between.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edgeinfer.errors import EngineClosedError, EngineFailedError, RequestError
from edgeinfer.llamacpp.embed import EmbedContext, n_ctx_train, n_embd, pooling_of

if TYPE_CHECKING:
    from edgeinfer.engine.engine import Engine

# Tokens in one embeddings decode, and so in one input at most: what one stream holds (--ctx-size /
# --parallel with the per-seq KV layout), up to EMBED_CTX. Every input attends over the whole
# decode's cells and every token's logits are computed too (llama.cpp does not skip the output
# layer of a generative model), so a decode's cost grows faster than its tokens.
EMBED_CTX = 2048
MAX_SEQS = 64  # inputs in one decode
MAX_INPUTS = 2048  # inputs in one request (OpenAI's bound)
MAX_TOTAL_TOKENS = 300_000  # tokens over all inputs of one request (OpenAI's bound)
POLL_S = 0.25  # how often a waiting caller looks for the engine having stopped
# While streams run, embeddings take at most this share of the engine thread's time: a decode of
# many tokens costs as much as a hundred one-token steps, so taking turns alone would starve them.
SHARE = 0.5


def pack(lengths: list[int], max_tokens: int, max_seqs: int) -> list[list[int]]:
    """Inputs (by index, in order) grouped into decodes of at most max_tokens tokens and max_seqs inputs."""
    groups: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if not groups or used + n > max_tokens or len(groups[-1]) == max_seqs:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


@dataclass(slots=True, eq=False)
class _Job:
    """One request: its inputs, the decodes left (groups of input indices), the unit vectors so far."""

    inputs: list[list[int]]
    groups: list[list[int]]
    out: np.ndarray
    future: Future[np.ndarray] = field(default_factory=Future)


class Embeddings:
    """The engine's embeddings: `embed` / `aembed` from any thread, `run_pending` on the engine thread."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        model = engine.model
        self.n_embd = n_embd(model)
        self.pooling = pooling_of(model.info)
        self.max_tokens = min(EMBED_CTX, engine.n_ctx_stream, n_ctx_train(model) or EMBED_CTX)
        self.jobs: list[_Job] = []  # guarded by the engine's lock; the engine loop waits on it too (pending)
        self.decodes = 0  # llama_decode calls made (tests, stats)
        self._next_at = 0.0  # time.perf_counter() before which no decode runs while streams do
        self._ctx: EmbedContext | None = None
        self._ctx_lock = threading.Lock()  # close() against the engine thread's first use

    # --- callers (any thread) ------------------------------------------------------

    def check(self, inputs: list[list[int]]) -> None:
        """RequestError naming the input and the limit, for a request that can never be served."""
        if not inputs:
            raise RequestError("input is empty; send a string, a list of strings or token ids", "input")
        if len(inputs) > MAX_INPUTS:
            raise RequestError(f"{len(inputs)} inputs; one request takes at most {MAX_INPUTS}", "input")
        n_vocab = self._engine.vocab.n_tokens
        total = 0
        for i, tokens in enumerate(inputs):
            if not tokens:
                raise RequestError(f"input[{i}] is empty; send text or at least one token id", "input")
            if len(tokens) > self.max_tokens:
                raise RequestError(
                    f"input[{i}] is {len(tokens)} tokens; an embeddings input holds at most {self.max_tokens} "
                    "tokens (the embeddings context's size); shorten it or split it into parts",
                    "input",
                )
            bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise RequestError(
                    f"input[{i}] holds token id {bad}, outside this model's vocabulary (0 to {n_vocab - 1})", "input"
                )
            total += len(tokens)
        if total > MAX_TOTAL_TOKENS:
            raise RequestError(f"{total} tokens over all inputs; one request takes at most {MAX_TOTAL_TOKENS}", "input")

    def submit(self, inputs: list[list[int]]) -> Future[np.ndarray]:
        """Queue inputs for the engine thread; the future gives one unit vector per input (float32 rows)."""
        self.check(inputs)
        eng = self._engine
        groups = pack([len(t) for t in inputs], self.max_tokens, MAX_SEQS)
        job = _Job(inputs, groups, np.empty((len(inputs), self.n_embd), np.float32))
        eng.check_open()  # before the lock too: a parked engine thread may hold it for good
        with eng.lock:
            eng.check_open()
            self.jobs.append(job)
        eng.wake()
        return job.future

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """Unit vectors, one row per input: the blocking call."""
        future = self.submit(inputs)
        while True:
            try:
                return future.result(timeout=POLL_S)
            except TimeoutError:
                self._check_running()

    async def aembed(self, inputs: list[list[int]]) -> np.ndarray:
        """As embed, awaited on an event loop; cancelling it drops the request's decodes not yet run."""
        waiting = asyncio.wrap_future(self.submit(inputs))
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=POLL_S)
            if done:
                return waiting.result()
            self._check_running()

    def _check_running(self) -> None:
        """A job queued when the engine thread stopped is never run: tell its caller instead of waiting."""
        eng = self._engine
        if eng.fatal_error is not None:
            raise EngineFailedError(f"the engine stopped ({eng.fatal_error}); restart it")
        if not eng.thread_alive():
            raise EngineClosedError("the engine is closed")

    # --- the engine thread ---------------------------------------------------------

    def pending(self) -> bool:
        return bool(self.jobs)

    def fail(self, error: BaseException) -> None:
        """Nothing to do: a caller waiting on a job looks for the engine having stopped (_check_running)."""

    def run_pending(self) -> None:
        """Run one decode of the oldest request, if any: called by the engine loop between steps.

        While streams run, a decode waits until the last one's time has gone to them (SHARE); a
        request whose caller has gone (its future cancelled) is dropped before its next decode."""
        if not self.jobs:  # the common case, read without the lock: only callers add, under it
            return
        with self._engine.lock:
            while self.jobs and self.jobs[0].future.cancelled():
                self.jobs.pop(0)
            if not self.jobs:
                return
            streams = self._engine.sched.running or self._engine.sched.waiting
            if streams and time.perf_counter() < self._next_at:
                return  # the streams' turn
            job = self.jobs[0]
        try:
            group = job.groups.pop(0)
            t0 = time.perf_counter()
            vectors = self._context().embed([job.inputs[i] for i in group])
            took = time.perf_counter() - t0
            self._next_at = t0 + took + took * (1 - SHARE) / SHARE
            self.decodes += 1
            job.out[group] = normalize(vectors)
        except BaseException as e:
            self._finish(job, error=e)
            return
        if not job.groups:
            self._finish(job)

    def _finish(self, job: _Job, error: BaseException | None = None) -> None:
        with self._engine.lock:
            self.jobs.remove(job)
        if job.future.set_running_or_notify_cancel():  # False: the caller cancelled meanwhile
            if error is None:
                job.future.set_result(job.out)
            else:
                job.future.set_exception(error)

    def _context(self) -> EmbedContext:
        with self._ctx_lock:
            if self._ctx is None:
                eng = self._engine
                cfg = eng.config
                self._ctx = EmbedContext(
                    eng.model, self.max_tokens, MAX_SEQS, self.pooling, cfg.threads_batch or cfg.threads, cfg.flash_attn
                )
            return self._ctx

    def close(self) -> None:
        """Free the context (before the model it uses); the engine thread has stopped by now."""
        with self._ctx_lock:
            if self._ctx is not None:
                self._ctx.close()
                self._ctx = None
