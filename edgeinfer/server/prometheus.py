"""GET /metrics: each loaded model's engine figures in Prometheus text format (a `model` label), read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from edgeinfer.engine.metrics import Histogram
from edgeinfer.engine.stats import EngineStats


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    buckets = [(str(b), float(c)) for b, c in zip(h.bounds, h.counts, strict=True)] + [("+Inf", float(h.n))]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.total)


class EngineCollector(Collector):
    """Collects what `read` returns, (model id, (snapshot, metrics)) per engine in memory, each sample
    labelled with its model. It holds no engine: an unloaded model's engine is gone once the pool lets it go."""

    def __init__(self, read: Callable[[], list[tuple[str, tuple[EngineStats, Any]]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for model, (snap, metrics) in self._read():
            for family in _families(snap, metrics):
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    into.samples.append(s._replace(labels={"model": model, **s.labels}))
        yield from merged.values()


def _families(snap: EngineStats, m: Any) -> Iterator[Metric]:
    """One engine's metric families (its snapshot and its Metrics), unlabelled by model."""
    req, kv, pc, spec = snap.requests, snap.kv, snap.prefix_cache, snap.spec
    yield GaugeMetricFamily("edgeinfer_requests_running", "Streams being decoded.", value=req.running)
    yield GaugeMetricFamily("edgeinfer_requests_waiting", "Streams queued for admission.", value=req.waiting)
    yield CounterMetricFamily("edgeinfer_requests", "Requests received.", value=req.total)
    finished = CounterMetricFamily("edgeinfer_streams_finished", "Streams finished, by reason.", labels=["reason"])
    for reason, n in sorted(req.finished.items()):
        finished.add_metric([reason], n)
    yield finished
    yield CounterMetricFamily("edgeinfer_prompt_tokens", "Prompt tokens of finished streams.", value=snap.tokens.prompt)
    yield CounterMetricFamily("edgeinfer_generation_tokens", "Tokens generated.", value=snap.tokens.generated)
    yield CounterMetricFamily(
        "edgeinfer_constrained_tokens", "Tokens of streams with a grammar.", value=snap.tokens.constrained
    )
    yield CounterMetricFamily(
        "edgeinfer_forced_tokens", "Tokens a grammar forced (no sampling step).", value=snap.tokens.forced
    )
    yield CounterMetricFamily(
        "edgeinfer_prompt_tokens_cached", "Prompt tokens served from kept KV.", value=pc.hit_tokens
    )
    yield CounterMetricFamily("edgeinfer_prompt_tokens_computed", "Prompt tokens computed.", value=pc.computed_tokens)
    cache = snap.cache
    hits = CounterMetricFamily("edgeinfer_cache_hits", "KV restores, by the tier they came from.", labels=["tier"])
    hits.add_metric(["ram"], cache.ram_hits)
    hits.add_metric(["disk"], cache.disk_hits)
    yield hits
    entries = GaugeMetricFamily("edgeinfer_cache_entries", "Saved conversations, by tier.", labels=["tier"])
    entries.add_metric(["ram"], cache.ram_entries)
    entries.add_metric(["disk"], cache.disk_entries)
    yield entries
    size = GaugeMetricFamily("edgeinfer_cache_bytes", "Bytes of saved KV, by tier.", labels=["tier"])
    size.add_metric(["ram"], cache.ram_bytes)
    size.add_metric(["disk"], cache.disk_bytes)
    yield size
    yield CounterMetricFamily("edgeinfer_cache_restores", "KV restores.", value=cache.restores)
    yield CounterMetricFamily(
        "edgeinfer_cache_restore_seconds", "Seconds spent restoring KV.", value=cache.restore_seconds
    )
    yield CounterMetricFamily("edgeinfer_cache_ram_evictions", "Entries evicted from RAM.", value=cache.ram_evictions)
    if pc.hit_rate is not None:
        yield GaugeMetricFamily("edgeinfer_prefix_hit_rate", "Share of prompt tokens from cache.", value=pc.hit_rate)
    if snap.model.devices:
        where = ["device", "where"]
        layers = GaugeMetricFamily("edgeinfer_device_layers", "Model layers per device.", labels=where)
        weights = GaugeMetricFamily("edgeinfer_device_weight_bytes", "Model weight bytes per device.", labels=where)
        for d in snap.model.devices:
            layers.add_metric([d.device, d.where], d.layers)
            weights.add_metric([d.device, d.where], d.weight_bytes)
        yield layers
        yield weights
    gpu = snap.model.gpu
    yield GaugeMetricFamily("edgeinfer_gpu_layers", "Model layers on the GPU (--gpu-layers).", value=gpu.layers)
    yield GaugeMetricFamily("edgeinfer_gpu_layers_total", "Model layers that can go on a GPU.", value=gpu.n_layers)
    if gpu.layers:
        yield GaugeMetricFamily(
            "edgeinfer_gpu_planned_bytes", "GPU bytes planned for the model before its load.", value=gpu.planned_bytes
        )
        if gpu.measured_bytes is not None:
            yield GaugeMetricFamily("edgeinfer_gpu_load_bytes", "GPU memory the load took.", value=gpu.measured_bytes)
        yield GaugeMetricFamily("edgeinfer_gpu_memory_free_bytes", "The GPU's free memory.", value=gpu.free_bytes)
        yield GaugeMetricFamily("edgeinfer_gpu_memory_total_bytes", "The GPU's memory.", value=gpu.total_bytes)
    yield GaugeMetricFamily("edgeinfer_kv_cells_used", "KV cells reserved or kept.", value=kv.used_cells)
    yield GaugeMetricFamily("edgeinfer_kv_cells_total", "KV cells in the context.", value=kv.total_cells)
    yield GaugeMetricFamily("edgeinfer_kv_usage_ratio", "Share of KV cells in use.", value=kv.usage)
    yield CounterMetricFamily("edgeinfer_decode_steps", "llama_decode calls.", value=snap.steps.count)
    yield CounterMetricFamily(
        "edgeinfer_decode_seconds", "Seconds spent in llama_decode.", value=snap.steps.decode_seconds
    )
    yield GaugeMetricFamily(
        "edgeinfer_threads",
        "CPU threads of the last decode (fitted to the free cores unless --threads).",
        value=snap.steps.threads,
    )
    if spec.mode != "off":
        yield CounterMetricFamily("edgeinfer_spec_drafted_tokens", "Draft tokens verified.", value=spec.drafted)
        yield CounterMetricFamily("edgeinfer_spec_accepted_tokens", "Draft tokens accepted.", value=spec.accepted)
        yield CounterMetricFamily("edgeinfer_spec_verifications", "Drafts verified.", value=spec.verifications)
        by_pos = GaugeMetricFamily(
            "edgeinfer_spec_acceptance_by_position",
            "Share of drafts accepted at each position.",
            labels=["position"],
        )
        for i, rate in enumerate(spec.acceptance_by_position, start=1):
            if rate is not None:
                by_pos.add_metric([str(i)], rate)
        yield by_pos
    yield _histogram("edgeinfer_time_to_first_token_seconds", "Submit to first token.", m.ttft_hist)
    yield _histogram("edgeinfer_inter_token_latency_seconds", "Time between a stream's tokens.", m.itl_hist)


class IgnoredCollector(Collector):
    """edgeinfer_ignored_fields_total{api, field}: requests that carried a field the server takes and ignores."""

    def __init__(self, ignored: Any) -> None:
        self._ignored = ignored

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "edgeinfer_ignored_fields", "Requests carrying a field that means nothing here.", labels=["api", "field"]
        )
        for api, fields in self._ignored.snapshot().items():
            for field, n in fields.items():
                family.add_metric([api, field], n)
        yield family
