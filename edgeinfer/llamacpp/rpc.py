"""llama.cpp's RPC backend: lend this machine's device to another edgeinfer (a worker), or load a
model across this machine and workers (the layer split).

A worker is ggml's own RPC server (`ggml_backend_rpc_start_server`) run in-process; a client adds
each worker as a device (`ggml_backend_rpc_add_server`) and passes the device list in the model
parameters, as llama-server's --rpc does. The protocol has no authentication and no encryption.
A worker serves one client at a time. llama.cpp aborts the process when a worker cannot be reached
or stops answering, so workers are checked here first (a TCP connect and the protocol's HELLO), and
later failures go through the abort hook (ggml.py).
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.llamacpp import ggml
from edgeinfer.llamacpp.core import init_backend, max_devices_supported
from edgeinfer.models.gguf import GGUFInfo
from edgeinfer.options import parse_shares

DEFAULT_PORT = 50052
PROTO_MAJOR = 7  # ggml-rpc.h RPC_PROTO_MAJOR_VERSION of the vendored llama.cpp
_HELLO, _CAPS = 14, 24  # RPC_CMD_HELLO; RPC_CONN_CAPS_SIZE


def _rpc_reg() -> int:
    init_backend()
    reg = ggml.lib().ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise ConfigError(
            "this llama.cpp build has no RPC backend; reinstall with `make install` (it builds with -DGGML_RPC=ON)"
        )
    return int(reg)


def _proc(name: str, restype: Any, *argtypes: Any) -> Any:
    addr = ggml.lib().ggml_backend_reg_get_proc_address(_rpc_reg(), name.encode())
    if not addr:
        raise ConfigError(f"llama.cpp's RPC backend lacks {name}; rebuild llama-cpp-python")
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


def probe(host: str, port: int, timeout: float = 5.0) -> None:
    """Check that a worker answers the protocol's HELLO, with the same major version; ConfigError if not.

    llama.cpp itself would abort the whole process on a worker it cannot reach.
    """
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            size = struct.unpack("<Q", _recv(s, 8))[0]
            reply = _recv(s, size) if size < 4096 else b""
    except TimeoutError:
        raise ConfigError(
            f"RPC worker {where} did not answer within {timeout:g} s (a worker serves one client at a time: "
            "is another edgeinfer using it?)"
        ) from None
    except OSError as e:
        raise ConfigError(
            f"RPC worker {where} is not reachable ({e.strerror or e}); start it there with "
            f"`edgeinfer worker --port {port}`"
        ) from None
    if len(reply) < 4 or reply[0] != PROTO_MAJOR:
        version = ".".join(map(str, reply[:3])) if len(reply) >= 3 else "none"
        raise ConfigError(
            f"{where} is not an RPC worker of this llama.cpp (protocol {version}, want {PROTO_MAJOR}.x); "
            "run the same edgeinfer version there"
        )


def _recv(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the worker closed the connection")
        data += chunk
    return data


def serve_worker(host: str, port: int, threads: int) -> None:
    """Serve this machine's devices (its GPUs, else the CPU) to RPC clients; returns only if listening failed.

    Runs ggml's server loop on a daemon thread, so that the caller's thread still takes signals.
    """
    start = _proc(
        "ggml_backend_rpc_start_server", None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )  # fmt: skip
    devs = ggml.local_gpus() or [ggml.cpu_device()]
    array = (ctypes.c_void_p * len(devs))(*devs)
    endpoint = f"{host}:{port}".encode()
    done = threading.Event()

    def run() -> None:
        start(endpoint, None, threads, len(devs), array)  # blocks while serving
        done.set()

    threading.Thread(target=run, name="edgeinfer-rpc-server", daemon=True).start()
    done.wait()


@dataclass
class Share:
    """One device of a split model: what it holds."""

    device: str  # "CPU" (this machine), a local GPU's name, or "RPC0" ...
    where: str  # "local" or the worker's HOST:PORT
    layers: int
    weight_bytes: int
    free_bytes: int


@dataclass
class Placement:
    """A model's layers over this machine and workers, as llama.cpp's model parameters and as figures."""

    n_gpu_layers: int
    shares: list[Share]
    _devices: Any = field(repr=False, default=None)  # NULL-terminated ggml_backend_dev_t array
    _split: Any = field(repr=False, default=None)  # float array, llama_max_devices long

    def apply(self, params: Any) -> None:
        params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        params.n_gpu_layers = self.n_gpu_layers
        params.tensor_split = self._split


def place_for(config: Any, info: GGUFInfo) -> Placement:
    """The placement an EngineConfig's --rpc and --tensor-split ask for."""
    return place(config.rpc_endpoints, info, parse_shares(config.tensor_split) if config.tensor_split else None)


