"""Build llama-cpp-python's wheel (it compiles llama.cpp) into a cache folder, showing progress.

    python scripts/build_llama_wheel.py --package llama-cpp-python==X.Y.Z --out DIR [--cmake-args ...] [--cflags ...]
    python scripts/build_llama_wheel.py --patches-key    # the digest of its source patches (the wheel key's part)

`make install` runs this when DIR holds no wheel yet. pip's own output goes to DIR/../<key>.log;
the terminal gets the build's step count, elapsed time and an estimate of what is left (one
line rewritten in place on a terminal, one line every 30 s in a log). A failed build prints the
log's last lines and its path. The wheel is written next to DIR and moved in when complete, so
two builds at once, or one interrupted, never leave half a wheel where the next install looks.
Standard library only: it runs before the project's dependencies are installed.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path

NINJA = re.compile(r"^\s*\[(\d+)/(\d+)\]")  # ninja: [12/345] Building C object ...
MAKE = re.compile(r"^\s*\[\s*(\d+)%\]")  # make: [ 45%] Building ...
LOG_EVERY_S = 30.0


def minutes(s: float) -> str:
    return f"{int(s // 60)}:{int(s % 60):02d}"


class Progress:
    """What the build is doing, as one line."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.start = time.monotonic()
        self.step = "fetching and configuring"
        self.done, self.total = 0, 0
        self.last_print = 0.0
        self.compile_start: float | None = None

    def feed(self, line: str) -> None:
        if m := NINJA.match(line):
            self.done, self.total = int(m[1]), int(m[2])
        elif m := MAKE.match(line):
            self.done, self.total = int(m[1]), 100
        elif "Building wheel for" in line:
            self.step = "configuring llama.cpp"
            return
        else:
            return
        if self.compile_start is None:
            self.compile_start = time.monotonic()
        self.step = "compiling llama.cpp"

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        text = f"  {self.step}"
        if self.total:
            text += f": {self.done}/{self.total} ({100 * self.done // self.total}%)"
        text += f", {minutes(elapsed)} elapsed"
        if self.compile_start is not None and self.done >= 10 and self.total:
            spent = time.monotonic() - self.compile_start
            text += f", about {minutes(spent / self.done * (self.total - self.done))} left"
        return text

    def show(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            if force or now - self.last_print >= 0.5:
                print(f"\r{self.line():<100}", end="", flush=True)
                self.last_print = now
        elif force or now - self.last_print >= LOG_EVERY_S:
            print(self.line(), flush=True)
            self.last_print = now


def drop_from_wheel(wheel: Path, patterns: list[str]) -> list[str]:
    """Rewrite the wheel without the files matching any of patterns (and their RECORD lines)."""
    if not patterns:
        return []
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        dropped = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
        if not dropped:
            return []
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename in dropped:
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(x for x in lines if x.split(",", 1)[0] not in dropped).encode()
                dst.writestr(info, data)
    os.replace(tmp, wheel)
    return dropped


# llama-cpp-python does not load ggml's loadable backends (GGML_BACKEND_DL: the portable build's CPU
# variants, RPC, a GPU's), so in such a build its own `Llama(model_path=...)` fails with "no backends
# are loaded". llama.cpp's tools load them at start; this makes `llama_backend_init`, which Llama calls
# first, do the same, unless the program loaded some itself (edgeinfer does, to honour its CPU-variant
# choice). Appended to llama_cpp/llama_cpp.py in the wheel, where `_lib` and `_base_path` are defined.
BACKENDS_MARK = "# --- edgeinfer: load the build's ggml backends"
BACKENDS_PATCH = f"""

{BACKENDS_MARK} (scripts/build_llama_wheel.py) ---
_lib.ggml_backend_reg_count.restype = ctypes.c_size_t
_lib.ggml_backend_reg_count.argtypes = []
_lib.ggml_backend_load_all_from_path.restype = None
_lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
_llama_backend_init_alone = llama_backend_init


def llama_backend_init():
    \"\"\"Initialize the llama + ggml backend; first load this build's ggml backends if none are loaded.\"\"\"
    if _lib.ggml_backend_reg_count() == 0:
        _lib.ggml_backend_load_all_from_path(str(_base_path).encode())
    _llama_backend_init_alone()
"""
PATCHED_FILE = "llama_cpp/llama_cpp.py"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def load_backends_on_init(wheel: Path) -> bool:
    """Patch a wheel with loadable backends so llama_backend_init loads them; False if not needed or done."""
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        if not any(fnmatch.fnmatch(n, "llama_cpp/lib/libggml-cpu*.so") for n in names):
            return False  # backends linked in: nothing to load
        source = src.read(PATCHED_FILE).decode()
        if BACKENDS_MARK in source:
            return False
        patched = (source.rstrip("\n") + "\n" + BACKENDS_PATCH).encode()
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                data = src.read(info)
                if info.filename == PATCHED_FILE:
                    data = patched
                elif info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    fixed = f"{PATCHED_FILE},{_record_hash(patched)}\n"
                    data = "".join(fixed if x.split(",", 1)[0] == PATCHED_FILE else x for x in lines).encode()
                dst.writestr(info, data)
    os.replace(tmp, wheel)
    return True


def patch(out: Path) -> None:
    """Apply the patches above to the kept wheel (also one built before they existed)."""
    for wheel in out.glob("llama_cpp_python-*.whl"):
        if load_backends_on_init(wheel):
            print(f"  {wheel.name}: llama_backend_init loads the build's ggml backends (llama_cpp.Llama works)")


# Patches to llama.cpp's source, applied before it is compiled, each in every build or only when its backend
# is in the flags: the CPU buffer clear (below), and code that needs newer system headers than a distribution
# ships made to compile with the older ones, behind a version check (with headers new enough, the code
# compiles as llama.cpp wrote it). Their digest is part of the wheel cache's key (patches_key).
@dataclass(frozen=True)
class SourcePatch:
    flag: str | None  # the CMake flag that compiles the file, e.g. GGML_VULKAN (None: every build)
    path: str  # inside the sdist
    why: str
    old: str
    new: str

    def applies(self, cmake_args: str) -> bool:
        return self.flag is None or flag_on(cmake_args, self.flag)


VULKAN_LAYER_SETTINGS_OLD = """    VkBool32 enable_best_practice = layer_settings;
    std::vector<vk::LayerSettingEXT> settings = {
        {
            "VK_LAYER_KHRONOS_validation",
            "validate_best_practices",
            vk::LayerSettingTypeEXT::eBool32,
            1,
            &enable_best_practice
        },
    };
    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);
    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);
"""  # noqa: E501 (llama.cpp's line, as it is)
VULKAN_NO_SETTINGS = (
    "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n"
)
# The CPU's buffers are cleared with memset. llama.cpp clears its KV cache once it is allocated, so a
# process touched every page of it before its first token: gigabytes at the default context (Gemma 3 270M,
# 8 streams of 32k cells: 5 GB resident, 2.6 s of page faults on an Intel Xeon VM, 14.75 s on an AMD one).
# Linux's madvise(MADV_DONTNEED) hands a private anonymous mapping's whole pages back, and they read as
# zeros when next touched: the cache is cleared at once and takes RAM as it fills. Only buffers ggml
# allocated itself (ggml_aligned_malloc), never one made from a caller's pointer (a mapped model file would
# read back from its file, not as zeros).
CPU_CLEAR_OLD = """static void ggml_backend_cpu_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value) {
    GGML_ASSERT(buffer);
    memset(buffer->context, value, buffer->size);
}
"""
CPU_CLEAR_NEW = (
    CPU_CLEAR_OLD
    + """
// edgeinfer (scripts/build_llama_wheel.py): a buffer ggml allocated is cleared to zero by handing its whole
// pages back to the kernel, which reads them as zeros when next touched (Linux); its edges by memset.
#if defined(__linux__) && !defined(GGML_USE_CPU_HBM)
#include <sys/mman.h>
#include <unistd.h>
#endif
static void ggml_backend_cpu_buffer_clear_owned(ggml_backend_buffer_t buffer, uint8_t value) {
    GGML_ASSERT(buffer);
#if defined(__linux__) && !defined(GGML_USE_CPU_HBM)
    const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
    const uintptr_t begin = (uintptr_t) buffer->context;
    const uintptr_t end = begin + buffer->size;
    const uintptr_t first = (begin + page - 1) & ~(page - 1);
    const uintptr_t last = end & ~(page - 1);
    if (value == 0 && last > first && last - first >= 16 * page &&
            madvise((void *) first, last - first, MADV_DONTNEED) == 0) {
        memset((void *) begin, 0, first - begin);
        memset((void *) last, 0, end - last);
        return;
    }
#endif
    memset(buffer->context, value, buffer->size);
}
"""
)
# The owned buffers' table (the first of the two; the second is the from-pointer one) takes the new clear.
CPU_TABLE_OLD = """static const struct ggml_backend_buffer_i ggml_backend_cpu_buffer_i = {
    /* .free_buffer     = */ ggml_backend_cpu_buffer_free_buffer,
    /* .get_base        = */ ggml_backend_cpu_buffer_get_base,
    /* .init_tensor     = */ NULL, // no initialization required
    /* .memset_tensor   = */ ggml_backend_cpu_buffer_memset_tensor,
    /* .set_tensor      = */ ggml_backend_cpu_buffer_set_tensor,
    /* .get_tensor      = */ ggml_backend_cpu_buffer_get_tensor,
    /* .set_tensor_2d   = */ NULL,
    /* .get_tensor_2d   = */ NULL,
    /* .cpy_tensor      = */ ggml_backend_cpu_buffer_cpy_tensor,
    /* .clear           = */ ggml_backend_cpu_buffer_clear,
"""
CPU_BACKEND = "vendor/llama.cpp/ggml/src/ggml-backend.cpp"
CPU_LAZY_CLEAR = "a KV cache is cleared by handing its pages back (madvise), not by touching every one (memset)"

SOURCE_PATCHES = (
    SourcePatch(None, CPU_BACKEND, CPU_LAZY_CLEAR, CPU_CLEAR_OLD, CPU_CLEAR_NEW),
    SourcePatch(
        None,
        CPU_BACKEND,
        CPU_LAZY_CLEAR + " (the owned buffers' table)",
        CPU_TABLE_OLD,
        CPU_TABLE_OLD.replace("ggml_backend_cpu_buffer_clear,", "ggml_backend_cpu_buffer_clear_owned,"),
    ),
    SourcePatch(
        flag="GGML_VULKAN",
        path="vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp",
        why=(
            "vk::LayerSettingEXT needs Vulkan headers >= 1.3.261 (Debian 12 has 1.3.239); with older "
            "headers the instance is made without the validation layer's best-practices setting"
        ),
        old=VULKAN_LAYER_SETTINGS_OLD,
        new=(
            "#if VK_HEADER_VERSION >= 261  // edgeinfer: scripts/build_llama_wheel.py\n"
            + VULKAN_LAYER_SETTINGS_OLD
            + "#else\n"
            + VULKAN_NO_SETTINGS
            + "#endif\n"
        ),
    ),
)


def flag_on(cmake_args: str, flag: str) -> bool:
    """Whether cmake_args sets -Dflag to a true value (CMake's ON, 1, TRUE, YES)."""
    m = re.findall(rf"-D{flag}(?::BOOL)?=(\S+)", cmake_args, re.IGNORECASE)
    return bool(m) and m[-1].upper() in ("ON", "1", "TRUE", "YES", "Y")


def patch_source(tree: Path, cmake_args: str, patches: tuple[SourcePatch, ...] = SOURCE_PATCHES) -> list[str]:
    """Apply the patches (SOURCE_PATCHES) whose flag is on to an unpacked sdist; the reasons of those applied."""
    applied = []
    for sp in patches:
        if not sp.applies(cmake_args):
            continue
        path = tree / sp.path
        text = path.read_text()
        if sp.new in text:
            continue
        if text.count(sp.old) != 1:
            raise SystemExit(
                f"{sp.path} no longer holds the code edgeinfer's patch expects ({sp.why}); "
                "update SOURCE_PATCHES in scripts/build_llama_wheel.py for this llama-cpp-python"
            )
        path.write_text(text.replace(sp.old, sp.new))
        applied.append(f"{sp.path}: {sp.why}")
    return applied


def fetch_source(package: str, into: Path, cmake_args: str, log) -> str:
    """The package's sdist unpacked under into and patched; the path pip builds. Without a patch to apply,
    the requirement itself (pip fetches it)."""
    if not any(sp.applies(cmake_args) for sp in SOURCE_PATCHES):
        return package
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(into), package]
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    (sdist,) = into.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    (tree,) = (p for p in into.iterdir() if p.is_dir())
    for reason in patch_source(tree, cmake_args):
        print(f"  patched {reason}")
    return str(tree)


