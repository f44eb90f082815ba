"""Lossless verification of drafted tokens: pure numpy, no llama.cpp.

Given draft tokens x_1..x_k and the target's distributions p_1..p_{k+1} at each
position (p_i conditioned on the accepted prefix), a verifier returns the tokens to
emit: some accepted drafts, then one token drawn by the target itself. Every emitted
token is distributed exactly as if the target had sampled it alone.
"""

from __future__ import annotations

import numpy as np


def verify_greedy(draft: list[int], target_argmax: list[int]) -> list[int]:
    """Greedy: accept drafts while they equal the target's argmax; then emit the target's token.

    target_argmax has k+1 entries (the last one follows an all-accepted draft).
    """
    out: list[int] = []
    for i, x in enumerate(draft):
        if x != target_argmax[i]:
            break
        out.append(x)
    out.append(target_argmax[len(out)])
    return out


def verify_rejection(draft: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Speculative sampling with a draft distribution (Leviathan et al. 2023; Chen et al. 2023).

    draft: x_1..x_k, x_i drawn from q[i] (k x V); p: target distributions (k+1 x V).
    For each i in order:
        accept x_i with probability min(1, p_i(x_i) / q_i(x_i))
            (q >= p at x: accept with prob p/q; q < p: always accept);
        on rejection emit one token from the residual norm(max(0, p_i - q_i)) and stop.
    If all k are accepted, emit a bonus token from p_{k+1}.
    The emitted token at each position then has law exactly p_i: the accepted mass
    min(p, q) plus the rejected mass (1 - sum min(p, q)) times the residual sums to p.
    """
    out: list[int] = []
    for i, x in enumerate(draft):
        px, qx = p[i, x], q[i, x]
        if qx > 0 and rng.random() * qx < px:  # u < p/q without dividing by zero
            out.append(int(x))
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        # total == 0 only when p == q, where rejection has probability 0; guard anyway.
        out.append(int(rng.choice(len(residual), p=residual / total)) if total > 0 else int(x))
        return out
    out.append(int(rng.choice(p.shape[1], p=p[len(draft)])))
    return out


def verify_sample_match(draft: list[int], samples: list[int]) -> list[int]:
    """A drafter without probabilities (n-gram lookup): sample from the target, keep matches.

    samples[i] is the target's own draw at position i given the drafts before it were
    accepted. Accept x_i while x_i == samples[i]; the first mismatch emits samples[i].
    Every emitted token is a target sample, so the output law is the target's.
    """
    out: list[int] = []
    for i, x in enumerate(draft):
        out.append(samples[i])
        if samples[i] != x:
            return out
    out.append(samples[len(draft)])
    return out


def sampling_probs(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    """The distribution llama.cpp's chain (top-k, top-p, min-p, temperature, dist) samples from.

    Same order as edgeinfer.llamacpp.Sampler: the truncations look at the softmax of
    the raw logits; the temperature then scales what survives. With top_k set only the
    k best logits are sorted, which keeps this cheap on a large vocabulary.
    """
    x = logits.astype(np.float64)
    n = x.shape[0]
    cand = np.argpartition(-x, top_k - 1)[:top_k] if 0 < top_k < n else np.arange(n)
    cand = cand[np.argsort(-x[cand], kind="stable")]  # best first
    v = x[cand]
    keep = np.ones(len(cand), dtype=bool)
    if top_p < 1.0 or min_p > 0.0:
        probs = np.exp(v - v[0])
        probs /= probs.sum()
        if top_p < 1.0:
            # Keep the smallest prefix whose mass reaches top_p (at least one token).
            cut = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
            keep[cut:] = False
        if min_p > 0.0:
            keep &= probs >= min_p * probs[0]
    w = np.exp((v[keep] - v[0]) / temperature)
    out = np.zeros(n)
    out[cand[keep]] = w / w.sum()
    return out
