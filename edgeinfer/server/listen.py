"""Serving: bind the Unix socket safely (0600, stale files replaced, live servers refused), run uvicorn."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path
from typing import Any

import uvicorn

from edgeinfer.errors import ConfigError


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


def serve(app: Any, socket_path: Path | None, tcp: tuple[str, int] | None, grace_s: float = 10.0) -> None:
    """Run until SIGINT/SIGTERM; then stop accepting, let streams finish for grace_s, cancel, remove the socket."""
    sockets = []
    if socket_path is not None:
        sockets.append(bind_unix_socket(socket_path))
        app.state.edgeinfer.on_close.append(lambda: _remove(socket_path))
    try:
        if tcp is not None:
            sockets.append(bind_tcp(*tcp))
        config = uvicorn.Config(
            app, log_level="warning", timeout_graceful_shutdown=max(1, round(grace_s)), lifespan="on"
        )
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        for s in sockets:
            s.close()
        if socket_path is not None:
            _remove(socket_path)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
