"""The disk tier: saved KV as one file per entry, so a restarted server (or `chat --resume`) starts warm.

Files live in `<cache dir>/<identity>/`, where the identity names what makes KV bytes
reusable: the model file (a hash of its header and its size), the KV type and layout.
Each file holds a small JSON header (identity, token count, payload size, CRC-32), the
tokens and the payload. Files are written in a background thread, to a temporary name
and renamed, so a crash leaves no half-written entry; the folder is kept under its byte
budget by removing the oldest files. A file that is truncated, corrupt or does not match
its header is skipped with one warning and removed, never loaded. A folder that cannot
be written (read-only, full) turns the tier off with one warning: the RAM tier goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import struct
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

MAGIC = b"EIKV\x00\x01\r\n"  # edgeinfer KV, format 1
SUFFIX = ".kv"
RAM_ONLY = "keeping the cache in RAM only"


def warn_stderr(message: str) -> None:
    sys.stderr.write(f"edgeinfer: warning: {message}\n")


def file_identity(path: Path, head_bytes: int = 1 << 20) -> str:
    """A model file's identity: a hash of its first MiB (the GGUF header and metadata) and its size."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(head_bytes))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:16]


class DiskTier:
    """KV entries as files under root/identity, at most max_bytes of them."""

    def __init__(self, root: Path, identity: str, max_bytes: int, warn: Callable[[str], None] = warn_stderr) -> None:
        self.dir = Path(root).expanduser() / identity
        self.identity = identity
        self.max_bytes = max_bytes
        self.warn = warn
        self.error: str | None = None  # why the tier is off, if it is
        self._sizes: dict[str, int] = {}  # file name -> bytes, oldest first
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, list[int], bytes | bytearray | None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            self._fail(f"cannot write the KV cache folder {self.dir} ({e.strerror or e}); {RAM_ONLY}")

    # --- reading ------------------------------------------------------------

    def load_index(self) -> list[list[int]]:
        """The tokens of every sound entry on disk, oldest first; bad files are removed with one warning."""
        if not self.dir.is_dir():
            return []
        found, bad = [], []
        files = sorted(self.dir.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
        for path in files:
            tokens = self._read(path, payload=False)
            if tokens is None:
                bad.append(path)
                continue
            found.append(tokens[0])
            self._sizes[path.name] = path.stat().st_size
        self._remove_bad(bad)
        return found

    def read(self, tokens: list[int]) -> bytes | None:
        """The payload of the entry for tokens, checked; None (and the file removed) if it is missing or bad."""
        path = self.dir / self._name(tokens)
        if not path.exists():
            return None  # removed to keep the folder within its budget, or not written yet
        got = self._read(path, payload=True)
        if got is None or got[0] != list(tokens):
            self._remove_bad([path])
            return None
        return got[1]

    def _read(self, path: Path, payload: bool) -> tuple[list[int], bytes] | None:
        try:
            with open(path, "rb") as f:
                if f.read(len(MAGIC)) != MAGIC:
                    return None
                (n_head,) = struct.unpack("<I", f.read(4))
                head = json.loads(f.read(n_head))
                if head.get("identity") != self.identity:
                    return None
                n_tokens, n_payload = int(head["n_tokens"]), int(head["payload_bytes"])
                raw = f.read(4 * n_tokens)
                if len(raw) != 4 * n_tokens:
                    return None
                tokens = np.frombuffer(raw, dtype="<i4").tolist()
                if not payload:
                    rest = os.fstat(f.fileno()).st_size - f.tell()
                    return (tokens, b"") if rest == n_payload else None
                data = f.read(n_payload + 1)
                if len(data) != n_payload or zlib.crc32(data) != int(head["crc32"]):
                    return None
                return tokens, data
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return None

    def _remove_bad(self, paths: list[Path]) -> None:
        if not paths:
            return
        names = ", ".join(p.name for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
        self.warn(f"skipped {len(paths)} unreadable KV cache file(s) in {self.dir} ({names}); removed them")
        for p in paths:
            with self._lock:
                self._sizes.pop(p.name, None)
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)

    # --- writing (background) -------------------------------------------------

    def write(self, tokens: list[int], blob: bytes | bytearray) -> None:
        if self.error is None:
            self._start()
            self._queue.put(("write", list(tokens), blob))

    def remove(self, tokens: list[int]) -> None:
        if self.error is None:
            self._start()
            self._queue.put(("remove", list(tokens), None))

    def flush(self) -> None:
        """Wait until every queued write is on disk (tests, shutdown)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self._sizes), sum(self._sizes.values())

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="edgeinfer-kv-disk", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                op, tokens, blob = job
                if self.error is not None:
                    continue
                if op == "write" and blob is not None:
                    self._write(tokens, blob)
                else:
                    self._unlink(self._name(tokens))
            finally:
                self._queue.task_done()

    def _write(self, tokens: list[int], blob: bytes | bytearray) -> None:
        name = self._name(tokens)
        head = json.dumps(
            {"identity": self.identity, "n_tokens": len(tokens), "payload_bytes": len(blob), "crc32": zlib.crc32(blob)}
        ).encode()
        tmp = self.dir / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(head)) + head)
                f.write(np.asarray(tokens, dtype="<i4").tobytes())
                f.write(blob)
            os.replace(tmp, self.dir / name)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self._fail(f"cannot write to the KV cache folder {self.dir} ({e.strerror or e}); {RAM_ONLY}")
            return
        with self._lock:
            self._sizes.pop(name, None)
            self._sizes[name] = (self.dir / name).stat().st_size
        self._fit()

    def _fit(self) -> None:
        """Remove the oldest files until the folder is within its budget (the newest always stays)."""
        while True:
            with self._lock:
                total = sum(self._sizes.values())
                if total <= self.max_bytes or len(self._sizes) <= 1:
                    return
                oldest = next(iter(self._sizes))
            self._unlink(oldest)

    def _unlink(self, name: str) -> None:
        with self._lock:
            self._sizes.pop(name, None)
        with contextlib.suppress(OSError):
            (self.dir / name).unlink(missing_ok=True)

    def _name(self, tokens: list[int]) -> str:
        return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:32] + SUFFIX

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            self.warn(message)
