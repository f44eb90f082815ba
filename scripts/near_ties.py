"""The soak's near-tie check: greedy answers seen under load against the answer computed alone.

Packed and speculative batches round differently from a lone stream's (README, Packed and alone),
so a greedy answer under load may part from the alone one, but only where the alone run's top two
candidates nearly tie. Used by scripts/soak.py (and its --check-answers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeinfer.engine import Engine, make_engine
from edgeinfer.options import EngineConfig, SamplingParams

NEAR_TIE_NATS = 0.5  # as the tests' near-tie helper
# Each accepted parting must itself be a near-tie; this cap only bounds the work per answer.
# Draft verification rounds in batches of up to 17 rows, and a 48-token answer was seen to pass
# five genuine near-ties (gaps 0.003-0.1 nats), so 4 was too few.
MAX_FORCED = 8


def check_greedy_texts(texts: dict[str, set[str]], flash_attn: str, max_tokens: int) -> tuple[list[str], list[float]]:
    """Every distinct greedy answer the soak saw, against the prompt's greedy answer computed alone.

    Packed batches round differently from a lone stream's (README, Packed and alone), so answers
    may part from the alone reference, but only where its top two candidates nearly tie. Past each
    such parting the reference is recomputed from the answer's own choice (teacher forcing), so a
    later, confident parting is still found. Returns one line per answer that parts elsewhere,
    and the gaps (nats between the reference's choice and the answer's) of the partings accepted.
    """
    config = EngineConfig(model="default", spec="off", cache_ram=0, parallel=1, flash_attn=flash_attn)
    failures: list[str] = []
    gaps: list[float] = []
    with make_engine(config) as eng:
        for prompt, answers in texts.items():
            for text in answers:
                prompt_ids = eng.chat_prompt([{"role": "user", "content": prompt}])
                why = _parts_at_near_ties_only(eng, Answer(prompt_ids, text, max_tokens), prompt_ids, "", gaps)
                if why:
                    failures.append(f"{prompt!r} -> {text[:60]!r}...: {why}")
    return failures, gaps


@dataclass(frozen=True)
class Answer:
    prompt: list[int]
    text: str
    max_tokens: int


def _parts_at_near_ties_only(
    eng: Engine, ans: Answer, ids: list[int], done: str, gaps: list[float], forced: int = 0
) -> str | None:
    """None if ans.text follows from ids (whose text past the prompt is done) by near-ties only.

    The answer is known as text, not tokens, so a reference token may match it as text while the
    answer held a longer token there (" a" against " also"). Such forks, where the longer token is
    also a near-tie, are tried when the plain walk fails. Accepted gaps are added to gaps.
    """
    left = ans.max_tokens - (len(ids) - len(ans.prompt))
    if left == 0:
        return None if done == ans.text else f"the reference hit max_tokens at {len(done)} of {len(ans.text)} chars"
    if forced > MAX_FORCED:
        return f"more than {MAX_FORCED} near-ties"
    ref = eng.generate(ids, SamplingParams(temperature=0, max_tokens=left, logprobs=5))
    ids, forks = list(ids), []
    for tok, lp in zip(ref.token_ids, ref.logprobs, strict=True):
        best = max(v for _, _, v in lp.top)
        forks += [
            (list(ids), done, t, s, best - v)
            for t, s, v in lp.top
            if len(s) > len(lp.text) and ans.text.startswith(done + s) and best - v < NEAR_TIE_NATS
        ]
        if lp.text and ans.text.startswith(done + lp.text):
            ids.append(tok)
            done += lp.text
            continue
        break  # the answer parts from the reference at this token
    else:
        if done == ans.text:
            return None
        if len(ref.token_ids) == left:
            return f"the reference hit max_tokens at {len(done)} of {len(ans.text)} chars"
        # The reference ended (end of text) where the answer went on: the top five there.
        lp = eng.generate(ids, SamplingParams(temperature=0, max_tokens=1, logprobs=5, ignore_eos=True)).logprobs[0]
    why = _force(eng, ans, ids, done, lp, gaps, forced)
    for f_ids, f_done, t, s, gap in reversed(forks) if why else ():
        branch: list[float] = [gap]
        if _parts_at_near_ties_only(eng, ans, [*f_ids, t], f_done + s, branch, forced + 1) is None:
            gaps += branch
            return None
    return why


def _force(eng: Engine, ans: Answer, ids: list[int], done: str, lp: Any, gaps: list[float], forced: int) -> str | None:
    """At the parting (ids, done): take the answer's choice if it was a near-tie and go on."""
    at = len(ids) - len(ans.prompt)
    if done == ans.text:  # the answer ended here, the reference went on: the end token is its choice
        alts = [(t, "", v) for t, _, v in lp.top if eng.vocab.is_eog(t)]
    else:
        alts = [(t, s, v) for t, s, v in lp.top if s and ans.text.startswith(done + s) and t != lp.token]
    if not alts:
        return f"token {at}: none of the reference's top five continues the answer"
    t, s, v = max(alts, key=lambda a: len(a[1]))
    if (gap := max(v for _, _, v in lp.top) - v) >= NEAR_TIE_NATS:
        return f"token {at}: parts where the reference was confident ({gap:.2f} nats)"
    if not s:
        gaps.append(gap)
        return None  # the answer's end was a near-tie
    branch = [gap]
    why = _parts_at_near_ties_only(eng, ans, [*ids, t], done + s, branch, forced + 1)
    if why is None:
        gaps += branch
    return why


def tie_summary(gaps: list[float]) -> str:
    if not gaps:
        return "no near-ties: every answer is the alone one"
    gaps = sorted(gaps)
    return (
        f"{len(gaps)} near-ties passed, gap between the reference's top choice and the answer's: "
        f"median {gaps[len(gaps) // 2]:.4f}, largest {gaps[-1]:.4f} nats"
    )
