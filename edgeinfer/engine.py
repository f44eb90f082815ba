"""The engine: one thread runs schedule -> decode -> sample, packing every stream into one llama_decode.

Callers submit requests from any thread (or an asyncio loop) and read per-token
events from a StreamHandle. All llama.cpp work happens on the engine thread; the
scheduler is guarded by one lock that is never held during llama_decode.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.chat import ChatTemplate
from edgeinfer.errors import EdgeInferError, EngineClosedError, RequestError
from edgeinfer.events import Chunk, Finish, StreamStats, TokenLogprob
from edgeinfer.llamacpp import Batch, Context, ContextParams, Model, Sampler
from edgeinfer.metrics import Metrics
from edgeinfer.models import resolve_model
from edgeinfer.params import EngineConfig, SamplingParams
from edgeinfer.scheduler import BatchItem, Scheduler, Status, StepPlan, Stream
from edgeinfer.spec.runner import SpecState, Speculator
from edgeinfer.text import TextStream

_FINISH_REASONS = {
    Status.STOPPED: "stop",
    Status.LENGTH: "length",
    Status.CANCELLED: "cancelled",
    Status.ERROR: "error",
}


class StreamHandle:
    """The caller's side of one stream: iterate it (sync or async) for Chunk events, then one Finish."""

    def __init__(self, engine: Engine, stream: Stream, loop: asyncio.AbstractEventLoop | None) -> None:
        self._engine = engine
        self._stream = stream
        self._loop = loop
        self._q: Any = asyncio.Queue() if loop is not None else _SyncQueue()
        self.index = stream.index
        self.id = stream.id
        self.finish: Finish | None = None

    def _push(self, event: Chunk | Finish) -> None:
        """Called on the engine thread. Asyncio handles get their events when the engine flushes its outbox."""
        if self._loop is None:
            self._q.put(event)
        else:
            self._engine._outbox.setdefault(self._loop, []).append((self._q, event))

    def cancel(self) -> None:
        """Stop this stream; its KV is freed at the next step."""
        self._engine.cancel(self)

    def __iter__(self) -> Iterator[Chunk | Finish]:
        while self.finish is None:
            event = self._q.get()
            if isinstance(event, Finish):
                self.finish = event
            yield event

    async def __aiter__(self) -> AsyncIterator[Chunk | Finish]:
        while self.finish is None:
            event = await self._q.get()
            if isinstance(event, Finish):
                self.finish = event
            yield event

    def result(self) -> Finish:
        """Wait for the end of the stream (sync handles); chunks not yet read are dropped."""
        if self.finish is None:
            self.finish = self._q.last()
        assert self.finish is not None
        return self.finish

    def collect(self) -> list[Chunk | Finish]:
        """Wait for the end of the stream (sync handles); every event in order, without a wake-up per token."""
        events = self._q.all()
        self.finish = events[-1]
        return events

    async def aresult(self) -> Finish:
        async for _ in self:
            pass
        assert self.finish is not None
        return self.finish


def _deliver(items: list[tuple[asyncio.Queue[Any], Chunk | Finish]]) -> None:
    for q, event in items:
        q.put_nowait(event)


