"""The one package that talks to llama.cpp: `core` (model, context, batch, vocab), `sampler` and `rpc`
(ggml's RPC backend: workers, remote devices, the layer split). Only `core` imports llama_cpp;
it hands libllama to `ggml`, and `sampler` and `quantize` take the module from it."""

from edgeinfer.llamacpp.core import (
    DEFAULT_SEED,
    KV_TYPES,
    Batch,
    Context,
    ContextParams,
    Model,
    Vocab,
    resolve_flash_attn,
)
from edgeinfer.llamacpp.ggml import on_abort, wedged
from edgeinfer.llamacpp.quantize import quantize
from edgeinfer.llamacpp.sampler import Sampler

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
