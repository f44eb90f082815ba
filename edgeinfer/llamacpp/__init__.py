"""The one package that talks to llama.cpp: `core` (model, context, batch, sampler, vocab) and `rpc`
(ggml's RPC backend: workers, remote devices, the layer split). Only `core` imports llama_cpp;
it hands libllama to `ggml`."""

from edgeinfer.llamacpp.core import (
    DEFAULT_SEED,
    KV_TYPES,
    Batch,
    Context,
    ContextParams,
    Model,
    Sampler,
    Vocab,
    resolve_flash_attn,
)
from edgeinfer.llamacpp.ggml import on_abort, wedged
from edgeinfer.llamacpp.quantize import quantize

__all__ = [
    "DEFAULT_SEED",
    "KV_TYPES",
    "Batch",
    "Context",
    "ContextParams",
    "Model",
    "Sampler",
    "Vocab",
    "on_abort",
    "quantize",
    "resolve_flash_attn",
    "wedged",
]
