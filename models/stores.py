"""GGUFs other tools already downloaded (Hub cache, llama.cpp's cache, LM Studio, Ollama), found to load in place.

Nothing here copies or rewrites a file: `find` returns the path of the file that the other tool keeps,
and llama.cpp maps that same file. Listing reads directory entries and 4 bytes per file (the GGUF
magic), never a whole file.

Where each tool keeps its files (checked against each tool's source):
- Hugging Face Hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
  (models--OWNER--REPO/snapshots/COMMIT/FILE, read with huggingface_hub's scan_cache_dir).
- llama.cpp's -hf cache (ggml-org/llama.cpp, common/common.cpp fs_get_cache_directory): $LLAMA_CACHE,
  else $XDG_CACHE_HOME/llama.cpp or ~/.cache/llama.cpp. Older releases wrote flat files named
  OWNER_REPO_FILE.gguf ('/' made '_', common/arg.cpp) beside manifest=OWNER_REPO=TAG.json (the Hub's
  answer, whose ggufFile.rfilename names the file); newer ones (common/hf-cache.cpp) use the Hub cache
  layout, in $LLAMA_CACHE when it is set and in the Hub cache itself when not.
- Ollama (ollama/ollama, envconfig/config.go Models, manifest/paths.go, types/model/name.go): $OLLAMA_MODELS,
  else ~/.ollama/models (and /usr/share/ollama/.ollama/models, the Linux service's home); manifests at
  manifests/HOST/NAMESPACE/MODEL/TAG are JSON whose layer of mediaType application/vnd.ollama.image.model
  names blobs/sha256-HEX, a GGUF. Names print as Ollama's DisplayShortest: qwen2.5:0.5b, user/model:tag.
- LM Studio (lmstudio-ai/lmstudio-js findLMStudioHome): the folder named in ~/.lmstudio-home-pointer, else
  ~/.lmstudio (older: ~/.cache/lm-studio); models/PUBLISHER/REPO/FILE.gguf. LM Studio reads no environment
  variable for its home, so EDGEINFER_STORES is the way to point edgeinfer elsewhere.

EDGEINFER_STORES (folders separated by os.pathsep), when set, replaces all the default locations; each
folder's layout is recognised from its contents. Set it empty to search no store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from edgeinfer.errors import ConfigError, ModelFileError

from .files import is_first_part, is_model_file, quant_of, split_of

GGUF_MAGIC = b"GGUF"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")


@dataclass(slots=True)
class Found:
    """One GGUF in another tool's store, with why it cannot run where it cannot."""

    name: str  # what to pass to --model
    path: Path  # the file llama.cpp maps (the first part of a split GGUF)
    source: str  # its Source's name
    size: int  # bytes, all parts of a split GGUF
    repos: tuple[str, ...] = ()  # lower-case repo/model names a shorter --model may use ("owner/repo", "qwen2.5")
    tag: str = ""  # quant (Hub, LM Studio, llama.cpp) or tag (Ollama) a shorter --model may use
    problem: str | None = None  # why it cannot run, one line (a missing blob, not a GGUF)
    flat: bool = False  # a llama.cpp flat file: OWNER_REPO_FILE.gguf, whose repo is known only as a prefix

    def answers(self, repo: str, tag: str) -> bool:
        """Whether `repo[:tag]` (lower case) names this file; tag "" is any tag (Ollama: checked by the caller)."""
        named = repo in self.repos or (self.flat and self.path.stem.lower().startswith(repo.replace("/", "_") + "_"))
        stem = self.path.stem.lower()
        return named and (not tag or tag in (self.tag.lower(), stem, split_of(stem)[0]))


@dataclass(slots=True)
class Store:
    """One folder another tool keeps models in."""

    source: str
    root: Path
    found: list[Found] = field(default_factory=list)


def _home() -> Path:
    return Path.home()


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or _home() / ".cache")


