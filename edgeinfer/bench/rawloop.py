"""The baseline: a bare loop packing N streams into one llama_decode, with no scheduler.

It does the least work possible per step (fill the batch, decode, greedy-sample each
row), so the engine's overhead shows as the ratio of the two in one run.
"""

from __future__ import annotations

import time

from edgeinfer.bench.results import RunResult, StreamResult
from edgeinfer.llamacpp import Batch, Context, Sampler


def run_raw(ctx: Context, prompts: list[list[int]], max_tokens: int) -> RunResult:
    """Prefill every prompt (in n_batch chunks), then decode max_tokens tokens per stream."""
    n = len(prompts)
    for seq in range(n):
        ctx.seq_rm(seq)
    batch = Batch(ctx.n_batch)
    samplers = [Sampler(ctx.n_vocab) for _ in range(n)]
    t_start = time.perf_counter()
    # Prefill: pack prompts into batches of at most n_batch tokens; sample at each prompt's end.
    last: list[int] = [0] * n
    first_t: list[float] = [0.0] * n
    pending = [(seq, 0) for seq in range(n)]
    while pending:
        batch.clear()
        rows: list[tuple[int, int]] = []
        room = ctx.n_batch
        nxt = []
        for seq, done in pending:
            if room == 0:
                nxt.append((seq, done))
                continue
            p = prompts[seq]
            k = min(len(p) - done, room)
            row = batch.add(seq, p[done : done + k], done, done + k == len(p))
            room -= k
            if done + k < len(p):
                nxt.append((seq, done + k))
            else:
                rows.append((seq, row))
        ctx.decode(batch)
        now = time.perf_counter()
        for seq, row in rows:
            last[seq] = samplers[seq].sample(ctx, row)
            first_t[seq] = now
        pending = nxt
    # Decode: one token per stream per step.
    pos = [len(p) for p in prompts]
    steps: list[float] = []
    for _ in range(max_tokens - 1):
        batch.clear()
        for seq in range(n):
            batch.add(seq, [last[seq]], pos[seq], True)
            pos[seq] += 1
        ctx.decode(batch)
        for seq in range(n):
            last[seq] = samplers[seq].sample(ctx, seq)
        steps.append(time.perf_counter())
    t_end = time.perf_counter()
    for s in samplers:
        s.close()
    batch.close()
    for seq in range(n):
        ctx.seq_rm(seq)
    streams = [
        StreamResult(
            prompt_tokens=len(prompts[i]),
            completion_tokens=max_tokens,
            ttft_s=first_t[i] - t_start,
            arrivals=[t - t_start for t in (first_t[i], *steps)],
        )
        for i in range(n)
    ]
    return RunResult(streams, t_start, t_end)
