"""A draft model: a second, smaller model of the same vocabulary that proposes tokens.

It keeps its own KV cache, one sequence per target sequence id. Before drafting it
catches up on whatever part of a stream it has not seen (prompt, accepted tokens),
and drops what the target rejected, by comparing token lists; a long prefix another
stream's draft sequence holds is copied, not computed again. All speculating streams
draft together: one llama_decode per draft depth. A sequence is forgotten when its
stream ends; if the KV still fills up, the sequences not drafting right now are.

By default a draft is the draft model's most likely token at each depth (the best bet
for sample-and-match, which draws the emitted tokens from the target's own sampler).
For rejection sampling it is drawn from the draft's law q instead, and the stop rule
looks only at q, never at the drawn token, so that the kept tokens follow q.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgeinfer.engine.prefix import common_prefix
from edgeinfer.engine.scheduler import MIN_SHARE
from edgeinfer.errors import ConfigError
from edgeinfer.llamacpp import Batch, Context, ContextParams, Model
from edgeinfer.speculative.drafting import Draft, Offer, Pick
from edgeinfer.speculative.verify import sampling_probs

if TYPE_CHECKING:
    from edgeinfer.engine.stream import Stream


@dataclass(slots=True)
class DraftRequest:
    """One stream's drafting job this step."""

    seq: int
    tokens: list[int]  # the stream's tokens; the last one is not in the target KV yet
    k: int  # draft at most this many
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    # None: draft the draft model's most likely token (verified by sample-and-match or greedily).
    # Given: draw each token from the draft's sampling law q, for rejection sampling against q.
    rng: np.random.Generator | None = None


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

    def __init__(
        self, path: Path, target: Model, params: ContextParams, p_min: float = 0.5, gpu_layers: int = 0
    ) -> None:
        self.model = Model(path, gpu_layers=gpu_layers)
        try:
            check_vocab(target, self.model)
            self.ctx = Context(self.model, params)
        except BaseException:
            self.model.close()
            raise
        self.batch = Batch(self.ctx.n_batch)
        self.p_min = p_min  # stop a stream's draft when its token's draft probability is below this
        self.held: dict[int, list[int]] = {}  # seq -> tokens in the draft KV
        self.computed = 0  # tokens the draft model has decoded (catch-up and drafts; copied prefixes are not)

    def draft(self, reqs: list[DraftRequest], on_step: Callable[[int, float], None]) -> dict[int, Draft]:
        """Draft for every request together; on_step(n_streams, seconds) reports each draft decode."""
        out = {r.seq: Draft([], None) for r in reqs}
        qs: dict[int, list[np.ndarray]] = {r.seq: [] for r in reqs}
        logits = self._catch_up(reqs, on_step)
        live = {r.seq: r for r in reqs}
        while live:
            step: dict[int, list[int]] = {}
            for seq, r in list(live.items()):
                q = None
                if r.rng is None:
                    conf = _top_prob(logits[seq], r.temperature)
                else:
                    q = sampling_probs(logits[seq], r.temperature, r.top_k, r.top_p, r.min_p)
                    conf = float(q.max())
                # Stop before choosing the token, on the law alone: a stop that looked at the drawn
                # token would keep likely tokens and drop unlikely ones, and the kept drafts would
                # no longer follow q, which rejection sampling assumes (the first token is always kept).
                if conf < self.p_min and out[seq].tokens:
                    del live[seq]
                    continue
                if q is None:
                    tok = int(np.argmax(logits[seq]))
                else:
                    assert r.rng is not None
                    tok = int(r.rng.choice(len(q), p=q))
                    qs[seq].append(q)
                out[seq].tokens.append(tok)
                if len(out[seq].tokens) >= r.k:
                    del live[seq]
                else:
                    step[seq] = [tok]
            if step:
                logits = self._feed({seq: (len(self.held[seq]), toks) for seq, toks in step.items()}, on_step)
        for seq, d in out.items():
            if qs[seq]:
                d.q = np.stack(qs[seq])
        return out

    def _catch_up(self, reqs: list[DraftRequest], on_step: Callable[[int, float], None]) -> dict[int, np.ndarray]:
        """Bring each draft sequence to its stream's tokens[:-1], then feed the last token, which starts
        the draft; return the logits after it, by sequence.

        A stream that shares a long prefix with another (n choices, forks of one kept prefix, agents
        with one system prompt: the target computed that prefix once) copies it from the other's draft
        sequence instead of computing it again: at once from a sequence not drafting this step, or from
        one catching up in this step once that one's tokens are in.
        """
        pending = {r.seq: self._sync(r) for r in reqs}
        later: dict[int, tuple[int, DraftRequest]] = {}  # seq -> (the leader it copies from, its request)
        leaders: list[DraftRequest] = []
        for r in reqs:
            pos, rest = pending[r.seq]
            if len(rest) < MIN_SHARE:
                continue  # the usual step: a token or two to feed
            want = r.tokens[:-1]
            donor, n = -1, pos
            for seq, held in self.held.items():
                if seq not in pending and (m := common_prefix(held, want)) > n:
                    donor, n = seq, m
            if n - pos >= MIN_SHARE:
                self._share(donor, r.seq, n, r.tokens)
                pending[r.seq] = (n, r.tokens[n:])
                pos = n
            lead, m = max(((x, common_prefix(x.tokens, want)) for x in leaders), key=lambda xm: xm[1], default=(r, 0))
            if m - pos >= MIN_SHARE:
                later[r.seq] = (lead.seq, r)
                del pending[r.seq]
            elif len(r.tokens) - pos >= MIN_SHARE:
                leaders.append(r)
        logits = self._feed(pending, on_step)
        if later:
            for seq, (lead_seq, r) in later.items():
                n = common_prefix(self.held[lead_seq], r.tokens[:-1])
                self._share(lead_seq, seq, n, r.tokens)
                pending[seq] = (n, r.tokens[n:])
            logits.update(self._feed({seq: pending[seq] for seq in later}, on_step))
        return logits

    def _share(self, src: int, dst: int, n: int, tokens: list[int]) -> None:
        self.ctx.seq_share(src, dst, n)
        self.held[dst] = tokens[:n]

    def _sync(self, r: DraftRequest) -> tuple[int, list[int]]:
        """Drop what the draft KV holds beyond the common prefix; return (pos0, tokens to feed)."""
        held = self.held.get(r.seq, [])
        want = r.tokens
        keep = common_prefix(held, want[:-1])
        if keep < len(held):
            self.ctx.seq_rm(r.seq, keep, -1)
        self.held[r.seq] = held[:keep]
        return keep, want[keep:]

    def _feed(
        self, pending: dict[int, tuple[int, list[int]]], on_step: Callable[[int, float], None]
    ) -> dict[int, np.ndarray]:
        """Decode each sequence's tokens (in n_batch chunks); return the logits after each one's last token.

        The logits are copied after the decode that held a sequence's last token: the next
        chunk's decode reuses the output rows.
        """
        logits: dict[int, np.ndarray] = {}
        queue = [(seq, pos, toks) for seq, (pos, toks) in pending.items() if toks]
        while queue:
            self.batch.clear()
            room = self.ctx.n_batch
            nxt = []
            fed: list[tuple[int, list[int]]] = []
            rows = {}
            for seq, pos, toks in queue:
                take = min(len(toks), room)
                if take == 0:
                    nxt.append((seq, pos, toks))
                    continue
                last = take == len(toks)
                row = self.batch.add(seq, toks[:take], pos, last)
                fed.append((seq, toks[:take]))
                room -= take
                self.computed += take
                if last:
                    rows[seq] = row
                else:
                    nxt.append((seq, pos + take, toks[take:]))
            t0 = time.perf_counter()
            self._decode(set(pending))
            on_step(len(rows), time.perf_counter() - t0)
            for seq, toks in fed:
                self.held[seq] = self.held[seq] + toks
            logits.update({seq: self.ctx.logits(row) for seq, row in rows.items()})
            queue = nxt
        return logits

    def _decode(self, busy: set[int]) -> None:
        """Decode the batch; when the KV is full, forget the sequences not drafting now and retry once."""
        if self.ctx.decode(self.batch):
            return
        idle = [seq for seq in self.held if seq not in busy]
        for seq in idle:
            self.forget(seq)
        if not idle or not self.ctx.decode(self.batch):
            raise ConfigError("the draft model's context is full; raise --ctx-size")

    def forget(self, seq: int) -> None:
        self.held.pop(seq, None)
        self.ctx.seq_rm(seq)

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()
        self.model.close()


