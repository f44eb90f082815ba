"""llama.cpp's sampler chain for one stream, and the grammar engine's view of the vocabulary."""

from __future__ import annotations

import ctypes
import warnings
from typing import Any

import llama_cpp as C
import numpy as np

from edgeinfer.errors import DecodeError
from edgeinfer.llamacpp import DEFAULT_SEED, Context, Vocab

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


def guidance_tokenizer(vocab: Vocab) -> Any:
    """llguidance's tokenizer over this vocabulary (about half a second: build it once per model)."""
    from llguidance.llamacpp import lltokenizer_from_vocab

    with warnings.catch_warnings():  # it asks llama-cpp-python for each token's attributes by a deprecated name
        warnings.simplefilter("ignore", DeprecationWarning)
        return lltokenizer_from_vocab(vocab._handle())


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
    ) -> None:
        params = C.llama_sampler_chain_default_params()
        params.no_perf = True
        self._h = C.llama_sampler_chain_init(params)
        add = lambda s: C.llama_sampler_chain_add(self._h, s)  # noqa: E731
        if logit_bias:
            biases = (C.llama_logit_bias * len(logit_bias))(*(C.llama_logit_bias(t, b) for t, b in logit_bias.items()))
            add(C.llama_sampler_init_logit_bias(n_vocab, len(logit_bias), biases))
        if repeat_penalty != 1.0 or frequency_penalty or presence_penalty:
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
        return int(C.llama_sampler_sample(self._h, ctx.handle, row))

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
