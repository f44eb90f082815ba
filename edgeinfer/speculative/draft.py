"""A draft model: a second, smaller model of the same vocabulary that proposes tokens.

It keeps its own KV cache, one sequence per target sequence id. Before drafting it
catches up on whatever part of a stream it has not seen (prompt, accepted tokens),
and drops what the target rejected, by comparing token lists. All speculating streams
draft together: one llama_decode per draft depth.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeinfer.engine.prefix import common_prefix
from edgeinfer.errors import ConfigError
from edgeinfer.llamacpp import Batch, Context, ContextParams, Model
from edgeinfer.speculative.verify import sampling_probs


@dataclass(slots=True)
class DraftRequest:
    """One stream's drafting job this step."""

    seq: int
    tokens: list[int]  # the stream's tokens; the last one is not in the target KV yet
    k: int  # draft at most this many
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    rng: np.random.Generator


@dataclass(slots=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | None  # (len(tokens), vocab) draft distributions; None when greedy


def check_vocab(target: Model, draft: Model) -> None:
    """Refuse a draft whose tokens are not the target's, token for token."""
    tv, dv = target.vocab, draft.vocab
    if tv.n_tokens != dv.n_tokens:
        raise ConfigError(
            f"draft model {draft.path.name} has {dv.n_tokens} tokens, the target {tv.n_tokens}: "
            "a draft must share the target's vocabulary (pick one from the same model family)"
        )
    for t in range(tv.n_tokens):
        if tv.text_of(t) != dv.text_of(t):
            raise ConfigError(
                f"draft model {draft.path.name} differs from the target at token {t} "
                f"({dv.text_of(t)!r} vs {tv.text_of(t)!r}): a draft must share the target's vocabulary"
            )


class DraftModel:
    """Owns the draft model, its context and its per-sequence record of what its KV holds."""

    def __init__(self, path: Path, target: Model, params: ContextParams, p_min: float = 0.5) -> None:
        self.model = Model(path, gpu_layers=target.gpu_layers)
        try:
            check_vocab(target, self.model)
            self.ctx = Context(self.model, params)
        except BaseException:
            self.model.close()
            raise
        self.batch = Batch(self.ctx.n_batch)
        self.p_min = p_min  # stop a stream's draft when its token's draft probability is below this
        self.held: dict[int, list[int]] = {}  # seq -> tokens in the draft KV

    def draft(self, reqs: list[DraftRequest], on_step: Callable[[int, float], None]) -> dict[int, Draft]:
        """Draft for every request together; on_step(n_streams, seconds) reports each draft decode."""
        out = {r.seq: Draft([], None) for r in reqs}
        qs: dict[int, list[np.ndarray]] = {r.seq: [] for r in reqs}
        # Catch up: the draft KV must hold tokens[:-1]; then the last token starts the draft.
        pending = {r.seq: self._sync(r) for r in reqs}
        rows = self._feed(pending, on_step)
        live = {r.seq: r for r in reqs}
        depth = 0
        while live:
            depth += 1
            step: dict[int, list[int]] = {}
            for seq, r in list(live.items()):
                logits = self.ctx.logits(rows[seq])
                if r.temperature <= 0:
                    tok = int(np.argmax(logits))
                    conf = _softmax_max(logits)
                else:
                    probs = sampling_probs(logits, r.temperature, r.top_k, r.top_p, r.min_p)
                    tok = int(r.rng.choice(len(probs), p=probs))
                    conf = float(probs[tok])
                if conf < self.p_min and out[seq].tokens:
                    del live[seq]
                    continue
                out[seq].tokens.append(tok)
                if r.temperature > 0:
                    qs[seq].append(probs)
                if len(out[seq].tokens) >= r.k:
                    del live[seq]
                else:
                    step[seq] = [tok]
            if step:
                rows = self._feed({seq: (len(self.held[seq]), toks) for seq, toks in step.items()}, on_step)
        for seq, d in out.items():
            if qs[seq]:
                d.q = np.stack(qs[seq])
        return out

    def _sync(self, r: DraftRequest) -> tuple[int, list[int]]:
        """Drop what the draft KV holds beyond the common prefix; return (pos0, tokens to feed)."""
        held = self.held.get(r.seq, [])
        want = r.tokens
        keep = common_prefix(held, want[:-1])
        if keep < len(held):
            self.ctx.seq_rm(r.seq, keep, -1)
            self.held[r.seq] = held[:keep]
        else:
            self.held[r.seq] = held
        return keep, want[keep:]

    def _feed(self, pending: dict[int, tuple[int, list[int]]], on_step: Callable[[int, float], None]) -> dict[int, int]:
        """Decode each sequence's tokens (in n_batch chunks); return each one's last output row."""
        rows: dict[int, int] = {}
        queue = [(seq, pos, toks) for seq, (pos, toks) in pending.items() if toks]
        while queue:
            self.batch.clear()
            room = self.ctx.n_batch
            nxt = []
            step_rows = {}
            for seq, pos, toks in queue:
                take = min(len(toks), room)
                if take == 0:
                    nxt.append((seq, pos, toks))
                    continue
                last = take == len(toks)
                row = self.batch.add(seq, toks[:take], pos, last)
                self.held[seq] = self.held[seq] + toks[:take]
                room -= take
                if last:
                    step_rows[seq] = row
                else:
                    nxt.append((seq, pos + take, toks[take:]))
            t0 = time.perf_counter()
            if not self.ctx.decode(self.batch):
                raise ConfigError("the draft model's context is full; raise --ctx-size")
            on_step(len(step_rows), time.perf_counter() - t0)
            rows.update(step_rows)
            queue = nxt
        return rows

    def forget(self, seq: int) -> None:
        self.held.pop(seq, None)
        self.ctx.seq_rm(seq)

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()


def _softmax_max(logits: np.ndarray) -> float:
    m = logits.max()
    return 1.0 / float(np.exp(logits - m).sum())
