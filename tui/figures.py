"""What the dashboard shows, computed from snapshots: formatting, derived rates, the tok/s history, sort orders.

Pure Python, no Textual, so every figure can be checked without a screen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.engine.stats import DeviceStats, EngineStats, GpuStats, StreamRow

DASH = "—"  # a figure with no value yet (no request has finished, no speculation configured)


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return DASH
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def fmt_rate(tps: float | None) -> str:
    return DASH if tps is None else f"{tps:.1f}"


def fmt_percent(fraction: float | None) -> str:
    return DASH if fraction is None else f"{100 * fraction:.1f} %"


def fmt_count(n: int) -> str:
    """134515008 -> '135M'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def cards(snap: EngineStats) -> dict[str, str]:
    """The figure cards, by widget id."""
    lat = snap.latency
    return {
        "tps": fmt_rate(snap.rate.generated_tps_1s),
        "ttft": f"{fmt_seconds(lat.ttft_p50_s)} / {fmt_seconds(lat.ttft_p95_s)}",
        "itl": f"{fmt_seconds(lat.itl_p50_s)} / {fmt_seconds(lat.itl_p95_s)}",
        "running": str(snap.requests.running),
        "waiting": str(snap.requests.waiting),
        "done": str(snap.requests.done),
        "prefix": fmt_percent(snap.prefix_cache.hit_rate),
        "spec": fmt_percent(snap.spec.acceptance),
    }


def model_lines(snap: EngineStats) -> list[str]:
    m = snap.model
    return [
        m.name or m.path or "?",
        f"{m.quantization} · {fmt_count(m.n_params)} params · {m.architecture}",
        f"context {m.ctx_size} cells · KV {m.kv_type}",
        f"parallel {m.parallel} · {threads_text(snap)}",
        *([device_split(m.devices)] if m.devices else [gpu_text(m.gpu)]),
    ]


def gpu_text(g: GpuStats) -> str:
    """'GPU 31/31 layers · 6,900 MiB free' (the card is in the stats and `edgeinfer models`), or 'CPU only'."""
    if not g.layers:
        return "CPU only" if g.device == "CPU" else "CPU only (the model does not fit the GPU)"
    free = f" · {g.free_bytes / 2**20:,.0f} MiB free" if g.total_bytes else ""
    return f"GPU {g.layers}/{g.n_layers} layers{free}"


def threads_text(snap: EngineStats) -> str:
    """'threads 2', or 'threads 1 of 2 (other work holds the rest)' while the count is fitted down."""
    st = snap.steps
    if st.threads_fitted and st.threads < st.threads_max:
        return f"threads {st.threads} of {st.threads_max} (other work holds the rest)"
    return f"threads {st.threads}"


def served_line(served: list[tuple[str, bool]]) -> str:
    """A server's models, loaded ones marked: 'models: ● smol-q8 · ○ SmolLM2-135M-Instruct.Q4_1'."""
    return "models: " + " · ".join(f"{'●' if loaded else '○'} {name}" for name, loaded in served)


def device_split(devices: list[DeviceStats]) -> str:
    """A model split over RPC workers: 'layers: CPU 10 (34 MiB) · RPC0 127.0.0.1:50052 11 (35 MiB)'."""
    return "layers: " + " · ".join(
        f"{d.device}{'' if d.where == 'local' else ' ' + d.where} {d.layers} ({fmt_bytes(d.weight_bytes)})"
        for d in devices
    )


