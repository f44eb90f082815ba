"""The live progress bar of a benchmark, on stderr; plain lines where stderr is not a terminal."""

from __future__ import annotations

import sys
from types import TracebackType

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class BarProgress:
    """Counts finished streams against the sweep's total; the label says which run is going."""

    def __init__(self, total: int, unit: str = "streams") -> None:
        self.live = sys.stderr.isatty()
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._bar.add_task("starting", total=total)

    def __enter__(self) -> BarProgress:
        if self.live:
            self._bar.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self.live:
            self._bar.stop()

    def begin(self, label: str) -> None:
        if self.live:
            self._bar.update(self._task, description=label)
        else:
            click.echo(click.style(label, dim=True), err=True)

    def advance(self) -> None:
        self._bar.advance(self._task)

    def remaining(self, n: int) -> None:
        done = self._bar.tasks[0].completed
        self._bar.update(self._task, total=done + n)
