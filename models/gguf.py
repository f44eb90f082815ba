"""GGUF metadata through ggml's own reader (the `gguf` package): validates model files before llama.cpp sees them.

llama.cpp aborts or crashes on some malformed files, so every path is checked here
first: the magic, the version, every metadata entry, the tensor table, and that the
file is long enough to hold every tensor it declares (by gguf's own block sizes, so
the newer types, IQ*, TQ*, MXFP4, count right).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, LlamaFileType
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS, ReaderField

from edgeinfer.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
# Arrays longer than this are kept as their length only (the vocabulary has ~50k entries).
_MAX_ARRAY_KEPT = 64


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
        if ft is None:
            return "unknown"
        try:
            return LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"type {ft}"

    @property
    def sliding_window(self) -> int | None:
        """Tokens a sliding-window layer attends over (Gemma 3: 512); None for a model without such layers."""
        value = self.metadata.get(f"{self.architecture}.attention.sliding_window")
        return int(value) if value else None

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


class _Truncated(Exception):
    """The file ends before what its header declares; `need` is the size it should have (0: header cut)."""

    def __init__(self, need: int = 0) -> None:
        self.need = need


class _Reader(GGUFReader):
    """GGUFReader that stops at the end of the file and skips the items of long arrays.

    The stock reader builds one numpy view per array item: 4-5 s for SmolLM2's 49k tokens
    and 48k merges. Here a long array is walked with struct (strings) or sized by
    arithmetic (numbers) and kept as its length only, so a read takes milliseconds.
    """

    def _get(
        self,
        offset: int,
        dtype: npt.DTypeLike,
        count: int = 1,
        override_order: Literal["I", "S", "<"] | None = None,
    ) -> npt.NDArray[Any]:
        if offset + np.dtype(dtype).itemsize * int(count) > self.data.size:
            raise _Truncated
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[npt.NDArray[Any]], list[int], list[GGUFValueType]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype = GGUFValueType(int(raw_itype[0]))
        count = int(alen[0])
        if count <= _MAX_ARRAY_KEPT or itype == GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs + 12
        if itype == GGUFValueType.STRING:
            fmt = "<Q" if self.endianess == GGUFEndian.LITTLE else ">Q"
            buf, size = self.data.data, self.data.size  # one memoryview: no buffer export per item
            for _ in range(count):
                if offs + 8 > size:
                    raise _Truncated
                offs += 8 + struct.unpack_from(fmt, buf, offs)[0]
            if offs > size:
                raise _Truncated
        else:
            np_type = self.gguf_scalar_to_np.get(itype)
            if np_type is None:
                raise ValueError(f"unknown array item type {itype}")
            offs += np.dtype(np_type).itemsize * count
            if offs > self.data.size:
                raise _Truncated
        # No item parts: the field reads as its length only (see _value).
        return offs - orig_offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, itype]

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
        end = start_offs
        for f in fields:
            _len, _name, _n_dims, dims, raw_dtype, offset = f.parts
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
            end = max(end, start_offs + int(offset[0]) + int(np.prod(dims, dtype=np.uint64)) * type_size // block)
        if end > self.data.size:
            raise _Truncated(end)
        super()._build_tensors(start_offs, fields)


def _text(part: npt.NDArray[Any]) -> str:
    return bytes(part).decode("utf-8", errors="replace")


def _value(f: ReaderField) -> tuple[Any, int | None]:
    """A field's value as plain Python, and for a long array (kept as its length only) that length."""
    kind = f.types[0]
    if kind == GGUFValueType.STRING:
        return _text(f.parts[-1]), None
    if kind != GGUFValueType.ARRAY:
        return f.parts[-1].tolist()[0], None
    count = int(f.parts[4][0])  # parts: key length, key, value type, item type, count, items...
    if count > _MAX_ARRAY_KEPT:
        return None, count
    if f.types[-1] == GGUFValueType.STRING:
        return [_text(f.parts[i]) for i in f.data], None
    return f.contents(), None


def _check_start(p: Path, size: int) -> None:
    """The magic, version and counts, read directly so their errors are exact (and an empty file is no mmap)."""
    with p.open("rb") as f:
        head = f.read(24)
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"{p}: not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')")
    if len(head) < 24:
        raise _Truncated
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:])
    if version not in READER_SUPPORTED_VERSIONS:
        raise ModelFileError(f"{p}: GGUF version {version} is not supported (2 and 3 are)")
    if n_tensors > 1 << 20 or n_kv > 1 << 20:
        raise ModelFileError(f"{p}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys); download it again")


def read_gguf(path: str | Path) -> GGUFInfo:
    """Read and validate a GGUF file's header; raise ModelFileError naming what is wrong."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"{p}: no such file; pass --model with the path of a .gguf file")
    if p.is_dir():
        raise ModelFileError(f"{p}: is a directory; pass --model with the path of a .gguf file")
    size = p.stat().st_size
    try:
        _check_start(p, size)
        reader = _Reader(p)
        meta: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for key, f in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            meta[key], n = _value(f)
            if n is not None:
                lengths[key] = n
        version = int(reader.fields["GGUF.version"].parts[0][0])
        groups: dict[str, int] = {}
        for t in reader.tensors:
            group = ".".join(t.name.split(".")[:2]) if t.name.startswith("blk.") else t.name
            groups[group] = groups.get(group, 0) + int(t.n_bytes)
        n_params = sum(int(t.n_elements) for t in reader.tensors)
        n_tensors = len(reader.tensors)
        del reader  # drop the memory map now
    except _Truncated as e:
        if not e.need:
            raise ModelFileError(f"{p}: the file is truncated (header ends early); download it again") from None
        raise ModelFileError(
            f"{p}: the file is truncated ({size} bytes, {e.need - size} fewer than its tensors need); download it again"
        ) from None
    except ModelFileError:
        raise
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read the file ({e.strerror or e})") from None
    except Exception as e:  # the reader raises ValueError, KeyError, IndexError... on a corrupt file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelFileError(f"{p}: corrupt GGUF file ({reason}); download it again") from None
    return GGUFInfo(p, version, meta, n_tensors, n_params, size, lengths, groups)
