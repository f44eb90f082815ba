"""The dashboard (`edgeinfer top`): Pilot tests on a scripted feed, an SVG snapshot, a stalled feed,
real `edgeinfer serve` processes on a Unix socket, and the in-process serve and bench paths."""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from edgeinfer.bench.exclusive import run_exclusive
from edgeinfer.bench.targets import EngineTarget
from edgeinfer.bench.workloads import messages
from edgeinfer.cli import main
from edgeinfer.engine.stats import EngineStats, StreamRow
from edgeinfer.errors import EngineClosedError
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine
from edgeinfer.server.app import make_server
from edgeinfer.tui import figures
from edgeinfer.tui.app import Dashboard, make_dashboard
from edgeinfer.tui.launch import BenchmarkStopped, bench_with_dashboard, run_headless, serve_with_dashboard
from edgeinfer.tui.sources import ScriptedSource, SocketSource
from edgeinfer.tui.widgets import HelpScreen, KvBar, StreamsTable

from .conftest import sse_events, stop_process

pytestmark = pytest.mark.pure

SIZE = (120, 36)
SNAPSHOT_SVG = Path(__file__).parent / "snapshots" / "dashboard.svg"


# --- scripted snapshots ---------------------------------------------------------


def stream(sid: int, state: str, generated: int = 0, tps: float | None = None, **kw: Any) -> dict[str, Any]:
    row = {"id": sid, "index": 0, "state": state, "prompt_tokens": 30 + sid, "cached_tokens": 0}
    row |= {"generated_tokens": generated, "tps": tps, "ttft_s": None, "age_s": 1.0 + sid}
    return row | kw


STREAMS = [
    stream(0, "decode", 40, 38.5, ttft_s=0.12, cached_tokens=16),
    stream(1, "prefill"),
    stream(2, "waiting"),
    stream(3, "decode", 12, 41.2, ttft_s=0.3),
]


def snapshot(t: float = 1000.0, tps: float = 173.2, **over: Any) -> dict[str, Any]:
    snap = {
        "time": t,
        "model": {
            "name": "SmolLM2 135M",
            "path": "/models/smollm2.gguf",
            "architecture": "llama",
            "quantization": "Q4_1",
            "n_params": 134515008,
            "ctx_size": 8192,
            "parallel": 16,
            "gpu_layers": 31,
            "kv_type": "f16",
            "gpu": {
                "device": "Vulkan0 (AMD Radeon RX 7600 (RADV NAVI33))",
                "layers": 31,
                "n_layers": 31,
                "free_bytes": 6_900 << 20,
                "total_bytes": 8_176 << 20,
            },
        },
        "requests": {"running": 3, "waiting": 1, "total": 40, "finished": {"stop": 30, "length": 5}},
        "kv": {"layout": "per-seq", "used_cells": 3520, "total_cells": 8192, "cells_per_seq": 512},
        "tokens": {"prompt": 1000, "generated": 5000},
        "prefix_cache": {"hit_tokens": 342, "computed_tokens": 658, "kept": 2, "resumed_in_place": 7},
        "cache": {"ram_entries": 3, "ram_bytes": 70 << 20, "ram_budget_bytes": 2 << 30, "ram_hits": 5},
        "rate": {"generated_tps_1s": tps, "generated_tps_10s": 160.0},
        "latency": {"ttft_p50_s": 0.134, "ttft_p95_s": 0.5, "itl_p50_s": 0.011, "itl_p95_s": 0.02},
        "steps": {"count": 100, "decode_seconds": 5.0, "threads": 2, "threads_max": 2, "threads_fitted": True},
        "streams": STREAMS,
    }
    return snap | over


async def until(pilot: Any, cond: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}; status: {pilot.app.status_text()!r}")
        await pilot.pause(0.05)


def text_of(app: Dashboard, selector: str) -> str:
    return str(app.query_one(selector).content)  # type: ignore[attr-defined]


# --- pure figures ---------------------------------------------------------------


def stats(**over: Any) -> EngineStats:
    return EngineStats.model_validate(snapshot(**over))


