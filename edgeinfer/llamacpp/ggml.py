"""ggml's backend registry and abort hook, through libllama's own handle (ctypes).

llama-cpp-python binds llama.cpp's API but not ggml's device registry, which the RPC
backend needs (find the `RPC` backend, add a worker, list devices), nor ggml's abort
callback. Symbols are found through libllama, whose dependencies (libggml,
libggml-base) dlsym searches.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU, DEVICE_ACCEL = 0, 1, 2, 3

_vp, _sz, _s = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
_ABORT_FN = ctypes.CFUNCTYPE(None, ctypes.c_char_p)  # ggml_abort_callback_t
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "ggml_backend_reg_count": (_sz, []),
    "ggml_backend_load_all_from_path": (None, [_s]),
    "ggml_backend_load": (_vp, [_s]),
    "ggml_backend_reg_by_name": (_vp, [_s]),
    "ggml_backend_reg_get_proc_address": (_vp, [_vp, _s]),
    "ggml_backend_reg_dev_count": (_sz, [_vp]),
    "ggml_backend_reg_dev_get": (_vp, [_vp, _sz]),
    "ggml_backend_dev_count": (_sz, []),
    "ggml_backend_dev_get": (_vp, [_sz]),
    "ggml_backend_dev_by_type": (_vp, [ctypes.c_int]),
    "ggml_backend_dev_type": (ctypes.c_int, [_vp]),
    "ggml_backend_dev_name": (_s, [_vp]),
    "ggml_backend_dev_description": (_s, [_vp]),
    "ggml_backend_dev_memory": (None, [_vp, ctypes.POINTER(_sz), ctypes.POINTER(_sz)]),
    "ggml_set_abort_callback": (_vp, [_ABORT_FN]),
}
_lib_cache: Any = None


def bind(handle: Any) -> None:
    """Take libllama's ctypes handle (core.py, the one module that imports llama_cpp, hands it over)."""
    global _lib_cache
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = res, args
    _lib_cache = handle


def lib() -> Any:
    """libllama with the ggml functions edgeinfer calls declared (argument and result types)."""
    assert _lib_cache is not None, "edgeinfer.llamacpp.core binds the library on import"
    return _lib_cache


# --- loadable backends ------------------------------------------------------
# The portable build keeps ggml's CPU kernels as one library per x86-64 level (libggml-cpu-haswell.so
# for AVX2, -skylakex/-icelake/-zen4 for AVX-512, ...) and loads the best this CPU runs. Each level
# rounds differently, so EDGEINFER_CPU_VARIANT=NAME loads that one instead: on an AVX-512 machine
# `haswell` reproduces an AVX2 machine's numerics (docs/testing.md).

CPU_VARIANT_ENV = "EDGEINFER_CPU_VARIANT"


def cpu_variants(lib_dir: Path) -> list[str]:
    """The CPU variants a build ships that this CPU runs, worst to best by ggml's own score."""
    scored = []
    for path in lib_dir.glob("libggml-cpu-*.so"):
        score = ctypes.CDLL(str(path)).ggml_backend_score  # each variant scores itself, as ggml does to pick one
        score.restype = ctypes.c_int
        if s := score():
            scored.append((s, path.name.removeprefix("libggml-cpu-").removesuffix(".so")))
    return [name for _, name in sorted(scored)]


# A CUDA build made with NVIDIA's compiler from PyPI (scripts/cuda_toolchain.sh, `make install CUDA=1`) links
# the CUDA runtime and cuBLAS of that toolkit, which is not on the loader's path: loaded here first, by full
# path, the CUDA backend's own load finds them (the loader matches a loaded library by its soname).
CUDA_TOOLKIT_LIBS = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeinfer/cuda-13/nvidia/cu13/lib"
)
CUDA_RUNTIME = ("libcudart.so.*", "libcublasLt.so.*", "libcublas.so.*")


def preload_cuda_runtime(lib_dir: Path, toolkit_libs: Path = CUDA_TOOLKIT_LIBS) -> list[str]:
    """With a CUDA backend in lib_dir, load the PyPI toolkit's runtime libraries it needs; those loaded."""
    if not (lib_dir / "libggml-cuda.so").is_file() or not toolkit_libs.is_dir():
        return []
    loaded = []
    for pattern in CUDA_RUNTIME:
        for path in sorted(toolkit_libs.glob(pattern))[:1]:
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                loaded.append(path.name)
            except OSError:
                pass  # the system's CUDA, if any, is found the usual way
    return loaded