def hub_cache() -> Path:
    """The Hub cache, as huggingface_hub computes it (read from the environment now, not at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    hf_home = os.environ.get("HF_HOME")
    return (Path(hf_home).expanduser() if hf_home else _cache_home() / "huggingface") / "hub"


def llama_cache() -> Path:
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"]).expanduser()
    if sys.platform == "darwin":
        return _home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "llama.cpp"
    return _cache_home() / "llama.cpp"


def ollama_stores() -> list[Path]:
    if os.environ.get("OLLAMA_MODELS"):
        return [Path(os.environ["OLLAMA_MODELS"]).expanduser()]
    return [_home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def lmstudio_stores() -> list[Path]:
    homes = [_home() / ".lmstudio", _home() / ".cache" / "lm-studio"]
    pointer = _home() / ".lmstudio-home-pointer"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if text := pointer.read_text(encoding="utf-8").strip():
            homes.insert(0, Path(text))
    return [h / "models" for h in homes]


def default_stores() -> list[Store]:
    """Each source's own folders, in precedence order."""
    return [Store(src.name, p) for src in SOURCES for p in src.places()]


def kind_of(root: Path) -> str:
    """Which tool's layout a folder named in EDGEINFER_STORES has: the first source (most specific first) that
    recognises it, else the plain folder of GGUFs (LM Studio's)."""
    return next((src.name for src in sorted(SOURCES, key=lambda x: -x.specificity) if src.recognises(root)), "lmstudio")


def candidates() -> list[Store]:
    """The folders to search, present or not: EDGEINFER_STORES's, else each tool's own."""
    env = os.environ.get("EDGEINFER_STORES")
    if env is None:
        return default_stores()
    return [Store(kind_of(r), r) for r in (Path(p).expanduser() for p in env.split(os.pathsep) if p.strip())]


def stores() -> list[Store]:
    """The folders present, each once, in precedence order."""
    seen: set[Path] = set()
    unique = []
    for s in candidates():
        key = s.root.resolve()
        if key not in seen and s.root.is_dir():
            seen.add(key)
            unique.append(s)
    return unique


def is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def quant_tag(file_name: str) -> str:
    """The quant a file's name carries (files.quant_of), "" when none: Found.tag."""
    return quant_of(file_name) or ""


def _problem(path: Path) -> str | None:
    return None if is_gguf(path) else f"{path} is not a GGUF file (no GGUF magic); download it again"


