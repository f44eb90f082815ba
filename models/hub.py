"""Models by Hub name: `REPO[:QUANT]` to a GGUF in the Hugging Face cache, pulled on first use.

Everything goes through huggingface_hub, which reads HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, HF_TOKEN and
HF_HUB_OFFLINE itself; files land in its standard cache, shared with every other tool that uses it. A
name already in the cache resolves with no request at all. A download is checked as a complete GGUF
(every part of a split one) and removed from the cache if it is not, so nothing later passes as complete.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.errors import HubAccessError, HubError, HubNotFoundError, ModelFileError

from .files import is_model_file, quant_of, split_of

# huggingface_hub (and gguf with numpy) take about 0.5 s to import, so they are imported where a Hub name is
# resolved, not here: resolve_model imports this module for every command, most of which never touch the Hub.

# With no QUANT, the first of these the repo has: the usual 4-bit default first (llama.cpp's and Ollama's
# choice), then the other 4-bit types, then larger ones by size, then smaller ones; a repo with none of
# them gives its first GGUF by name.
PREFERENCE = (
    "Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "IQ4_XS", "IQ4_NL", "Q5_K_M", "Q5_K_S", "Q5_0", "Q5_1",
    "Q6_K", "Q8_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "IQ3_M", "IQ3_XS", "Q2_K", "BF16", "F16", "F32",
)  # fmt: skip

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_REF = re.compile(
    rf"^(?:(?:https?://)?(?:huggingface\.co|hf\.co)/)?(?P<repo>{_NAME}/{_NAME})"
    rf"(?:/(?:resolve|blob)/main/(?P<file>[^:]+\.gguf)|:(?P<quant>{_NAME}))?/?$"
)


@dataclass(frozen=True, slots=True)
class HubRef:
    """A model named on the Hub: a repo, and a quant or a file in it (neither: the preferred quant)."""

    repo: str
    quant: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        return self.repo + (f":{self.quant}" if self.quant else "") + (f" ({self.file})" if self.file else "")


def parse_ref(value: str) -> HubRef | None:
    """`owner/repo`, `owner/repo:QUANT`, with an `hf.co/` or `https://huggingface.co/` prefix, or a
    https://huggingface.co/owner/repo/resolve/main/FILE.gguf address; None for anything else."""
    if value.endswith(".gguf") and "/resolve/" not in value and "/blob/" not in value:
        return None
    m = _REF.match(value.strip())
    if m is None or m["repo"].endswith((".", "-")) or ".." in m["repo"]:
        return None
    return HubRef(m["repo"], m["quant"], m["file"])


@dataclass(frozen=True, slots=True)
class Choice:
    """One model in a repo: its file, or every part of a split one (first part first)."""

    files: tuple[str, ...]

    @property
    def quant(self) -> str | None:
        return quant_of(self.files[0])


def models_in(filenames: list[str]) -> list[Choice]:
    """The repo's GGUF models (files.py's rule): split parts grouped into one, sidecars left out."""
    groups: dict[str, list[str]] = {}
    for name in sorted(filenames):
        if not is_model_file(name):
            continue
        base, _, parts = split_of(name)
        groups.setdefault(f"{base} of {parts}" if parts > 1 else name, []).append(name)
    return [Choice(tuple(files)) for files in groups.values()]


def choose(ref: HubRef, filenames: list[str]) -> Choice:
    """The model REF names among a repo's files; HubNotFoundError listing the quants it has if none."""
    models = models_in(filenames)
    if not models:
        raise HubNotFoundError(f"{ref.repo} has no GGUF files; edgeinfer runs GGUF models (look for a -GGUF repo)")
    if ref.file:
        picked = [c for c in models if ref.file in c.files]
    elif ref.quant:
        q = ref.quant.upper()
        # The exact quant first (Q4_K_M); else any name carrying it as a word (Q4_K matches Q4_K_M and Q4_K_S).
        picked = [c for c in models if c.quant == q] or [
            c for c in models if re.search(rf"(?<![A-Za-z0-9]){re.escape(q)}(?![A-Za-z0-9])", c.files[0], re.I)
        ]
    else:
        picked = models
    if not picked:
        what = f"no file {ref.file}" if ref.file else f"no {ref.quant} GGUF"
        raise HubNotFoundError(f"{ref.repo} has {what}; it has {available(models)}: pull {ref.repo}:QUANT with one")
    return min(picked, key=_rank)


def available(models: list[Choice]) -> str:
    quants = sorted({c.quant or c.files[0] for c in models}, key=lambda q: _rank(Choice((f"x-{q}.gguf",))))
    return ", ".join(quants)


def _rank(c: Choice) -> tuple[int, str]:
    q = c.quant
    return (PREFERENCE.index(q) if q in PREFERENCE else len(PREFERENCE), c.files[0])


