"""llama.cpp embeddings: a second context over a loaded Model, embeddings on, one pooled vector per sequence."""

from __future__ import annotations

import numpy as np

from edgeinfer.errors import DecodeError, ModelLoadError
from edgeinfer.llamacpp.core import FLASH_ATTN, Batch, C, Model, resolve_flash_attn
from edgeinfer.models.gguf import GGUFInfo
from edgeinfer.options import usable_cores

# GGUF `<arch>.pooling_type` values (llama.cpp's enum) that give one vector per sequence.
POOLING = {1: "mean", 2: "cls", 3: "last"}
_POOLING_TYPE = {"mean": C.LLAMA_POOLING_TYPE_MEAN, "cls": C.LLAMA_POOLING_TYPE_CLS, "last": C.LLAMA_POOLING_TYPE_LAST}


def pooling_of(info: GGUFInfo) -> str:
    """How a model's token states become one vector: what its GGUF declares (embedding models say so),
    else the mean, which is what a causal chat model (no such key) gets; none or rank (a reranker's
    classifier) give no vector per text, so they too are pooled by the mean."""
    declared = info.metadata.get(f"{info.architecture}.pooling_type")
    return POOLING.get(int(declared), "mean") if isinstance(declared, int) else "mean"


def n_embd(model: Model) -> int:
    """The length of the model's pooled vectors."""
    return int(C.llama_model_n_embd_out(model.handle))


def n_ctx_train(model: Model) -> int:
    return int(C.llama_model_n_ctx_train(model.handle))


class EmbedContext:
    """A llama.cpp context with embeddings on: one llama_decode turns up to n_seq_max token lists,
    n_ctx tokens in all, into one pooled vector each. It shares the Model's weights with the
    generation context; the caller keeps the two from decoding at the same time."""

    def __init__(
        self, model: Model, n_ctx: int, n_seq_max: int, pooling: str, threads: int = 0, flash_attn: str = "auto"
    ) -> None:
        threads = threads or usable_cores()
        params = C.llama_context_default_params()
        params.n_ctx = n_ctx
        # A pooled vector is taken per micro-batch: a text split over two would be pooled twice and
        # the first half lost, so the whole decode is one micro-batch.
        params.n_batch = n_ctx
        params.n_ubatch = n_ctx
        params.n_seq_max = n_seq_max
        params.kv_unified = True  # the texts share one pool of cells: a long one may take most of it
        params.n_threads = threads
        params.n_threads_batch = threads
        params.embeddings = True
        params.pooling_type = _POOLING_TYPE[pooling]
        fa = resolve_flash_attn(flash_attn, "f16", model.gpu_layers, bool(model.info.sliding_window))
        params.flash_attn_type = FLASH_ATTN[fa]
        params.no_perf = True
        self._h = C.llama_init_from_model(model.handle, params)
        if not self._h:
            raise ModelLoadError(
                f"llama.cpp could not create the embeddings context of {n_ctx} tokens (out of memory?); "
                "run with EDGEINFER_LLAMA_LOG=1 to see why"
            )
        self._mem = C.llama_get_memory(self._h)
        self.n_ctx: int = C.llama_n_ctx(self._h)
        self.n_seq_max: int = C.llama_n_seq_max(self._h)
        self.n_embd = n_embd(model)
        self.pooling = pooling
        self._batch = Batch(self.n_ctx)

    def embed(self, seqs: list[list[int]]) -> np.ndarray:
        """One pooled vector per token list (float32, len(seqs) x n_embd, not normalized), in one llama_decode."""
        if not 0 < len(seqs) <= self.n_seq_max or sum(map(len, seqs)) > self.n_ctx or not all(seqs):
            raise DecodeError(f"an embeddings decode takes 1 to {self.n_seq_max} non-empty lists, {self.n_ctx} tokens")
        C.llama_memory_clear(self._mem, True)  # each decode starts from empty cells, at position 0
        batch = self._batch
        batch.clear()
        for seq, tokens in enumerate(seqs):
            batch.add(seq, tokens, 0, True, logits_from=0)  # pooling reads every token's state
        rc = C.llama_decode(self._h, batch.raw)
        if rc != 0:
            raise DecodeError(f"llama_decode of {batch.n} tokens for embeddings failed with code {rc}")
        out = np.empty((len(seqs), self.n_embd), np.float32)
        for seq in range(len(seqs)):
            ptr = C.llama_get_embeddings_seq(self._h, seq)
            if not ptr:
                raise DecodeError(f"llama.cpp returned no pooled embedding for sequence {seq}")
            out[seq] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
        return out

    def close(self) -> None:
        if self._h:
            self._batch.close()
            C.llama_free(self._h)
            self._h = None
