"""dist/edgeinfer, the one-file build (scripts/build_binary.py; `make test` builds it first).

Every run is as a user's on a machine without Python: an empty environment (`env -i`, a bare
PATH, a temporary HOME), from another directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from . import gate
from .conftest import healthy

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "dist" / "edgeinfer"
SOURCES = [ROOT / "pyproject.toml", ROOT / "scripts" / "build_binary.py"]
SOURCES += [
    p for d in ("edgeinfer", "models", "tui") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".toml", ".tcss")
]
PROMPT = "Name three rivers of Europe."
# What a C/C++ program may take from the system: glibc, and the kernel's vDSO.
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libutil.so.1"}
SYSTEM_LIBS |= {"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "linux-vdso.so.1", "libgcc_s.so.1", "libstdc++.so.6"}
# A GPU backend also takes its driver's library from the system: where there is none, ggml's loader skips that
# backend (it is loaded at run time, not linked) and the CPU runs the model.
DRIVER_LIBS = {"libggml-vulkan.so": {"libvulkan.so.1"}, "libggml-cuda.so": {"libcuda.so.1"}}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    assert BINARY.exists(), f"{BINARY} is missing: run `make binary` (make test builds it)"
    newest = max(SOURCES, key=lambda p: p.stat().st_mtime)
    assert BINARY.stat().st_mtime >= newest.stat().st_mtime, f"{BINARY} is older than {newest}: run `make binary`"
    return tmp_path_factory.mktemp("binary-home")


def run(home: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """The binary in an empty environment, from a folder of its own."""
    return subprocess.run(
        [str(BINARY), *args], env=bare_env(home, **env), cwd=home, capture_output=True, text=True, timeout=timeout
    )


def bare_env(home: Path, **env: str) -> dict[str, str]:
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", **env}


def unpacked(home: Path) -> Path:
    """The binary's own unpacked build (test_serve adds old ones beside it)."""
    apps = home / ".cache" / "edgeinfer" / "app"
    [folder] = [p for p in apps.iterdir() if not p.name.startswith(("0000", "1111"))]
    return folder / "edgeinfer"


def test_generate_gives_the_virtualenv_install_greedy_text(home):
    args = ["generate", "--temperature", "0", "--max-tokens", "24", "--flash-attn", "off", PROMPT]
    frozen = run(home, *args)
    assert frozen.returncode == 0, frozen.stderr
    assert "first start of this build, unpacking" in frozen.stderr
    installed = subprocess.run(
        [sys.executable, "-m", "edgeinfer.cli", *args], capture_output=True, text=True, timeout=300, cwd=home
    )
    assert installed.returncode == 0, installed.stderr
    again = run(home, *args)  # a second start runs the unpacked copy
    assert again.returncode == 0 and "unpacking" not in again.stderr
    # The same llama.cpp, the same kernels: each is the greedy answer (speculation may draft in any of them).
    for out in (frozen, installed, again):
        assert out.stdout.strip()
        gate.follows_greedy(out.stdout.removesuffix("\n"), [{"role": "user", "content": PROMPT}], 24)


def test_model_path_takes_another_gguf(home, model_path, tmp_path):
    other = tmp_path / "mine.gguf"
    other.write_bytes(Path(model_path).read_bytes())
    r = run(home, "generate", "--model", str(other), "--temperature", "0", "--max-tokens", "4", PROMPT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    missing = run(home, "generate", "--model", str(tmp_path / "absent.gguf"), PROMPT)
    assert missing.returncode != 0 and "absent.gguf" in missing.stderr and "Traceback" not in missing.stderr


def test_models_names_the_built_in_model(home):
    r = run(home, "models")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "smollm2-135m-instruct-q4_1" in x)
    assert "built in" in line
    gate.contains(r.stdout, f"present: {unpacked(home)}")


def healthy_client(proc: subprocess.Popen, sock: Path) -> httpx.Client:
    """A client of the binary's server on sock, once GET /health answers 200 (within 120 s)."""
    return healthy(sock, proc, limit_s=120, log=lambda: proc.stderr.read() if proc.stderr else "")


