"""The one package that talks to llama.cpp: `core` (model, context, batch, vocab), `sampler` and `rpc`
(ggml's RPC backend: workers, remote devices, the layer split). Only `core` imports llama_cpp;
it hands libllama to `ggml`, and `sampler` and `quantize` take the module from it."""

import os

# llama.cpp's CPU threads are OpenMP's (libgomp), one team per thread that calls llama_decode: each engine's
# thread has its own. Once a process holds more of libgomp's threads than it has cores (two engines that have
# both decoded: several models served, a benchmark's bare loop beside an engine), libgomp spins only 100 times
# before a thread sleeps at a barrier, instead of 300,000, and every step of every engine slows: two engines
# on 2 cores decoded 54-72 tok/s against 107-110 alone (scripts/two_engines.py). OMP_WAIT_POLICY=ACTIVE raises
# that to 1,000; GOMP_SPINCOUNT keeps the spinning at libgomp's default otherwise (about 3 ms, then a thread
# sleeps: an idle server still uses no CPU). libgomp reads both as it loads, with the CPU backend, later than
# this. Whoever set OMP_WAIT_POLICY keeps theirs.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    os.environ.setdefault("GOMP_SPINCOUNT", "300000")

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