def build(package: str, out: Path, cmake_args: str, cflags: str, drop: list[str]) -> int:
    if any(out.glob("llama_cpp_python-*.whl")):
        print(f"llama.cpp: using the wheel built before, in {out}")
        patch(out)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}.log"
    print(
        "Building llama.cpp through llama-cpp-python, once per machine and build flags "
        "(measured 5-11 minutes on 2 cores; more cores, less time)."
    )
    print(f"  flags: CMAKE_ARGS={cmake_args!r} CFLAGS={cflags!r}; full log: {log_path}")
    env = dict(os.environ, CMAKE_ARGS=cmake_args, CFLAGS=cflags, CXXFLAGS=cflags)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    progress = Progress(sys.stdout.isatty())
    tail: deque[str] = deque(maxlen=40)
    with tempfile.TemporaryDirectory(prefix=f"{out.name}.", dir=out.parent) as tmp, log_path.open("w") as log:
        source = fetch_source(package, Path(tmp) / "src", cmake_args, log)
        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir", "-w", tmp, source]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip())
                progress.feed(line)
                progress.show()
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            print("\ninterrupted; nothing was kept, the next install starts the build again")
            return 130
        progress.show(force=True)
        if progress.tty:
            print()
        wheels = list(Path(tmp).glob("llama_cpp_python-*.whl"))
        if code != 0 or not wheels:
            print(f"llama.cpp did not build (pip exit status {code}). The log's last lines:", file=sys.stderr)
            print("\n".join(tail), file=sys.stderr)
            print(f"Whole log: {log_path}. A C and C++ compiler are needed (README).", file=sys.stderr)
            if flag_on(cmake_args, "GGML_VULKAN"):
                print(
                    "The Vulkan backend was in the build because its headers and glslc are installed; "
                    "`make install VULKAN=0` builds without it (docs/gpu.md).",
                    file=sys.stderr,
                )
            return 1
        out.mkdir(parents=True, exist_ok=True)
        for wheel in wheels:
            for name in drop_from_wheel(wheel, drop):
                print(f"  left out of the wheel: {name}")
            load_backends_on_init(wheel)
            os.replace(wheel, out / wheel.name)  # same file system: complete or absent, never half
    print(f"llama.cpp built in {minutes(time.monotonic() - progress.start)}; wheel kept in {out}")
    return 0


def patches_key() -> str:
    """A digest of SOURCE_PATCHES: part of the wheel cache's key (Makefile), so a changed patch builds again."""
    text = repr([(sp.flag, sp.path, sp.old, sp.new) for sp in SOURCE_PATCHES])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--patches-key"]:
        print(patches_key())
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", required=True, help="the pip requirement, e.g. llama-cpp-python==0.3.36")
    ap.add_argument("--out", type=Path, required=True, help="the folder the wheel is kept in")
    ap.add_argument("--cmake-args", default="", help="extra CMake flags (CMAKE_ARGS), e.g. -DGGML_CUDA=on")
    ap.add_argument("--cflags", default="", help="CFLAGS and CXXFLAGS for the build")
    ap.add_argument(
        "--drop", action="append", default=[], help="leave files matching this glob out of the wheel (repeatable)"
    )
    args = ap.parse_args(argv)
    return build(args.package, args.out, args.cmake_args, args.cflags, args.drop)


if __name__ == "__main__":
    sys.exit(main())
