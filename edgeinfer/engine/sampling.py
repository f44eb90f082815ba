"""Per-stream sampling: llama.cpp's sampler chain built from SamplingParams, and log-probabilities."""

from __future__ import annotations

import numpy as np

from edgeinfer.events import TokenLogprob
from edgeinfer.llamacpp import Context, Sampler, Vocab
from edgeinfer.options import SamplingParams


def make_sampler(
    p: SamplingParams, n_vocab: int, index: int = 0, prompt: list[int] | None = None, banned: tuple[int, ...] = ()
) -> Sampler:
    """The sampler of stream `index` of a request; with penalties it has already seen the prompt's tail; it
    never picks a `banned` token.

    n streams with one seed must still differ: stream i draws with seed + i.
    """
    sampler = Sampler(
        n_vocab,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        min_p=p.min_p,
        repeat_penalty=p.repeat_penalty,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        repeat_last_n=p.repeat_last_n,
        seed=None if p.seed is None else p.seed + index,
        logit_bias=p.logit_bias,
        banned=banned,
    )
    if p.has_penalties and prompt and p.repeat_last_n:
        for t in prompt[-p.repeat_last_n :]:
            sampler.accept(t)
    return sampler


def logprob(ctx: Context, vocab: Vocab, row: int, token: int, top: int) -> TokenLogprob:
    """The chosen token's log-probability under the model's raw logits, and the `top` most likely tokens."""
    logits = ctx.logits(row).astype(np.float64)
    m = logits.max()
    logp = logits - (m + np.log(np.exp(logits - m).sum()))
    best = np.argpartition(-logp, top)[:top] if top else np.array([], dtype=np.int64)
    best = best[np.argsort(-logp[best])]

    def piece(t: int) -> str:
        return vocab.piece(int(t)).decode("utf-8", "replace")

    return TokenLogprob(token, piece(token), float(logp[token]), [(int(t), piece(t), float(logp[t])) for t in best])
