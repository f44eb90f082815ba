"""Running the dashboard from the CLI: `edgeinfer top`, and beside `serve` or `bench` in the same process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from edgeinfer.errors import EdgeInferError

from .app import Dashboard, make_dashboard
from .sources import EngineSource, SocketSource

T = TypeVar("T")

# How the CLI runs the app in the foreground; tests pass one that drives it with a Pilot.
RunApp = Callable[[Dashboard], Any]


def _run_in_terminal(app: Dashboard) -> None:
    app.run()


def run_headless(script: Callable[[Dashboard, Any], Awaitable[None]], size: tuple[int, int] = (120, 36)) -> RunApp:
    """A RunApp without a terminal: the app runs under a Textual Pilot that `script(app, pilot)` drives.

    For tests and for saving screenshots; the script must end the app (e.g. press q) or return.
    """

    def run(app: Dashboard) -> None:
        async def go() -> None:
            async with app.run_test(size=size) as pilot:
                await script(app, pilot)

        asyncio.run(go())

    return run


class BenchmarkStopped(EdgeInferError):
    """The dashboard was closed while the benchmark still ran."""


def run_top(
    socket_path: str | Path | None, api_key: str | None, interval: float, run: RunApp = _run_in_terminal
) -> None:
    """`edgeinfer top`: the dashboard over a server's socket (the default one unless given)."""
    from edgeinfer.server.listen import default_socket_path

    path = Path(socket_path).expanduser() if socket_path else default_socket_path()
    run(make_dashboard(SocketSource(path, api_key, interval)))


def serve_with_dashboard(
    app: Any,
    socket_path: Path,
    tcp: tuple[str, int] | None = None,
    grace_s: float = 10.0,
    api_key: str | None = None,
    interval: float = 1.0,
    run: RunApp = _run_in_terminal,
) -> None:
    """`edgeinfer serve --dashboard`: the server on a background thread, the dashboard on its socket in front.

    Quitting the dashboard stops the server as SIGTERM would: streams get grace_s to finish.
    """
    from edgeinfer.server.listen import serve

    def dashboard() -> None:
        run(make_dashboard(SocketSource(socket_path, api_key, interval, retry_s=0.5)))

    serve(app, socket_path, tcp, grace_s, foreground=dashboard)


def bench_with_dashboard(
    engine: Any, job: Callable[[Callable[[str], None]], T], interval: float = 1.0, run: RunApp = _run_in_terminal
) -> T:
    """`edgeinfer bench --dashboard`: job(progress) runs on a background thread while the dashboard shows engine.

    Returns the job's result once the dashboard is closed. Closing it before the job ends
    closes the engine, which cancels the job's streams, and raises BenchmarkStopped.
    """
    dashboard = make_dashboard(EngineSource(engine, interval))
    outcome: dict[str, Any] = {}

    def progress(line: str) -> None:
        dashboard.job_line = f"benchmark: {line}"

    def target() -> None:
        try:
            outcome["result"] = job(progress)
            dashboard.job_line = "benchmark finished: q shows the results"
        except BaseException as e:
            outcome["error"] = e
            dashboard.job_line = f"benchmark failed: {e}"

    progress("starting")
    thread = threading.Thread(target=target, name="edgeinfer-bench", daemon=True)
    thread.start()
    stopped = False
    try:
        run(dashboard)
    finally:
        if thread.is_alive():
            stopped = True
            engine.close()
        thread.join()
    if stopped:  # whatever the job returned after its streams were cancelled is not a measurement
        raise BenchmarkStopped("the dashboard was closed before the benchmark finished; no figures to report")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]  # type: ignore[no-any-return]
