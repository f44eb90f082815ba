"""The engine: one thread runs draft -> schedule -> decode -> postprocess, packing every stream into one llama_decode.

Callers submit requests from any thread (or an asyncio loop) and read events from a
StreamHandle. All llama.cpp work happens on the engine thread; the scheduler is
guarded by one lock that is never held during llama_decode.

One Stream (step.py) holds each stream's state from submit to its Finish; the engine keeps them in
`streams`, and `_finished` is the one place a stream ends. Between two steps the engine thread runs
its BetweenSteps work (embeddings; the benchmark's raw loop, edgeinfer.bench.exclusive). One step,
and the layer that owns each part:
  speculator.propose(running)      -> drafts by stream id            (edgeinfer.speculative)
  scheduler.schedule(drafts)       -> StepPlan: batch items          (scheduler.py)
  ctx.decode(batch)                                                   (edgeinfer.llamacpp)
  sample / verify each item        -> StepOutput per stream          (sampling.py, grammar.py, emit.py, here)
  scheduler.postprocess(plan, outs) -> the streams that ended         (then _finished: emit.py, speculator)
What breaks is handled in faults.py, over the small faults.Host interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from edgeinfer.engine import faults
from edgeinfer.engine.disk import warn_stderr
from edgeinfer.engine.embeddings import Embeddings
from edgeinfer.engine.emit import Emitter
from edgeinfer.engine.facts import ModelFacts
from edgeinfer.engine.grammar import GrammarFailed, Grammars, next_tokens
from edgeinfer.engine.handle import StreamHandle
from edgeinfer.engine.kvcache import ContextKv, make_store
from edgeinfer.engine.metrics import Metrics
from edgeinfer.engine.offload import Offload, gpus_free, local_gpus, plan_for
from edgeinfer.engine.requests import check_request
from edgeinfer.engine.sampling import logprob, make_sampler
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sizing import sized
from edgeinfer.engine.stats import (
    EngineStats,
    EngineView,
    GpuStats,
    SpeculationStats,
    build_stats,
    gpu_stats,
    model_stats,
)
from edgeinfer.engine.step import BatchItem, StepOutput, StepPlan
from edgeinfer.engine.stream import Status, Stream
from edgeinfer.engine.template import ChatTemplate
from edgeinfer.engine.text import TextStream
from edgeinfer.engine.threads import ThreadTuner
from edgeinfer.errors import EdgeInferError, EngineClosedError, EngineFailedError
from edgeinfer.events import Finish
from edgeinfer.llamacpp import Batch, Context, ContextParams, Model, on_abort, wedged
from edgeinfer.llamacpp.rpc import place_for
from edgeinfer.models.gguf import read_gguf
from edgeinfer.options import EngineConfig, SamplingParams, model_sampling
from edgeinfer.speculative.speculator import Speculator


class BetweenSteps(Protocol):
    """Work the engine thread runs between two steps (embeddings; the benchmark's raw loop), never during one."""

    def pending(self) -> bool:
        """Whether work is queued; read under the engine's lock, so it must not take the lock itself."""

    def run_pending(self) -> None:
        """Run some of the queued work: on the engine thread, the lock not held."""

    def fail(self, error: BaseException) -> None:
        """The engine stopped: the queued work ends with `error` (the engine's lock is held)."""


class Engine:
    """Runs many streams of one model, packed into one llama_decode per step."""

    def __init__(self, config: EngineConfig, show: Sequence[str] = ()) -> None:
        """show: texts (the tags of tool calls and thinking) that this vocabulary may hold as special tokens, to be
        shown as their text so that the answer's parsers see them (llama.cpp renders a control token as nothing)."""
        config, self.sizing = sized(config)  # --ctx-size 0 and --parallel 0 decided from the model and memory
        info = read_gguf(config.model)
        placement = place_for(config, info) if config.rpc else None
        # --gpu-layers auto decided from the GPU's free memory (the workers' split decides with --rpc).
        self.offload: Offload | None = None if placement else plan_for(config, info)
        if placement is not None:
            config = config.replace(gpu_layers=placement.n_gpu_layers, draft_gpu_layers=placement.n_gpu_layers)
        else:
            assert self.offload is not None
            config = config.replace(gpu_layers=self.offload.layers, draft_gpu_layers=self.offload.draft_layers)
        self.config = config
        self.model_path = config.model
        free_before = gpus_free() if self.offload and self.offload.layers else None
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
        self.speculator: Speculator | None = None
        self.speculation_error: str | None = None
        try:
            self._load(config, placement, ctx_params)
        except EdgeInferError as e:
            # An estimate that was short (another program took the memory meanwhile, a driver that reserves
            # more): with auto, the CPU runs the model instead, and the plan says why.
            if self.offload is None or not self.offload.auto or not self.offload.layers:
                raise
            self.offload = replace(
                self.offload, layers=0, weight_bytes=0, kv_bytes=0, compute_bytes=0, draft_layers=0, draft_bytes=0,
                reason=f"the load on the GPU failed ({e}); the CPU runs every layer",
            )  # fmt: skip
            free_before = None
            config = config.replace(gpu_layers=0, draft_gpu_layers=0)
            self.config = config
            self._load(config, placement, ctx_params)
        if free_before is not None and self.offload is not None:  # what the load took, beside the estimate
            self.offload = replace(self.offload, measured_bytes=max(0, free_before - gpus_free()))
        self.vocab = self.model.vocab
        self.vocab.show(list(show))
        self.template = ChatTemplate.for_model(self.model)
        self.n_ctx = self.ctx.n_ctx
        self.per_seq = not self.ctx.kv_unified
        self.n_ctx_stream = self.ctx.n_ctx_seq if self.per_seq else self.n_ctx  # what one stream can hold
        # An answer whose request names no bound runs to the end of its stream's context, as llama-server's does
        # (a base model's chat turn is bounded by the server: server/run.py).
        self.default_max_tokens = self.n_ctx_stream
        self.facts = ModelFacts(
            template=self.template,
            special_token=self.vocab.special_token,
            tool_format=config.tool_format,
            reasoning_format=config.reasoning_format,
            reasoning_budget=config.reasoning_budget,
            sampling_defaults=model_sampling(self.model.info.metadata),
        )
        self.store = make_store(config, self.model, self.ctx)
        self.sched = Scheduler(
            ContextKv(self.ctx, self.store),
            n_ctx=self.n_ctx,
            max_streams=config.parallel,
            token_budget=self.ctx.n_batch,
            cells_per_seq=self.ctx.n_ctx_seq if self.per_seq else None,
            max_queue=config.max_queue,
            # Finished conversations stay in their sequences where there are tiers to keep them in at all; with a
            # disk tier each is written there as it ends as well, so that a crash or a kill loses none of it.
            keep_finished=self.store is not None and self.store.ram_bytes > 0,
            write_through=self.store is not None and self.store.disk is not None,
        )
        self.metrics = Metrics()
        # Threads fitted to the load only where the user left them to us (--threads and --threads-batch 0).
        self.thread_tuner = ThreadTuner(self.ctx.threads) if not (config.threads or config.threads_batch) else None
        self.emitter = Emitter(self.vocab, self.metrics)  # guarded by lock
        self.streams: dict[int, Stream] = {}  # every stream from submit to its Finish, by id; guarded by lock
        self.grammars = Grammars(self.vocab)
        self._model_stats = model_stats(config, self.model, self.n_ctx)
        self._batch = Batch(self.ctx.n_batch)
        # The one lock: callers' threads and the engine thread share the scheduler, the streams, the emitter
        # and the work between steps under it. It is never held during llama_decode.
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self._closing = False
        self.fatal_error: str | None = None  # why the engine thread stopped, if it did
        self.embeddings = Embeddings(self)  # its llama.cpp context is made on the first request
        self._between: list[BetweenSteps] = [self.embeddings]
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
        grammars = self.grammars.states(self.grammars.compile(params.grammar), n) if params.grammar else [None] * n
        t_submit = time.perf_counter()
        self._check_failed()
        with self.lock:
            self.check_open()
            group = self.sched.add(tokens, n, max_new)
            handles = []
            # ignore_eos as llama-server has it: no end-of-generation token is picked (the text goes on as text,
            # not past an end of turn); a grammar's end is still its end.
            banned = self.vocab.eog_ids if params.ignore_eos and not params.grammar else ()
            for s, grammar in zip(group.streams, grammars, strict=True):
                s.handle = StreamHandle(s.id, s.index, self.cancel, loop)
                s.params, s.grammar, s.t_submit = params, grammar, t_submit
                s.sampler = make_sampler(params, self.vocab.n_tokens, s.index, tokens, banned)
                s.text = TextStream(params.stop)
                self.streams[s.id] = s
                if self.speculator is not None:
                    self.speculator.attach(s)
                handles.append(s.handle)
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
        with self.lock:
            s = self.streams.get(handle.id)
            if s is not None and not s.status.finished:
                self.sched.cancel(s)
                self._wake.notify()

    def reset_prefixes(self) -> None:
        """Forget the KV of finished conversations: in RAM, and in the sequences they ended in (the chat's /reset)."""
        with self.lock:
            if self.store is not None:
                self.store.clear()
            self.sched.forget_kept()
            self._wake.notify()

    def check_open(self) -> None:
        """EngineFailedError or EngineClosedError when the engine takes no new work; the caller holds the lock."""
        self._check_failed()
        if self._closing:
            raise EngineClosedError("the engine is shutting down; no new requests are taken")

    def _check_failed(self) -> None:
        if self.fatal_error is not None:
            raise EngineFailedError(f"the engine stopped ({self.fatal_error}); restart it")

    def thread_alive(self) -> bool:
        return self._thread.is_alive()

    def wake(self) -> None:
        """Wake the engine thread: work between steps was queued (the caller does not hold the lock)."""
        with self.lock:
            self._wake.notify()

    def add_between_steps(self, work: BetweenSteps) -> None:
        """Run `work` between steps from now on, until remove_between_steps (EngineClosedError once closing)."""
        with self.lock:
            if self._closing:
                raise EngineClosedError("the engine is closed")
            self._between.append(work)
            self._wake.notify()

    def remove_between_steps(self, work: BetweenSteps) -> None:
        with self.lock:
            if work in self._between:
                self._between.remove(work)

    def is_idle(self) -> bool:
        """No stream is running, waiting or waiting to be finished (the KV cells are then empty)."""
        with self.lock:
            return not self.sched.has_work()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no stream is running, waiting, or ended with its KV still to save (tests, benchmarks)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.is_idle():
                return True
            time.sleep(0.005)
        return False

    def snapshot(self) -> EngineStats:
        """The engine now: model, load, KV, rates, latencies, speculation, streams."""
        with self.lock:
            return build_stats(self._view())

    def _load(self, config: EngineConfig, placement: Any, ctx_params: ContextParams) -> None:
        """Load the model, its context and the speculator (the draft model's context too), or close what was
        made and raise."""
        model = Model(config.model, gpu_layers=int(config.gpu_layers), placement=placement)
        ctx: Context | None = None
        try:
            ctx = Context(model, ctx_params)
            speculator = Speculator(config, model, ctx_params, ctx.batch_invariant) if config.spec != "off" else None
        except BaseException:
            if ctx is not None:
                ctx.close()
            model.close()
            raise
        self.model, self.ctx, self.speculator = model, ctx, speculator

    def _gpu_stats(self) -> GpuStats:
        """The offload, with the GPUs' free memory read now (nothing to read when no layer is there)."""
        offload = self.offload
        return gpu_stats(offload, local_gpus() if offload is not None and offload.gpus else [])

    def _view(self) -> EngineView:
        """What the stats are made of; the caller holds the lock."""
        speculator = self.speculator
        return EngineView(
            config=self.config,
            model=self._model_stats.model_copy(update={"gpu": self._gpu_stats()}),
            n_ctx=self.n_ctx,
            n_ctx_seq=self.ctx.n_ctx_seq,
            sched=self.sched,
            metrics=self.metrics,
            streams=list(self.streams.values()),
            spec=speculator.stats() if speculator is not None else SpeculationStats(error=self.speculation_error),
            cache=self.store.refresh_stats().model_copy() if self.store is not None else None,
            threads=self.ctx.threads,
            threads_max=self.thread_tuner.max if self.thread_tuner is not None else self.ctx.threads,
            thread_changes=self.thread_tuner.changes if self.thread_tuner is not None else None,
        )

    def close(self) -> None:
        """Cancel everything, stop the engine thread and free llama.cpp's memory."""
        if wedged():  # a llama.cpp call aborted and its thread is parked: touch nothing, the process exits
            return
        if self._unhook is not None:
            self._unhook()
        with self.lock:
            if self._closing:
                return
            self._closing = True
            for s in self.streams.values():
                self.sched.cancel(s)
            self._wake.notify()
        self._thread.join()
        if self.fatal_error is None:
            try:  # the conversations still in their sequences go to the tiers, the disk too, for a restart
                self.sched.release_kept(save=True)
            except Exception as e:
                warn_stderr(f"the finished conversations' KV was not saved at close ({e}); they start cold next time")
        if self.store is not None:
            self.store.close()
        if self.speculator is not None:
            self.speculator.close()
        self._batch.close()
        self.embeddings.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what fault handling asks of the engine (faults.Host) ---------------

    def stop(self, reason: str) -> None:
        """Refuse new work; every stream and the work queued between steps end with the reason (lock held)."""
        self.fatal_error = reason
        self._closing = True
        streams, self.streams = self.streams, {}
        for s in streams.values():
            s.status = Status.ERROR
            with contextlib.suppress(Exception):
                self.emitter.finish(s, error=f"the engine stopped ({reason}); restart it")
        for work in self._between:
            work.fail(EngineFailedError(f"the engine stopped: {reason}"))

    def end_stream(self, s: Stream, status: Status, error: str | None = None) -> None:
        """End a running stream, in the scheduler and for its caller (lock held)."""
        self.sched.finish(s, status)
        self._finished(s, error)

    def deliver(self) -> None:
        """Hand the queued events to their asyncio loops, without the lock (the engine thread may hold it for good)."""
        self.emitter.outbox.flush()

    # --- the engine thread ------------------------------------------------

    # When a step's events go to the asyncio loops: the loop's thread wakes at once and needs the GIL for its
    # part (rendering, the socket write). Handed out while this thread still runs Python (planning the next
    # step), the loop's thread waits for the GIL, takes it at this thread's next ctypes call, and this thread
    # then waits for it back. So events go out just before the GIL is let go for a while: the next
    # llama_decode, or idling; and before slow work (saving ended streams, work between steps).

    def _flush(self) -> None:
        """Hand the step's events to each asyncio loop in one wake-up; cancel streams whose loop is gone."""
        gone = self.emitter.outbox.flush()
        if gone:
            with self.lock:
                self._cancel_gone(gone)

    def _cancel_gone(self, gone: list[asyncio.AbstractEventLoop]) -> None:
        for s in self.streams.values():
            if s.handle.loop in gone:
                self.sched.cancel(s)

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                if any(w.pending() for w in self._between):
                    self._flush()
                    for work in list(self._between):  # a copy: callers add and remove work meanwhile
                        work.run_pending()
                self._iterate()
        except BaseException as e:
            faults.die(self, e)

    def _wait_for_work(self) -> bool:
        """Save what the streams the last step ended leave in the KV cache (their events out first); wait for
        streams or work between steps (the events out first); False once closed."""
        if self.sched.has_ended():
            self._flush()
        try:
            with self.lock:
                self.sched.retire_ended()
        except Exception as e:  # saving a sequence failed: like a step failing
            faults.fail_all(self, e)
        with self.lock:
            while not self.sched.has_work() and not self._closing and not any(w.pending() for w in self._between):
                if self.emitter.outbox:
                    self._cancel_gone(self.emitter.outbox.flush())
                    continue  # cancelling changed the work
                self._wake.wait()
            if self._closing and not self.sched.has_work():
                for work in self._between:
                    work.fail(EngineClosedError("the engine is closed"))
                return False
        return True

    def _iterate(self) -> None:
        """One step: draft, schedule, run the batch, post-process."""
        t_iter = time.perf_counter()
        drafts = self._propose()  # outside the lock: only this thread changes streams' tokens
        with self.lock:
            plan = self.sched.schedule(drafts)
        try:
            n_emitted = self._step(plan)
        except BaseException as e:
            faults.fail_all(self, e)
            return
        if self.speculator is not None and plan.items and all(len(it.tokens) == 1 + it.n_draft for it in plan.items):
            # A decode-only step: its whole time, drafting included, against what it emitted.
            drafted = any(it.n_draft for it in plan.items)
            self.speculator.observe_iteration(len(plan.items), drafted, n_emitted, time.perf_counter() - t_iter)

    def _propose(self) -> dict[int, list[int]]:
        if self.speculator is None:
            return {}
        try:
            return self.speculator.propose(self.sched.running, self.ctx.n_batch)
        except BaseException as e:
            self._drop_speculator(e)
            return {}

    def _drop_speculator(self, error: BaseException) -> None:
        """Drafting broke (e.g. the draft context is full): go on without speculation."""
        with self.lock:  # submit() and the Finish path read self.speculator under the lock
            speculator, self.speculator = self.speculator, None
            self.speculation_error = str(error)
        if speculator is not None:
            warn_stderr(f"speculative decoding is off from now on: {type(error).__name__}: {error}")
            speculator.close()

    def _step(self, plan: StepPlan) -> int:
        """Decode the plan's batch and hand out the results; returns tokens emitted."""
        for s in plan.finished:
            self._finished(s)
        if not plan.items:
            return 0
        batch = self._batch
        batch.clear()
        rows = []
        for it in plan.items:
            it.row0 = batch.n
            rows.append(batch.add(it.stream.seq, it.tokens, it.pos0, bool(it.samplers), 0 if it.n_draft else -1))
        tuner = self.thread_tuner
        if tuner is not None and (threads := tuner.threads()) != self.ctx.threads:
            self.ctx.set_threads(threads)
        self._flush()  # the last step's events, as the GIL is let go
        t0 = time.perf_counter()
        self.metrics.decoding_since = t0
        try:
            if not self.ctx.decode(batch):
                faults.kv_full(self, plan)
                return 0
        finally:
            self.metrics.decoding_since = None
        t1 = time.perf_counter()
        if self.speculator is not None:
            self.speculator.observe_step(plan.n_tokens, sum(it.n_draft for it in plan.items), t1 - t0)
        with self.lock:
            outputs = []
            for it, row in zip(plan.items, rows, strict=True):
                if it.n_draft:
                    outputs.append(self._verify(it, t1))
                else:
                    outputs.extend(self._sample(s, row, t1) for s in it.samplers)
            for s in self.sched.postprocess(plan, outputs):
                self._finished(s)
            n_emitted = sum(len(out.tokens) for out in outputs)
            self.metrics.step(n_emitted, plan.n_tokens, t1 - t0)
        return n_emitted

    def _verify(self, it: BatchItem, now: float) -> StepOutput:
        """The accepted drafts and the target's own next token; the rejected drafts leave the KV."""
        assert self.speculator is not None
        s = it.stream
        out = self.speculator.verify(self.ctx, it)
        output = self.emitter.tokens(s, out, now, n_rejected=it.n_draft - (len(out) - 1))
        if output.status is None:
            self.speculator.emitted(s, out)
        return output

    def _sample(self, s: Stream, row: int, now: float) -> StepOutput:
        try:  # the sampled token, then any its grammar forces
            tokens = next_tokens(s.grammar, s.sampler, self.ctx, row, s.max_new - s.n_generated)
        except GrammarFailed as e:
            s.error = f"the output grammar could not go on: {e}"
            return StepOutput(s, [], status=Status.ERROR)
        lp = None
        if s.params.logprobs is not None:
            lp = logprob(self.ctx, self.vocab, row, tokens[0], s.params.logprobs)
            s.logprobs.append(lp)
        output = self.emitter.tokens(s, tokens, now, lp=lp, in_kv=False)
        if output.status is None and self.speculator is not None:
            self.speculator.emitted(s, tokens)
        return output

    def _finished(self, s: Stream, error: str | None = None) -> None:
        """A stream has ended (the scheduler knows): the one place its caller and the speculator hear of it."""
        del self.streams[s.id]
        if self.speculator is not None:
            self.speculator.detach(s)
        self.emitter.finish(s, error)