def test_derived_figures():
    assert stats().prefix_cache.hit_rate == pytest.approx(0.342)
    assert stats(prefix_cache={"hit_tokens": 0, "computed_tokens": 0}).prefix_cache.hit_rate is None
    assert stats().spec.acceptance is None
    assert stats(spec={"mode": "off", "error": None}).spec.acceptance is None
    assert stats(spec={"accepted": 3, "drafted": 4}).spec.acceptance == 0.75
    assert stats(spec={"accepted": 0, "drafted": 0}).spec.acceptance is None
    assert StreamRow.model_validate(stream(0, "decode", drafted=4, accepted=2)).acceptance == 0.5
    assert [figures.fmt_seconds(x) for x in (None, 0.0114, 1.7561)] == ["—", "11 ms", "1.76 s"]
    assert figures.fmt_count(134515008) == "135M"
    kept = "3520 / 8192 cells · kept 2, 7 resumed"
    assert figures.kv_text(stats()) == f"{kept} · RAM 3, 70 MiB · 5 restored"
    with_disk = stats(cache={"ram_entries": 1, "disk_entries": 9, "disk_budget_bytes": 1 << 30, "disk_hits": 2})
    assert figures.kv_text(with_disk) == f"{kept} · RAM 1, disk 9 · 2 restored"
    unified = stats(kv={"layout": "unified", "used_cells": 10, "total_cells": 8192})
    assert figures.kv_text(unified) == "10 / 8192 cells (unified) · RAM 3, 70 MiB · 5 restored"
    ids = lambda sort: [s.id for s in figures.sorted_streams(stats().streams, sort)]  # noqa: E731
    assert [ids(i) for i in range(4)] == [[0, 1, 2, 3], [3, 0, 1, 2], [0, 3, 1, 2], [0, 3, 1, 2]]
    # The JSON a server sends reads back into the same figures.
    again = EngineStats.model_validate_json(stats().model_dump_json())
    assert again == stats() and figures.cards(again) == figures.cards(stats())


def test_rate_history_bins_holds_and_forgets():
    h = figures.RateHistory(span_s=10, hold_s=3)
    assert h.series() == [0.0] * 10
    for t, tps in [(100.2, 10.0), (100.7, 20.0), (102.5, 40.0)]:
        h.add(t, tps)
    # Second 100 averages its two samples; 101 holds 100's value; 102 is new.
    assert h.series() == [0.0] * 7 + [15.0, 15.0, 40.0]
    h.add(108.1, 5.0)  # a 6 s gap: an outage, drawn as 0 after the hold
    assert h.series()[-7:] == [40.0, 40.0, 40.0, 40.0, 0.0, 0.0, 5.0]
    h.add(125.0, 1.0)  # everything older than 10 s is dropped
    assert h.peak() == 1.0 and len(h.series()) == 10


def test_rate_history_follows_a_slow_feed():
    h = figures.RateHistory(span_s=30, hold_s=3)
    for i in range(6):  # one snapshot every 5 s (`--interval 5`)
        h.add(100.0 + 5 * i, 50.0)
    assert h.series()[-26:] == [50.0] * 26  # no dips to 0 between snapshots
    h.add(140.0, 60.0)  # then a 15 s outage: the usual gap is still 5 s, so it shows
    assert h.series()[-15:] == [50.0] * 7 + [0.0] * 7 + [60.0]  # held 7.5 s after the last one at 125


# --- the app on a scripted feed ---------------------------------------------------


