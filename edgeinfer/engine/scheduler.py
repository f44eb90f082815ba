"""The scheduler: which tokens of which streams go into the next llama_decode.

Pure Python; it knows nothing of llama.cpp. Each stream has `tokens` (prompt plus
generated) and `n_computed`, the number of those already in the KV cache. A step
moves every running stream's `n_computed` towards `len(tokens)` under one token
budget: a decoding stream needs one token, a new prompt takes what budget is left
(chunked prefill), so there is no separate prefill phase.

KV cells are accounted by reservation: a request reserves its prompt plus `n` times
its `max_new` tokens when admitted, so a running stream can never run out of cells.
Finished streams may be *retained*: their KV stays, keyed by the tokens it holds, so
that a later prompt with the same prefix (the next chat turn) skips that prefill.
Retained entries are evicted least recently used whenever admission needs the room,
and while streams run they may hold no more cells than the running streams reserve (or
1/16 of the context, if that is more): llama.cpp's attention reads every occupied cell
for every stream, so a prefix nobody reuses slows every decode step.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from edgeinfer.engine.prefix import PrefixTrie
from edgeinfer.engine.step import BatchItem, Group, KvOp, Status, StepOutput, StepPlan, Stream
from edgeinfer.errors import QueueFullError

__all__ = ["BatchItem", "Group", "KvOp", "Scheduler", "Status", "StepOutput", "StepPlan", "Stream"]

# Prefixes shorter than this are computed again rather than copied or waited for.
MIN_SHARE = 16


class Scheduler:
    """Holds waiting and running streams and plans each step."""

    def __init__(
        self,
        n_ctx: int,
        max_streams: int,
        n_seq_ids: int,
        token_budget: int,
        max_retained: int = 0,
        max_queue: int | None = None,
    ) -> None:
        if token_budget < max_streams:
            raise ValueError("token budget must be at least the number of streams")
        if n_seq_ids < max_streams:
            raise ValueError("need at least one sequence id per stream")
        self.n_ctx = n_ctx
        self.max_streams = max_streams
        self.token_budget = token_budget
        self.max_retained = max_retained
        self.max_queue = max_queue
        self.waiting: deque[Group] = deque()
        self.running: list[Stream] = []
        self.free_seqs: list[int] = list(range(n_seq_ids - 1, -1, -1))
        self.retained: OrderedDict[int, list[int]] = OrderedDict()  # seq -> tokens in its KV; oldest first
        self.kept = PrefixTrie()  # the retained entries, by seq
        self.live = PrefixTrie()  # prompts of running streams, by stream id
        self._live_streams: dict[int, Stream] = {}
        self.reserved = 0  # cells reserved by admitted groups
        self._ops: list[KvOp] = []
        self._next_id = 0
        self._cancelled_waiting: list[Stream] = []
        # Counters for stats.
        self.prompt_tokens_cached = 0
        self.prompt_tokens_computed = 0
        self.evictions = 0

    # --- requests ---------------------------------------------------------

    def add(self, prompt: list[int], n: int, max_new: int, retain: bool = True) -> Group:
        """Queue a request of n streams (checked by the engine: it fits); QueueFullError when the queue is full."""
        group = Group(list(prompt), n, max_new, retain=retain and n == 1)
        assert prompt and 1 <= n <= self.max_streams and group.reserve <= self.n_ctx, "the engine checks requests"
        if self.max_queue is not None and self._queued() >= self.max_queue:
            raise QueueFullError(f"the queue is full ({self.max_queue} waiting requests); retry shortly")
        for i in range(n):
            s = Stream(self._next_id, group, i, list(prompt), len(prompt), max_new)
            self._next_id += 1
            group.streams.append(s)
        group.n_live = n
        self.waiting.append(group)
        return group

    def _queued(self) -> int:
        """Waiting groups that will not start at the next step: the ones beyond the free stream slots.

        A request that arrives while a slot is free is not queued, even before the engine
        thread has admitted it, so a burst does not see the queue full for a moment.
        """
        free = self.max_streams - len(self.running)
        queued = 0
        for g in self.waiting:
            if queued == 0 and g.n <= free:
                free -= g.n
            else:
                queued += 1
        return queued

    def cancel(self, stream: Stream) -> None:
        """Ask for a stream to stop; it is finished and its KV freed at the next step."""
        stream.cancel_requested = True

    @property
    def n_waiting(self) -> int:
        return sum(g.n_live for g in self.waiting)

    @property
    def cells_used(self) -> int:
        return self.reserved + sum(len(t) for t in self.retained.values())

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._ops or self._cancelled_waiting)

    # --- the step ---------------------------------------------------------

    def schedule(self, drafts: dict[int, list[int]] | None = None) -> StepPlan:
        """Plan the next step; `drafts` (stream id -> draft tokens) ride along with their streams' next token."""
        drafts = drafts or {}
        finished = self._apply_cancellations()
        self._admit()
        self._trim_retained()
        self._resolve_shares()
        items: list[BatchItem] = []
        budget = self.token_budget
        # Decoding streams first: one token each (plus any draft), so running streams never stall.
        n_decoding = sum(1 for s in self.running if not self._blocked(s) and len(s.tokens) - s.n_computed == 1)
        spare = budget - n_decoding
        for s in self.running:
            if not self._blocked(s) and len(s.tokens) - s.n_computed == 1:
                draft = drafts.get(s.id, [])[: max(0, spare)]
                spare -= len(draft)
                items.append(BatchItem(s, [s.tokens[-1], *draft], s.n_computed, self._samplers(s), len(draft)))
                budget -= 1 + len(draft)
        # Then prompt chunks, oldest first, in what budget is left.
        for s in self.running:
            left = len(s.tokens) - s.n_computed
            if budget <= 0:
                break
            if self._blocked(s) or left <= 1:
                continue
            chunk = min(left, budget)
            samplers = self._samplers(s) if chunk == left else []
            items.append(BatchItem(s, s.tokens[s.n_computed : s.n_computed + chunk], s.n_computed, samplers))
            budget -= chunk
        ops, self._ops = self._ops, []
        return StepPlan(ops, items, finished)

    def postprocess(self, plan: StepPlan, outputs: list[StepOutput]) -> list[Stream]:
        """After the decode: the plan's batch is in the KV cache; apply each stream's output; return the ended ones."""
        self._complete(plan)
        ended = []
        for out in outputs:
            s = out.stream
            if out.n_rejected > 0:
                s.n_computed -= out.n_rejected
                self._ops.append(KvOp("rm", s.seq, s.n_computed, -1))
            s.tokens.extend(out.tokens)
            if out.status is not None:
                self.finish(s, out.status)
                ended.append(s)
        return ended

    def _complete(self, plan: StepPlan) -> None:
        """Record that the plan's batch is now in the KV cache."""
        for it in plan.items:
            s = it.stream
            s.n_computed += len(it.tokens)
            computed_prompt = min(len(it.tokens), max(0, s.n_prompt - it.pos0))
            self.prompt_tokens_computed += computed_prompt
            for child in it.samplers:
                if child is not s:
                    # The child shares the leader's prompt cells from now on.
                    self._ops.append(KvOp("cp", s.seq, 0, s.n_computed, dst=child.seq))
                    child.n_computed = s.n_computed
                    child.n_cached = s.n_cached
                    child.fork_pending = False

    def finish(self, stream: Stream, status: Status) -> None:
        """End a running stream; its sequence is retained or queued for removal."""
        assert status.finished and stream.status == Status.RUNNING
        stream.status = status
        self.running.remove(stream)
        group = stream.group
        group.n_live -= 1
        if stream.id in self.live:
            self.live.remove(stream.id)
            del self._live_streams[stream.id]
        if group.retain and status != Status.ERROR and stream.n_computed > 0:
            self._keep(stream.seq, stream.tokens[: stream.n_computed])
        else:
            self._release_seq(stream.seq)
        if group.n_live == 0:
            self.reserved -= group.reserve
        while len(self.retained) > self.max_retained:
            self._evict_oldest()

    # --- internals --------------------------------------------------------

    def _apply_cancellations(self) -> list[Stream]:
        done = self._cancelled_waiting
        self._cancelled_waiting = []
        for s in list(self.running):
            if s.cancel_requested:
                self.finish(s, Status.CANCELLED)
                done.append(s)
        for g in list(self.waiting):
            for s in g.streams:
                if s.cancel_requested and s.status == Status.WAITING:
                    s.status = Status.CANCELLED
                    g.n_live -= 1
                    done.append(s)
            if g.n_live == 0:
                self.waiting.remove(g)
        return done

    def _admit(self) -> None:
        while self.waiting:
            g = self.waiting[0]
            if len(self.running) + g.n > self.max_streams or not self._try_admit(g):
                return
            self.waiting.popleft()

    def _trim_retained(self) -> None:
        """While streams run, keep retained cells within what they reserve (least recently used out first)."""
        if not self.running:
            return
        budget = max(self.reserved, self.n_ctx // 16)
        held = sum(len(t) for t in self.retained.values())
        while held > budget:
            seq = next(iter(self.retained))
            held -= len(self.retained[seq])
            self._evict(seq)

    def _try_admit(self, g: Group) -> bool:
        # The longest prefix already held: by a kept (finished) sequence, or a live stream's prompt.
        kept_seq, kept_len = self.kept.longest(g.prompt)
        live_id, live_len = self.live.longest(g.prompt)
        last = len(g.prompt) - 1  # the last prompt token is computed again: its logits start the reply
        take_over = kept_seq >= 0 and kept_len >= live_len and kept_len == len(self.retained[kept_seq])
        take_over = take_over and min(kept_len, last) > 0
        keep_seq = kept_seq if take_over else -1
        while True:
            reclaim = len(self.retained[keep_seq]) if keep_seq >= 0 else 0
            free_cells = self.n_ctx - self.cells_used + reclaim
            free_ids = len(self.free_seqs) + (1 if keep_seq >= 0 else 0)
            if free_cells >= g.reserve and free_ids >= g.n:
                break
            victims = [seq for seq in self.retained if seq != keep_seq]
            if not victims:
                return False
            self._evict(victims[0])
        streams = [s for s in g.streams if s.status == Status.WAITING]
        leader = streams[0]
        if take_over:
            # The kept KV is a prefix of this prompt (the next turn of a chat): continue in it.
            reuse = min(kept_len, last)
            self._unkeep(kept_seq)
            leader.seq = kept_seq
            leader.n_computed = leader.n_cached = reuse
            self.prompt_tokens_cached += reuse
            self._ops.append(KvOp("rm", kept_seq, reuse, -1))
        else:
            leader.seq = self.free_seqs.pop()
            kept_seq, kept_len = self.kept.longest(g.prompt)  # eviction may have dropped the match
            if kept_seq >= 0 and min(kept_len, last) >= MIN_SHARE and kept_len >= live_len:
                # Share a kept prefix: copy its cells, keep the entry for others.
                reuse = min(kept_len, last)
                self._ops.append(KvOp("cp", kept_seq, 0, reuse, dst=leader.seq))
                self.retained.move_to_end(kept_seq)
                leader.n_computed = leader.n_cached = reuse
                self.prompt_tokens_cached += reuse
            elif live_id >= 0 and min(live_len, last) >= MIN_SHARE:
                # A running stream computes (or has computed) this prefix: copy it once it is there.
                leader.share_src = self._live_streams[live_id]
                leader.share_len = min(live_len, last)
        for s in streams[1:]:
            s.seq = self.free_seqs.pop()
            s.fork_pending = True
        for s in streams:
            s.status = Status.RUNNING
            self.running.append(s)
        self.live.insert(leader.id, g.prompt)
        self._live_streams[leader.id] = leader
        self.reserved += g.reserve
        return True

    def _resolve_shares(self) -> None:
        """Streams waiting for another's prompt prefix copy it as soon as it is computed."""
        for s in self.running:
            src = s.share_src
            if src is None:
                continue
            if src.status == Status.RUNNING and src.n_computed >= s.share_len and src.share_src is None:
                self._ops.append(KvOp("cp", src.seq, 0, s.share_len, dst=s.seq))
                s.n_computed = s.n_cached = s.share_len
                self.prompt_tokens_cached += s.share_len
                s.share_src = None
            elif src.status.finished:
                s.share_src = None  # its source is gone: compute the prompt itself

    @staticmethod
    def _blocked(s: Stream) -> bool:
        """Waiting for another stream's KV (a fork's leader, or a shared prefix)."""
        return s.fork_pending or s.share_src is not None

    def _keep(self, seq: int, tokens: list[int]) -> None:
        self.retained[seq] = tokens
        self.kept.insert(seq, tokens)

    def _unkeep(self, seq: int) -> None:
        del self.retained[seq]
        self.kept.remove(seq)

    @staticmethod
    def _samplers(s: Stream) -> list[Stream]:
        """The streams that sample from s's next logits: s, and its forks still waiting for the prompt."""
        if s.group.n == 1:
            return [s]
        return [s] + [c for c in s.group.streams if c.fork_pending]

    def _release_seq(self, seq: int) -> None:
        self._ops.append(KvOp("rm", seq))
        self.free_seqs.append(seq)

    def _evict(self, seq: int) -> None:
        self._unkeep(seq)
        self._release_seq(seq)
        self.evictions += 1

    def _evict_oldest(self) -> None:
        self._evict(next(iter(self.retained)))

    def evict_all(self) -> None:
        """Drop every retained prefix (e.g. on /reset)."""
        while self.retained:
            self._evict_oldest()
