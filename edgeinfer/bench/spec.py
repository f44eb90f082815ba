"""The benchmark's own options, declared once; the CLI derives `edgeinfer bench`'s flags from them.

The engine options (model, parallel, KV type...) are EngineConfig's, as on every command.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from edgeinfer.errors import ConfigError
from edgeinfer.options import KvType, Options

Workload = Literal["chat", "code-edit", "agent", "multi-agent", "long-prefill", "json"]


def _cli(flag: str | None = None, envvar: str | None = None) -> dict[str, Any]:
    return {"cli_flag": flag, "cli_envvar": envvar}


class BenchOptions(Options):
    """What to measure, against what, and where the results go."""

    workload: Workload = Field("chat", description="Fixed prompt set (edgeinfer/bench/workloads.py).")
    concurrency: str = Field("1,2,4,8,16,32", description="Comma-separated stream counts.")
    max_tokens: int | None = Field(
        None,
        ge=2,
        description=(
            "Tokens per stream [default: chat 128, code-edit 256, agent 64, multi-agent 48, long-prefill 32; "
            "json 256, the cap on a JSON answer]."
        ),
    )
    repeats: int = Field(2, ge=1, description="Cold+warm run pairs per level; the best is kept.")
    sockets: list[str] = Field(
        default_factory=list,
        description="An OpenAI server on this Unix socket (edgeinfer, llama-server); repeatable.",
        json_schema_extra=_cli("--socket"),
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Any OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1; repeatable.",
        json_schema_extra=_cli("--url"),
    )
    api: str = Field(
        "chat",
        description=(
            "With --socket/--url: the API to stream from: chat (completions), responses, messages; "
            "several comma-separated run side by side."
        ),
    )
    remote_model: str | None = Field(
        None, description="With --socket/--url: the model name to send (default: its first)."
    )
    api_key: str | None = Field(
        None, description="With --socket/--url: the API key.", json_schema_extra=_cli(envvar="EDGEINFER_API_KEY")
    )
    in_process: bool = Field(False, description="With --socket/--url: measure an in-process engine beside them.")
    raw: bool = Field(False, description="Also measure a bare llama_decode loop on the engine's context.")
    quality: bool = Field(False, description="Greedy agreement of these settings with --ref-model/--ref-kv-type.")
    ref_model: str | None = Field(None, description="With --quality: the reference model [default: --model].")
    ref_kv_type: KvType = Field("f16", description="With --quality: the reference's KV cache precision.")
    tune: bool = Field(False, description="Find the best settings and save them for serve and chat.")
    json_out: str | None = Field(
        None, description="Write the report as JSON to FILE, or - for stdout.", json_schema_extra=_cli("--json")
    )
    plot_out: str | None = Field(None, description="Write a PNG plot to FILE.", json_schema_extra=_cli("--plot"))
    dashboard: bool = Field(False, description="Show the live dashboard of the engine while it runs.")

    def levels(self) -> list[int]:
        if not re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", self.concurrency):
            raise ConfigError(f"--concurrency {self.concurrency!r}: use comma-separated integers, e.g. 1,4,16")
        levels = [int(x) for x in self.concurrency.split(",")]
        if min(levels) < 1 or levels != sorted(set(levels)):
            raise ConfigError("--concurrency: levels must be positive and increasing, e.g. 1,2,4,8")
        return levels
