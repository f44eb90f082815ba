"""Which files of a folder (or a Hub repo) are models: the one rule every place that lists GGUFs follows.

A model is a `.gguf` file that is not a sidecar (a vision projector, `mmproj`; an importance
matrix, `imatrix`). A split GGUF (llama.cpp's gguf-split: NAME-00001-of-00003.gguf) is one model,
named by its first part. The quantization is read from the name as llama.cpp's and the Hub's
tools write it (Q4_K_M, IQ2_XXS, Q8_0, TQ1_0, MXFP4, BF16, F16...), the last one named.
"""

from __future__ import annotations

import re
from pathlib import Path

SIDECARS = ("mmproj", "imatrix")
_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})$")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[A-Z0-9]{1,3})*|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|F32)(?![A-Za-z0-9])",
    re.IGNORECASE,
)


def _stem(name: str) -> str:
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def is_model_file(name: str) -> bool:
    """A .gguf file (any case) that is not a sidecar."""
    low = name.lower()
    return low.endswith(".gguf") and not any(word in low.rsplit("/", 1)[-1] for word in SIDECARS)


def split_of(name: str) -> tuple[str, int, int]:
    """(the name without its part suffix and .gguf, part, parts); (stem, 1, 1) for a file that is not split."""
    m = _SPLIT.match(_stem(name))
    return (m[1], int(m[2]), int(m[3])) if m else (_stem(name), 1, 1)


def is_first_part(name: str) -> bool:
    """The file that names its model: a whole GGUF, or part 1 of a split one."""
    return split_of(name)[1] == 1


def parts_of(first: Path) -> list[Path]:
    """Every part of the GGUF whose first part (or only file) is first, in order."""
    base, _, parts = split_of(first.name)
    if parts == 1:
        return [first]
    return [first.with_name(f"{base}-{i:05d}-of-{parts:05d}.gguf") for i in range(1, parts + 1)]


def quant_of(name: str) -> str | None:
    """The quant type a GGUF's file name carries (the last one named), upper-case; None if none."""
    found = _QUANT.findall(Path(name).name)
    return found[-1].upper() if found else None
