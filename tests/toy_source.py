"""A toy model store, the whole of a new source in one module (tests/test_extensions.py registers it).

A "toybox" folder holds GGUFs and a toybox.json index: {"model name": "file.gguf", ...}. Its default folder is
$TOYBOX_HOME; EDGEINFER_STORES folders are recognised as toyboxes by their index.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edgeinfer.models.stores import Found, is_gguf, quant_tag


class ToyBox:
    name = "toybox"
    title = "Toybox"
    specificity = 4  # an index file says more than any other layout's clues

    def places(self) -> list[Path]:
        home = os.environ.get("TOYBOX_HOME")
        return [Path(home)] if home else []

    def recognises(self, root: Path) -> bool:
        return (root / "toybox.json").is_file()

    def scan(self, root: Path) -> list[Found]:
        index = json.loads((root / "toybox.json").read_text())
        out = []
        for name, file in index.items():
            path = root / file
            problem = None if is_gguf(path) else f"{path} is not a GGUF file; put it back in the toybox"
            size = path.stat().st_size if path.exists() else 0
            out.append(Found(name, path, self.name, size, (name.lower(),), quant_tag(file), problem))
        return out