def fmt_bytes(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def kv_text(snap: EngineStats) -> str:
    """Cells in use, the finished conversations kept in their sequences and those saved behind them (RAM, disk),
    with the turns resumed in place and the restores."""
    kv, cache, pc = snap.kv, snap.cache, snap.prefix_cache
    text = f"{kv.used_cells} / {kv.total_cells} cells"
    # Only one KV stream per sequence keeps conversations; that says the layout where the width is short.
    text += f" · kept {pc.kept}, {pc.resumed_in_place} resumed" if kv.layout == "per-seq" else f" ({kv.layout})"
    text += f" · RAM {cache.ram_entries}"
    text += f", disk {cache.disk_entries}" if cache.disk_budget_bytes else f", {fmt_bytes(cache.ram_bytes)}"
    return text + f" · {cache.ram_hits + cache.disk_hits} restored"


# --- the streams table ------------------------------------------------------

COLUMNS = ("id", "state", "prompt", "cached", "generated", "tok/s", "TTFT", "accepted", "age")
_STATE_ORDER = {"decode": 0, "prefill": 1, "waiting": 2}

# (name, key, descending): `s` cycles through these.
SORTS: list[tuple[str, Callable[[StreamRow], Any], bool]] = [
    ("id", lambda s: s.id, False),
    ("tok/s", lambda s: s.tps or 0.0, True),
    ("generated", lambda s: s.generated_tokens, True),
    ("state", lambda s: (_STATE_ORDER.get(s.state, 3), s.id), False),
]


def sorted_streams(streams: list[StreamRow], sort: int) -> list[StreamRow]:
    _, key, descending = SORTS[sort % len(SORTS)]
    return sorted(streams, key=key, reverse=descending)


def stream_cells(s: StreamRow) -> tuple[str, ...]:
    return (
        str(s.id),
        s.state,
        str(s.prompt_tokens),
        str(s.cached_tokens),
        str(s.generated_tokens),
        fmt_rate(s.tps),
        fmt_seconds(s.ttft_s),
        fmt_percent(s.acceptance),
        f"{s.age_s:.1f} s",
    )


# --- the tok/s chart --------------------------------------------------------


@dataclass(slots=True)
class RateHistory:
    """Aggregate generated tok/s, one bin per second of snapshot time, over the last span_s seconds.

    Time is the snapshots' own clock, so a scripted feed draws the same chart every run.
    A bin with no sample repeats the one before it for up to `hold_s` seconds, or 1.5 times the
    usual gap between snapshots if that is longer (`--interval 5`); longer gaps (an outage) read as 0.
    """

    span_s: int = 120
    hold_s: float = 3.0
    samples: int = 0  # snapshots added since start
    _bins: dict[int, tuple[float, int]] = field(default_factory=dict)  # second -> (sum of tok/s, samples)
    _last_t: float | None = None
    _gaps: deque[float] = field(default_factory=lambda: deque(maxlen=9))  # seconds between recent snapshots

    def add(self, t: float, tps: float) -> None:
        self.samples += 1
        sec = int(t)
        total, n = self._bins.get(sec, (0.0, 0))
        self._bins[sec] = (total + tps, n + 1)
        if self._last_t is not None and t > self._last_t:
            self._gaps.append(t - self._last_t)
        self._last_t = t if self._last_t is None else max(self._last_t, t)
        for old in [k for k in self._bins if k <= sec - self.span_s]:
            del self._bins[old]

    def hold(self) -> float:
        """Seconds a value is carried over empty bins: the median gap tells the feed's pace, an outage does not."""
        usual = sorted(self._gaps)[len(self._gaps) // 2] if self._gaps else 0.0
        return max(self.hold_s, 1.5 * usual)

    def series(self) -> list[float]:
        """Exactly span_s values, oldest first, ending at the latest sample's second (zeros before any)."""
        if self._last_t is None:
            return [0.0] * self.span_s
        end = int(self._last_t)
        out: list[float] = []
        value, seen_at, hold = 0.0, None, self.hold()
        for sec in range(end - self.span_s + 1, end + 1):
            if sec in self._bins:
                total, n = self._bins[sec]
                value, seen_at = total / n, sec
            elif seen_at is None or sec - seen_at > hold:
                value = 0.0
            out.append(value)
        return out

    def peak(self) -> float:
        return max((total / n for total, n in self._bins.values()), default=0.0)
