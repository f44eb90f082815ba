"""Speculation inside the engine's step: who drafts how much, drafting, and verification.

The engine calls propose() before planning a step; the drafts it returns (by stream id)
go to the scheduler, which puts them into the plan's batch items. After the decode the
engine calls verify() for every item that carried drafts. A stream's own state lives on
it (stream.drafting, stream.n_drafted, stream.n_accepted), from attach() to detach().
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgeinfer.engine.stats import SpeculationStats
from edgeinfer.engine.step import BatchItem
from edgeinfer.engine.stream import Stream
from edgeinfer.llamacpp import Context, ContextParams, Model
from edgeinfer.options import EngineConfig
from edgeinfer.speculative.control import Acceptance, Candidate, Controller, Gate
from edgeinfer.speculative.draft import DraftModel, ModelDrafter
from edgeinfer.speculative.drafting import DRAFTERS, Drafter, Drafting, Pick
from edgeinfer.speculative.ngram import NgramDrafter
from edgeinfer.speculative.verify import sampling_probs, verify_greedy, verify_rejection, verify_sample_match


def _draft_model(config: EngineConfig, target: Model, params: ContextParams) -> Drafter | None:
    if config.draft_model is None or config.spec == "ngram":
        return None
    layers = config.draft_gpu_layers if isinstance(config.draft_gpu_layers, int) else 0  # the engine decides auto
    return ModelDrafter(DraftModel(config.draft_model, target, params, config.draft_p_min, layers))


def _ngram(config: EngineConfig, target: Model, params: ContextParams) -> Drafter:
    return NgramDrafter()


BUILT_IN = (_draft_model, _ngram)  # the n-gram drafter answers every configuration


def make_drafter(config: EngineConfig, target: Model, params: ContextParams) -> Drafter:
    """The drafter config asks for: a registered one's (drafting.register_drafter), else a built-in one."""
    for factory in (*DRAFTERS, *BUILT_IN):
        drafter = factory(config, target, params)
        if drafter is not None:
            return drafter
    raise AssertionError("the n-gram drafter answers every configuration")


@dataclass(slots=True)
class SpeculationCounters:
    """Totals for stats and /metrics."""

    max_draft: int
    drafted: int = 0
    accepted: int = 0
    verifications: int = 0
    drafted_at: list[int] = field(default_factory=list)  # drafts made at position i (1-based i = index + 1)
    accepted_at: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.drafted_at = [0] * self.max_draft
        self.accepted_at = [0] * self.max_draft

    def record(self, drafted: int, accepted: int) -> None:
        self.verifications += 1
        self.drafted += drafted
        self.accepted += accepted
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1