def load_backends(lib_dir: Path, cpu_variant: str | None) -> None:
    """Load the build's backends from lib_dir: the best of each, or the named CPU variant and the rest."""
    preload_cuda_runtime(lib_dir)
    if not cpu_variant:
        lib().ggml_backend_load_all_from_path(str(lib_dir).encode())
        return
    path = lib_dir / f"libggml-cpu-{cpu_variant}.so"
    if not path.is_file() or not lib().ggml_backend_load(str(path).encode()):
        why = "this build has no such variant" if not path.is_file() else "this CPU lacks the instructions it needs"
        raise ValueError(
            f"{CPU_VARIANT_ENV}={cpu_variant}: {why}; this CPU runs {', '.join(cpu_variants(lib_dir))} "
            "(the last is the best, loaded when the variable is unset)"
        )
    for other in sorted(lib_dir.glob("libggml-*.so")):  # the other backends (RPC, a GPU's): one build each
        if not other.name.startswith(("libggml-cpu-", "libggml-base")):
            lib().ggml_backend_load(str(other).encode())


def backend_count() -> int:
    """How many backends are registered (loaded, or linked in)."""
    return int(lib().ggml_backend_reg_count())


def loaded_cpu_variant() -> str | None:
    """The CPU variant this process runs (read from its mapped libraries); None for a build without variants."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.search(r"libggml-cpu-([\w.]+)\.so", maps)
    return found.group(1) if found else None


def device_name(dev: int) -> str:
    return (lib().ggml_backend_dev_name(dev) or b"?").decode()


def device_description(dev: int) -> str:
    return (lib().ggml_backend_dev_description(dev) or b"?").decode(errors="replace")


def device_memory(dev: int) -> tuple[int, int]:
    """(free, total) bytes a device reports (a worker's device asks the worker)."""
    free, total = _sz(0), _sz(0)
    lib().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def cpu_device() -> int:
    return int(lib().ggml_backend_dev_by_type(DEVICE_CPU))


def local_gpus() -> list[int]:
    """This machine's GPU devices (workers' devices are not registered, so never among them)."""
    devs = (lib().ggml_backend_dev_get(i) for i in range(lib().ggml_backend_dev_count()))
    return [d for d in devs if lib().ggml_backend_dev_type(d) in (DEVICE_GPU, DEVICE_IGPU)]


def has_gpu() -> bool:
    """A local GPU backend is loaded. (llama_supports_gpu_offload is also true for any RPC-capable build.)"""
    return bool(local_gpus())


# --- aborts ---------------------------------------------------------------
# ggml ends the process with abort() on errors it cannot return, among them a worker that stops
# answering. Its abort callback runs first, on the thread that failed: edgeinfer's hook tells the
# engines that use workers (their requests end with the reason, /health turns 503) and then parks
# that thread for good, so the process lives on to answer and shut down; with no engine to tell
# (a model still loading) it prints the reason on one line and exits.

_abort_handlers: list[Callable[[str], None]] = []
_abort_lock = threading.Lock()
_parked = threading.Event()  # set once a thread is parked: the llama.cpp state is no longer usable


@_ABORT_FN
def _on_abort(message: bytes | None) -> None:
    text = (message or b"ggml abort").decode("utf-8", "replace").strip()
    reason = re.sub(r"^\S+:\d+: ", "", text)  # drop ggml's "path/file.cpp:123: "
    _parked.set()
    with _abort_lock:
        handlers = list(_abort_handlers)
    if not handlers:
        sys.stderr.write(f"edgeinfer: error: llama.cpp stopped: {reason}\n")
        sys.stderr.flush()
        os._exit(1)
    for handler in handlers:
        try:
            handler(reason)
        except Exception as e:
            sys.stderr.write(f"edgeinfer: error while reporting a llama.cpp abort: {e!r}\n")
    threading.Event().wait()  # park: returning would abort()


def install_abort_hook() -> None:
    lib().ggml_set_abort_callback(_on_abort)


def on_abort(handler: Callable[[str], None]) -> Callable[[], None]:
    """Call handler(reason) when llama.cpp aborts; returns the function that removes it."""
    with _abort_lock:
        _abort_handlers.append(handler)

    def remove() -> None:
        with _abort_lock:
            if handler in _abort_handlers:
                _abort_handlers.remove(handler)

    return remove


def wedged() -> bool:
    """A llama.cpp call aborted and its thread is parked: do not free or join anything, just exit."""
    return _parked.is_set()
