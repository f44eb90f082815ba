"""The near-tie rule: how far llama.cpp's batch shapes move a greedy choice, measured, and the checks built on it.

Packed and speculative batches round differently from a lone stream's (docs/testing.md),
so a greedy answer under load may part from the alone one, but only where the alone run's top
candidates nearly tie. How near is "nearly" depends on the CPU kernels (AVX2 rounds differently
from AVX-512), so it is measured on the machine that runs the check, not fixed: `measure_drift`
evaluates the same positions alone and in the batch shapes the engine makes, teacher-forced, and
reports how far the gap between two of a row's top candidates moved. Used by the tests' helper
(tests/conftest.py) and by scripts/soak.py (and its --check-answers).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.engine import Engine
from edgeinfer.llamacpp import ggml
from edgeinfer.llamacpp.core import Batch, Context, Model, build_identity
from edgeinfer.options import ContextParams, EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

# A parting is accepted where the reference's gap is within the measured drift times this: the drift is
# the largest shift seen over a few hundred rows, and rows not sampled can shift somewhat further.
DRIFT_MARGIN = 1.5
TOKENS_PER_FORCED = 20  # the budget of forced near-ties grows with the text: 2, plus one per this many tokens
TOP = 5  # candidates of each row compared (the references carry logprobs=5)
CHUNKS = (2, 5, 9, 17)  # one stream's rows in one batch: draft verification (k drafts + 1)


def max_forced(n_tokens: int) -> int:
    """Near-ties one comparison of n_tokens may force its way past (each one must be a measured near-tie)."""
    return 2 + n_tokens // TOKENS_PER_FORCED


@dataclass(frozen=True)
class Drift:
    """How far batch shapes moved the gaps between a row's top candidates, on this CPU variant."""

    variant: str | None  # the llama.cpp CPU kernels that ran (haswell, zen4, ...)
    flash_attn: str
    rows: int  # logits rows compared with their one-token evaluation
    largest: float  # nats: the most a batch shape moved one of a row's top candidates towards its best
    p99: float
    by_shape: dict[str, float]  # the largest shift in each batch shape

    @property
    def tie_nats(self) -> float:
        """A greedy parting is a near-tie when the reference's top two were closer than this."""
        return DRIFT_MARGIN * self.largest

    def __str__(self) -> str:
        return (
            f"CPU variant {self.variant}, flash attention {self.flash_attn}: over {self.rows} rows, batch shapes "
            f"closed a gap between a row's best candidate and another of its top {TOP} by up to "
            f"{self.largest:.3f} nats (p99 {self.p99:.3f}; by shape: "
            + ", ".join(f"{shape} {shift:.2f}" for shape, shift in self.by_shape.items())
            + f"); near-tie below {self.tie_nats:.3f} nats"
        )


def measure_drift(
    config: EngineConfig, prompts: list[list[int]], n_tokens: int = 48, cache_dir: Path | None = None
) -> Drift:
    """The drift, read from cache_dir when this very measurement was made before (see drift_key), else
    measured (about 20 s on 2 cores) and, with cache_dir, kept there."""
    path = cache_dir / f"{drift_key(config, prompts, n_tokens)}.json" if cache_dir is not None else None
    if path is not None:
        try:
            return Drift(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass
    drift = _measure_drift(config, prompts, n_tokens)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(drift)))
        tmp.replace(path)
    return drift