async def test_dashboard_shows_every_figure():
    spec = {"mode": "ngram", "drafted": 200, "accepted": 150, "acceptance": 0.75}
    app = make_dashboard(
        ScriptedSource([snapshot(spec=spec, streams=[*STREAMS[:3], STREAMS[3] | {"drafted": 10, "accepted": 5}])])
    )
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.received == 1, "the snapshot")
        assert app.status_text() == "● script"
        cards = {k: app.card(k) for k in ("tps", "ttft", "itl", "running", "waiting", "done", "prefix", "spec")}
        assert cards == {
            "tps": "173.2",
            "ttft": "134 ms / 500 ms",
            "itl": "11 ms / 20 ms",
            "running": "3",
            "waiting": "1",
            "done": "35",
            "prefix": "34.2 %",
            "spec": "75.0 %",
        }
        model = text_of(app, "#model")
        for part in (
            "SmolLM2 135M",
            "Q4_1",
            "135M params",
            "context 8192 cells",
            "parallel 16",
            "GPU 31/31 layers · 6,900 MiB free",
        ):
            assert part in model
        bar = app.query_one(KvBar).query_one("ProgressBar")
        assert (bar.progress, bar.total) == (3520, 8192)  # type: ignore[attr-defined]
        assert "3520 / 8192 cells · kept 2, 7 resumed · RAM 3, 70 MiB · 5 restored" in text_of(app, "#kv-text")
        assert "peak 173.2 tok/s" in text_of(app, "#chart-caption")
        table = app.query_one(StreamsTable)
        assert table.ids() == ["0", "1", "2", "3"]
        assert [str(c) for c in table.get_row("0")] == ["0", "decode", "30", "16", "40", "38.5", "120 ms", "—", "1.0 s"]
        assert [str(c) for c in table.get_row("3")][5:8] == ["41.2", "300 ms", "50.0 %"]
        assert [str(c) for c in table.get_row("2")][1] == "waiting"


async def test_without_speculation_the_card_shows_a_dash():
    app = make_dashboard(ScriptedSource([snapshot(spec={"mode": "off", "error": None})]))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.received == 1, "the snapshot")
        assert app.card("spec") == "—"
        assert app.card("tps") == "173.2"


async def test_keys_pause_sort_help_quit():
    source = ScriptedSource([snapshot()])
    app = make_dashboard(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.received == 1, "the first snapshot")

        await pilot.press("p")  # pause: the display freezes, snapshots still arrive
        source.push(snapshot(t=1001, requests={"running": 9, "waiting": 0, "finished": {}}))
        await until(pilot, lambda: app.received == 2, "the second snapshot")
        assert app.card("running") == "3"
        assert "paused, 1 snapshots since" in app.status_text()
        await pilot.press("p")
        assert app.card("running") == "9" and "paused" not in app.status_text()

        table = app.query_one(StreamsTable)
        await pilot.press("s")
        assert table.ids() == ["3", "0", "1", "2"] and "sorted by tok/s" in table.border_title
        await pilot.press("s")
        assert table.ids() == ["0", "3", "1", "2"] and "sorted by generated" in table.border_title
        await pilot.press("s", "s")
        assert table.ids() == ["0", "1", "2", "3"] and "sorted by id" in table.border_title

        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "pause / resume the display" in text_of(app.screen, "#help")  # type: ignore[arg-type]
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

        assert app.return_code is None
        await pilot.press("q")
        assert app.return_code == 0


async def test_a_fast_feed_is_drawn_at_a_bounded_rate():
    """Snapshots faster than the screen can draw are folded into the newest one, not queued up."""
    source = ScriptedSource([snapshot(t=1000.0 + i / 100, requests={"running": i, "waiting": 0}) for i in range(60)])
    app = make_dashboard(source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.received == 60 and app.shown is app.latest, "the burst")
        assert app.card("running") == "59"
        assert app.draws < 10, f"{app.draws} redraws for one burst of 60 snapshots"
        assert app.history.samples == 60  # every snapshot still reached the chart's history


async def test_an_outage_is_shown_and_cleared():
    app = make_dashboard(ScriptedSource(["no server at /tmp/x.sock"]))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "no server" in app.status_text(), "the outage")
        assert app.status_text() == "✗ no server at /tmp/x.sock"
        assert app.query_one("#status").has_class("down")
        app.source.push(snapshot())  # type: ignore[attr-defined]
        await until(pilot, lambda: app.status_text() == "● script", "the feed back")
        assert not app.query_one("#status").has_class("down")


