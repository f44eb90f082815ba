"""EngineStats: the typed picture of an engine that the stats API, /metrics, the dashboard and the benchmark read.

The engine fills it (Engine.snapshot()); `GET /v1/edgeinfer/stats` sends it as JSON and
the dashboard reads that JSON back into it. Every derived figure (hit rate, acceptance)
is computed here, once. Fields have defaults so that a snapshot from an older server
still reads.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field

from edgeinfer.engine.scheduler import Status


class _Stats(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ModelStats(_Stats):
    name: str = ""
    path: str = ""
    architecture: str = "?"
    quantization: str = "?"
    n_params: int = 0
    ctx_size: int = 0  # KV cells
    parallel: int = 0
    gpu_layers: int = 0
    kv_type: str = "?"


class RequestStats(_Stats):
    running: int = 0  # streams being decoded
    waiting: int = 0  # streams queued for admission
    total: int = 0  # requests received
    finished: dict[str, int] = {}  # streams finished, by reason

    @property
    def done(self) -> int:
        return sum(self.finished.values())


class KvStats(_Stats):
    layout: str = "?"  # per-seq (one KV stream per sequence) | unified
    used_cells: int = 0  # reserved by running streams
    total_cells: int = 0
    cells_per_seq: int = 0  # what one stream can hold

    @property
    def usage(self) -> float:
        return self.used_cells / self.total_cells if self.total_cells else 0.0


class TokenStats(_Stats):
    prompt: int = 0  # prompt tokens of finished streams
    generated: int = 0


class PrefixCacheStats(_Stats):
    hit_tokens: int = 0  # prompt tokens whose KV was restored or copied instead of computed
    computed_tokens: int = 0  # prompt tokens computed

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hit_rate(self) -> float | None:
        """Prompt tokens found in the cache over all prompt tokens scheduled; None before the first prompt."""
        total = self.hit_tokens + self.computed_tokens
        return self.hit_tokens / total if total else None


class CacheStats(_Stats):
    """The tiers behind the KV cells: finished conversations' KV in host RAM and on disk."""

    ram_entries: int = 0
    ram_bytes: int = 0
    ram_budget_bytes: int = 0
    disk_entries: int = 0
    disk_bytes: int = 0
    disk_budget_bytes: int = 0
    disk_error: str | None = None  # why the disk tier is off, if it is
    ram_hits: int = 0  # restores served from RAM
    disk_hits: int = 0  # restores read from disk
    restores: int = 0
    restore_failures: int = 0
    restore_seconds: float = 0.0
    saves: int = 0
    save_seconds: float = 0.0
    ram_evictions: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def restore_ms_mean(self) -> float | None:
        return 1000 * self.restore_seconds / self.restores if self.restores else None


class RateStats(_Stats):
    generated_tps_1s: float = 0.0
    generated_tps_10s: float = 0.0


class LatencyStats(_Stats):
    """Over the last minute, in seconds."""

    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None


class StepStats(_Stats):
    count: int = 0  # llama_decode calls
    decode_seconds: float = 0.0


class SpecStats(_Stats):
    mode: str = "off"
    source: str | None = None  # ngram | draft
    error: str | None = None  # why speculation stopped, if it did
    drafted: int = 0
    accepted: int = 0
    verifications: int = 0
    drafted_at: list[int] = []  # drafts made at position i + 1
    accepted_at: list[int] = []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mean_accepted(self) -> float | None:
        """Accepted draft tokens per verification."""
        return self.accepted / self.verifications if self.verifications else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def acceptance_by_position(self) -> list[float | None]:
        return [a / d if d else None for a, d in zip(self.accepted_at, self.drafted_at, strict=False)]


class StreamRow(_Stats):
    """One running or waiting stream."""

    id: int
    index: int = 0
    state: str = "?"  # prefill | decode | waiting
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    tps: float | None = None
    ttft_s: float | None = None
    drafted: int = 0
    accepted: int = 0
    age_s: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class EngineStats(_Stats):
    """The engine at one moment."""

    time: float = 0.0  # time.time() when taken
    model: ModelStats = ModelStats()
    requests: RequestStats = RequestStats()
    kv: KvStats = KvStats()
    tokens: TokenStats = TokenStats()
    prefix_cache: PrefixCacheStats = PrefixCacheStats()
    cache: CacheStats = CacheStats()
    rate: RateStats = RateStats()
    latency: LatencyStats = LatencyStats()
    steps: StepStats = StepStats()
    spec: SpecStats = SpecStats()
    streams: list[StreamRow] = []


def build_stats(engine: Any) -> EngineStats:
    """Fill EngineStats from an engine's parts; the caller holds the engine's lock."""
    now = time.perf_counter()
    sched, m, info, config = engine.sched, engine.metrics, engine.model.info, engine.config
    spec = engine.spec
    rows = []
    for live in engine.delivery.live.values():
        s = live.stream
        if s.status == Status.WAITING:
            state = "waiting"
        elif s.n_computed < s.n_prompt - 1 or s.fork_pending:
            state = "prefill"
        else:
            state = "decode"
        span = live.t_last - live.t_first
        drafted, accepted = spec.drafted_for(s.id) if spec is not None else (0, 0)
        rows.append(
            StreamRow(
                id=s.id,
                index=s.index,
                state=state,
                prompt_tokens=s.n_prompt,
                cached_tokens=s.n_cached,
                generated_tokens=s.n_generated,
                tps=(s.n_generated - 1) / span if s.n_generated > 1 and span > 0 else None,
                ttft_s=live.t_first - live.t_submit if live.t_first else None,
                drafted=drafted,
                accepted=accepted,
                age_s=now - live.t_submit,
            )
        )
    return EngineStats(
        time=time.time(),
        model=ModelStats(
            name=info.name,
            path=str(engine.model_path),
            architecture=info.architecture,
            quantization=info.quantization,
            n_params=engine.model.n_params,
            ctx_size=engine.n_ctx,
            parallel=config.parallel,
            gpu_layers=config.gpu_layers,
            kv_type=config.kv_type,
        ),
        requests=RequestStats(
            running=len(sched.running), waiting=sched.n_waiting, total=m.requests, finished=dict(m.finished)
        ),
        kv=KvStats(
            layout=config.kv_layout,
            used_cells=sched.cells_used,
            total_cells=engine.n_ctx,
            cells_per_seq=engine.ctx.n_ctx_seq,
        ),
        tokens=TokenStats(prompt=m.prompt_tokens, generated=m.generated_tokens),
        prefix_cache=PrefixCacheStats(
            hit_tokens=sched.prompt_tokens_cached, computed_tokens=sched.prompt_tokens_computed
        ),
        cache=engine.store.refresh_stats().model_copy() if engine.store is not None else CacheStats(),
        rate=RateStats(generated_tps_1s=m.generated_tps(1.0), generated_tps_10s=m.generated_tps(10.0)),
        latency=LatencyStats(**m.rolling()),
        steps=StepStats(count=m.steps, decode_seconds=m.decode_seconds),
        spec=spec.stats() if spec is not None else SpecStats(mode="off", error=engine.spec_error),
        streams=rows,
    )
