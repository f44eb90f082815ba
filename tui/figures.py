"""What the dashboard shows, computed from snapshots: formatting, derived rates, the tok/s history, sort orders.

Pure Python, no Textual, so every figure can be checked without a screen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


def prefix_hit_rate(snap: dict[str, Any]) -> float | None:
    """Prompt tokens found in the KV cache over all prompt tokens scheduled; None before the first prompt."""
    tokens = snap.get("tokens", {})
    cached, computed = tokens.get("prompt_cached", 0), tokens.get("prompt_computed", 0)
    return cached / (cached + computed) if cached + computed else None


def spec_acceptance(holder: dict[str, Any]) -> float | None:
    """The fraction of drafted tokens accepted; None without speculation (or before any draft).

    A snapshot carries it in "spec" ({"acceptance": x}, or the counts {"accepted": a, "drafted": d});
    a stream row carries "acceptance" itself.
    """
    direct = holder.get("acceptance")
    if isinstance(direct, int | float):
        return float(direct)
    spec = holder.get("spec")
    if not isinstance(spec, dict):
        return None
    if isinstance(spec.get("acceptance"), int | float):
        return float(spec["acceptance"])
    accepted, drafted = spec.get("accepted"), spec.get("drafted")
    if isinstance(accepted, int | float) and isinstance(drafted, int | float) and drafted > 0:
        return accepted / drafted
    return None


def cards(snap: dict[str, Any]) -> dict[str, str]:
    """The figure cards, by widget id."""
    lat, req, rate = snap.get("latency", {}), snap.get("requests", {}), snap.get("rate", {})
    return {
        "tps": fmt_rate(rate.get("generated_tps_1s")),
        "ttft": f"{fmt_seconds(lat.get('ttft_p50_s'))} / {fmt_seconds(lat.get('ttft_p95_s'))}",
        "itl": f"{fmt_seconds(lat.get('itl_p50_s'))} / {fmt_seconds(lat.get('itl_p95_s'))}",
        "running": str(req.get("running", 0)),
        "waiting": str(req.get("waiting", 0)),
        "done": str(sum(req.get("finished", {}).values())),
        "prefix": fmt_percent(prefix_hit_rate(snap)),
        "spec": fmt_percent(spec_acceptance(snap)),
    }


def model_lines(snap: dict[str, Any]) -> list[str]:
    m = snap.get("model", {})
    gpu = m.get("gpu_layers", 0)
    return [
        str(m.get("name") or m.get("path", "?")),
        f"{m.get('quantization', '?')} · {fmt_count(m.get('n_params', 0))} params · {m.get('architecture', '?')}",
        f"context {m.get('ctx_size', '?')} cells · KV {m.get('kv_type', '?')}",
        f"parallel {m.get('parallel', '?')} · GPU layers {'all' if gpu < 0 else gpu}",
    ]


def kv_text(snap: dict[str, Any]) -> str:
    kv = snap.get("kv", {})
    used, total = kv.get("used_cells", 0), kv.get("total_cells", 0)
    text = f"{used} / {total} cells · {kv.get('retained_prefixes', 0)} kept prefixes"
    kept_cells = snap.get("prefix_cache", {}).get("retained_cells")
    return text if kept_cells is None else f"{text} ({kept_cells} cells)"


# --- the streams table ------------------------------------------------------

COLUMNS = ("id", "state", "prompt", "cached", "generated", "tok/s", "TTFT", "accepted", "age")
_STATE_ORDER = {"decode": 0, "prefill": 1, "waiting": 2}

# (name, key, descending): `s` cycles through these.
SORTS: list[tuple[str, Callable[[dict[str, Any]], Any], bool]] = [
    ("id", lambda s: s["id"], False),
    ("tok/s", lambda s: s.get("tps") or 0.0, True),
    ("generated", lambda s: s.get("generated_tokens", 0), True),
    ("state", lambda s: (_STATE_ORDER.get(s.get("state", ""), 3), s["id"]), False),
]


def sorted_streams(streams: list[dict[str, Any]], sort: int) -> list[dict[str, Any]]:
    _, key, descending = SORTS[sort % len(SORTS)]
    return sorted(streams, key=key, reverse=descending)


def stream_cells(s: dict[str, Any]) -> tuple[str, ...]:
    return (
        str(s["id"]),
        s.get("state", "?"),
        str(s.get("prompt_tokens", 0)),
        str(s.get("cached_tokens", 0)),
        str(s.get("generated_tokens", 0)),
        fmt_rate(s.get("tps")),
        fmt_seconds(s.get("ttft_s")),
        fmt_percent(spec_acceptance(s)),
        f"{s.get('age_s', 0.0):.1f} s",
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
