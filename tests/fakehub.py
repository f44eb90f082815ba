"""A loopback fake of the Hugging Face Hub's HTTP API, for huggingface_hub pointed at it with HF_ENDPOINT.

It answers the calls huggingface_hub 2.4 makes for a model download (read from its file_download.py,
hf_api.py and utils/_http.py): GET /api/models/{repo}[/revision/{rev}] (model_info: id, sha, siblings),
GET /api/models/{repo}/tree/{rev} (list_repo_tree, for snapshot_download and `hf download`), and HEAD and
GET /{repo}/resolve/{rev}/{file} with ETag, X-Repo-Commit, Content-Length and Accept-Ranges, GET with Range
answered 206. Errors carry the X-Error-Code header the client maps to its exceptions (RepoNotFound,
GatedRepo, EntryNotFound). Fault switches: cut a download after N bytes once, slow every download,
and a gated repo's status (401 or 403). Every request is logged, so a test can assert that none was sent.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    """Repos of files (repo id -> file name -> bytes), served on 127.0.0.1 while running."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated: dict[str, int] = field(default_factory=dict)  # repo id -> 401 or 403 without a token
    cut_after: dict[str, int] = field(default_factory=dict)  # file name -> bytes sent before the next GET is cut
    hold_after: int | None = None  # bytes of downloads sent, after which every download waits for `release`
    release: threading.Event = field(default_factory=threading.Event)
    chunk: int = CHUNK
    log: list[Request] = field(default_factory=list)
    bytes_sent: int = 0
    _etags: dict[int, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos.setdefault(repo, {}).update(files)

    def requests(self, method: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.log if method is None or r.method == method]

    def etag(self, data: bytes) -> str:
        # An LFS file's ETag is its sha256 (the cache's blob name); computed once per content.
        key = id(data)
        if key not in self._etags:
            self._etags[key] = hashlib.sha256(data).hexdigest()
        return self._etags[key]

    @staticmethod
    def commit(repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        hub = self.fake
        with hub._lock:
            hub.log.append(Request(self.command, self.path, dict(self.headers.items())))
        path = unquote(urlsplit(self.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = "/".join(parts[2:4])
            rest = parts[4:]
            if not self._allowed(repo, body):
                return
            if rest[:1] == ["tree"]:
                return self._tree(repo, body)
            return self._info(repo, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            if not self._allowed(repo, body):
                return
            data = hub.repos[repo].get(name)
            if data is None:
                return self._error(404, "EntryNotFound", f"{name} not in {repo}", body, repo)
            return self._file(repo, name, data, body)
        self._error(404, "", "no such endpoint", body)

    def _allowed(self, repo: str, body: bool) -> bool:
        hub = self.fake
        if repo not in hub.repos:
            self._error(404, "RepoNotFound", "Repository not found", body)
            return False
        status = hub.gated.get(repo)
        if status and not self.headers.get("authorization"):
            self._error(status, "GatedRepo", "Access to this model is restricted: you must be authenticated", body)
            return False
        return True

    def _info(self, repo: str, body: bool) -> None:
        files = self.fake.repos[repo]
        sha = self.fake.commit(repo)
        info = {"id": repo, "modelId": repo, "sha": sha, "private": False, "gated": False, "tags": ["gguf"]}
        info["siblings"] = [{"rfilename": name} for name in files]
        self._json(info, body, sha)

    def _tree(self, repo: str, body: bool) -> None:
        hub = self.fake
        tree = [
            {
                "type": "file",
                "path": name,
                "size": len(data),
                "oid": hashlib.sha1(hub.etag(data).encode()).hexdigest(),
                "lfs": {"oid": hub.etag(data), "size": len(data), "pointerSize": 134},
            }
            for name, data in hub.repos[repo].items()
        ]
        self._json(tree, body, hub.commit(repo))

    def _file(self, repo: str, name: str, data: bytes, body: bool) -> None:
        hub = self.fake
        start, end = 0, len(data)
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start = int(first or 0)
            end = int(last) + 1 if last else len(data)
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{hub.etag(data)}"')
        self.send_header("X-Linked-Etag", f'"{hub.etag(data)}"')
        self.send_header("X-Repo-Commit", hub.commit(repo))
        self.send_header("Content-Type", "application/octet-stream")
        # As the Hub's CDN sends it: the progress bar is labelled with the file name, not the URL.
        self.send_header("Content-Disposition", f'attachment; filename="{name.rsplit("/", 1)[-1]}";')
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        cut = hub.cut_after.pop(name, None) if not rng else None
        view = memoryview(data)
        pos = start
        try:
            while pos < end:
                n = min(hub.chunk, end - pos)
                if cut is not None and pos + n > cut:
                    self.wfile.write(view[pos:cut])
                    self.close_connection = True  # the body stops short: the client sees a dropped connection
                    return
                self.wfile.write(view[pos : pos + n])
                pos += n
                with hub._lock:
                    hub.bytes_sent += n
                if hub.hold_after is not None and hub.bytes_sent >= hub.hold_after:
                    hub.release.wait(60)  # the client is mid-download until the test says so
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _json(self, obj: object, body: bool, sha: str) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("X-Repo-Commit", sha)
        self.end_headers()
        if body:
            self.wfile.write(raw)

    def _error(self, status: int, code: str, message: str, body: bool, repo: str | None = None) -> None:
        raw = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        if code:
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
        if repo:
            self.send_header("X-Repo-Commit", self.fake.commit(repo))
        self.end_headers()
        if body:
            self.wfile.write(raw)
