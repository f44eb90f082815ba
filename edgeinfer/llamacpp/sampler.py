"""llama.cpp's sampler chain for one stream, and the greedy pick that skips it."""

from __future__ import annotations

import ctypes
import math
from typing import TYPE_CHECKING

import numpy as np

from edgeinfer.errors import DecodeError
from edgeinfer.llamacpp.core import DEFAULT_SEED, C

if TYPE_CHECKING:
    from edgeinfer.llamacpp.core import Context


TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class Sampler:
    """llama.cpp's native sampler chain for one stream: penalties, top-k/p, min-p, temperature."""

    def __init__(
        self,
        n_vocab: int,
        *,
        temperature: float = 0.0,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_last_n: int = 64,
        seed: int | None = None,
        logit_bias: dict[int, float] | None = None,
        banned: tuple[int, ...] = (),
    ) -> None:
        """`banned` tokens are never picked (llama-server's ignore_eos: the end-of-generation tokens)."""
        params = C.llama_sampler_chain_default_params()
        params.no_perf = True
        self._h = C.llama_sampler_chain_init(params)
        add = lambda s: C.llama_sampler_chain_add(self._h, s)  # noqa: E731
        penalized = repeat_penalty != 1.0 or frequency_penalty or presence_penalty
        # A chain of greedy alone keeps no state and takes the largest logit, so sample() reads it
        # from the row: llama_sampler_sample first copies all n_vocab logits into a candidates
        # array, about 0.2 ms a token on this CPU (2% of a 16-stream step), for the same answer.
        # Banned tokens keep that path: the largest logit is rarely one of them, and then the row is read again.
        self._argmax = temperature <= 0 and not logit_bias and not penalized
        self._banned = frozenset(banned)
        self._banned_ids = np.array(sorted(self._banned), dtype=np.int64)
        bias = {**(logit_bias or {}), **dict.fromkeys(banned, -math.inf)}
        if bias:
            biases = (C.llama_logit_bias * len(bias))(*(C.llama_logit_bias(t, b) for t, b in bias.items()))
            add(C.llama_sampler_init_logit_bias(n_vocab, len(bias), biases))
        if penalized:
            penalties = (repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty)
            add(C.llama_sampler_init_penalties(n_vocab, *penalties))
        if temperature <= 0:
            add(C.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                add(C.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                add(C.llama_sampler_init_top_p(top_p, 1))
            if min_p > 0.0:
                add(C.llama_sampler_init_min_p(min_p, 1))
            add(C.llama_sampler_init_temp(temperature))
            add(C.llama_sampler_init_dist(DEFAULT_SEED if seed is None else seed & 0xFFFFFFFF))

    def sample(self, ctx: Context, row: int) -> int:
        """Sample from output row `row` of the last decode and record the token in the chain."""
        if self._argmax:
            return self.greedy(ctx, row)
        return int(C.llama_sampler_sample(self._h, ctx.handle, row))

    def greedy(self, ctx: Context, row: int) -> int:
        """The row's largest logit among the tokens not banned (the first, on a tie)."""
        token = ctx.argmax(row)
        if token in self._banned:
            token = int(self.logits(ctx, row).argmax())
        return token

    def logits(self, ctx: Context, row: int) -> np.ndarray:
        """The row's logits, the banned tokens' at minus infinity (a copy then)."""
        logits = ctx.logits(row)
        if self._banned:
            logits = logits.copy()
            logits[self._banned_ids] = -np.inf
        return logits

    def sample_masked(self, ctx: Context, row: int, allowed: np.ndarray) -> int:
        """Sample from row `row` among the tokens marked in `allowed` (a grammar's mask) and record it."""
        ids = np.flatnonzero(allowed).astype(np.int32)
        if not len(ids):
            raise DecodeError("the grammar allows no token here")
        data = np.zeros(len(ids), TOKEN_DATA)
        data["id"] = ids
        data["logit"] = ctx.logits(row)[ids]
        ptr = data.ctypes.data_as(ctypes.POINTER(C.llama_token_data))
        cur = C.llama_token_data_array(ptr, len(ids), -1, False)
        C.llama_sampler_apply(self._h, ctypes.byref(cur))
        token = int(data["id"][cur.selected])
        C.llama_sampler_accept(self._h, token)
        return token

    def accept(self, token: int) -> None:
        """Record a token chosen elsewhere (e.g. the prompt) for the penalties."""
        C.llama_sampler_accept(self._h, token)

    def close(self) -> None:
        if self._h:
            C.llama_sampler_free(self._h)
            self._h = None