def place(endpoints: list[tuple[str, int]], info: GGUFInfo, shares: list[float] | None) -> Placement:
    """Add the workers as devices and split the model's layers: this machine's CPU first, then its GPUs, then
    the workers' devices, by `shares` or by each one's free memory (llama.cpp's own layer assignment)."""
    max_devices = max_devices_supported()
    for host, port in endpoints:
        probe(host, port)
    ggml.install_abort_hook()
    add = _proc("ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
    devices: list[tuple[int, str]] = [(d, "local") for d in ggml.local_gpus()]
    for host, port in endpoints:
        reg = add(f"{host}:{port}".encode())
        if not reg:
            raise ConfigError(f"RPC worker {host}:{port} offers no device")
        lib = ggml.lib()
        n = lib.ggml_backend_reg_dev_count(reg)
        devices += [(lib.ggml_backend_reg_dev_get(reg, i), f"{host}:{port}") for i in range(n)]
    if len(devices) > max_devices - 1:
        raise ConfigError(f"{len(devices)} devices; this llama.cpp takes {max_devices - 1} besides the CPU")
    free = [ggml.device_memory(ggml.cpu_device())[0]] + [ggml.device_memory(d)[0] for d, _ in devices]
    if shares is None:
        shares = [float(f) for f in free]
    elif len(shares) != 1 + len(devices):
        names = ", ".join(["this machine"] + [f"{ggml.device_name(d)} ({w})" for d, w in devices])
        raise ConfigError(f"--tensor-split has {len(shares)} shares; give {1 + len(devices)}, one each for: {names}")
    total = sum(shares)
    n_all = info.n_layer + 1  # the repeating layers and the output layer
    local = round(n_all * shares[0] / total)
    n_gpu = n_all - local
    per_layer = [info.tensor_bytes.get(f"blk.{i}", 0) for i in range(info.n_layer)] + [_output_bytes(info)]
    counts, weights = [local] + [0] * len(devices), [sum(per_layer[:local])] + [0] * len(devices)
    weights[0] += sum(b for k, b in info.tensor_bytes.items() if k.startswith("token_embd"))  # always on the CPU
    gpu_shares = shares[1:]
    cum = [sum(gpu_shares[: i + 1]) / (sum(gpu_shares) or 1) for i in range(len(gpu_shares))]
    for il in range(local, n_all):  # llama_model::load_tensors: upper_bound over the cumulative splits
        k = next((i for i, c in enumerate(cum) if (il - local) / n_gpu < c), len(cum) - 1)
        counts[1 + k] += 1
        weights[1 + k] += per_layer[il]
    labels = ["CPU"] + [ggml.device_name(d) for d, _ in devices]
    wheres = ["local"] + [w for _, w in devices]
    placed = [Share(*row) for row in zip(labels, wheres, counts, weights, free, strict=True)]
    dev_array = (ctypes.c_void_p * (len(devices) + 1))(*[d for d, _ in devices], None)
    split = (ctypes.c_float * max_devices)(*gpu_shares)
    return Placement(n_gpu, placed, dev_array, split)


def _output_bytes(info: GGUFInfo) -> int:
    """The output layer's weights; a model with tied embeddings copies token_embd there."""
    out = sum(b for k, b in info.tensor_bytes.items() if k.startswith("output"))
    if "output.weight" not in info.tensor_bytes:
        out += info.tensor_bytes.get("token_embd.weight", 0)
    return out


def workers_down(endpoints: list[tuple[str, int]], settle_s: float = 1.0) -> str:
    """After a failure: which workers no longer take connections, as the start of a message ('' if none).

    A killed worker's connection to us can break a moment before its listening socket closes, so
    while every worker still answers this asks again for up to settle_s before saying none is down.
    """
    deadline = time.monotonic() + settle_s
    while True:
        down = []
        for host, port in endpoints:
            try:
                socket.create_connection((host, port), timeout=1.0).close()
            except OSError as e:
                down.append(f"RPC worker {host}:{port} is down ({e.strerror or e})")
        if down or not endpoints or time.monotonic() >= deadline:
            return "; ".join(down) + "; restart it, then edgeinfer. " if down else ""
        time.sleep(0.05)