def _top_prob(logits: np.ndarray, temperature: float) -> float:
    """The most likely token's probability at the stream's temperature (greedy: at temperature 1)."""
    x = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    return 1.0 / float(np.exp(x - x.max()).sum())


class ModelDrafter:
    """Drafts from a draft model (DraftModel): every picked stream's draft in one decode per depth."""

    name = "draft"
    runs_model = True

    def __init__(self, drafts: DraftModel) -> None:
        self.drafts = drafts

    def prior(self, backing: int) -> float:
        return 0.7

    def attach(self, stream: Stream) -> None:
        return None

    def available(self, stream: Stream, room: int) -> Offer:
        return Offer(room)

    def draft(self, picks: list[Pick], on_step: Callable[[int, float], None]) -> dict[int, Draft]:
        reqs = []
        for pick in picks:
            s, p = pick.stream, pick.stream.params
            reqs.append(DraftRequest(s.seq, s.tokens, pick.k, p.temperature, p.top_k, p.top_p, p.min_p, pick.rng))
        by_seq = self.drafts.draft(reqs, on_step)
        return {pick.stream.id: by_seq[pick.stream.seq] for pick in picks}

    def emitted(self, stream: Stream, tokens: list[int]) -> None:
        pass

    def detach(self, stream: Stream) -> None:
        self.drafts.forget(stream.seq)  # its sequence in the draft model's KV

    def close(self) -> None:
        self.drafts.close()
