"""The dashboard's pieces: figure cards, the model panel, the tok/s chart, the KV bar, the streams table, help."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, ProgressBar, Sparkline, Static

from edgeinfer.engine.stats import EngineStats, StreamRow

from . import figures
from .figures import DASH

# (widget id, label): the figure cards, in reading order, four to a row.
CARDS = [
    ("tps", "tok/s now"),
    ("ttft", "TTFT p50/p95"),
    ("itl", "ITL p50/p95"),
    ("spec", "spec. accepted"),
    ("running", "running"),
    ("waiting", "waiting"),
    ("done", "finished"),
    ("prefix", "prefix cache"),
]


class Card(Static):
    """One figure: its label in the border, its value inside."""

    def __init__(self, label: str, *, id: str) -> None:
        super().__init__(DASH, id=id)
        self.border_title = label

    @property
    def value(self) -> str:
        return str(self.content)


class RateChart(Vertical):
    """Aggregate generated tok/s over the history span, with now / 10 s / peak figures under it."""

    def __init__(self, span_s: int, *, id: str) -> None:
        super().__init__(id=id)
        self.span_s = span_s
        self.border_title = f"generated tok/s · last {span_s // 60} min" if span_s >= 120 else f"last {span_s} s"

    def compose(self) -> ComposeResult:
        yield Sparkline([0.0] * self.span_s, id="spark")
        yield Static(DASH, id="chart-caption")

    def show(self, series: list[float], snap: EngineStats, peak: float) -> None:
        # Sparkline scales from the data's minimum; a leading 0 pins the floor at 0 tok/s, so a dip
        # from 190 to 150 does not read as a stall. Summaries are per-bucket maxima, so it stays hidden
        # whenever the chart is narrower than the series.
        self.query_one(Sparkline).data = [0.0, *series]
        rate = snap.rate
        self.query_one("#chart-caption", Static).update(
            f"now {figures.fmt_rate(rate.generated_tps_1s)} · "
            f"10 s mean {figures.fmt_rate(rate.generated_tps_10s)} · "
            f"peak {figures.fmt_rate(peak)} tok/s (chart: 0 to peak)"
        )


class KvBar(Horizontal):
    """KV-cache cells in use, as a bar and as counts."""

    def compose(self) -> ComposeResult:
        yield Label("KV cache", id="kv-label")
        yield ProgressBar(total=1, show_eta=False, id="kv-bar")
        yield Static(DASH, id="kv-text")

    def show(self, snap: EngineStats) -> None:
        kv = snap.kv
        self.query_one(ProgressBar).update(total=max(1, kv.total_cells), progress=kv.used_cells)
        self.query_one("#kv-text", Static).update(figures.kv_text(snap))


_NUMERIC = {"prompt", "cached", "generated", "tok/s", "TTFT", "accepted", "age"}
_STATE_STYLE = {"decode": "green", "prefill": "yellow", "waiting": "dim"}


class StreamsTable(DataTable[Text]):
    """One row per live stream; rows are keyed by stream id."""

    def on_mount(self) -> None:
        self.cursor_type = "none"
        self.zebra_stripes = True
        for name in figures.COLUMNS:
            self.add_column(Text(name, justify="right") if name in _NUMERIC else name, key=name)

    def show(self, streams: list[StreamRow], sort: int) -> None:
        name, _, descending = figures.SORTS[sort % len(figures.SORTS)]
        self.border_title = f"streams ({len(streams)}) · sorted by {name}{' ↓' if descending else ''} · s: next"
        self.clear()
        for s in figures.sorted_streams(streams, sort):
            cells = [
                Text(c, justify="right") if col in _NUMERIC else Text(c, style=_STATE_STYLE.get(c, ""))
                for col, c in zip(figures.COLUMNS, figures.stream_cells(s), strict=True)
            ]
            self.add_row(*cells, key=str(s.id))

    def ids(self) -> list[str]:
        """Stream ids in display order (tests, and anyone reading the table)."""
        return [str(self.get_row_at(i)[0]) for i in range(self.row_count)]


HELP = """\
[b]edgeinfer top[/b]: live figures of one edgeinfer engine

[b]q[/b]  quit            [b]p[/b]  pause / resume the display (snapshots keep arriving)
[b]s[/b]  sort the streams table: id, tok/s, generated tokens, state
[b]?[/b]  this help (escape or ? closes it)

[b]tok/s[/b]           generated tokens per second over all streams (last 1 s; chart: per second)
[b]TTFT[/b]            time to first token, p50 / p95 over the last minute of requests
[b]ITL[/b]             inter-token latency: time between a stream's tokens, p50 / p95, last minute
[b]spec. accepted[/b]  drafted tokens the model accepted ({dash} without speculation)
[b]prefix cache[/b]    hit rate: prompt tokens restored or copied instead of computed / all prompt tokens
[b]KV cache[/b]        cells running streams hold; finished conversations kept in their streams (and
                turns resumed there), saved to RAM (and disk) once a stream is wanted, and restored

Streams are [green]decode[/green], [yellow]prefill[/yellow] (reading the prompt) or waiting for a slot.
"""


class HelpScreen(ModalScreen[None]):
    """The keys and what each figure means."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "close"),
        Binding("question_mark", "dismiss", "close", key_display="?"),
    ]

    def compose(self) -> ComposeResult:
        yield Static(HELP.format(dash=DASH), id="help")
