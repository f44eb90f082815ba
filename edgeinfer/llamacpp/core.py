"""llama.cpp's model, context, batch and vocabulary (the sampler chain is in sampler.py).

Every llama.cpp handle (model, context, batch, sampler) is owned by one Python object
that frees it in close(). Failures become edgeinfer errors. Only Python ints, bytes,
lists and numpy arrays cross this boundary; outside edgeinfer.llamacpp no module imports llama_cpp.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Protocol

import llama_cpp as C
import numpy as np

from edgeinfer.errors import ConfigError, DecodeError, EngineClosedError, ModelLoadError
from edgeinfer.llamacpp import ggml
from edgeinfer.models.gguf import read_gguf
from edgeinfer.options import ContextParams, usable_cores

ggml.bind(C.llama_cpp._lib)

DEFAULT_SEED = C.LLAMA_DEFAULT_SEED
# Set by the test suite while a test of its pure tier runs (tests/conftest.py): a model load there fails.
NO_MODELS_ENV = "EDGEINFER_NO_MODELS"
# Context.seq_share copies a sequence through its state only up to this size: the bytes are held in RAM in
# between (a 7B model's 4,096 tokens would be about 2 GiB); a larger one is copied as its whole stream.
STATE_COPY_MAX = 256 << 20

KV_TYPES = {"f16": C.GGML_TYPE_F16, "q8_0": C.GGML_TYPE_Q8_0, "q4_0": C.GGML_TYPE_Q4_0}
FLASH_ATTN = {
    "auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def resolve_flash_attn(setting: str, kv_type: str, gpu_layers: int | str, sliding_window: bool = False) -> str:
    """--flash-attn auto. On the CPU: "on" for a model with sliding-window layers (Gemma 3 270M, one stream,
    4k and 12k-token prompts: prompts 1.3x and 2.0x as fast with it, decoding after them 1.3x and 1.7x), else
    "off" (llama.cpp's auto turns it on; SmolLM2 then decoded at 0.88x after a 4k-token prompt, and at half
    speed on another CPU: docs/benchmarks.md, scripts/flash_attn.py). On a GPU other than Vulkan's (below), or
    with a quantized KV cache, which needs it: llama.cpp's choice. gpu_layers "auto" counts as on a GPU when
    there is one."""
    if setting != "auto" or kv_type != "f16":
        return setting
    if gpu_layers != 0:
        init_backend()  # the devices are known once the backends are loaded
    gpus = ggml.local_gpus() if gpu_layers != 0 else []
    # Vulkan: with flash attention, a batch of several rows with logits right after a one-row decode (what
    # speculation sends) crashes this llama.cpp's Vulkan backend (scripts/vulkan_fa_repro.py, seen on Mesa's
    # software device; llama.cpp issue 27314 reports a Vulkan flash-attention segfault on a Radeon card), so
    # auto leaves it off there too, unless a quantized KV cache needs it.
    if gpus:
        return "off" if all(ggml.device_name(d).startswith("Vulkan") for d in gpus) else "auto"
    return "on" if sliding_window else "off"


@functools.cache
def build_identity() -> list[Any]:
    """llama-cpp-python's version and its libraries' contents (name, SHA-256): equal on two runs only when the
    same llama.cpp build runs, wherever it is installed (a fresh virtualenv of the same wheel is the same build).
    About 0.2 s, once per process."""
    libs = sorted(p for p in Path(C.__file__).parent.glob("lib/*.so*") if p.is_file() and not p.is_symlink())
    return [C.__version__, [(p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in libs]]


_init_lock = threading.Lock()
_initialised = False


@C.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty on stderr; keep it quiet unless asked (EDGEINFER_LLAMA_LOG=1).
    if os.environ.get("EDGEINFER_LLAMA_LOG") == "1":
        os.write(2, text)


def init_backend() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            C.llama_log_set(_log_callback, ctypes.c_void_p(0))
            # A build with loadable backends (GGML_BACKEND_DL: the portable build's CPU variants, a
            # GPU backend) keeps them beside libllama: load the best for this machine before a model.
            # First, so that llama_backend_init (which the build patches to load them when none are,
            # for llama-cpp-python's own Llama) finds them loaded. A program that made a Llama first
            # has them already: loading again would register each twice.
            lib = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(C.__file__).parent / "lib")
            if any(lib.glob("libggml-cpu-*.so")) and ggml.backend_count() == 0:
                try:  # through libllama's own libggml: dlsym searches its needs
                    ggml.load_backends(lib, os.environ.get(ggml.CPU_VARIANT_ENV))
                except ValueError as e:
                    raise ConfigError(str(e)) from None
            C.llama_backend_init()
            _initialised = True


def max_devices_supported() -> int:
    return int(C.llama_max_devices())


class Vocab:
    """Tokenizer of a loaded model: text <-> token ids, end-of-generation tests."""

    def __init__(self, handle: C.llama_vocab_p) -> None:
        self._h: C.llama_vocab_p | None = handle  # None once its model is closed
        self.n_tokens: int = C.llama_vocab_n_tokens(handle)
        self.bos: int = C.llama_vocab_bos(handle)
        self.eos: int = C.llama_vocab_eos(handle)
        self.add_bos: bool = bool(C.llama_vocab_get_add_bos(handle))
        self._pieces: dict[int, bytes] = {}
        # Special tokens that output shows as their text (piece() with special=False): the openings and closings
        # of tool calls and thinking that a vocabulary holds as one control token (Mistral's [TOOL_CALLS],
        # Llama 3's <|python_tag|>), which llama.cpp would otherwise render as nothing, hiding them from the parsers.
        self.shown: set[int] = set()
        self._eog = np.array([bool(C.llama_vocab_is_eog(handle, t)) for t in range(self.n_tokens)])
        self.eog_ids: tuple[int, ...] = tuple(int(t) for t in np.flatnonzero(self._eog))  # end-of-generation tokens

    def handle(self) -> C.llama_vocab_p:
        if self._h is None:
            raise EngineClosedError("the model is closed; create a new engine")
        return self._h

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        h = self.handle()
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(h, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # -n tokens needed
            buf = (C.llama_token * -n)()
            n = C.llama_tokenize(h, data, len(data), buf, len(buf), add_special, parse_special)
        return buf[:n]

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character); a special token's text only with special
        or when it is shown."""
        special = special or token in self.shown
        key = token if not special else -1 - token
        cached = self._pieces.get(key)
        if cached is None:
            h = self.handle()
            buf = ctypes.create_string_buffer(64)
            n = C.llama_token_to_piece(h, token, buf, 64, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(h, token, buf, -n, 0, special)
            cached = self._pieces[key] = buf.raw[:n]
        return cached

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", errors="replace")

    def special_token(self, text: str) -> int | None:
        """The one special token (control or user-defined, as the tokenizer's added tokens are) that text is in this
        vocabulary; None when text is plain text here. A grammar names such a token by its id: llguidance matches
        a quoted string with text tokens only."""
        tokens = self.tokenize(text, add_special=False, parse_special=True) if text else []
        if len(tokens) != 1 or self.text_of(tokens[0]) != text:
            return None
        attr = C.llama_vocab_get_attr(self.handle(), tokens[0])
        return tokens[0] if attr & (C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED) else None

    def show(self, texts: list[str]) -> None:
        """Output shows these texts where the vocabulary holds them as one special token (see shown)."""
        for text in texts:
            token = self.special_token(text)
            if token is not None:
                self.shown.add(token)

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    def text_of(self, token: int) -> str:
        """The vocabulary entry's own text (for compatibility checks)."""
        return C.llama_vocab_get_text(self.handle(), token).decode("utf-8", errors="replace")


class Placement(Protocol):
    """A model's layers over devices, as llama.cpp's model parameters (rpc.Placement)."""

    n_gpu_layers: int
    shares: list[Any]

    def apply(self, params: Any) -> None: ...


class Model:
    """A loaded GGUF model. Validates the file in Python before llama.cpp opens it."""

    def __init__(
        self, path: str | Path, gpu_layers: int = 0, use_mmap: bool = True, placement: Placement | None = None
    ) -> None:
        init_backend()
        self.path = Path(path).expanduser()
        self.info = read_gguf(self.path)
        params = C.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        params.use_mmap = use_mmap
        # With workers: which device holds which layers (rpc.place_for decides it before the load).
        self.placement = placement
        if placement is not None:
            placement.apply(params)
            gpu_layers = placement.n_gpu_layers
        if os.environ.get(NO_MODELS_ENV):  # the test suite's pure tier (tests/conftest.py)
            why = os.environ[NO_MODELS_ENV]
            raise ModelLoadError(f"{path}: no model may load here ({NO_MODELS_ENV} is set: {why})")
        self._h = C.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._h:
            raise ModelLoadError(
                f"{self.path}: llama.cpp could not load this model (architecture "
                f"{self.info.architecture!r}); run with EDGEINFER_LLAMA_LOG=1 to see why"
            )
        self.vocab = Vocab(C.llama_model_get_vocab(self._h))
        self.n_params: int = C.llama_model_n_params(self._h)
        self.gpu_layers = gpu_layers

    @property
    def handle(self) -> C.llama_model_p:
        return self._h

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self._h, buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        tmpl = C.llama_model_chat_template(self._h, None)
        return tmpl.decode("utf-8") if tmpl else None

    def close(self) -> None:
        if self._h:
            self.vocab._h = None  # the vocabulary lives inside the model
            C.llama_model_free(self._h)
            self._h = None


class Context:
    """A llama.cpp context: the KV cache and the decode call."""

    def __init__(self, model: Model, p: ContextParams) -> None:
        if p.kv_type not in KV_TYPES:
            raise ConfigError(f"--kv-type {p.kv_type!r} is not one of {', '.join(KV_TYPES)}")
        if p.flash_attn not in FLASH_ATTN:
            raise ConfigError(f"--flash-attn {p.flash_attn!r} is not one of {', '.join(FLASH_ATTN)}")
        max_seq = C.llama_max_parallel_sequences()
        if not 1 <= p.n_seq_max <= max_seq:
            raise ConfigError(f"{p.n_seq_max} sequences asked for; llama.cpp supports 1 to {max_seq}")
        threads = p.n_threads or usable_cores()
        params = C.llama_context_default_params()
        params.n_ctx = p.n_ctx
        params.n_batch = p.n_batch
        params.n_ubatch = min(p.n_ubatch, p.n_batch)
        params.n_seq_max = p.n_seq_max
        params.n_threads = threads
        params.n_threads_batch = p.n_threads_batch or threads
        self.flash_attn = resolve_flash_attn(p.flash_attn, p.kv_type, model.gpu_layers, bool(model.info.sliding_window))
        # A row's logits do not depend on what else its batch holds: measured on the CPU with flash
        # attention on for SmolLM2 (a row in a 4-row chunk of its stream equals the row alone, bit for
        # bit); off, rows round apart by batch shape; Gemma 3 (sliding-window layers) not even with it on
        # (0.6-0.7 apart at the chunk's third and fourth rows); on a GPU not checked. So not counted on
        # there: tests/test_spec.py checks the claim on both models.
        on_gpu = (model.gpu_layers and ggml.has_gpu()) or model.placement
        self.batch_invariant = self.flash_attn == "on" and not on_gpu and not model.info.sliding_window
        self.kv_on_host = not on_gpu  # seq_share copies a short sequence through its state only there
        self._landing: set[int] = set()  # sequences in a whole-stream copy that lands at the next decode
        params.flash_attn_type = FLASH_ATTN[self.flash_attn]
        params.type_k = KV_TYPES[p.kv_type]
        params.type_v = KV_TYPES[p.kv_type]
        # Unified: one cell pool, seq_cp shares cells, but attention walks every occupied cell for
        # every token. Per sequence: each stream attends over its own cells only; seq_cp copies.
        params.kv_unified = p.kv_unified
        params.no_perf = True
        self.model = model
        self._h = C.llama_init_from_model(model.handle, params)
        if not self._h:
            raise ModelLoadError(
                f"llama.cpp could not create a context of {p.n_ctx} tokens with KV type {p.kv_type} "
                "(out of memory, or flash attention needed for a quantized V cache); try a smaller --ctx-size"
            )
        self._mem = C.llama_get_memory(self._h)
        self.n_ctx: int = C.llama_n_ctx(self._h)
        self.n_ctx_seq: int = C.llama_n_ctx_seq(self._h)  # cells one sequence can hold
        self.kv_unified = p.kv_unified
        self.n_batch: int = C.llama_n_batch(self._h)
        self.n_seq_max: int = C.llama_n_seq_max(self._h)
        self.n_vocab = model.vocab.n_tokens
        self.threads = threads

    @property
    def handle(self) -> C.llama_context_p:
        return self._h

    def set_threads(self, n: int) -> None:
        """The CPU threads of the next decodes (prompt batches and single tokens alike); cheap, between decodes."""
        C.llama_set_n_threads(self._h, n, n)
        self.threads = n

    def decode(self, batch: Batch) -> bool:
        """Run one llama_decode. Returns False when the KV cache has no room for the batch."""
        rc = C.llama_decode(self._h, batch.raw)
        if rc not in (0, 1):
            raise DecodeError(f"llama_decode failed with code {rc}")
        if rc == 0:
            self._landing.clear()
        return rc == 0

    def logits(self, i: int) -> np.ndarray:
        """A copy of the logits row of output i of the last decode (float32, n_vocab)."""
        return self._row(i).copy()

    def argmax(self, i: int) -> int:
        """The token with the largest logit in output row i of the last decode (the first, on a tie)."""
        return int(self._row(i).argmax())

    def _row(self, i: int) -> np.ndarray:
        ptr = C.llama_get_logits_ith(self._h, i)
        if not ptr:
            raise DecodeError(f"the last decode has no logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(C.llama_memory_seq_rm(self._mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Copy src's positions [p0, p1) to dst; per-sequence KV copies whole streams, at the next decode."""
        if not self.kv_unified:
            assert p0 <= 0 and p1 < 0, "per-sequence KV copies whole streams"
            self._landing.update((src, dst))
        C.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_share(self, src: int, dst: int, n: int) -> bool:
        """dst (empty) holds src's first n positions. Unified KV shares the cells. Per sequence, a KV stream
        held in host memory whose sequence fills at most half of it is copied through the sequence's state
        (its own cells only, read and written at once; at most STATE_COPY_MAX bytes held in between);
        otherwise llama.cpp copies src's whole stream, at the next decode. Either way dst's tail past n is
        dropped. True when the bytes move at the next decode. A source whose own stream copy has not landed
        yet holds its positions but not their bytes: it is copied as a stream too, behind that copy.

        seq_cp between streams moves every cell of the stream, used or not: on the 2-core VM a 33-token
        prompt copied to 7 streams of 8,192 cells took 75 ms a copy, through its state 4 ms
        (`scripts/seq_share_cost.py`)."""
        if self.kv_unified:
            self.seq_cp(src, dst, 0, n)
            return False
        if (
            self.kv_on_host
            and src not in self._landing
            and 2 * (self.seq_pos_max(src) + 1) <= self.n_ctx_seq
            and (size := C.llama_state_seq_get_size(self._h, src)) <= STATE_COPY_MAX
        ):
            if self.set_seq_state(dst, self._read_state(src, size)):
                self.seq_rm(dst, n, -1)
                return False
            self.seq_rm(dst)  # no room for it: copy the stream instead
        self.seq_cp(src, dst, -1, -1)
        self.seq_rm(dst, n, -1)
        return True

    def seq_state(self, seq: int) -> bytearray:
        """One sequence's KV, serialized (llama_state_seq_get_data) straight into a bytearray: no second copy."""
        return self._read_state(seq, C.llama_state_seq_get_size(self._h, seq))

    def _read_state(self, seq: int, size: int) -> bytearray:
        data = bytearray(size)
        n = C.llama_state_seq_get_data(self._h, (ctypes.c_uint8 * size).from_buffer(data), size, seq)
        if n != size:
            raise DecodeError(f"saving sequence {seq}'s KV wrote {n} of {size} bytes")
        return data

    def set_seq_state(self, seq: int, data: bytes | bytearray) -> bool:
        """Load a serialized sequence into seq (replacing what it held); False when llama.cpp refuses it."""
        if isinstance(data, bytearray):
            buf: Any = (ctypes.c_uint8 * len(data)).from_buffer(data)
        else:  # read from disk: point at the bytes object's own buffer, llama.cpp only reads it
            buf = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
        return C.llama_state_seq_set_data(self._h, buf, len(data), seq) == len(data)

    def seq_pos_max(self, seq: int) -> int:
        """Largest position held for seq, -1 when it holds none."""
        return int(C.llama_memory_seq_pos_max(self._mem, seq))

    def clear(self) -> None:
        C.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        if self._h:
            C.llama_free(self._h)
            self._h = None


class Batch:
    """A reusable llama_batch of up to `capacity` tokens, one sequence id per token."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = C.llama_batch_init(capacity, 0, 1)
        self._token = np.ctypeslib.as_array(self.raw.token, shape=(capacity,))
        self._pos = np.ctypeslib.as_array(self.raw.pos, shape=(capacity,))
        self._n_seq = np.ctypeslib.as_array(self.raw.n_seq_id, shape=(capacity,))
        self._logits = np.ctypeslib.as_array(self.raw.logits, shape=(capacity,))
        self._seq = self.raw.seq_id
        self._n_seq[:] = 1
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(self, seq: int, tokens: list[int], pos0: int, want_logits: bool, logits_from: int = -1) -> int:
        """Append tokens of one sequence at positions pos0...; return the batch row of the last, or -1.

        logits_from >= 0 asks for logits at every token from that offset on (draft verification).
        """
        k = len(tokens)
        i, j = self.n, self.n + k
        if j > self.capacity:
            raise DecodeError(f"batch overflow: {j} tokens > capacity {self.capacity}")
        self._token[i:j] = tokens
        self._pos[i:j] = np.arange(pos0, pos0 + k)
        self._logits[i:j] = 0
        for r in range(i, j):
            self._seq[r][0] = seq
        if want_logits:
            self._logits[j - 1] = 1
        if logits_from >= 0:
            self._logits[i + logits_from : j] = 1
        self.n = j
        self.raw.n_tokens = j
        return j - 1 if want_logits else -1

    def close(self) -> None:
        if self.raw is not None:
            C.llama_batch_free(self.raw)
            self.raw = None