def _repo_files(source: str, repo: str, files: list[tuple[str, Path]]) -> list[Found]:
    """The GGUFs of one repo (Hub cache, llama.cpp, LM Studio): `repo:QUANT` when the quant is unique
    in the repo, else `repo:FILE`; a split GGUF is one entry, its first part, sized with all parts."""
    models = [(rel, p) for rel, p in files if is_model_file(rel)]
    parts: dict[str, list[Path]] = {}
    for rel, p in models:
        parts.setdefault(split_of(rel)[0], []).append(p)
    firsts = [(rel, p) for rel, p in models if is_first_part(rel)]
    tags = [quant_tag(rel) for rel, _ in firsts]
    out = []
    for (rel, p), tag in zip(firsts, tags, strict=True):
        base, _, count = split_of(rel)
        label = tag if tag and tags.count(tag) == 1 else base
        group = parts[base]
        size = sum(_size(q) for q in group)
        problem = _problem(p)
        if problem is None and len(group) < count:
            problem = f"only {len(group)} of its {count} parts are present; download the rest"
        out.append(Found(f"{repo}:{label}", p, source, size, (repo.lower(),), tag, problem))
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def scan_hub(root: Path, source: str = "hub") -> list[Found]:
    """GGUFs in a Hub-layout cache: each model repo's `main` revision (else its newest)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revs = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        rev = revs[-1]
        files = [(f.file_path.relative_to(rev.snapshot_path).as_posix(), f.file_path) for f in rev.files]
        out += _repo_files(source, repo.repo_id, sorted(files))
    return out


def scan_llama_cache(root: Path) -> list[Found]:
    """llama.cpp's cache: the Hub layout (newer releases) and the flat files of older ones."""
    out = scan_hub(root, "llama.cpp") if any(root.glob("models--*")) else []
    named: dict[str, tuple[str, str]] = {}  # flat file name -> (repo, tag) from the manifests
    for m in sorted(root.glob("manifest=*.json")):
        flat, _, tag = m.name.removeprefix("manifest=").removesuffix(".json").rpartition("=")
        try:
            rfilename = json.loads(m.read_text())["ggufFile"]["rfilename"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        # One '_' in the flat repo name can only be the '/' that llama.cpp replaced.
        repo = flat.replace("_", "/") if flat.count("_") == 1 else flat
        named.setdefault(f"{flat}_{rfilename}".replace("/", "_"), (repo, tag))
    for p in sorted(root.glob("*.gguf")):
        if not p.is_file() or not is_model_file(p.name):
            continue
        repo, tag = named.get(p.name, ("", ""))
        name = (repo if tag == "latest" else f"{repo}:{tag}") if repo else p.stem
        repos = (repo.lower(),) if repo else ()
        out.append(Found(name, p, "llama.cpp", _size(p), repos, quant_tag(p.name), _problem(p), flat=True))
    return out


def scan_lmstudio(root: Path) -> list[Found]:
    """A folder of GGUFs, LM Studio's way (PUBLISHER/REPO/FILE.gguf), or any folder of .gguf files."""
    by_repo: dict[str, list[tuple[str, Path]]] = {}
    for p in sorted(root.rglob("*.gguf")):
        rel = p.relative_to(root).parts
        if len(rel) > 4 or not p.is_file():
            continue
        depth = 2 if len(rel) >= 3 else len(rel) - 1  # PUBLISHER/REPO/FILE; DIR/FILE; FILE
        by_repo.setdefault("/".join(rel[:depth]), []).append(("/".join(rel[depth:]), p))
    out = []
    for repo, files in by_repo.items():
        if repo:
            out += _repo_files("lmstudio", repo, files)
        else:  # models at the top: each its own name (a split one its name without the part suffix)
            for f in _repo_files("lmstudio", "", files):
                stem = split_of(f.path.name)[0]
                out.append(dataclasses.replace(f, name=stem, repos=(stem.lower(),)))
    return out


def _ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    if host.lower() != "registry.ollama.ai":
        return f"{host}/{namespace}/{model}:{tag}"
    return f"{model}:{tag}" if namespace.lower() == "library" else f"{namespace}/{model}:{tag}"


def scan_ollama(root: Path) -> list[Found]:
    """Ollama's manifests whose model layer is a GGUF blob."""
    manifests = root / "manifests"
    out = []
    for m in sorted(manifests.glob("*/*/*/*")):  # HOST/NAMESPACE/MODEL/TAG, as Ollama's own Manifests() reads
        if not m.is_file() or m.name.startswith("."):
            continue
        host, namespace, model, tag = m.relative_to(manifests).parts
        name = _ollama_name(host, namespace, model, tag)
        repo = name.rpartition(":")[0]
        repos = tuple({repo.lower(), f"{namespace}/{model}".lower(), f"{host}/{namespace}/{model}".lower()})
        try:
            layers = json.loads(m.read_text()).get("layers") or []
            layer = next((x for x in layers if x.get("mediaType") == OLLAMA_MODEL_LAYER), None)
        except (OSError, ValueError, AttributeError) as e:
            out.append(Found(name, m, "ollama", 0, repos, tag, f"its manifest {m} is unreadable ({e})"))
            continue
        if layer is None:
            continue  # not a GGUF model (e.g. safetensors tensors): nothing llama.cpp can load
        digest = _DIGEST.match(str(layer.get("digest", "")))
        if digest is None:
            out.append(Found(name, m, "ollama", 0, repos, tag, f"its manifest {m} names no sha256 blob"))
            continue
        blob = root / "blobs" / f"sha256-{digest[1]}"
        if not blob.is_file():
            problem: str | None = f"its blob {blob} is missing; run `ollama pull {name}` to fetch it again"
        else:
            problem = _problem(blob)
        out.append(Found(name, blob, "ollama", int(layer.get("size") or _size(blob)), repos, tag, problem))
    return out


class Source(Protocol):
    """One tool's store of models: where it keeps them, how to tell its folder, how to scan it."""

    @property
    def name(self) -> str:
        """What `edgeinfer models` and Found.source call it."""
        ...

    @property
    def title(self) -> str:
        """Its heading in `edgeinfer models`."""
        ...

    @property
    def specificity(self) -> int:
        """EDGEINFER_STORES folders are recognised by the most specific source first (0: never by layout)."""
        ...

    def places(self) -> list[Path]:
        """Its default folders (present or not)."""
        ...

    def recognises(self, root: Path) -> bool:
        """Whether a folder has this tool's layout."""
        ...

    def scan(self, root: Path) -> list[Found]:
        """The GGUFs in one of its folders."""
        ...


@dataclass(frozen=True, slots=True)
class Kept:
    """A source made of its functions: the built-in ones."""

    name: str
    title: str
    specificity: int
    folders: Callable[[], list[Path]]
    layout: Callable[[Path], bool]
    scanner: Callable[[Path], list[Found]]

    def places(self) -> list[Path]:
        return self.folders()

    def recognises(self, root: Path) -> bool:
        return self.layout(root)

    def scan(self, root: Path) -> list[Found]:
        return self.scanner(root)


def _entries(root: Path) -> list[str]:
    return [p.name for p in root.iterdir()] if root.is_dir() else []


# In precedence order: of two files under one name, the first source's runs.
SOURCES: list[Source] = [
    Kept(
        "hub",
        "Hugging Face Hub cache",
        1,
        lambda: [hub_cache()],
        lambda r: any(n.startswith("models--") for n in _entries(r)),
        scan_hub,
    ),
    Kept(
        "llama.cpp",
        "llama.cpp cache",
        2,
        lambda: [llama_cache()],
        lambda r: any(n.endswith(".gguf") or n.startswith("manifest=") for n in _entries(r)),
        scan_llama_cache,
    ),
    Kept("lmstudio", "LM Studio", 0, lmstudio_stores, lambda r: False, scan_lmstudio),
    Kept(
        "ollama",
        "Ollama",
        3,
        ollama_stores,
        lambda r: (r / "manifests").is_dir() and (r / "blobs").is_dir(),
        scan_ollama,
    ),
]


def register_source(source: Source) -> Source:
    """Add a tool's store (a Source in a module of its own): searched after the built-in ones."""
    if any(s.name == source.name for s in SOURCES):
        raise ValueError(f"a model source named {source.name!r} is already registered")
    SOURCES.append(source)
    return source


def source_named(name: str) -> Source:
    return next(s for s in SOURCES if s.name == name)


def discover(places: Iterable[Store] | None = None) -> list[Store]:
    """Every store searched, with what it holds; an unreadable folder counts as empty."""
    out = []
    for store in stores() if places is None else places:
        try:
            store.found = source_named(store.source).scan(store.root)
        except OSError:
            store.found = []
        out.append(store)
    return out


def all_found() -> list[Found]:
    """Everything found, in precedence order: the stores' order (Hub cache, llama.cpp, LM Studio, Ollama,
    or EDGEINFER_STORES's), so that of two files under one name the first store's runs."""
    return [f for s in discover() for f in s.found]


def match(name: str, found: list[Found]) -> Found | None:
    """The file a --model name means: an exact name first, else the one file a shorter name can mean."""
    low = name.lower()
    exact = [f for f in found if f.name.lower() == low]
    if exact:
        return exact[0]
    repo, sep, tag = low.removesuffix(".gguf").rpartition(":")
    if not sep:
        repo, tag = tag, ""
    hits = [f for f in found if f.answers(repo, tag)]
    if not tag:
        latest = [f for f in hits if f.source == "ollama" and f.tag.lower() == "latest"]
        hits = latest or hits  # Ollama's rule: no tag means `latest`
    unique = list({f.path.resolve(): f for f in reversed(hits)}.values())[::-1]  # one file under two names: one
    if len(unique) > 1:
        names = ", ".join(f.name for f in unique[:8])
        raise ConfigError(f"{name} names {len(unique)} models on disk: {names}; pass one of these names")
    return unique[0] if unique else None


def find(name: str) -> Path | None:
    """The file of a model another tool keeps under this name, or None; a broken entry is an error."""
    hit = match(name, all_found())
    if hit is None:
        return None
    if hit.problem:
        raise ModelFileError(f"{hit.name} ({hit.source}): {hit.problem}")
    return hit.path