async def test_layout_matches_the_svg_snapshot(tmp_path):
    """The whole screen, after two minutes of a scripted feed, against tests/snapshots/dashboard.svg.

    After an intended layout change (or a Textual upgrade), look at the new picture and rewrite it with
    EDGEINFER_UPDATE_SNAPSHOTS=1 pytest tests/test_tui.py -k svg
    """
    feed = [snapshot(t=1000.0 + i, tps=150 + 40 * math.sin(i / 9)) for i in range(130)]
    app = make_dashboard(ScriptedSource(feed))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.received == len(feed) and app.shown is app.latest, "the scripted feed")
        await pilot.pause()
        svg = app.export_screenshot()
    if os.environ.get("EDGEINFER_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT_SVG.parent.mkdir(exist_ok=True)
        SNAPSHOT_SVG.write_text(svg)
    assert SNAPSHOT_SVG.is_file(), f"{SNAPSHOT_SVG} is missing; create it with EDGEINFER_UPDATE_SNAPSHOTS=1"
    if svg != SNAPSHOT_SVG.read_text():
        got = tmp_path / SNAPSHOT_SVG.name
        got.write_text(svg)
        raise AssertionError(f"the dashboard no longer matches {SNAPSHOT_SVG.name}; this run's picture is in {got}")


# --- the socket source against a feed that stalls ------------------------------------


async def test_a_stalled_feed_is_dropped_and_the_ui_stays_live(tmp_path):
    """A server that sends one snapshot and then nothing: the dashboard says so, keeps answering keys, reconnects."""
    connections = 0

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        body = f"data: {__import__('json').dumps(snapshot())}\r\n\r\n".encode()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(body), body))
        await writer.drain()
        await asyncio.sleep(30)  # then silence

    sock = tmp_path / "stall.sock"
    server = await asyncio.start_unix_server(stall, path=str(sock))
    try:
        app = make_dashboard(SocketSource(sock, interval=0.2, retry_s=0.2, stall_s=0.6))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.received == 1, "the one snapshot")
            assert app.card("ttft") == "134 ms / 500 ms"
            await until(pilot, lambda: "the feed stalled" in app.status_text(), "the stall to be noticed")
            await pilot.press("p")
            assert "paused" in app.status_text()
            await until(pilot, lambda: connections >= 2, "a reconnection")
    finally:
        server.close()


# --- real servers --------------------------------------------------------------------


@pytest.fixture
def servers():
    """Start `edgeinfer serve` processes on a socket; all are stopped at the end of the test."""
    procs: list[subprocess.Popen] = []

    def start(sock: Path) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", str(sock)]
        # One compute thread: the dashboard under test needs the other core to keep up.
        cmd += ["--parallel", "4", "--ctx-size", "2048", "--grace", "1", "--threads", "1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop_process(proc)


async def chat(sock: Path, n: int, max_tokens: int) -> list[dict[str, Any]]:
    """n concurrent chat requests over the socket, each generating exactly max_tokens tokens."""
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    transport = httpx.AsyncHTTPTransport(uds=str(sock))
    async with httpx.AsyncClient(transport=transport, base_url="http://edgeinfer", timeout=120) as client:
        replies = await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(n)))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return [r.json() for r in replies]


@pytest.mark.model
async def test_no_server_then_a_server_then_a_restart(tmp_path, servers):
    sock = tmp_path / "e.sock"
    app = make_dashboard(SocketSource(sock, interval=0.25, retry_s=0.2))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "no server" in app.status_text(), "the no-server message")
        assert app.status_text() == (
            f"✗ no server at {sock} — start `edgeinfer serve --socket {sock}`; retrying every 0.2 s"
        )
        await pilot.pause(0.5)
        assert app.received == 0 and "no server" in app.status_text()  # still retrying, still saying so

        first = servers(sock)
        await until(pilot, lambda: app.status_text() == f"● unix:{sock}", "the first server", timeout=90)
        assert "135M params" in text_of(app, "#model") and "context 2048 cells" in text_of(app, "#model")

        stop_process(first)
        await until(pilot, lambda: app.status_text().startswith("✗"), "the lost server", timeout=30)
        seen = app.received

        servers(sock)
        await until(pilot, lambda: app.status_text() == f"● unix:{sock}", "the restarted server", timeout=90)
        assert app.received > seen


