"""Bench output: the terminal tables and the JSON report (edgeinfer/bench/schema.py)."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable

import click

from edgeinfer.bench import schema
from edgeinfer.bench.results import RunResult, paired
from edgeinfer.bench.sweep import Sweep

Echo = Callable[[str], None]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _table(echo: Echo, title: str, columns: list[tuple[str, int]], rows: list[list[str]]) -> None:
    """A right-aligned table under a title."""
    head = " ".join(f"{name:>{width}}" for name, width in columns)
    echo(f"\n{title}")
    echo(head)
    echo("-" * len(head))
    for row in rows:
        echo(" ".join(f"{cell:>{width}}" for cell, (_, width) in zip(row, columns, strict=True)))


_COLUMNS = [
    ("streams", 7),
    ("agg tok/s", 9),
    ("decode", 7),
    ("per-stream", 10),
    ("req/s", 6),
    ("prefill", 8),
    ("TTFT ms p50/p95/p99", 19),
    ("ITL ms p50/p99", 14),
    ("cold TTFT p50", 13),
    ("accept", 6),
]


def _row(c: int, warm: RunResult, cold: RunResult) -> list[str]:
    return [
        str(c),
        f"{warm.total_tps:.1f}",
        f"{warm.decode_tps:.1f}",
        f"{warm.per_stream_tps:.1f}",
        f"{warm.requests_per_s:.2f}",
        f"{warm.prefill_tps:.0f}",
        "/".join(_ms(warm.ttft(q)) for q in (50, 95, 99)),
        "/".join(_ms(warm.itl(q)) for q in (50, 99)),
        _ms(cold.ttft(50)),
        _pct(warm.acceptance),
    ]


def print_sweep(sweep: Sweep, echo: Echo) -> None:
    """One table per target, a side-by-side table when there are several, and each target's knee."""
    for t in sweep.targets:
        rows = [_row(lv.concurrency, lv.sides[t.name].warm, lv.sides[t.name].cold) for lv in sweep.levels]
        title = (
            f"{t.name} ({t.kind}): {sweep.workload}, {sweep.max_tokens} tokens per stream, "
            f"best of {sweep.repeats} (warm runs; cold TTFT from cold runs)"
        )
        _table(echo, title, _COLUMNS, rows)
    if len(sweep.targets) > 1:
        print_side_by_side(sweep, echo)
    for t in sweep.targets:
        knee = sweep.knee(t.name)
        if knee is not None:
            echo(f"{t.name}: knee: {knee.reason}; recommended --parallel {knee.parallel}")


def print_side_by_side(sweep: Sweep, echo: Echo) -> None:
    """Aggregate tok/s and TTFT p50 of every target; each other target's aggregate and decode rates over the first's."""
    base, others = sweep.targets[0], sweep.targets[1:]
    columns = [("streams", 7)] + [(f"{k + 1}: tok/s", 9) for k in range(len(sweep.targets))]
    columns += [(f"{k + 2}/1 agg", 7) for k in range(len(others))]
    columns += [(f"{k + 2}/1 decode", 10) for k in range(len(others))]
    if sweep.repeats > 1:
        columns += [(f"{k + 2}/1 paired", 10) for k in range(len(others))]
    columns += [("TTFT p50 ms " + "/".join(str(k + 1) for k in range(len(sweep.targets))), 18)]
    rows = []
    for lv in sweep.levels:
        b = lv.sides[base.name].warm
        runs = [lv.sides[t.name].warm for t in sweep.targets]
        agg = [f"{r.total_tps / b.total_tps:.2f}" if b.total_tps else "-" for r in runs[1:]]
        dec = [f"{r.decode_tps / b.decode_tps:.2f}" if b.decode_tps else "-" for r in runs[1:]]
        pairs = [_ratio(paired(r, b)) for r in runs[1:]] if sweep.repeats > 1 else []
        ttft = "/".join(_ms(r.ttft(50)) for r in runs)
        rows.append([str(lv.concurrency), *(f"{r.total_tps:.1f}" for r in runs), *agg, *dec, *pairs, ttft])
    names = ", ".join(f"{k + 1}: {t.name}" for k, t in enumerate(sweep.targets))
    _table(echo, f"side by side, warm runs ({names})", columns, rows)
    if sweep.repeats > 1:
        echo(
            "paired: the median over the repeats of each one's aggregate tok/s over target 1's in the same repeat,"
            " run beside it (the bests above may come minutes apart)"
        )


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def build_report(sweep: Sweep) -> schema.Report:
    levels = [
        schema.Level(
            concurrency=lv.concurrency,
            targets={
                name: schema.Side(
                    cold=schema.Figures.model_validate(side.cold.figures()),
                    warm=schema.Figures.model_validate(side.warm.figures()),
                )
                for name, side in lv.sides.items()
            },
        )
        for lv in sweep.levels
    ]
    knees = {}
    for t in sweep.targets:
        k = sweep.knee(t.name)
        if k is not None:
            gain = None if k.gain_after is None else round(k.gain_after, 4)
            knees[t.name] = schema.Knee(parallel=k.parallel, found=k.found, gain_after=gain, reason=k.reason)
    return schema.Report(
        schema_version=schema.SCHEMA_VERSION,
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        machine=schema.Machine(platform=platform.platform(), python=sys.version.split()[0], cpus=os.cpu_count() or 1),
        workload=sweep.workload,  # type: ignore[arg-type]
        max_tokens=sweep.max_tokens,
        repeats=sweep.repeats,
        targets=[schema.Target(name=t.name, kind=t.kind, **t.describe()) for t in sweep.targets],  # type: ignore[arg-type]
        levels=levels,
        knees=knees,
    )


def write_json(sweep: Sweep, dest: str) -> None:
    write_text(build_report(sweep).model_dump_json(by_alias=True, indent=2), dest)


def write_text(text: str, dest: str) -> None:
    """JSON text to stdout (dest "-") or to a file, saying where it went."""
    if dest == "-":
        click.echo(text)
        return
    with open(dest, "w") as f:
        f.write(text + "\n")
    click.echo(f"wrote {dest}", err=True)
