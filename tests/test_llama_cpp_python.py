"""llama-cpp-python stays whole: its own high-level API runs in the environment `make` builds.

The portable build keeps ggml's backends as loadable libraries, which llama-cpp-python does not
load by itself; scripts/build_llama_wheel.py patches the wheel so that `llama_backend_init` loads
them. These tests run in a fresh process, as a user's script (or LangChain's and LlamaIndex's
wrappers) would: nothing of edgeinfer is imported there first.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import gate

pytestmark = pytest.mark.model

SCRIPT = """
import json, sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, verbose=False, seed=1)
done = llm("The capital of France is", max_tokens=6, temperature=0.0)
chat = llm.create_chat_completion(
    messages=[{"role": "user", "content": "Say hello."}], max_tokens=6, temperature=0.0
)
print(json.dumps({"text": done["choices"][0]["text"], "tokens": done["usage"]["completion_tokens"],
                  "chat": chat["choices"][0]["message"]["content"]}))
"""


def run_script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def test_llama_high_level_api_generates_text(model_path):
    r = run_script(SCRIPT, str(model_path))
    assert r.returncode == 0, f"llama_cpp.Llama failed in this environment:\n{r.stderr[-2000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tokens"] > 0 and out["text"].strip(), out
    assert out["chat"].strip(), out


def test_edgeinfer_after_llama_in_one_process_loads_the_backends_once(model_path):
    # A script that made a Llama first and then uses edgeinfer: the backends are not registered twice.
    code = (
        "import sys\n"
        "from llama_cpp import Llama\n"
        "Llama(model_path=sys.argv[1], n_ctx=256, verbose=False)\n"
        "from edgeinfer.llamacpp import core, ggml\n"
        "core.init_backend()\n"
        "print(ggml.backend_count())\n"
    )
    r = run_script(code, str(model_path))
    assert r.returncode == 0, r.stderr[-2000:]
    before = run_script("from edgeinfer.llamacpp import core, ggml; core.init_backend(); print(ggml.backend_count())")
    gate.written(r.stdout.split()[-1], before.stdout.split()[-1])  # a count of backends


def test_the_wheel_patch_is_applied_once_and_keeps_the_record_true(tmp_path):
    import base64
    import hashlib
    import zipfile

    build = load_build_script()
    wheel = tmp_path / "llama_cpp_python-0-py3-none-any.whl"
    source = b"import ctypes\n_lib = None\ndef llama_backend_init():\n    pass\n"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llama_cpp/llama_cpp.py", source)
        z.writestr("llama_cpp/lib/libggml-cpu-haswell.so", b"")
        z.writestr(
            "x.dist-info/RECORD", "llama_cpp/llama_cpp.py,sha256=old,1\nllama_cpp/lib/libggml-cpu-haswell.so,,\n"
        )
    assert build.load_backends_on_init(wheel)
    assert not build.load_backends_on_init(wheel)  # already patched
    with zipfile.ZipFile(wheel) as z:
        patched = z.read("llama_cpp/llama_cpp.py")
        record = z.read("x.dist-info/RECORD").decode()
    assert patched.startswith(source) and patched.count(build.BACKENDS_MARK.encode()) == 1
    compile(patched, "llama_cpp.py", "exec")
    digest = base64.urlsafe_b64encode(hashlib.sha256(patched).digest()).rstrip(b"=").decode()
    assert f"llama_cpp/llama_cpp.py,sha256={digest},{len(patched)}" in record.splitlines()
    plain = tmp_path / "native-0-py3-none-any.whl"  # a build with its backends linked in needs nothing
    with zipfile.ZipFile(plain, "w") as z:
        z.writestr("llama_cpp/llama_cpp.py", source)
    assert not build.load_backends_on_init(plain)


def load_build_script():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "build_llama_wheel", Path(__file__).resolve().parent.parent / "scripts" / "build_llama_wheel.py"
    )
    assert spec and spec.loader
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build  # its dataclasses look their module up
    spec.loader.exec_module(build)
    return build


def vulkan_source(tmp_path, text_of):
    """The build script, its Vulkan patch, and ggml-vulkan.cpp in an sdist tree under tmp_path holding
    text_of(patch)."""
    build = load_build_script()
    (sp,) = (p for p in build.SOURCE_PATCHES if p.flag == "GGML_VULKAN")
    src = tmp_path / sp.path
    src.parent.mkdir(parents=True)
    src.write_text(text_of(sp))
    return build, sp, src


def vulkan_patch(build, tree, cmake_args: str) -> list[str]:
    return build.patch_source(tree, cmake_args, tuple(p for p in build.SOURCE_PATCHES if p.flag == "GGML_VULKAN"))


@pytest.mark.pure
def test_the_vulkan_source_patch_applies_only_with_vulkan_and_only_once(tmp_path):
    build, sp, src = vulkan_source(tmp_path, lambda sp: "void init() {\n" + sp.old + "    create();\n}\n")
    original = src.read_text()
    assert vulkan_patch(build, tmp_path, "-DGGML_RPC=ON") == []  # not a Vulkan build: untouched
    assert vulkan_patch(build, tmp_path, "-DGGML_VULKAN=OFF") == []
    assert src.read_text() == original
    (reason,) = vulkan_patch(build, tmp_path, "-DGGML_NATIVE=OFF -DGGML_VULKAN=ON")
    assert "1.3.261" in reason
    patched = src.read_text()
    # The original block compiles with new headers; the old-header branch makes the instance without settings.
    head, rest = patched.split("#if VK_HEADER_VERSION >= 261", 1)
    assert head == "void init() {\n" and rest.count(sp.old) == 1
    assert f"#else\n{build.VULKAN_NO_SETTINGS}#endif\n    create();" in rest
    assert vulkan_patch(build, tmp_path, "-DGGML_VULKAN=on") == []  # applied already
    assert src.read_text() == patched


@pytest.mark.pure
def test_a_vulkan_source_that_changed_stops_the_build_with_what_to_update(tmp_path):
    build, _, _ = vulkan_source(tmp_path, lambda sp: "// llama.cpp rewrote the instance set-up\n")
    with pytest.raises(SystemExit, match="update SOURCE_PATCHES"):
        vulkan_patch(build, tmp_path, "-DGGML_VULKAN=1")


CPU_BACKEND_SOURCE = """static void ggml_backend_cpu_buffer_free_buffer(ggml_backend_buffer_t buffer) {{}}
{clear}
{owned}    /* .reset           = */ NULL,
}};

