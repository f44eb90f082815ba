"""`edgeinfer bench --quality`: does a precision change alter the answers, and how much?

A reference configuration (say the F16 model with an F16 KV cache) and a candidate (a
Q4_1 model, or a q8_0 KV cache) each answer a fixed prompt set greedily. Three figures:

- identical: answers equal token for token;
- common prefix: how far the two answers agree before they first part;
- forced agreement: the candidate reads the reference's answer token by token (teacher
  forcing) and we count where its own greedy choice is the reference's next token. One
  early difference does not drag every later token along, so this is the steadier figure.
  The reference reading its own answers the same way gives the floor of this figure: a
  batched read rounds differently from token-by-token generation, so near-ties flip even
  with identical settings (about 98% for SmolLM2-135M on a CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgeinfer.bench.exclusive import run_exclusive
from edgeinfer.bench.workloads import QUESTIONS
from edgeinfer.engine.prefix import common_prefix
from edgeinfer.errors import EdgeInferError


@dataclass(slots=True)
class Agreement:
    """One prompt's answers compared."""

    prompt: str
    reference: list[int]
    candidate: list[int]
    forced_matches: int  # positions of the reference answer where the candidate's greedy choice agrees

    @property
    def identical(self) -> bool:
        return self.reference == self.candidate

    @property
    def common_prefix(self) -> int:
        return common_prefix(self.reference, self.candidate)


@dataclass(slots=True)
class Quality:
    reference: str
    candidate: str
    max_tokens: int
    items: list[Agreement]
    floor: float  # forced agreement of the reference with its own answers

    @property
    def identical(self) -> int:
        return sum(a.identical for a in self.items)

    @property
    def prefix_fraction(self) -> float:
        """Mean share of each reference answer that the candidate reproduced before parting."""
        return float(np.mean([a.common_prefix / max(1, len(a.reference)) for a in self.items]))

    @property
    def forced_agreement(self) -> float:
        total = sum(len(a.reference) for a in self.items)
        return sum(a.forced_matches for a in self.items) / total if total else 1.0

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": "quality",
            "reference": self.reference,
            "candidate": self.candidate,
            "max_tokens": self.max_tokens,
            "prompts": len(self.items),
            "identical": self.identical,
            "prefix_fraction": round(self.prefix_fraction, 4),
            "forced_agreement": round(self.forced_agreement, 4),
            "forced_agreement_floor": round(self.floor, 4),
            "items": [
                {
                    "prompt": a.prompt,
                    "reference_tokens": len(a.reference),
                    "common_prefix": a.common_prefix,
                    "forced_matches": a.forced_matches,
                    "identical": a.identical,
                }
                for a in self.items
            ],
        }


def greedy_answers(engine: object, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy answer, all packed in one batch (end-of-text ends an answer)."""
    from edgeinfer.options import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    handles = [engine.submit(p, params)[0] for p in prompts]  # type: ignore[attr-defined]
    return [h.result().token_ids for h in handles]


def forced_matches(engine: object, prompt: list[int], answer: list[int]) -> int:
    """Feed prompt + answer through engine's own context; count answer tokens its argmax predicts."""
    from edgeinfer.llamacpp import Batch, Context

    def run(ctx: Context) -> int:
        tokens = prompt + answer[:-1]
        first = len(prompt) - 1  # the row whose logits predict answer[0]
        batch = Batch(ctx.n_batch)
        matches = 0
        try:
            ctx.seq_rm(0)
            for start in range(0, len(tokens), ctx.n_batch):
                chunk = tokens[start : start + ctx.n_batch]
                batch.clear()
                wanted = max(0, first - start)
                batch.add(0, chunk, start, False, logits_from=wanted if wanted < len(chunk) else -1)
                if not ctx.decode(batch):
                    raise EdgeInferError("the KV cache is too small for the quality prompts; raise --ctx-size")
                for row in range(wanted, len(chunk)):
                    predicted = ctx.argmax(row)
                    matches += predicted == answer[start + row - first]
        finally:
            ctx.seq_rm(0)
            batch.close()
        return matches

    return int(run_exclusive(engine, run))  # type: ignore[arg-type]


def compare(
    make_reference: Callable[[], object],
    make_candidate: Callable[[], object],
    names: tuple[str, str],
    max_tokens: int = 64,
    questions: list[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Quality:
    """Answer the prompt set with each configuration in turn (one engine loaded at a time)."""
    questions = questions or QUESTIONS
    progress(f"reference ({names[0]}): answering {len(questions)} prompts")
    ref_engine = make_reference()
    try:
        vocab_ref = _vocab_fingerprint(ref_engine)
        prompts_ref = [ref_engine.chat_prompt([{"role": "user", "content": q}]) for q in questions]  # type: ignore[attr-defined]
        ref_answers = greedy_answers(ref_engine, prompts_ref, max_tokens)
        own = sum(forced_matches(ref_engine, p, a) for p, a in zip(prompts_ref, ref_answers, strict=True) if a)
        floor = own / max(1, sum(len(a) for a in ref_answers))
    finally:
        ref_engine.close()  # type: ignore[attr-defined]
    progress(f"candidate ({names[1]}): answering and reading the reference answers")
    cand = make_candidate()
    try:
        if _vocab_fingerprint(cand) != vocab_ref:
            raise EdgeInferError(
                "the reference and candidate models have different vocabularies; compare quantizations of one model"
            )
        prompts = [cand.chat_prompt([{"role": "user", "content": q}]) for q in questions]  # type: ignore[attr-defined]
        answers = greedy_answers(cand, prompts, max_tokens)
        items = [
            Agreement(q, ref, mine, forced_matches(cand, p, ref) if ref else 0)
            for q, p, ref, mine in zip(questions, prompts, ref_answers, answers, strict=True)
        ]
    finally:
        cand.close()  # type: ignore[attr-defined]
    return Quality(names[0], names[1], max_tokens, items, floor)


def _vocab_fingerprint(engine: object) -> tuple[int, int]:
    """Vocabulary size and a hash of its first pieces: enough to tell two tokenizers apart."""
    vocab = engine.vocab  # type: ignore[attr-defined]
    return vocab.n_tokens, hash(tuple(vocab.piece(t) for t in range(min(vocab.n_tokens, 2000))))


def print_quality(q: Quality, echo: Callable[[str], None]) -> None:
    n = len(q.items)
    echo(f"\ngreedy agreement, {n} prompts, up to {q.max_tokens} tokens each")
    echo(f"  reference: {q.reference}")
    echo(f"  candidate: {q.candidate}")
    echo(f"  identical answers:  {q.identical}/{n}")
    echo(f"  common prefix:      {q.prefix_fraction:.1%} of each reference answer, on average")
    echo(f"  forced agreement:   {q.forced_agreement:.1%} of reference tokens are the candidate's own greedy choice")
    echo(f"                      (the reference reading its own answers: {q.floor:.1%}, the floor of this figure)")
    worst = min(q.items, key=lambda a: a.forced_matches / max(1, len(a.reference)))
    echo(f"  least agreement:    {worst.prompt!r} ({worst.forced_matches}/{len(worst.reference)} tokens)")