class Speculator:
    """Drafts for decoding streams and verifies the drafts, losslessly."""

    def __init__(
        self, config: EngineConfig, target: Model, ctx_params: ContextParams, batch_invariant: bool = False
    ) -> None:
        self.mode = config.spec
        self.batch_invariant = batch_invariant
        self.adaptive = config.spec == "auto"
        self.drafter = make_drafter(config, target, ctx_params)
        # Sample-and-match by default: every emitted token is the stream's own sampler's draw, so
        # seeded text is the same with speculation on or off, whatever the drafts were.
        self.rejection = config.spec_verify == "rejection"
        self.max_draft = config.spec_max
        self.controller = Controller(config.spec_max)
        self.gate = Gate()
        self.counters = SpeculationCounters(config.spec_max)
        self._prior = Acceptance(self.drafter.prior(0), weight=0.05)
        # Acceptance of backed drafts (Offer.backing > 0), across streams, by (backing, sampled): a long n-gram
        # match is a copy going on in any stream, and a sampled stream takes fewer drafts than a greedy one.
        self._backed: dict[tuple[int, bool], Acceptance] = {}
        self.enabled = True  # False: no drafts (the benchmark compares both on one engine); verification goes on

    def attach(self, stream: Stream) -> None:
        """Start drafting for a new stream (its params set), where speculation can be lossless for it."""
        params = stream.params
        if params.has_penalties:
            return  # penalties depend on every emitted token; the verifiers do not model them
        if params.logprobs is not None or params.grammar is not None or params.logit_bias:
            return  # a grammar's stream has its forced tokens instead; a biased one is not the model's law
        if params.seed is not None and params.temperature > 0 and not self.batch_invariant:
            # A verified draft row rounds apart from a plain step's row here, and a seeded draw
            # near an interval edge would land elsewhere: a seed promises the same text with
            # speculation on or off, so seeded sampling decodes plainly.
            return
        seed = None if params.seed is None else params.seed + stream.index
        own = self.drafter.attach(stream)
        stream.drafting = Drafting(own, Acceptance(self._prior.alpha), np.random.default_rng(seed))

    def detach(self, stream: Stream) -> None:
        """The stream has ended: its state goes (its counts stay), and the drafter's (a draft model's KV)."""
        stream.drafting = None
        self.drafter.detach(stream)

    # --- before the step ----------------------------------------------------

    def propose(self, running: list[Stream], n_batch: int) -> dict[int, list[int]]:
        """Drafts (by stream id) for the decoding streams worth drafting for (n_batch: the step's token budget)."""
        if not self.enabled:
            return {}
        # Prompt tokens (and tokens a grammar forced) the next step will likely carry, for the cost model.
        left = [len(s.tokens) - s.n_computed for s in running]
        prefill_tokens = min(n_batch, sum(n for n in left if n > 1))
        decoding = [s for s in running if not s.fork_pending and len(s.tokens) - s.n_computed == 1]
        cands: list[Candidate] = []
        by_id: dict[int, Stream] = {}
        for s in decoding:
            st = s.drafting
            room = min(self.max_draft, s.max_new - s.n_generated - 1)
            # The first token always comes from the plain path: it may feed forked streams too.
            if st is None or room <= 0 or s.n_generated == 0:
                continue
            offer = self.drafter.available(s, room)
            if offer.n <= 0:
                continue
            st.backing = offer.backing
            cands.append(Candidate(s.id, self._acceptance(s).alpha, offer.n))
            by_id[s.id] = s
        if not cands:
            return {}
        if self.adaptive and not self.gate.allows(len(decoding)):
            return {}
        if self.adaptive:
            base = len(decoding) + prefill_tokens
            plan = self.controller.plan(cands, base, len(decoding), self.drafter.runs_model)
        else:
            plan = {c.key: c.available for c in cands}
        plan = {key: k for key, k in plan.items() if k > 0}
        if not plan:
            return {}
        picks = []
        for key, k in plan.items():
            s = by_id[key]
            assert s.drafting is not None  # a candidate drafts
            rng = s.drafting.rng if self.rejection and s.params.temperature > 0 else None
            picks.append(Pick(s, k, rng))
        drafts = self.drafter.draft(picks, self.controller.draft.observe)
        out = {}
        for pick in picks:
            s, d = pick.stream, drafts[pick.stream.id]
            out[s.id] = d.tokens
            assert s.drafting is not None
            s.drafting.q = d.q
        return out

    # --- after the decode -----------------------------------------------------

    def observe_step(self, n_tokens: int, n_draft: int, seconds: float) -> None:
        self.controller.target.observe(n_tokens, seconds, n_draft)

    def observe_iteration(self, n_decoding: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A decode-only step, drafting and verification included: feeds the gate. Not an exploring step's: its
        drafts are the ones the costs said would not pay (the gate judges the drafts they chose); two refused
        at a server's first answer shut the gate, and it took hundreds of steps to open again."""
        if drafted and self.controller.explored:  # a step's drafts come from that step's plan
            return
        self.gate.observe(n_decoding, drafted, tokens, seconds)

    def verify(self, ctx: Context, item: BatchItem) -> list[int]:
        """The tokens to emit for a stream whose item carried drafts (accepted drafts, then one more)."""
        s = item.stream
        st, sampler, p = s.drafting, s.sampler, s.params
        assert st is not None  # only a drafting stream's item carries drafts
        draft = item.draft
        k = len(draft)
        row0 = item.row0
        if p.temperature <= 0:
            argmax = [sampler.greedy(ctx, row0 + i) for i in range(k + 1)]
            out = verify_greedy(draft, argmax)
        elif st.q is not None and len(st.q) == k:  # drafts drawn from q: --spec-verify rejection
            probs = np.stack(
                [
                    sampling_probs(sampler.logits(ctx, row0 + i), p.temperature, p.top_k, p.top_p, p.min_p)
                    for i in range(k + 1)
                ]
            )
            out = verify_rejection(draft, st.q, probs, st.rng)
        else:  # sample-and-match: the stream's sampler draws at each position, as without drafts
            samples: list[int] = []
            for i in range(k + 1):
                samples.append(sampler.sample(ctx, row0 + i))
                if i < k and samples[-1] != draft[i]:
                    break
            out = verify_sample_match(draft, samples)
        st.q = None
        accepted = len(out) - 1
        s.n_drafted += k
        s.n_accepted += accepted
        if st.backing > 0:
            self._acceptance(s).update(k, accepted)
        else:
            st.accept.update(k, accepted)
            self._prior.update(k, accepted)
        self.counters.record(k, accepted)
        return out

    def _acceptance(self, s: Stream) -> Acceptance:
        """The rate a stream's pending draft is judged and learned by: its backing's, else the stream's own."""
        st = s.drafting
        assert st is not None
        if st.backing <= 0:
            return st.accept
        key = (st.backing, s.params.temperature > 0)
        if (rate := self._backed.get(key)) is None:
            rate = self._backed[key] = Acceptance(self.drafter.prior(st.backing))
        return rate

    def emitted(self, s: Stream, tokens: list[int]) -> None:
        if s.drafting is not None:
            self.drafter.emitted(s, tokens)

    def stats(self) -> SpeculationStats:
        c = self.counters
        return SpeculationStats(
            mode=self.mode,
            source=self.drafter.name,
            drafted=c.drafted,
            accepted=c.accepted,
            verifications=c.verifications,
            drafted_at=list(c.drafted_at),
            accepted_at=list(c.accepted_at),
        )

    def close(self) -> None:
        self.drafter.close()