class _SyncQueue:
    """A blocking queue whose reader can also wait for the last item alone (no wake-up per token)."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._cv = threading.Condition()
        self._waiting = False
        self._want_last = False
        self._closed = False

    def put(self, item: Any) -> None:
        with self._cv:
            self._items.append(item)
            if isinstance(item, Finish):
                self._closed = True
            if self._waiting and (self._closed or not self._want_last):
                self._cv.notify()

    def get(self) -> Any:
        with self._cv:
            while not self._items:
                self._waiting = True
                self._cv.wait()
                self._waiting = False
            return self._items.popleft()

    def last(self) -> Any:
        """Wait for the final item and return it, dropping the ones before it."""
        return self.all()[-1]

    def all(self) -> list[Any]:
        """Wait for the final item and return every item not yet read."""
        with self._cv:
            self._want_last = True
            while not self._closed:
                self._waiting = True
                self._cv.wait()
                self._waiting = False
            items = list(self._items)
            self._items.clear()
            return items


@dataclass(slots=True)
class _Live:
    """Engine-side state of one stream."""

    handle: StreamHandle
    params: SamplingParams
    sampler: Sampler
    text: TextStream
    t_submit: float
    t_first: float = 0.0
    t_last: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    spec: SpecState | None = None


def _stream_row(s: Stream, live: _Live, state: str, now: float) -> dict[str, Any]:
    span = live.t_last - live.t_first
    return {
        "id": s.id,
        "index": s.index,
        "state": state,
        "prompt_tokens": s.n_prompt,
        "cached_tokens": s.n_cached,
        "generated_tokens": s.n_generated,
        "tps": (s.n_generated - 1) / span if s.n_generated > 1 and span > 0 else None,
        "ttft_s": live.t_first - live.t_submit if live.t_first else None,
        "acceptance": live.spec.accepted / live.spec.drafted if live.spec and live.spec.drafted else None,
        "age_s": now - live.t_submit,
    }


class Engine:
    """Runs many streams of one model, packed into one llama_decode per step."""

    def __init__(self, config: EngineConfig) -> None:
        config.validate()
        self.config = config
        self.model_path = resolve_model(config.model)
        self.model = Model(self.model_path, gpu_layers=config.gpu_layers)
        keep = config.parallel if config.keep_prefixes is None else config.keep_prefixes
        ctx_params = ContextParams(
            n_ctx=config.ctx_size,
            n_batch=config.batch_size,
            n_ubatch=config.ubatch_size,
            n_seq_max=config.parallel + keep,
            n_threads=config.threads,
            n_threads_batch=config.threads_batch,
            flash_attn=config.flash_attn,
            kv_type=config.kv_type,
        )
        self.spec: Speculator | None = None
        self.spec_error: str | None = None
        self.spec_enabled = True
        try:
            self.ctx = Context(self.model, ctx_params)
            if config.spec != "off":
                self.spec = Speculator(config, self.model, ctx_params)
        except BaseException:
            if getattr(self, "ctx", None) is not None:
                self.ctx.close()
            self.model.close()
            raise
        vocab = self.model.vocab
        self.vocab = vocab
        self.template = ChatTemplate(
            self.model.chat_template(),
            bos=vocab.piece(vocab.bos, special=True).decode("utf-8", "replace") if vocab.bos >= 0 else "",
            eos=vocab.piece(vocab.eos, special=True).decode("utf-8", "replace") if vocab.eos >= 0 else "",
        )
        self.n_ctx = self.ctx.n_ctx
        self.default_max_tokens = max(256, self.n_ctx // config.parallel)
        self.sched = Scheduler(
            n_ctx=self.n_ctx,
            max_streams=config.parallel,
            n_seq_ids=config.parallel + keep,
            token_budget=self.ctx.n_batch,
            max_retained=keep,
            max_queue=config.max_queue,
        )
        self.metrics = Metrics()
        self._batch = Batch(self.ctx.n_batch)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._step_tokens = 0  # tokens emitted in the current step
        self._exclusive: list[tuple[Callable[[Context], Any], Future[Any]]] = []
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[Any, Chunk | Finish]]] = {}  # engine thread only
        self._thread = threading.Thread(target=self._run, name="edgeinfer-engine", daemon=True)
        self._thread.start()

    # --- public API -------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self.vocab.tokenize(text, add_special=True, parse_special=special)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """Render messages with the model's template and tokenize (special tokens parsed)."""
        text = self.template.render(messages, add_generation_prompt=True)
        bos = self.template.bos
        if self.vocab.add_bos and bos and text.startswith(bos):
            text = text[len(bos) :]  # the tokenizer adds BOS itself
        return self.vocab.tokenize(text, add_special=True, parse_special=True)

    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        n: int = 1,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> list[StreamHandle]:
        """Queue a request of n streams of one prompt; returns a handle per stream at once.

        Pass `loop` (or use asubmit) to read the handles with `async for`.
        """
        params = params or SamplingParams()
        params.validate()
        if n < 1:
            raise RequestError(f"n is {n}; it must be at least 1", "n")
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise RequestError("the prompt is empty", "prompt")
        if any(not 0 <= t < self.vocab.n_tokens for t in tokens):
            raise RequestError(
                f"the prompt has token ids outside the vocabulary (0..{self.vocab.n_tokens - 1})", "prompt"
            )
        max_new = self._max_new(len(tokens), n, params)
        t_submit = time.perf_counter()
        with self._lock:
            if self._closing:
                raise EngineClosedError("the engine is shutting down; no new requests are taken")
            group = self.sched.add(tokens, n, max_new)
            handles = []
            for s in group.streams:
                h = StreamHandle(self, s, loop)
                # n streams with one seed must still differ: stream i draws with seed + i.
                sampler = self._make_sampler(params, s.index)
                if params.repeat_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
                    for t in tokens[-params.repeat_last_n :] if params.repeat_last_n else []:
                        sampler.accept(t)
                s.payload = _Live(h, params, sampler, TextStream(params.stop), t_submit)
                if self.spec is not None:
                    s.payload.spec = self.spec.attach(params, tokens, s.index)
                handles.append(h)
            self.metrics.requests += 1
            self._wake.notify()
        return handles

    async def asubmit(
        self, prompt: str | list[int], params: SamplingParams | None = None, n: int = 1
    ) -> list[StreamHandle]:
        return self.submit(prompt, params, n, loop=asyncio.get_running_loop())

    def generate(self, prompt: str | list[int], params: SamplingParams | None = None) -> Finish:
        """One stream, to the end: the simplest call."""
        return self.submit(prompt, params)[0].result()

    def cancel(self, handle: StreamHandle) -> None:
        with self._lock:
            if not handle._stream.status.finished:
                self.sched.cancel(handle._stream)
                self._wake.notify()

    def reset_prefixes(self) -> None:
        """Forget the KV of finished streams (the chat's /reset)."""
        with self._lock:
            self.sched.evict_all()
            self._wake.notify()

    def set_speculation(self, on: bool) -> None:
        """Turn drafting on or off at run time (benchmarks compare both on one engine)."""
        self.spec_enabled = on

    def run_exclusive(self, fn: Callable[[Context], Any]) -> Any:
        """Run fn(ctx) on the engine thread while no stream runs, after dropping kept prefixes.

        For baselines that drive llama.cpp directly (the benchmark's raw loop): the same
        context and the same OS thread, so both share one set of compute threads.
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._closing:
                raise EngineClosedError("the engine is closed")
            self.sched.evict_all()
            self._exclusive.append((fn, future))
            self._wake.notify()
        return future.result()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no stream is running or waiting (tests, benchmarks)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if not self.sched.running and not self.sched.waiting:
                    return True
            time.sleep(0.005)
        return False

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready picture of the engine now: model, load, KV, rates, latencies, streams."""
        now = time.perf_counter()
        m = self.metrics
        with self._lock:
            sched = self.sched
            streams = []
            for s in sched.running:
                live: _Live = s.payload
                state = "prefill" if s.n_computed < s.n_prompt - 1 or s.fork_pending else "decode"
                streams.append(_stream_row(s, live, state, now))
            for g in sched.waiting:
                streams.extend(_stream_row(s, s.payload, "waiting", now) for s in g.streams if not s.status.finished)
            kv_used = sched.cells_used
            cached, computed = sched.prompt_tokens_cached, sched.prompt_tokens_computed
            n_retained, evictions = len(sched.retained), sched.evictions
            retained_cells = sum(len(t) for t in sched.retained.values())
            running, waiting = len(sched.running), sched.n_waiting
        info = self.model.info
        return {
            "time": time.time(),
            "model": {
                "name": info.name,
                "path": str(self.model_path),
                "architecture": info.architecture,
                "quantization": info.quantization,
                "n_params": self.model.n_params,
                "ctx_size": self.n_ctx,
                "parallel": self.config.parallel,
                "gpu_layers": self.config.gpu_layers,
                "kv_type": self.config.kv_type,
            },
            "requests": {"running": running, "waiting": waiting, "total": m.requests, "finished": dict(m.finished)},
            "kv": {"used_cells": kv_used, "total_cells": self.n_ctx, "retained_prefixes": n_retained},
            "tokens": {
                "prompt": m.prompt_tokens,
                "generated": m.generated_tokens,
                "prompt_cached": cached,
                "prompt_computed": computed,
            },
            "prefix_cache": {
                "hit_tokens": cached,
                "computed_tokens": computed,
                "hit_rate": cached / (cached + computed) if cached + computed else None,
                "retained_prefixes": n_retained,
                "retained_cells": retained_cells,
                "evictions": evictions,
            },
            "rate": {"generated_tps_1s": m.generated_tps(1.0), "generated_tps_10s": m.generated_tps(10.0)},
            "latency": m.rolling(),
            "steps": {"count": m.steps, "decode_seconds": m.decode_seconds},
            "spec": self.spec.stats() if self.spec is not None else {"mode": "off", "error": self.spec_error},
            "streams": streams,
        }

    def close(self) -> None:
        """Cancel everything, stop the engine thread and free llama.cpp's memory."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for s in list(self.sched.running):
                self.sched.cancel(s)
            for g in self.sched.waiting:
                for s in g.streams:
                    self.sched.cancel(s)
            self._wake.notify()
        self._thread.join()
        if self.spec is not None:
            self.spec.close()
        self._batch.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the engine thread ------------------------------------------------

    def _flush(self) -> None:
        """Hand the step's events to each asyncio loop in one wake-up, not one per token."""
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop is gone: nobody is listening
                with self._lock:
                    for s in list(self.sched.running):
                        live: _Live = s.payload
                        if live.handle._loop is loop:
                            self.sched.cancel(s)

    def _run(self) -> None:
        while True:
            self._flush()
            with self._lock:
                while not self.sched.has_work() and not self._closing and not self._exclusive:
                    self._wake.wait()
                if self._closing and not self.sched.has_work():
                    for _, fut in self._exclusive:
                        fut.set_exception(EngineClosedError("the engine is closed"))
                    return
            # Drafting happens outside the lock: only this thread changes streams' tokens.
            t_iter = time.perf_counter()
            if self.spec is not None and self.spec_enabled:
                try:
                    self.spec.propose(self.sched.running, self._prefill_estimate())
                except BaseException as e:
                    self._drafter_failed(e)
            with self._lock:
                plan = self.sched.schedule()
                exclusive = None
                if self._exclusive and not plan.items and not self.sched.running and not self.sched.waiting:
                    exclusive = self._exclusive.pop(0)
            if exclusive is not None:
                self._step(plan)  # applies the queued KV removals first
                self._flush()
                fn, fut = exclusive
                try:
                    fut.set_result(fn(self.ctx))
                except BaseException as e:
                    fut.set_exception(e)
                continue
            try:
                self._step(plan)
            except BaseException as e:
                self._fail_all(e)
                continue
            if self.spec is not None and plan.items and all(len(it.tokens) == 1 + it.n_draft for it in plan.items):
                # A decode-only step: its whole time, drafting included, against what it emitted.
                drafted = any(it.n_draft for it in plan.items)
                self.spec.observe_iteration(len(plan.items), drafted, self._step_tokens, time.perf_counter() - t_iter)

    def _step(self, plan: StepPlan) -> None:
        for s in plan.finished:
            self._finish_event(s)
        for op in plan.kv_ops:
            if op.kind == "rm":
                self.ctx.seq_rm(op.seq, op.p0, op.p1)
            else:
                self.ctx.seq_cp(op.seq, op.dst, op.p0, op.p1)
        if not plan.items:
            return
        batch = self._batch
        batch.clear()
        rows = []
        for it in plan.items:
            it.row0 = batch.n
            rows.append(batch.add(it.stream.seq, it.tokens, it.pos0, bool(it.samplers), 0 if it.n_draft else -1))
        t0 = time.perf_counter()
        if not self.ctx.decode(batch):
            self._kv_full(plan)
            return
        t1 = time.perf_counter()
        if self.spec is not None:
            self.spec.observe_step(plan.n_tokens, t1 - t0)
        self._step_tokens = 0
        with self._lock:
            self.sched.complete(plan)
            for it, row in zip(plan.items, rows, strict=True):
                if it.n_draft:
                    self._verify(it, t1)
                    continue
                for s in it.samplers:
                    self._sample(s, row, t1)
        self.metrics.step(self._step_tokens, plan.n_tokens, t1 - t0)

    def _verify(self, it: BatchItem, now: float) -> None:
        """Emit the accepted drafts and the target's own next token; drop the rejected KV."""
        assert self.spec is not None
        s = it.stream
        out = self.spec.verify(self.ctx, it, s.payload.sampler)
        self.sched.reject(s, it.n_draft - (len(out) - 1))
        for j, token in enumerate(out):
            status = self._emit(s, token, now, None)
            if status is not None:
                # Finished early: the accepted positions after this token leave the KV too.
                self.sched.reject(s, len(out) - 1 - j)
                self._end(s, status)
                break
        self.spec.emitted(s, out)

    def _sample(self, s: Stream, row: int, now: float) -> None:
        live: _Live = s.payload
        token = live.sampler.sample(self.ctx, row)
        lp = None
        if live.params.logprobs is not None:
            lp = self._logprob(row, token, live.params.logprobs)
            live.logprobs.append(lp)
        status = self._emit(s, token, now, lp)
        if status is not None:
            self._end(s, status)
        elif self.spec is not None:
            self.spec.emitted(s, [token])

    def _emit(self, s: Stream, token: int, now: float, lp: TokenLogprob | None) -> Status | None:
        """Hand one generated token to the stream; return the status it finishes with, if it does."""
        live: _Live = s.payload
        self._step_tokens += 1
        if live.t_first == 0.0:
            live.t_first = now
            self.metrics.ttft(now - live.t_submit)
        else:
            self.metrics.itl(now - live.t_last)
        live.t_last = now
        self.sched.append(s, token)
        if self.vocab.is_eog(token) and not live.params.ignore_eos:
            return Status.STOPPED
        delta = live.text.feed(self.vocab.piece(token))
        if live.text.stopped:
            if delta:
                live.handle._push(Chunk(s.index, delta, [token], now - live.t_submit))
            return Status.STOPPED
        live.handle._push(Chunk(s.index, delta, [token], now - live.t_submit, lp))
        if s.n_generated >= s.max_new:
            return Status.LENGTH
        return None

    def _end(self, s: Stream, status: Status) -> None:
        self.sched.finish(s, status)
        self._finish_event(s)

    def _finish_event(self, s: Stream, error: str | None = None) -> None:
        live: _Live = s.payload
        rest = live.text.flush()
        now = time.perf_counter()
        if rest:
            live.handle._push(Chunk(s.index, rest, [], now - live.t_submit))
        n_gen = s.n_generated
        decode_s = live.t_last - live.t_first
        stats = StreamStats(
            prompt_tokens=s.n_prompt,
            cached_tokens=s.n_cached,
            completion_tokens=n_gen,
            ttft_s=(live.t_first - live.t_submit) if live.t_first else None,
            decode_tps=(n_gen - 1) / decode_s if n_gen > 1 and decode_s > 0 else None,
            total_s=now - live.t_submit,
            draft_tokens=live.spec.drafted if live.spec else 0,
            draft_accepted=live.spec.accepted if live.spec else 0,
        )
        self.metrics.prompt_tokens += s.n_prompt
        live.sampler.close()
        reason = _FINISH_REASONS[s.status]
        self.metrics.finish(reason)
        gen = s.tokens[s.n_prompt :]
        live.handle._push(Finish(s.index, reason, live.text.text, gen, stats, live.logprobs or None, error))

    def _logprob(self, row: int, token: int, top: int) -> TokenLogprob:
        logits = self.ctx.logits(row).astype(np.float64)
        m = logits.max()
        logp = logits - (m + np.log(np.exp(logits - m).sum()))
        best = np.argpartition(-logp, top)[:top] if top else np.array([], dtype=np.int64)
        best = best[np.argsort(-logp[best])]
        piece = lambda t: self.vocab.piece(int(t)).decode("utf-8", "replace")  # noqa: E731
        return TokenLogprob(token, piece(token), float(logp[token]), [(int(t), piece(t), float(logp[t])) for t in best])

    def _prefill_estimate(self) -> int:
        """Prompt tokens the next step will likely carry (for the speculation cost model)."""
        left = sum(len(s.tokens) - s.n_computed for s in self.sched.running if len(s.tokens) - s.n_computed > 1)
        return min(left, self.ctx.n_batch)

    def _drafter_failed(self, error: BaseException) -> None:
        """Drafting broke (e.g. the draft context is full): go on without speculation."""
        for s in self.sched.running:
            s.draft = []
        if self.spec is not None:
            self.spec.close()
        self.spec = None
        self.spec_error = str(error)

    def _kv_full(self, plan: StepPlan) -> None:
        """llama.cpp found no room for the batch (fragmentation): end the youngest stream and go on."""
        with self._lock:
            self.sched.evict_all()
            youngest = max((it.stream for it in plan.items), key=lambda s: s.id)
            self._end(youngest, Status.LENGTH)
            # Nothing of this batch entered the KV cache; the next step plans it again.

    def _fail_all(self, error: BaseException) -> None:
        """A step failed: end every running stream with the error; the engine keeps serving."""
        message = str(error) if isinstance(error, EdgeInferError) else f"internal error: {error!r}"
        with self._lock:
            for s in list(self.sched.running):
                self.sched.finish(s, Status.ERROR)
                self._finish_event(s, message)

    def _make_sampler(self, p: SamplingParams, index: int = 0) -> Sampler:
        return Sampler(
            self.vocab.n_tokens,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            min_p=p.min_p,
            repeat_penalty=p.repeat_penalty,
            frequency_penalty=p.frequency_penalty,
            presence_penalty=p.presence_penalty,
            repeat_last_n=p.repeat_last_n,
            seed=None if p.seed is None else p.seed + index,
        )

    def _max_new(self, n_prompt: int, n: int, p: SamplingParams) -> int:
        room = (self.n_ctx - n_prompt) // n
        if room < 1:
            raise RequestError(
                f"the prompt is {n_prompt} tokens; the context holds {self.n_ctx} (raise --ctx-size)", "prompt"
            )
        if p.max_tokens is None:
            return min(room, self.default_max_tokens)
        if p.max_tokens > room:
            raise RequestError(
                f"max_tokens is {p.max_tokens}, but only {room} tokens fit after the {n_prompt}-token prompt "
                f"in the {self.n_ctx}-token context",
                "max_tokens",
            )
        return p.max_tokens