static const struct ggml_backend_buffer_i ggml_backend_cpu_buffer_from_ptr_i = {{
    /* .clear           = */ ggml_backend_cpu_buffer_clear,
}};
"""


@pytest.mark.pure
def test_the_cpu_clear_patch_applies_to_every_build_once_and_to_owned_buffers_only(tmp_path):
    build = load_build_script()
    src = tmp_path / build.CPU_BACKEND
    src.parent.mkdir(parents=True)
    src.write_text(CPU_BACKEND_SOURCE.format(clear=build.CPU_CLEAR_OLD, owned=build.CPU_TABLE_OLD))
    reasons = build.patch_source(tmp_path, "-DGGML_NATIVE=OFF -DGGML_RPC=ON")  # a CPU build: no flag needed
    assert len(reasons) == 2 and all("madvise" in r for r in reasons)
    patched = src.read_text()
    owned, from_ptr = patched.split("ggml_backend_cpu_buffer_from_ptr_i")
    # The owned table clears lazily; a buffer over a caller's pointer (a mapped model file) keeps memset.
    assert "/* .clear           = */ ggml_backend_cpu_buffer_clear_owned," in owned
    assert "ggml_backend_cpu_buffer_clear," in from_ptr and "_owned" not in from_ptr
    assert patched.count("MADV_DONTNEED") == 1 and "#if defined(__linux__)" in patched
    assert build.patch_source(tmp_path, "") == []  # applied already
    assert src.read_text() == patched
    assert build.patches_key() == load_build_script().patches_key()  # the wheel key's part is stable


@pytest.mark.pure
def test_a_cleared_cpu_buffer_reads_zero_to_its_edges_and_hands_its_pages_back():
    """The built library's clear: a buffer ggml allocated, filled, then cleared, reads as zeros everywhere (its
    unaligned edges are memset, its whole pages handed back), and on Linux those pages are no longer resident."""
    from edgeinfer.llamacpp import ggml
    from edgeinfer.llamacpp.core import init_backend

    init_backend()
    lib = ggml.lib()
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    for name, res, args in [
        ("ggml_backend_cpu_buffer_type", vp, []),
        ("ggml_backend_buft_alloc_buffer", vp, [vp, sz]),
        ("ggml_backend_buffer_get_base", vp, [vp]),
        ("ggml_backend_buffer_clear", None, [vp, ctypes.c_uint8]),
        ("ggml_backend_buffer_free", None, [vp]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    size = 64 * 4096 + 1000  # whole pages and ragged edges
    buf = lib.ggml_backend_buft_alloc_buffer(lib.ggml_backend_cpu_buffer_type(), size)
    assert buf
    try:
        base = lib.ggml_backend_buffer_get_base(buf)
        ctypes.memset(base, 0xAB, size)
        lib.ggml_backend_buffer_clear(buf, 0)
        if sys.platform == "linux":
            page = os.sysconf("SC_PAGESIZE")
            first = (base + page - 1) // page * page
            count = (base + size) // page - first // page
            resident = (ctypes.c_ubyte * count)()
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mincore.argtypes = [vp, sz, ctypes.c_void_p]
            assert libc.mincore(first, count * page, resident) == 0, os.strerror(ctypes.get_errno())
            kept = sum(b & 1 for b in resident)
            assert kept == 0, f"{kept} of {count} whole pages are resident after the clear: it touched them (memset)"
        assert ctypes.string_at(base, size) == bytes(size)
        ctypes.memset(base, 0xCD, size)  # written again, a page is private memory as before
        assert ctypes.string_at(base, size) == b"\xcd" * size
    finally:
        lib.ggml_backend_buffer_free(buf)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("args", "on"),
    [
        ("-DGGML_VULKAN=ON", True),
        ("-DGGML_VULKAN:BOOL=yes", True),
        ("-DGGML_VULKAN=ON -DGGML_VULKAN=OFF", False),  # the last one wins, as in CMake
        ("-DGGML_VULKAN_DEBUG=ON", False),
        ("", False),
    ],
)
def test_flag_on_reads_cmake_booleans(args, on):
    assert load_build_script().flag_on(args, "GGML_VULKAN") is on


def make_install_flags(tmp_path, *args: str) -> tuple[list[str], str]:
    """What `make install` would build (`make -n`) against a stand-in CUDA toolkit: its CMake flags and wheel folder."""
    nvcc = tmp_path / "edgeinfer/cuda-13/nvidia/cu13/bin/nvcc"
    if not nvcc.exists():
        nvcc.parent.mkdir(parents=True)
        nvcc.write_text("#!/bin/sh\n")
        nvcc.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_ARCHITECTURES", "MAKEFLAGS")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["make", "-n", "-C", str(root), "install", "VENV=" + str(tmp_path / "venv"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    flags = re.search(r'--cmake-args "([^"]*)"', done.stdout)
    out = re.search(r'--out "([^"]*)"', done.stdout)
    assert flags and out, done.stdout
    return flags[1].split(), out[1]


@pytest.mark.pure
def test_make_install_cuda_takes_the_architectures_from_its_command_line_or_the_environment(tmp_path):
    default, default_wheel = make_install_flags(tmp_path, "CUDA=1")
    assert "-DGGML_CUDA=ON" in default and "-DGGML_VULKAN=ON" not in default
    assert "-DCMAKE_CUDA_ARCHITECTURES=75-virtual;86-real;89-real;120a-real" in default
    # `make install CUDA=1 CUDA_ARCHITECTURES=90-real`: make hands command-line variables to recipes
    # but not to $(shell), so the Makefile must pass the list on itself.
    named, named_wheel = make_install_flags(tmp_path, "CUDA=1", "CUDA_ARCHITECTURES=90-real")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in named
    assert named_wheel != default_wheel  # another list is another wheel in the cache
    assert "-DGGML_CUDA=ON" not in make_install_flags(tmp_path, "VULKAN=0")[0]
