"""Serving: bind the Unix socket safely (0600, stale files replaced, live servers refused), run uvicorn."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from edgeinfer.errors import ConfigError, EngineFailedError
from edgeinfer.server.streaming import CUT_MARGIN_S


def default_socket_path() -> Path:
    """$XDG_RUNTIME_DIR/edgeinfer.sock, else ~/.cache/edgeinfer/edgeinfer.sock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "edgeinfer.sock"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "edgeinfer" / "edgeinfer.sock"


def bind_unix_socket(path: Path) -> socket.socket:
    """A listening-ready socket at path, owner-only; a stale socket file is replaced."""
    if len(os.fsencode(path)) > 100:
        raise ConfigError(f"{path}: socket paths are limited to about 100 bytes; choose a shorter --socket")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ConfigError(f"{path} exists and is not a socket; remove it or choose another --socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # stale: its server is gone
        except PermissionError:
            raise ConfigError(
                f"{path} is another user's socket (no permission to connect to it); choose another --socket"
            ) from None
        else:
            raise ConfigError(f"a server is already listening on {path}; stop it or pass another --socket")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600 from the start, no window with wider rights
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    try:
        return socket.create_server((host, port), reuse_port=False)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None


class _Server(uvicorn.Server):
    """uvicorn's server, noting when shutdown began so that requests in flight know their grace."""

    def __init__(self, config: uvicorn.Config, state: Any) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.state.shutdown_at is None:
            self.state.shutdown_at = time.monotonic()
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        # An engine that stopped for good cannot recover in this process: shut down, so that a
        # supervisor (systemd, a shell loop) starts a fresh one; serve() then exits non-zero.
        if not self.should_exit and self.state.fatal_error() is not None:
            self.handle_exit(0, None)
        return await super().on_tick(counter)


def serve(
    app: Any,
    socket_path: Path | None,
    tcp: tuple[str, int] | None,
    grace_s: float = 10.0,
    foreground: Callable[[], None] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM; then stop accepting, let streams finish for grace_s, cancel, remove the socket.

    The routes end what is still running at the grace's end with a clean "shutting down" error;
    uvicorn's own limit, CUT_MARGIN_S and a second later, cancels anything left.
    With `foreground` (the dashboard), the server runs on a thread and foreground() in this one;
    its return stops the server as SIGTERM would, with the same grace, and uvicorn logs nothing
    (its handlers would write to the terminal the dashboard draws on).
    """
    state = app.state.edgeinfer
    state.grace_s = grace_s
    # The streams end by this server's own shutdown (state.shutdown_at, read by the routes), and
    # uvicorn's graceful timeout cancels what is left.
    sockets = []
    remove = None
    if socket_path is not None:
        sockets.append(bind_unix_socket(socket_path))
        remove = _remover(socket_path)
        state.on_close.append(remove)
    try:
        if tcp is not None:
            sockets.append(bind_tcp(*tcp))
        logs: dict[str, Any] = {"log_level": "warning"} if foreground is None else {"log_config": None}
        config = uvicorn.Config(
            app, timeout_graceful_shutdown=math.ceil(grace_s + CUT_MARGIN_S) + 1, lifespan="on", **logs
        )
        server = _Server(config, state)
        if foreground is None:
            server.run(sockets=sockets)
        else:
            _run_beside(server, sockets, foreground, grace_s)
    finally:
        for s in sockets:
            s.close()
        if remove is not None:
            remove()
    fatal = state.fatal_error()
    if fatal is not None:
        raise EngineFailedError(f"the engine stopped ({fatal}); the server shut down, start it again")


def _run_beside(server: _Server, sockets: list[socket.socket], foreground: Callable[[], None], grace_s: float) -> None:
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, name="edgeinfer-serve", daemon=True)
    thread.start()
    try:
        foreground()
    finally:
        server.handle_exit(signal.SIGTERM, None)
        thread.join(grace_s + CUT_MARGIN_S + 10)


def _remover(path: Path) -> Callable[[], None]:
    """Removes the socket file at path only while it is the one bound now (same device and inode):
    a newer server may have bound the path since, and its socket is not ours to delete."""
    bound = path.lstat()
    ours = (bound.st_dev, bound.st_ino)

    def remove() -> None:
        with contextlib.suppress(FileNotFoundError):
            now = path.lstat()
            if (now.st_dev, now.st_ino) == ours:
                path.unlink()

    return remove
