"""The engine: one thread runs draft -> schedule -> decode -> postprocess, packing every stream into one llama_decode.

Callers submit requests from any thread (or an asyncio loop) and read events from a
StreamHandle. All llama.cpp work happens on the engine thread; the scheduler is
guarded by one lock that is never held during llama_decode.

One step, and the layer that owns each part:
  speculator.propose(running)      -> drafts by stream id            (edgeinfer.speculative)
  scheduler.schedule(drafts)       -> StepPlan: KV ops, batch items  (scheduler.py)
  ctx.decode(batch)                                                   (edgeinfer.llamacpp)
  sample / verify each item        -> StepOutput per stream          (sampling.py, grammar.py, here)
  scheduler.postprocess(plan, outs) -> the streams that ended
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from edgeinfer.engine import faults
from edgeinfer.engine.delivery import Delivery, Live, StreamHandle
from edgeinfer.engine.embeddings import Embeddings
from edgeinfer.engine.grammar import Grammars, next_tokens
from edgeinfer.engine.kvcache import ContextKv, make_store
from edgeinfer.engine.metrics import Metrics
from edgeinfer.engine.requests import check_request
from edgeinfer.engine.sampling import logprob, make_sampler
from edgeinfer.engine.scheduler import BatchItem, Scheduler, Status, StepOutput, StepPlan, Stream
from edgeinfer.engine.stats import EngineStats, build_stats
from edgeinfer.engine.template import ChatTemplate
from edgeinfer.engine.text import TextStream
from edgeinfer.errors import EngineClosedError, EngineFailedError
from edgeinfer.events import Finish
from edgeinfer.formats import reasoning, select
from edgeinfer.llamacpp import Batch, Context, ContextParams, Model, on_abort, wedged
from edgeinfer.options import EngineConfig, SamplingParams, parse_shares
from edgeinfer.speculative.speculator import Speculator


def make_engine(config: EngineConfig) -> Engine:
    """The one factory the CLI, the server, the benchmark and the tests use."""
    return Engine(config)


class Engine:
    """Runs many streams of one model, packed into one llama_decode per step."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_path = config.model
        shares = parse_shares(config.tensor_split) if config.tensor_split else None
        self.model = Model(config.model, gpu_layers=config.gpu_layers, rpc=config.rpc, tensor_split=shares)
        ctx_params = ContextParams(
            n_ctx=config.ctx_size,
            n_batch=config.batch_size,
            n_ubatch=config.ubatch_size,
            n_seq_max=config.parallel,
            n_threads=config.threads,
            n_threads_batch=config.threads_batch,
            flash_attn=config.flash_attn,
            kv_type=config.kv_type,
            kv_unified=config.kv_layout == "unified",
        )
        self.spec: Speculator | None = None
        self.spec_error: str | None = None
        self.spec_enabled = True
        try:
            self.ctx = Context(self.model, ctx_params)
            if config.spec != "off":
                self.spec = Speculator(config, self.model, ctx_params, self.ctx.batch_invariant)
        except BaseException:
            if getattr(self, "ctx", None) is not None:
                self.ctx.close()
            self.model.close()
            raise
        self.vocab = self.model.vocab
        # The tags of tool calls and thinking that this vocabulary holds as special tokens are shown as their text, so
        # that the answer's parsers see them (llama.cpp renders a control token as nothing).
        self.vocab.show([m for f in select.KNOWN.values() for m in f.markers])
        self.vocab.show([tag for t in reasoning.KNOWN for tag in (t.open, t.close)])
        self.template = ChatTemplate.for_model(self.model)
        self.n_ctx = self.ctx.n_ctx
        self.per_seq = not self.ctx.kv_unified
        self.n_ctx_stream = self.ctx.n_ctx_seq if self.per_seq else self.n_ctx  # what one stream can hold
        self.default_max_tokens = max(256, self.n_ctx // config.parallel)
        self.store = make_store(config, self.model, self.ctx)
        self.sched = Scheduler(
            ContextKv(self.ctx, self.store),
            n_ctx=self.n_ctx,
            max_streams=config.parallel,
            token_budget=self.ctx.n_batch,
            cells_per_seq=self.ctx.n_ctx_seq if self.per_seq else None,
            max_queue=config.max_queue,
        )
        self.metrics = Metrics()
        self.delivery = Delivery(self.vocab, self.metrics)  # guarded by _lock
        self.grammars = Grammars(self.vocab)
        self._batch = Batch(self.ctx.n_batch)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self.fatal_error: str | None = None  # why the engine thread stopped, if it did
        self._exclusive: list[tuple[Callable[[Context], Any], Future[Any]]] = []
        self.embeddings = Embeddings(self)  # its llama.cpp context is made on the first request
        self._unhook = on_abort(lambda reason: faults.aborted(self, reason)) if self.model.placement else None
        self._thread = threading.Thread(target=self._run, name="edgeinfer-engine", daemon=True)
        self._thread.start()

    # --- public API -------------------------------------------------------

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self.vocab.tokenize(text, add_special=True, parse_special=special)

    def chat_text(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
        """The prompt text of messages (and tools, where the template writes them) in the model's template."""
        return self.template.render(messages, add_generation_prompt=True, tools=tools)

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> list[int]:
        """chat_text, tokenized."""
        return self.chat_tokens(self.chat_text(messages, tools))

    def chat_tokens(self, text: str) -> list[int]:
        """A rendered prompt's tokens: its special tokens read as such, BOS once."""
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

        Pass `loop` (or use asubmit) to read the handles with `async for`. A request that can
        never be served raises RequestError here, before anything is queued.
        """
        params = params or SamplingParams()
        tokens = (self.tokenize(prompt) if prompt else []) if isinstance(prompt, str) else list(prompt)
        max_new = check_request(tokens, n, params, self)
        guides = self.grammars.guides(self.grammars.compile(params.grammar), n) if params.grammar else [None] * n
        t_submit = time.perf_counter()
        if self.fatal_error is not None:
            raise EngineFailedError(f"the engine stopped ({self.fatal_error}); restart it")
        with self._lock:
            if self.fatal_error is not None:
                raise EngineFailedError(f"the engine stopped ({self.fatal_error}); restart it")
            if self._closing:
                raise EngineClosedError("the engine is shutting down; no new requests are taken")
            group = self.sched.add(tokens, n, max_new)
            handles = []
            for s, guide in zip(group.streams, guides, strict=True):
                h = StreamHandle(s.id, s.index, self.cancel, loop)
                sampler = make_sampler(params, self.vocab.n_tokens, s.index, tokens)
                self.delivery.open(Live(s, h, params, sampler, TextStream(params.stop), t_submit, guide=guide))
                if self.spec is not None:
                    self.spec.attach(s, params)
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
        if self.fatal_error is not None:  # every stream has ended; the engine thread may hold the lock for good
            return
        with self._lock:
            live = self.delivery.live.get(handle.id)
            if live is not None and not live.stream.status.finished:
                self.sched.cancel(live.stream)
                self._wake.notify()

    def reset_prefixes(self) -> None:
        """Forget the saved KV of finished conversations held in RAM (the chat's /reset)."""
        with self._lock:
            if self.store is not None:
                self.store.clear()

    def set_speculation(self, on: bool) -> None:
        """Turn drafting on or off at run time (benchmarks compare both on one engine)."""
        self.spec_enabled = on

    def run_exclusive(self, fn: Callable[[Context], Any]) -> Any:
        """Run fn(ctx) on the engine thread while no stream runs (the KV cells are then empty).

        For baselines that drive llama.cpp directly (the benchmark's raw loop): the same
        context and the same OS thread, so both share one set of compute threads.
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._closing:
                raise EngineClosedError("the engine is closed")
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

    def snapshot(self) -> EngineStats:
        """The engine now: model, load, KV, rates, latencies, speculation, streams."""
        with self._lock:
            return build_stats(self)

    def close(self) -> None:
        """Cancel everything, stop the engine thread and free llama.cpp's memory."""
        if wedged():  # a llama.cpp call aborted and its thread is parked: touch nothing, the process exits
            return
        if self._unhook is not None:
            self._unhook()
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for live in self.delivery.live.values():
                self.sched.cancel(live.stream)
            self._wake.notify()
        self._thread.join()
        if self.store is not None:
            self.store.close()
        if self.spec is not None:
            self.spec.close()
        self._batch.close()
        self.embeddings.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the engine thread ------------------------------------------------

    def _flush(self) -> None:
        """Hand the step's events to each asyncio loop in one wake-up; cancel streams whose loop is gone."""
        gone = self.delivery.outbox.flush()
        if gone:
            with self._lock:
                for live in self.delivery.live.values():
                    if live.handle.loop in gone:
                        self.sched.cancel(live.stream)

    def _run(self) -> None:
        try:
            while self._iterate():
                pass
        except BaseException as e:
            faults.die(self, e)

    def _iterate(self) -> bool:
        """One pass of the engine thread: wait for work, draft, plan, decode. False once closed."""
        while True:
            self._flush()
            with self._lock:
                while (
                    not self.sched.has_work() and not self._closing and not self._exclusive and not self.embeddings.jobs
                ):
                    self._wake.wait()
                if self._closing and not self.sched.has_work():
                    for _, fut in self._exclusive:
                        fut.set_exception(EngineClosedError("the engine is closed"))
                    return False
            self.embeddings.run_pending()  # one embeddings decode, if any are queued: between two steps
            # Drafting happens outside the lock: only this thread changes streams' tokens.
            t_iter = time.perf_counter()
            drafts = self._propose()
            with self._lock:
                plan = self.sched.schedule(drafts)
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
                n_emitted = self._step(plan)
            except BaseException as e:
                faults.fail_all(self, e)
                continue
            if self.spec is not None and plan.items and all(len(it.tokens) == 1 + it.n_draft for it in plan.items):
                # A decode-only step: its whole time, drafting included, against what it emitted.
                drafted = any(it.n_draft for it in plan.items)
                self.spec.observe_iteration(len(plan.items), drafted, n_emitted, time.perf_counter() - t_iter)

    def _propose(self) -> dict[int, list[int]]:
        if self.spec is None or not self.spec_enabled:
            return {}
        try:
            return self.spec.propose(self.sched.running, self.ctx.n_batch)
        except BaseException as e:
            faults.drafter_failed(self, e)
            return {}

    def _step(self, plan: StepPlan) -> int:
        """Decode the plan's batch and hand out the results; returns tokens emitted."""
        for s in plan.finished:
            self._finish_event(s)
        if not plan.items:
            return 0
        batch = self._batch
        batch.clear()
        rows = []
        for it in plan.items:
            it.row0 = batch.n
            rows.append(batch.add(it.stream.seq, it.tokens, it.pos0, bool(it.samplers), 0 if it.n_draft else -1))
        t0 = time.perf_counter()
        if not self.ctx.decode(batch):
            faults.kv_full(self, plan)
            return 0
        t1 = time.perf_counter()
        if self.spec is not None:
            self.spec.observe_step(plan.n_tokens, t1 - t0)
        with self._lock:
            outputs = []
            for it, row in zip(plan.items, rows, strict=True):
                if it.n_draft:
                    outputs.append(self._verify(it, t1))
                else:
                    outputs.extend(self._sample(s, row, t1) for s in it.samplers)
            for s in self.sched.postprocess(plan, outputs):
                self._finish_event(s)
            n_emitted = sum(len(out.tokens) for out in outputs)
            self.metrics.step(n_emitted, plan.n_tokens, t1 - t0)
        return n_emitted

    def _verify(self, it: BatchItem, now: float) -> StepOutput:
        """The accepted drafts and the target's own next token; the rejected drafts leave the KV."""
        assert self.spec is not None
        s = it.stream
        out = self.spec.verify(self.ctx, it, self.delivery.live[s.id].sampler)
        output = self.delivery.tokens(s, out, now, n_rejected=it.n_draft - (len(out) - 1))
        if output.status is None:
            self.spec.emitted(s, out)
        return output

    def _sample(self, s: Stream, row: int, now: float) -> StepOutput:
        live = self.delivery.live[s.id]
        tokens = next_tokens(live, self.ctx, row)  # the sampled token, then any its grammar forces
        if tokens is None:
            return StepOutput(s, [], status=Status.ERROR)
        lp = None
        if live.params.logprobs is not None:
            lp = logprob(self.ctx, self.vocab, row, tokens[0], live.params.logprobs)
            live.logprobs.append(lp)
        output = self.delivery.tokens(s, tokens, now, lp=lp, in_kv=False)
        if output.status is None and self.spec is not None:
            self.spec.emitted(s, tokens)
        return output

    def _finish_event(self, s: Stream, error: str | None = None) -> None:
        drafted, accepted = (0, 0)
        if self.spec is not None:
            drafted, accepted = self.spec.drafted_for(s.id)
            self.spec.detach(s)
        self.delivery.finish(s, drafted, accepted, error)