def resolve(ref: HubRef) -> Path:
    """The local path of REF's GGUF (a split one's first part): from the cache with no request, else
    pulled; HubError (one line) if it cannot be had."""
    return cached_path(ref) or pull(ref)


def cached_path(ref: HubRef) -> Path | None:
    """REF's GGUF from the cache's snapshot of the repo's main branch, checked complete; None if absent.

    Sends no request. With no QUANT, the preferred of the repo's models already pulled."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from .gguf import read_gguf

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return None
    for repo in cache.repos:
        if repo.repo_type != "model" or repo.repo_id.lower() != ref.repo.lower():
            continue
        for rev in repo.revisions:
            if "main" not in rev.refs:
                continue
            present = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f.file_path for f in rev.files}
            try:
                choice = choose(ref, list(present))
            except HubNotFoundError:
                return None
            if not all(name in present for name in choice.files) or not _split_complete(choice):
                return None
            for name in choice.files:
                try:
                    read_gguf(present[name])
                except ModelFileError:
                    forget(present[name])  # damaged since: removed, so the pull fetches it again
                    return None
            return present[choice.files[0]]
    return None


def _split_complete(choice: Choice) -> bool:
    return len(choice.files) == split_of(choice.files[0])[2]


def pull(ref: HubRef) -> Path:
    """Download REF's GGUF (every part of a split one) into the Hugging Face cache and check it."""
    from huggingface_hub import HfApi, constants, hf_hub_download, is_offline_mode

    from .gguf import read_gguf

    if is_offline_mode():
        raise HubError(
            f"{ref}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set; "
            f"pull it while online (unset HF_HUB_OFFLINE)"
        )
    with _hub_errors(ref):
        info = HfApi().model_info(ref.repo)
        choice = choose(ref, [s.rfilename for s in info.siblings or []])
        if not _split_complete(choice):
            raise HubError(f"{ref.repo}: {choice.files[0]} is split, but the repo lacks some of its parts")
        # One file at a time in this thread, so Ctrl-C stops the download at once (huggingface_hub then
        # deletes this process's partial file); snapshot_download's worker threads would finish first.
        paths = [Path(hf_hub_download(ref.repo, name)) for name in choice.files]
    for name, path in zip(choice.files, paths, strict=True):
        try:
            read_gguf(path)
        except ModelFileError as e:
            forget(path)
            reason = str(e).removeprefix(f"{path}: ").removesuffix("; download it again")
            raise HubError(
                f"{ref.repo}/{name}: the download is not a complete GGUF ({reason}); it was removed from the cache, "
                "run the pull again"
            ) from None
    return paths[0]


def forget(path: Path) -> None:
    """Remove a cached file: its snapshot link and the blob it points to, so no later look-up finds it."""
    blob = Path(os.path.realpath(path))
    for p in (path, blob):
        p.unlink(missing_ok=True)


@contextmanager
def _hub_errors(ref: HubRef) -> Iterator[None]:
    """huggingface_hub's exceptions as one-line HubErrors that say what to do (Ctrl-C passes through)."""
    try:
        yield
    except HubError:
        raise
    except Exception as e:
        raise _as_hub_error(ref, e) from None


def _as_hub_error(ref: HubRef, e: Exception) -> HubError:
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, where = ref.repo, constants.ENDPOINT
    token = (
        "HF_TOKEN's account has no access to it"
        if os.environ.get("HF_TOKEN")
        else "set HF_TOKEN to a token with access"
    )
    if isinstance(e, GatedRepoError):
        if os.environ.get("HF_TOKEN"):
            return HubAccessError(
                f"{repo} is gated and HF_TOKEN's account has no access: accept its terms at {where}/{repo}"
            )
        return HubAccessError(
            f"{repo} is gated: accept its terms at {where}/{repo}, then set HF_TOKEN to a token of that account"
        )
    if isinstance(e, RepositoryNotFoundError):
        return HubNotFoundError(
            f"{repo}: no such model repository on {where}, nor such a file here "
            "(a private repo needs HF_TOKEN set to a token with access)"
        )
    if isinstance(e, RevisionNotFoundError | RemoteEntryNotFoundError):
        return HubNotFoundError(f"{repo}: the file is no longer on {where}; pull it again")
    if isinstance(e, OfflineModeIsEnabled):
        return HubError(f"{ref}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; pull it while online")
    if isinstance(e, HfHubHTTPError):
        status = e.response.status_code if e.response is not None else 0
        if status in (401, 403):
            return HubAccessError(f"{repo}: access denied (HTTP {status}); {token}")
        return HubError(f"{repo}: the Hub at {where} answered HTTP {status}; try again later")
    if isinstance(e, httpx2.TransportError | LocalEntryNotFoundError | ConnectionError):
        return HubError(
            f"{repo}: cannot reach the Hub at {where} ({_first_line(e)}); check the connection or HF_ENDPOINT"
        )
    return HubError(f"{repo}: download failed ({_first_line(e)}); run the pull again")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
