"""A pure-Python GGUF header reader: validates model files before llama.cpp sees them.

llama.cpp aborts or crashes on some malformed files, so every path is checked here
first: the magic, the version, every metadata entry, the tensor table, and that the
file is long enough to hold every tensor it declares.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from edgeinfer.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
# Arrays longer than this are kept as their length only (the vocabulary has ~50k entries).
_MAX_ARRAY_KEPT = 64

# ggml tensor type -> (elements per block, bytes per block), for the size check.
_BLOCK = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2),
    26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2),
}  # fmt: skip

# GGUF general.file_type -> name, for the common quantizations.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
    15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}  # fmt: skip

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(slots=True)
class GGUFInfo:
    """What a GGUF file declares about itself."""

    path: Path
    version: int
    metadata: dict[str, Any]
    n_tensors: int
    n_params: int
    file_size: int
    # Lengths of arrays too long to keep (e.g. tokenizer.ggml.tokens).
    array_lengths: dict[str, int] = field(default_factory=dict)
    # Bytes of tensor data by group: "blk.N" for repeating layer N, else the tensor's name.
    tensor_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def n_layer(self) -> int:
        return int(self.metadata.get(f"{self.architecture}.block_count", 0))

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", self.path.stem))

    @property
    def quantization(self) -> str:
        ft = self.metadata.get("general.file_type")
        return FILE_TYPES.get(ft, f"type {ft}") if ft is not None else "unknown"

    @property
    def context_length(self) -> int | None:
        value = self.metadata.get(f"{self.architecture}.context_length")
        return int(value) if value is not None else None

    @property
    def vocab_size(self) -> int | None:
        return self.array_lengths.get("tokenizer.ggml.tokens")

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")


class _Reader:
    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f = f
        self.path = path

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ModelFileError(f"{self.path}: the file is truncated (header ends early); download it again")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > 1 << 26:
            raise ModelFileError(f"{self.path}: corrupt GGUF header (string of {n} bytes)")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str, lengths: dict[str, int]) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if count > 1 << 26:
                raise ModelFileError(f"{self.path}: corrupt GGUF header (array of {count} items)")
            items = [self.value(etype, key, lengths) for _ in range(count)]
            if count > _MAX_ARRAY_KEPT:
                lengths[key] = count
                return None
            return items
        raise ModelFileError(f"{self.path}: corrupt GGUF header (unknown value type {vtype} for {key!r})")


def read_gguf(path: str | Path) -> GGUFInfo:
    """Read and validate a GGUF file's header; raise ModelFileError naming what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"{p}: no such file; pass --model with the path of a .gguf file")
    if p.is_dir():
        raise ModelFileError(f"{p}: is a directory; pass --model with the path of a .gguf file")
    size = p.stat().st_size
    try:
        with p.open("rb") as f:
            r = _Reader(f, p)
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise ModelFileError(f"{p}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
            version = r.scalar("<I")
            if version not in (2, 3):
                raise ModelFileError(f"{p}: GGUF version {version} is not supported (2 and 3 are)")
            n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
            if n_tensors > 1 << 20 or n_kv > 1 << 20:
                raise ModelFileError(f"{p}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
            meta: dict[str, Any] = {}
            lengths: dict[str, int] = {}
            for _ in range(n_kv):
                key = r.string()
                meta[key] = r.value(r.scalar("<I"), key, lengths)
            n_params, data_end = 0, 0
            groups: dict[str, int] = {}
            for _ in range(n_tensors):
                name = r.string()
                n_dims = r.scalar("<I")
                if n_dims > 8:
                    raise ModelFileError(f"{p}: corrupt GGUF tensor table ({n_dims} dimensions)")
                n_el = 1
                for _ in range(n_dims):
                    n_el *= r.scalar("<Q")
                ttype, offset = r.scalar("<I"), r.scalar("<Q")
                n_params += n_el
                per_block, block_bytes = _BLOCK.get(ttype, (1, 0))
                data_end = max(data_end, offset + n_el // per_block * block_bytes)
                group = ".".join(name.split(".")[:2]) if name.startswith("blk.") else name
                groups[group] = groups.get(group, 0) + n_el // per_block * block_bytes
            align = int(meta.get("general.alignment", 32))
            data_start = -(-f.tell() // align) * align
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read the file ({e.strerror})") from None
    if data_start + data_end > size:
        missing = data_start + data_end - size
        raise ModelFileError(
            f"{p}: the file is truncated ({size} bytes, {missing} fewer than its tensors need); download it again"
        )
    return GGUFInfo(p, version, meta, n_tensors, n_params, size, lengths, groups)
