"""The dashboard app and its factory: one stats source in, live figures out; q, p, s and ? at the keyboard."""

from __future__ import annotations

import time
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal
from textual.timer import Timer
from textual.widgets import Footer, Static

from edgeinfer.engine.stats import EngineStats

from . import figures
from .messages import FeedDown, StatsUpdate
from .sources import StatsSource
from .widgets import CARDS, Card, HelpScreen, KvBar, RateChart, StreamsTable

# At most 5 redraws a second however fast snapshots come: a redraw costs ~40 ms of CPU on a
# small machine, and a backlog of redraws would make the screen lag behind the feed.
MIN_REDRAW_S = 0.2


class Dashboard(App[None]):
    """Live figures of one engine, read from a StatsSource in a background worker."""

    TITLE = "edgeinfer top"
    CSS_PATH = "edgeinfer.tcss"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("p", "pause", "pause"),
        Binding("s", "sort", "sort streams"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
    ]

    def __init__(self, source: StatsSource, history_s: int = 120) -> None:
        super().__init__()
        self.source = source
        self.history = figures.RateHistory(history_s)
        self.latest: EngineStats | None = None  # the newest snapshot received
        self.shown: EngineStats | None = None  # the snapshot on screen (older than latest while paused)
        self.received = 0  # snapshots received since start
        self.missed = 0  # snapshots received while paused
        self.down: FeedDown | None = None  # why the feed is down, None while snapshots arrive
        self.served: list[tuple[str, bool]] = []  # a server's models (id, loaded), when it serves several
        self.paused = False
        self.sort = 0  # index into figures.SORTS
        self.draws = 0  # redraws so far
        self._last_draw = 0.0  # time.monotonic() of the last redraw
        self._draw_due: Timer | None = None  # a deferred redraw of the newest snapshot
        # A line about a job running beside the dashboard (the benchmark's progress). Plain
        # attribute writes are safe from any thread; it is shown at the next status refresh.
        self.job_line = ""

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        with Horizontal(id="top"):
            yield Static(figures.DASH, id="model")
            with Grid(id="cards"):
                for card_id, label in CARDS:
                    yield Card(label, id=card_id)
        yield RateChart(self.history.span_s, id="chart")
        yield KvBar(id="kv")
        yield StreamsTable(id="streams")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#model", Static).border_title = "model"
        self.query_one(StreamsTable).show([], self.sort)
        self.refresh_status()
        self.read_feed()

    @work(exclusive=True, group="feed")
    async def read_feed(self) -> None:
        """Forward the source's events as messages; the source retries outages itself, so this runs until exit."""
        async for event in self.source.events():
            self.post_message(event)

    # --- events -------------------------------------------------------------

    def on_stats_update(self, message: StatsUpdate) -> None:
        snap = message.snapshot
        was_down = self.down is not None and self.received > 0
        self.latest, self.down = snap, None
        self.served = message.served
        self.received += 1
        self.history.add(snap.time, snap.rate.generated_tps_1s)
        if self.paused:
            self.missed += 1
        else:
            self._draw_soon()
        if was_down:
            self.notify(f"reconnected to {self.source.label}", title="feed back")
        self.refresh_status()

    def on_feed_down(self, message: FeedDown) -> None:
        if self.down is None and self.received > 0:
            self.notify(message.problem, title="feed down", severity="error")
        self.down = message
        self.refresh_status()

    # --- actions --------------------------------------------------------------

    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused and self.latest is not None:
            self.draw(self.latest)
        self.missed = 0
        self.refresh_status()

    def action_sort(self) -> None:
        self.sort = (self.sort + 1) % len(figures.SORTS)
        self.query_one(StreamsTable).show(self.shown.streams if self.shown else [], self.sort)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    # --- drawing --------------------------------------------------------------

    def _draw_soon(self) -> None:
        """Draw the newest snapshot now, or when MIN_REDRAW_S has passed since the last redraw."""
        if self._draw_due is not None:
            return  # already due; it will draw whatever is newest then
        wait = self._last_draw + MIN_REDRAW_S - time.monotonic()
        if wait <= 0 and self.latest is not None:
            self.draw(self.latest)
        else:
            self._draw_due = self.set_timer(wait, self._draw_deferred)

    def _draw_deferred(self) -> None:
        self._draw_due = None
        if not self.paused and self.latest is not None:
            self.draw(self.latest)

    def draw(self, snap: EngineStats) -> None:
        """Draw one snapshot everywhere but the status line."""
        self.shown = snap
        self.draws += 1
        self._last_draw = time.monotonic()
        for card_id, text in figures.cards(snap).items():
            self.query_one(f"#{card_id}", Card).update(text)
        served = [figures.served_line(self.served)] if len(self.served) > 1 else []
        self.query_one("#model", Static).update("\n".join([*figures.model_lines(snap), *served]))
        self.query_one(RateChart).show(self.history.series(), snap, self.history.peak())
        self.query_one(KvBar).show(snap)
        self.query_one(StreamsTable).show(snap.streams, self.sort)

    def refresh_status(self) -> None:
        status = self.query_one("#status", Static)
        status.set_class(self.down is not None, "down")
        status.set_class(self.paused, "paused")
        if self.down is not None:
            text = f"✗ {self.down.problem}" + (f" — {self.down.hint}" if self.down.hint else "")
        elif self.latest is None:
            text = f"… connecting to {self.source.label}"
        else:
            text = f"● {self.source.label}"
        if self.paused:
            text += f" · paused, {self.missed} snapshots since (p resumes)"
        if self.job_line:
            text += f" · {self.job_line}"
        status.update(text)

    def status_text(self) -> str:
        return str(self.query_one("#status", Static).content)

    def card(self, card_id: str) -> str:
        """The text a figure card shows now."""
        return self.query_one(f"#{card_id}", Card).value


def make_dashboard(source: StatsSource, history_s: int = 120) -> Dashboard:
    """The one factory: `edgeinfer top`, `serve --dashboard`, `bench --dashboard` and the tests build the app here."""
    return Dashboard(source, history_s)