def test_serve_answers_on_its_socket(home):
    """...and, started with old builds unpacked beside its own, removes the stale one nobody runs."""
    apps = home / ".cache" / "edgeinfer" / "app"
    stale, running = apps / "0000000000000000", apps / "1111111111111111"
    for old in (stale, running):
        (old / "edgeinfer").mkdir(parents=True, exist_ok=True)
        (old / ".in-use").touch()
        os.utime(old / ".in-use", (time.time() - 3 * 86400,) * 2)
    held = os.open(running / ".in-use", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)  # as a process of that build would
    sock = home / "s.sock"
    proc = subprocess.Popen(
        [str(BINARY), "serve", "--socket", str(sock), "--parallel", "2"],
        env=bare_env(home),
        cwd=home,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = healthy_client(proc, sock)
        body = {"model": "default", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
        assert not stale.exists() and running.exists()  # pruned by the time the server answers
        own = unpacked(home).parent / ".in-use"
        assert time.time() - own.stat().st_mtime < 600, "the running build's start was not marked"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) in (0, -signal.SIGTERM)
        os.close(held)
    assert not sock.exists()


def test_bench_writes_its_json(home):
    r = run(home, "bench", "--concurrency", "1,4", "--max-tokens", "16", "--json", "bench.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((home / "bench.json").read_text())
    assert [row["concurrency"] for row in report["levels"]] == [1, 4]
    for row in report["levels"]:
        warm = row["targets"]["edgeinfer"]["warm"]
        assert warm["completion_tokens"] == 16 * row["concurrency"] and warm["aggregate_tps"] > 0


def test_unpacked_files_need_only_the_system_c_runtime(home):
    if not (home / ".cache" / "edgeinfer" / "app").exists():
        assert run(home, "--version").returncode == 0
    root = unpacked(home)
    elves = [root / "edgeinfer", *(p for p in root.rglob("*.so*") if p.is_file())]
    dirs = sorted({str(p.parent) for p in elves})
    outside: dict[str, str] = {}
    for elf in elves:
        out = subprocess.run(
            ["ldd", str(elf)], env={"LD_LIBRARY_PATH": os.pathsep.join(dirs)}, capture_output=True, text=True
        ).stdout
        for line in out.splitlines():
            if "statically linked" in line:
                continue
            name, _, where = line.strip().partition(" => ")
            name = name.split()[0] if name else ""
            assert "not found" not in where, f"{elf.name} needs {name}, which is neither bundled nor on the system"
            if not where.startswith(str(root)) and name and Path(name).name not in DRIVER_LIBS.get(elf.name, ()):
                outside[Path(name).name] = elf.name
    assert set(outside) <= SYSTEM_LIBS, {k: v for k, v in outside.items() if k not in SYSTEM_LIBS}


def test_an_unwritable_cache_is_a_clear_error(home, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder should go
    r = run(home, "--version", XDG_CACHE_HOME=str(blocked))
    assert r.returncode != 0
    assert "XDG_CACHE_HOME" in r.stderr and "Traceback" not in r.stderr


def test_a_machine_without_gzip_is_told_what_to_install(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sh", "tail", "tar", "mkdir", "mktemp", "id", "rm", "mv"):  # all the launcher uses but gzip
        where = shutil.which(tool)
        assert where, tool
        (tools / tool).symlink_to(where)
    fresh = tmp_path / "home"
    fresh.mkdir()
    r = subprocess.run(
        [str(BINARY), "--version"], env={"HOME": str(fresh), "PATH": str(tools)}, capture_output=True, text=True
    )
    assert r.returncode != 0 and "needs gzip" in r.stderr
    assert list((fresh / ".cache" / "edgeinfer" / "app").iterdir()) == []  # no half-unpacked folder left


def test_a_worker_from_the_binary_serves_a_model_split(home):
    """`worker` and --rpc from the binary (ggml's RPC backend is one of its libraries)."""
    from edgeinfer.llamacpp.rpc import probe

    from .test_rpc import free_port

    port = free_port()
    worker = subprocess.Popen(
        [str(BINARY), "worker", "--port", str(port), "--threads", "1"],
        env=bare_env(home),
        cwd=home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            try:
                probe("127.0.0.1", port, timeout=2)
                break
            except Exception:
                assert time.monotonic() < deadline, "the worker did not answer in 60 s"
                time.sleep(0.2)
        args = ["generate", "--temperature", "0", "--max-tokens", "24", "--flash-attn", "off", PROMPT]
        split = run(home, *args, "--rpc", f"127.0.0.1:{port}", "--tensor-split", "1,1")
        alone = run(home, *args)
    finally:
        worker.kill()
        worker.wait()
    assert split.returncode == 0, split.stderr
    for out in (split, alone):
        assert out.stdout.strip()
        gate.follows_greedy(out.stdout.removesuffix("\n"), [{"role": "user", "content": PROMPT}], 24)


class Terminal:
    """A program on a pseudo-terminal of 120x40, as a person at a terminal runs it."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        import fcntl
        import pty
        import struct
        import termios

        self.fd, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
        )
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 120) -> None:
        import select

        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not shown in {timeout:.0f} s; the screen so far ends: {self.seen[-600:]!r}"
            if select.select([self.fd], [], [], min(left, 0.5))[0]:
                try:
                    self.seen += os.read(self.fd, 65536).decode("utf-8", "replace")
                except OSError:  # the program closed the terminal
                    assert text in self.seen, f"{text!r} never shown: {self.seen[-600:]!r}"

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def close(self, timeout: float = 30) -> int:
        """Wait for the program to exit, reading what it draws meanwhile (a full terminal would block it)."""
        import select

        deadline = time.monotonic() + timeout
        try:
            while self.proc.poll() is None and time.monotonic() < deadline:
                if select.select([self.fd], [], [], 0.2)[0]:
                    try:
                        self.seen += os.read(self.fd, 65536).decode("utf-8", "replace")
                    except OSError:
                        break
            return self.proc.wait(max(deadline - time.monotonic(), 1))
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            os.close(self.fd)


def test_chat_from_the_binary_in_a_terminal(home):
    env = bare_env(home, TERM="xterm-256color")
    term = Terminal([str(BINARY), "chat", "--temperature", "0", "--max-tokens", "12"], env, home)
    try:
        term.expect("> ")
        term.send("Name a river.\r")
        term.expect("tok/s")
        term.send("/exit\r")
    finally:
        rc = term.close()
    assert rc == 0


def test_top_from_the_binary_in_a_terminal(home, tmp_path):
    sock = tmp_path / "s.sock"
    env = bare_env(home, TERM="xterm-256color")
    server = subprocess.Popen(
        [str(BINARY), "serve", "--socket", str(sock), "--parallel", "2"],
        env=env,
        cwd=home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        healthy_client(server, sock)
        term = Terminal([str(BINARY), "top", "--socket", str(sock)], env, home)
        try:
            term.expect("135M params")  # the model panel, drawn from the server's stats feed
            term.send("q")
        finally:
            rc = term.close()
        assert rc == 0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
