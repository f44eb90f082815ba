"""`edgeinfer worker`: lend this machine's CPU (or GPUs) to an edgeinfer on another machine (ggml RPC)."""

from __future__ import annotations

import ipaddress
import os
import socket

import click

from edgeinfer.cli.errors import errors_as_messages
from edgeinfer.errors import ConfigError
from edgeinfer.options import usable_cores

SECURITY = (
    "The RPC protocol has no authentication and no encryption: anyone who reaches the port can use the "
    "worker and read what it computes. Use it on a trusted network or through an SSH tunnel or WireGuard."
)


def is_loopback(host: str) -> bool:
    try:
        addrs = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        raise ConfigError(f"--host {host!r}: no such address") from None
    return all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=50052, show_default=True, help="Port to listen on.")
@click.option("--threads", "-t", type=click.IntRange(0), default=0, help="CPU threads (0: all cores).")
@click.option(
    "--allow-remote", is_flag=True, help="Listen on an address other than loopback (read the warning it prints)."
)
@errors_as_messages
def worker(host: str, port: int, threads: int, allow_remote: bool) -> None:
    """Serve this machine's device to `edgeinfer serve/chat/generate/bench --rpc HOST:PORT` elsewhere.

    The model's layers that the other side assigns here are sent over and computed here (llama.cpp's
    RPC backend). One client at a time; Ctrl-C stops the worker. Listens on loopback unless
    --allow-remote: the protocol has no authentication or encryption.
    """
    if not is_loopback(host):
        if not allow_remote:
            raise ConfigError(f"--host {host} is not loopback; add --allow-remote. {SECURITY}")
        click.secho(f"warning: listening on {host}:{port}. {SECURITY}", fg="yellow", err=True)
    try:  # ggml only says "Failed to create server socket": find out first, with the reason
        socket.create_server((host, port)).close()
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None
    from edgeinfer.llamacpp.rpc import serve_worker

    threads = threads or usable_cores()
    click.echo(f"edgeinfer worker on {host}:{port}, threads: {threads}; clients pass --rpc {host}:{port}.")
    click.echo("One client at a time. Ctrl-C stops it.")
    try:
        serve_worker(host, port, threads)
    except KeyboardInterrupt:
        click.echo("worker stopped")
        os._exit(0)  # ggml's server loop cannot be stopped; its thread goes with the process
    raise ConfigError(f"llama.cpp's RPC server could not listen on {host}:{port}")
