"""`edgeinfer models quantize`: a copy of a GGUF model at another precision (llama_model_quantize)."""

from __future__ import annotations

import ctypes
from pathlib import Path

from edgeinfer.errors import ConfigError, ModelLoadError
from edgeinfer.llamacpp.core import C, init_backend
from edgeinfer.models.gguf import read_gguf

QUANT_TYPES = {"F32": C.LLAMA_FTYPE_ALL_F32} | {
    name: getattr(C, f"LLAMA_FTYPE_MOSTLY_{name}")
    for name in ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K")
}


def quantize(src: str | Path, dst: str | Path, qtype: str, threads: int = 0, overwrite: bool = False) -> None:
    """Write a copy of a GGUF model at another precision (llama_model_quantize); DST is checked first."""
    from edgeinfer.models.catalog import check_copy_target

    read_gguf(src)
    check_copy_target(Path(src), Path(dst), overwrite)
    init_backend()
    key = qtype.upper()
    if key not in QUANT_TYPES:
        raise ConfigError(f"quantization type {qtype!r} is not one of {', '.join(QUANT_TYPES)}")
    params = C.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[key]
    params.nthread = threads
    # A quantized source is allowed: a Q4_1 file can be widened to F16 (a speculation target).
    params.allow_requantize = True
    rc = C.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise ModelLoadError(f"quantizing {src} to {key} failed (code {rc}); is {dst} writable?")