def drift_key(config: EngineConfig, prompts: list[list[int]], n_tokens: int) -> str:
    """What a drift measurement depends on, hashed: llama.cpp's libraries and the CPU kernels this process
    loaded, the model file, the numerics settings, the prompts, and this file's code. llama.cpp is
    deterministic for a given build, kernels, model and batch shape, so an equal key is an equal result."""
    parts = {
        "llama_cpp": build_identity(),
        "variant": ggml.loaded_cpu_variant(),
        "cores": os.cpu_count(),
        "model": _content(Path(config.model)),  # the weights, wherever this clone's virtualenv installed them
        "numerics": [config.flash_attn, config.kv_type, config.kv_layout, config.batch_size, config.ubatch_size],
        "threads": [config.threads, config.threads_batch],
        "prompts": prompts,
        "tokens": n_tokens,
        "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


@functools.cache
def _content(path: Path) -> str:
    """A file's SHA-256 (once per process: about 0.3 s for the default model)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _measure_drift(config: EngineConfig, prompts: list[list[int]], n_tokens: int) -> Drift:
    """Teacher-forced: each prompt's greedy continuation evaluated one token at a time (the reference),
    then the same positions in the shapes the engine batches them in: chunks of one stream's rows
    (speculative verification), the whole text in one batch (a cold prefill), and one row of each
    stream packed together (multi-stream decode). For every row, the shift is how far the batched
    evaluation moved one of the alone row's top candidates up against its best one: a greedy run
    parts from the alone one only where that shift exceeds their gap.
    """
    model = Model(config.model)
    n_seq = len(prompts)
    params = ContextParams(
        n_ctx=max(config.ctx_size, n_seq * 1024),
        n_batch=config.batch_size,
        n_ubatch=config.ubatch_size,
        n_seq_max=n_seq,
        n_threads=config.threads,
        flash_attn=config.flash_attn,
        kv_type=config.kv_type,
        kv_unified=config.kv_layout == "unified",
    )
    ctx = Context(model, params)
    batch = Batch(max(config.batch_size, 64))
    shifts: list[float] = []
    by_shape: dict[str, float] = {}
    try:
        alone = [_alone(ctx, batch, s, p, n_tokens) for s, p in enumerate(prompts)]

        def compare(seq: int, j: int, row: np.ndarray, shape: str) -> None:
            ref = alone[seq][1][j]
            top = np.argpartition(-ref, TOP)[:TOP]
            best = int(ref.argmax())
            d = row[top] - ref[top]  # how far each candidate moved; the best one's move subtracted below
            shifts.append(float(d.max() - (row[best] - ref[best])))
            by_shape[shape] = max(by_shape.get(shape, 0.0), shifts[-1])

        for seq, (cont, _) in enumerate(alone):
            prompt = prompts[seq]
            for k in CHUNKS:  # the prompt alone as in the reference, then the continuation k rows a batch
                _prefill(ctx, batch, seq, prompt)
                for j0 in range(0, len(cont) - 1, k):
                    part = cont[j0 : j0 + k]
                    _run(ctx, batch, [(seq, part, len(prompt) + j0, 0)])
                    for r in range(len(part)):
                        if j0 + r + 1 < len(cont):
                            compare(seq, j0 + r + 1, ctx.logits(r), f"{k} rows of one stream")
            ctx.seq_rm(seq)  # the whole text in one batch
            _run(ctx, batch, [(seq, prompt + cont[:-1], 0, len(prompt) - 1)])
            for j in range(len(cont)):
                compare(seq, j, ctx.logits(len(prompt) - 1 + j), "whole text")
        for seq, prompt in enumerate(prompts):  # every stream one row a step, packed
            _prefill(ctx, batch, seq, prompt)
        for j in range(n_tokens - 1):
            live = [s for s in range(n_seq) if j + 1 < len(alone[s][0])]
            if not live:
                break
            _run(ctx, batch, [(s, [alone[s][0][j]], len(prompts[s]) + j, 0) for s in live])
            for r, s in enumerate(live):
                compare(s, j + 1, ctx.logits(r), f"{len(live)} streams packed")
    finally:
        batch.close()
        ctx.close()
        model.close()
    arr = np.array(shifts)
    return Drift(
        ggml.loaded_cpu_variant(), ctx.flash_attn, len(arr), float(arr.max()), float(np.quantile(arr, 0.99)), by_shape
    )


def _prefill(ctx: Context, batch: Batch, seq: int, prompt: list[int]) -> np.ndarray:
    ctx.seq_rm(seq)
    _run(ctx, batch, [(seq, prompt, 0, len(prompt) - 1)])
    return ctx.logits(len(prompt) - 1)


def _alone(ctx: Context, batch: Batch, seq: int, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """The greedy continuation one token a step, and its logits rows (row j chose token j)."""
    rows = [_prefill(ctx, batch, seq, prompt)]
    cont = [int(rows[0].argmax())]
    while len(cont) < n and not ctx.model.vocab.is_eog(cont[-1]):
        _run(ctx, batch, [(seq, [cont[-1]], len(prompt) + len(cont) - 1, 0)])
        rows.append(ctx.logits(0))
        cont.append(int(rows[-1].argmax()))
    return cont, rows


def _run(ctx: Context, batch: Batch, parts: list[tuple[int, list[int], int, int]]) -> None:
    """One decode of (seq, tokens, first position, first token with logits) parts; ctx.logits takes batch rows."""
    batch.clear()
    for seq, tokens, pos0, logits_from in parts:
        batch.add(seq, tokens, pos0, want_logits=False, logits_from=logits_from)
    assert ctx.decode(batch), "the measurement's context is full"


def check_greedy_texts(
    texts: dict[str, set[str]], flash_attn: str, max_tokens: int, drift_cache: Path | None = None
) -> tuple[list[str], list[float], Drift]:
    """Every distinct greedy answer the soak saw, against the prompt's greedy answer computed alone.

    Packed batches round differently from a lone stream's (docs/testing.md), so answers
    may part from the alone reference, but only where its top two candidates nearly tie. Past each
    such parting the reference is recomputed from the answer's own choice (teacher forcing), so a
    later, confident parting is still found. Returns one line per answer that parts elsewhere,
    the gaps (nats between the reference's choice and the answer's) of the partings accepted, and
    the drift measured on this CPU that says which gaps are near-ties.
    """
    config = EngineConfig(model="default", spec="off", cache_ram=0, parallel=1, flash_attn=flash_attn)
    failures: list[str] = []
    gaps: list[float] = []
    with make_engine(config) as eng:
        prompts = [eng.chat_prompt([{"role": "user", "content": p}]) for p in list(texts)[:4]]
        drift = measure_drift(config, prompts, cache_dir=drift_cache)
        for prompt, answers in texts.items():
            for text in answers:
                prompt_ids = eng.chat_prompt([{"role": "user", "content": prompt}])
                ans = Answer(prompt_ids, text, max_tokens, drift.tie_nats)
                why = _parts_at_near_ties_only(eng, ans, prompt_ids, "", gaps)
                if why:
                    failures.append(f"{prompt!r} -> {text[:60]!r}...: {why}")
    return failures, gaps, drift


@dataclass(frozen=True)
class Answer:
    prompt: list[int]
    text: str
    max_tokens: int
    tie_nats: float  # a parting is a near-tie below this gap (Drift.tie_nats)


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
    if forced > max_forced(ans.max_tokens):
        return f"more than {max_forced(ans.max_tokens)} near-ties in {ans.max_tokens} tokens"
    ref = eng.generate(ids, SamplingParams(temperature=0, max_tokens=left, logprobs=5))
    ids, forks = list(ids), []
    for tok, lp in zip(ref.token_ids, ref.logprobs, strict=True):
        best = max(v for _, _, v in lp.top)
        forks += [
            (list(ids), done, t, s, best - v)
            for t, s, v in lp.top
            if len(s) > len(lp.text) and ans.text.startswith(done + s) and best - v < ans.tie_nats
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
        lp = eng.generate(ids, SamplingParams(temperature=0, max_tokens=1, logprobs=5)).logprobs[0]
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
    if (gap := max(v for _, _, v in lp.top) - v) >= ans.tie_nats:
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