@pytest.mark.model
async def test_live_requests_on_a_real_server(tmp_path, servers):
    sock = tmp_path / "e.sock"
    proc = servers(sock)
    app = make_dashboard(SocketSource(sock, interval=0.2, retry_s=0.2))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.status_text() == f"● unix:{sock}", "the server", timeout=90)
        assert app.card("done") == "0" and app.card("ttft") == "— / —"
        states: set[str] = set()
        shown: dict[str, set[str]] = {"tps": set(), "ttft": set(), "itl": set()}
        work = asyncio.create_task(chat(sock, 3, 32))

        def watch() -> bool:
            """Note what the screen shows while the requests run, until it has shown every live figure."""
            table = app.query_one(StreamsTable)
            states.update(str(table.get_row_at(i)[1]) for i in range(table.row_count))
            for card in shown:
                shown[card].add(app.card(card))
            return (
                "decode" in states
                and any(float(x) > 0 for x in shown["tps"])
                and any(x.endswith(("ms", " s")) for x in shown["ttft"])  # e.g. "212 ms / 340 ms"
                and any(x != "— / —" for x in shown["itl"])
            )

        await until(pilot, watch, "decoding streams, a non-zero tok/s, TTFT and ITL", timeout=120)
        replies = await work
        assert all(r["usage"]["completion_tokens"] == 32 for r in replies)
        await until(pilot, lambda: app.card("done") == "3", "three finished requests", timeout=60)
        # Finished conversations stay in their sequences for their next turn.
        assert re.search(r"kept [1-9]\d*, \d+ resumed", text_of(app, "#kv-text"))
        assert app.history.peak() > 0 and "peak 0.0" not in text_of(app, "#chart-caption")
        assert proc.poll() is None


# --- the dashboard beside serve and bench, in process -------------------------------------


@pytest.mark.model
def test_serve_with_dashboard(tmp_path, model_path):
    sock = tmp_path / "s.sock"
    app = make_server(EngineConfig(model=model_path, parallel=2, ctx_size=1024, threads=1, threads_batch=1))

    async def script(dash: Dashboard, pilot: Any) -> None:
        await until(pilot, lambda: dash.status_text() == f"● unix:{sock}", "the in-process server", timeout=60)
        await chat(sock, 2, 8)
        await until(pilot, lambda: dash.card("done") == "2", "two finished requests")
        await pilot.press("q")

    serve_with_dashboard(app, sock, grace_s=1, run=run_headless(script, SIZE))
    assert not sock.exists(), "quitting the dashboard leaves the socket behind"


