"""Bench output: the terminal table and the JSON file."""

from __future__ import annotations

import functools
import json
import platform
import sys
import time
from typing import Any

import click

from edgeinfer.bench.knee import Knee, find_knee
from edgeinfer.bench.runner import LevelResult, SocketLevel, SpecLevel
from edgeinfer.bench.stats import RunResult

SCHEMA_VERSION = 1


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def print_table(results: list[LevelResult], max_tokens: int, err: bool = False) -> None:
    echo = functools.partial(click.echo, err=err)
    head = (
        f"{'streams':>7} {'engine tok/s':>12} {'raw tok/s':>10} {'ratio':>6} {'per-stream':>10} "
        f"{'prefill tok/s':>13} {'TTFT p50 ms':>11} {'TTFT p95 ms':>11}"
    )
    echo(f"\ndecode throughput, {max_tokens} tokens per stream (greedy)")
    echo(head)
    echo("-" * len(head))
    for r in results:
        e, w = r.engine, r.raw
        ratio = e.decode_tps / w.decode_tps if w.decode_tps else 0.0
        echo(
            f"{r.concurrency:>7} {e.decode_tps:>12.1f} {w.decode_tps:>10.1f} {ratio:>6.2f} {e.per_stream_tps:>10.1f} "
            f"{e.prefill_tps:>13.1f} {_ms(e.ttft(50)):>11} {_ms(e.ttft(95)):>11}"
        )
    if len(results) > 1 and results[0].engine.decode_tps:
        top = results[-1]
        echo(
            f"\n{top.concurrency} streams: {top.engine.decode_tps / results[0].engine.decode_tps:.2f}x "
            f"the aggregate decode rate of {results[0].concurrency}"
        )
        knee = knee_of(results)
        echo(f"knee: {knee.reason}; recommended --parallel {knee.parallel}")


def knee_of(results: list[LevelResult]) -> Knee:
    """The knee of the engine's decode throughput, with TTFT p95 as the latency that rises."""
    return find_knee(
        [r.concurrency for r in results],
        [r.engine.decode_tps for r in results],
        [r.engine.ttft(95) for r in results],
    )


def print_socket_table(results: list[SocketLevel], max_tokens: int, socket_path: str, err: bool = False) -> None:
    echo = functools.partial(click.echo, err=err)
    head = (
        f"{'streams':>7} {'in-process tok/s':>16} {'socket tok/s':>12} {'ratio':>6} "
        f"{'TTFT p50 ms (in-proc / socket)':>31}"
    )
    echo(f"\naggregate throughput (prefill included), {max_tokens} tokens per stream, socket {socket_path}")
    echo(head)
    echo("-" * len(head))
    for r in results:
        e, s = r.engine, r.socket
        ratio = s.total_tps / e.total_tps if e.total_tps else 0.0
        ttft = f"{_ms(e.ttft(50))} / {_ms(s.ttft(50))}"
        echo(f"{r.concurrency:>7} {e.total_tps:>16.1f} {s.total_tps:>12.1f} {ratio:>6.2f} {ttft:>31}")


def print_spec_table(
    results: list[SpecLevel], max_tokens: int, workload: str, mode: str, model: str, err: bool = False
) -> None:
    echo = functools.partial(click.echo, err=err)
    head = f"{'streams':>7} {'spec ' + mode + ' tok/s':>16} {'spec off tok/s':>14} {'ratio':>6} {'acceptance':>10}"
    echo(f"\n{model}, workload {workload}, {max_tokens} tokens per stream (greedy), decode tok/s")
    echo(head)
    echo("-" * len(head))
    for r in results:
        ratio = r.on.decode_tps / r.off.decode_tps if r.off.decode_tps else 0.0
        acc = "-" if r.acceptance is None else f"{r.acceptance:.0%}"
        echo(f"{r.concurrency:>7} {r.on.decode_tps:>16.1f} {r.off.decode_tps:>14.1f} {ratio:>6.2f} {acc:>10}")


def print_url_table(results: list[tuple[int, RunResult]], max_tokens: int, url: str, err: bool = False) -> None:
    echo = functools.partial(click.echo, err=err)
    head = (
        f"{'streams':>7} {'total tok/s':>11} {'decode tok/s':>12} {'per-stream':>10} "
        f"{'TTFT p50 ms':>11} {'TTFT p95 ms':>11}"
    )
    echo(f"\n{url}, {max_tokens} tokens per stream (greedy, streaming)")
    echo(head)
    echo("-" * len(head))
    for c, r in results:
        echo(
            f"{c:>7} {r.total_tps:>11.1f} {r.decode_tps:>12.1f} {r.per_stream_tps:>10.1f} "
            f"{_ms(r.ttft(50)):>11} {_ms(r.ttft(95)):>11}"
        )


def write_url_json(results: list[tuple[int, RunResult]], dest: str, url: str, max_tokens: int) -> None:
    doc = {
        "schema": SCHEMA_VERSION,
        "kind": "remote",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "url": url,
        "max_tokens": max_tokens,
        "levels": [{"concurrency": c, "remote": r.figures()} for c, r in results],
    }
    _dump(doc, dest)


def write_json(results: list[Any], dest: str, engine: Any, max_tokens: int) -> None:
    kinds = {LevelResult: "engine", SocketLevel: "socket", SpecLevel: "spec"}
    doc = {
        "schema": SCHEMA_VERSION,
        "kind": kinds[type(results[0])] if results else "engine",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0]},
        "model": str(engine.model_path),
        "config": {
            "ctx_size": engine.n_ctx,
            "batch_size": engine.config.batch_size,
            "threads": engine.ctx.threads,
            "gpu_layers": engine.config.gpu_layers,
            "kv_type": engine.config.kv_type,
        },
        "max_tokens": max_tokens,
        "levels": [r.as_dict() for r in results],
    }
    if results and isinstance(results[0], LevelResult) and len(results) > 1:
        knee = knee_of(results)
        doc["knee"] = {"parallel": knee.parallel, "found": knee.found, "gain_after": knee.gain_after}
    _dump(doc, dest)


def _dump(doc: dict[str, Any], dest: str) -> None:
    text = json.dumps(doc, indent=2)
    if dest == "-":
        click.echo(text)
    else:
        with open(dest, "w") as f:
            f.write(text + "\n")
        click.echo(f"wrote {dest}", err=True)
