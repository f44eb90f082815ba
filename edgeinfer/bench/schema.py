"""The JSON report of `edgeinfer bench --json FILE`, as pydantic models.

These models are the schema: docs/bench-schema.json is generated from them
(`python -m edgeinfer.bench.schema > docs/bench-schema.json`) and a test keeps the two equal.
Adding an optional field keeps the version; renaming or removing one raises it.
Times are in seconds, rates in tokens (or requests) per second.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Figures(_Model):
    """One run: every stream of one target at one concurrency."""

    streams: int
    completion_tokens: int
    aggregate_tps: float = Field(description="generated tokens over the run's wall time, prefill included")
    aggregate_tps_each: list[float] | None = Field(
        default=None, description="aggregate_tps of every repeat, in the order run (pairs with another target's)"
    )
    decode_tps: float = Field(description="aggregate decode rate once every stream has its first token")
    per_stream_tps: float = Field(description="mean of each stream's own decode rate")
    prefill_tps: float = Field(description="prompt tokens (reused ones included) until the last first token")
    requests_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None = Field(description="gap between successive streamed chunks")
    itl_p99_s: float | None
    acceptance: float | None = Field(description="accepted / drafted tokens, where the target reports drafts")


class Side(_Model):
    cold: Figures = Field(description="the best cold run: no cached prefix matches")
    warm: Figures = Field(description="the best warm run: the shared prefix was computed by the run before")


class Level(_Model):
    concurrency: int
    targets: dict[str, Side] = Field(description="by target name")


class Target(_Model):
    name: str
    kind: Literal["engine", "raw", "socket", "url"]
    model: str | None = None
    where: str | None = Field(None, description="socket path or URL")
    config: dict[str, Any] | None = Field(None, description="engine settings, for in-process targets")


class Knee(_Model):
    parallel: int = Field(description="the recommended --parallel")
    found: bool = Field(description="false: throughput still rose at the largest level")
    gain_after: float | None = Field(description="throughput gain per doubling past the knee")
    reason: str


class Machine(_Model):
    platform: str
    python: str
    cpus: int


class Report(_Model):
    """A concurrency sweep."""

    schema_version: int = Field(SCHEMA_VERSION, alias="schema")
    kind: Literal["sweep"] = "sweep"
    time: str
    machine: Machine
    workload: Literal["chat", "code-edit", "agent", "multi-agent", "long-prefill"]
    max_tokens: int
    repeats: int
    targets: list[Target]
    levels: list[Level]
    knees: dict[str, Knee] = Field(description="by target name; empty with a single level")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def json_schema() -> dict[str, Any]:
    return Report.model_json_schema(by_alias=True)


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2))