def _quit_dashboard_mid_stream(tmp_path: Path, model_path: Path, grace_s: float, max_tokens: int) -> list[str]:
    """Serve with the dashboard, start one stream, press q once it runs; the stream's SSE lines."""
    sock = tmp_path / "g.sock"
    app = make_server(EngineConfig(model=model_path, parallel=2, ctx_size=4096, threads=1, threads_batch=1))
    body = {"model": "default", "messages": [{"role": "user", "content": "Write a long essay about rivers."}]}
    body |= {"max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 0}
    lines: list[str] = []
    started = threading.Event()

    def client() -> None:
        transport = httpx.HTTPTransport(uds=str(sock))
        with (
            httpx.Client(transport=transport, base_url="http://x", timeout=300) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    reader = threading.Thread(target=client, daemon=True)

    async def script(dash: Dashboard, pilot: Any) -> None:
        await until(pilot, lambda: dash.status_text() == f"● unix:{sock}", "the in-process server", timeout=60)
        reader.start()
        await until(pilot, started.is_set, "the stream under way", timeout=60)
        await pilot.press("q")

    serve_with_dashboard(app, sock, grace_s=grace_s, run=run_headless(script, SIZE))
    reader.join(60)
    assert not sock.exists()
    return lines


@pytest.mark.model
def test_quitting_the_dashboard_lets_streams_finish_within_grace(tmp_path, model_path):
    """q in `serve --dashboard` stops the server as SIGTERM does: a stream in flight runs to its end."""
    lines = _quit_dashboard_mid_stream(tmp_path, model_path, grace_s=600, max_tokens=120)
    events = sse_events(lines)
    assert "data: [DONE]" in lines, "quitting the dashboard cut the stream before its end"
    assert not [e for e in events if "error" in e]
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["length"]


@pytest.mark.model
def test_quitting_the_dashboard_ends_streams_past_grace_with_an_error(tmp_path, model_path):
    """Defect: the dashboard's server stopped by setting uvicorn's flag, so the routes never saw the
    shutdown begin and a stream still running at the grace's end got no shutting_down error."""
    lines = _quit_dashboard_mid_stream(tmp_path, model_path, grace_s=1, max_tokens=1800)
    events = sse_events(lines)
    errors = [e["error"]["message"] for e in events if "error" in e]
    assert len(errors) == 1 and "shutting down" in errors[0] and "--grace" in errors[0], (
        errors,
        lines[-3:],
        len(lines),
    )


@pytest.mark.model
def test_bench_with_dashboard_shares_the_engine(model_path):
    engine = make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=2048, threads=1, threads_batch=1))
    try:

        def job(progress: Any) -> Any:
            progress("4 streams")
            return EngineTarget(engine).run(messages("chat", 4), 16, lambda: None)

        async def script(dash: Dashboard, pilot: Any) -> None:
            await until(pilot, lambda: "finished" in dash.job_line, "the benchmark", timeout=120)
            await until(pilot, lambda: "benchmark finished" in dash.status_text(), "the status line")
            assert dash.history.peak() > 0, "the dashboard never saw the benchmark's tokens"
            await pilot.press("q")

        result = bench_with_dashboard(engine, job, interval=0.2, run=run_headless(script, SIZE))
        assert len(result.streams) == 4 and result.decode_tps > 0
    finally:
        engine.close()


@pytest.mark.model
def test_closing_the_dashboard_stops_the_benchmark(model_path):
    # unified: one stream may use the whole context for its long answer
    config = EngineConfig(model=model_path, parallel=2, ctx_size=2048, threads=1, threads_batch=1, kv_layout="unified")
    engine = make_engine(config)

    def job(progress: Any) -> str:
        progress("one long stream")
        handle = engine.submit("Count to a million.", SamplingParams(max_tokens=1500, ignore_eos=True))[0]
        return handle.result().finish_reason

    async def script(dash: Dashboard, pilot: Any) -> None:
        await until(pilot, lambda: dash.card("running") == "1", "the stream", timeout=60)
        assert "benchmark: one long stream" in dash.status_text()
        await pilot.press("q")

    try:
        with pytest.raises(BenchmarkStopped, match="closed before the benchmark finished"):
            bench_with_dashboard(engine, job, interval=0.2, run=run_headless(script, SIZE))
        with pytest.raises(EngineClosedError):  # quitting closed the engine, which cancelled the stream
            run_exclusive(engine, lambda ctx: None)
    finally:
        engine.close()


# --- the command line ------------------------------------------------------------------


def test_cli_dashboard_options():
    runner = CliRunner()
    result = runner.invoke(main, ["top", "--help"])
    assert result.exit_code == 0 and "--interval" in result.output and "--socket" in result.output
    result = runner.invoke(main, ["top", "--interval", "0"])
    assert result.exit_code == 2 and "0.05" in result.output
    result = runner.invoke(main, ["serve", "--dashboard", "--no-socket", "--port", "9"])
    assert result.exit_code == 2 and "--dashboard reads the Unix socket" in result.output
    result = runner.invoke(main, ["bench", "--dashboard", "--socket", "/tmp/x.sock"])
    assert result.exit_code == 2 and "edgeinfer top --socket" in result.output
