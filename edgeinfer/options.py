"""Every engine option and every sampling setting, declared once.

Each field's type, range, default and help text live here and nowhere else. The CLI's
flags (edgeinfer.cli.flags), the settings file (edgeinfer.settings), the server's
request schema (edgeinfer.server.schema) and the benchmark all derive from these two
models, so a new option is one new field. Values are checked when a model is built:
EngineConfig raises ConfigError naming the flag, SamplingParams raises RequestError
naming the parameter, and the engine trusts what it is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgeinfer.errors import ConfigError, RequestError

SpecMode = Literal["off", "ngram", "draft", "auto"]
KvLayout = Literal["per-seq", "unified"]
KvType = Literal["f16", "q8_0", "q4_0"]
FlashAttn = Literal["auto", "on", "off"]
ToolFormatName = Literal["auto", "hermes", "llama3", "mistral", "qwen3-coder", "generic"]
ReasoningFormat = Literal["auto", "deepseek", "none"]
# A layer count (-1: all), or "auto": fitted to the GPU's free memory (engine/offload.py).
GpuLayers = Annotated[int | Literal["auto"], Field(union_mode="left_to_right")]

MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 256  # characters per stop string
MAX_GRAMMAR_CHARS = 65_536  # characters of one schema or grammar
MAX_LOGIT_BIAS = 1024  # tokens one request may bias


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's cpuset), else every core.
    The default thread count: a thread more than the cores it may use waits at each of llama.cpp's barriers."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def flag(name: str) -> str:
    """The command-line flag of a field: parallel -> --parallel, ctx_size -> --ctx-size."""
    return "--" + name.replace("_", "-")


def _cli(*short: str, commands: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Field metadata for the CLI: short flags, and the commands that show the option (None: all)."""
    return {"cli_short": list(short), "cli_commands": list(commands) if commands else None}


def problems(e: ValidationError, name_of: Any = str) -> str:
    """A ValidationError as one line: each bad field by the name the user typed, its value, and the rule."""
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err.get("loc", ())]
        where = name_of(loc[0]) + "".join(f"[{x}]" for x in loc[1:]) if loc else "value"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            parts.append(f"{where} is not a known option")
        elif "input" in err and err.get("type") not in ("missing", "value_error") and loc:
            parts.append(f"{where} {err['input']!r}: {msg}")
        else:
            parts.append(f"{where}: {msg}" if loc else msg)
    return "; ".join(parts)


class Options(BaseModel):
    """Options a person sets by flag or in the settings file: a bad value raises ConfigError naming the flag."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise ConfigError(problems(e, flag)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise ConfigError(problems(e, flag)) from None


class EngineConfig(Options):
    """How to load the model and size the engine. Every field is a command-line option."""

    model: Path = Field(
        None,  # type: ignore[assignment]  # resolved to the default model's path
        validate_default=True,
        description="GGUF file, catalog name, a model another tool downloaded (qwen2.5:0.5b), or a Hub repo "
        "owner/repo[:QUANT], pulled on first use [default: SmolLM2-135M-Instruct Q4_1].",
        json_schema_extra=_cli("-m"),
    )
    parallel: int = Field(
        0,
        ge=0,
        le=128,
        description="Streams decoded together (0: as many as --kv-budget holds at the stream's context, up to 8).",
        json_schema_extra=_cli("-p"),
    )
    ctx_size: int = Field(
        0,
        ge=0,
        description="KV cells for all streams (0: each stream holds the model's trained context, as --kv-budget "
        "allows).",
        json_schema_extra=_cli("-c"),
    )
    kv_budget: int = Field(
        0, ge=0, description="MiB the KV cache may take when --ctx-size or --parallel is 0 (0: a quarter of RAM)."
    )
    batch_size: int = Field(512, ge=1, description="Tokens per decode step.", json_schema_extra=_cli("-b"))
    ubatch_size: int = Field(512, ge=1, description="Tokens per physical compute pass.")
    threads: int = Field(
        0, ge=0, description="CPU threads (0: the cores this process may use).", json_schema_extra=_cli("-t")
    )
    threads_batch: int = Field(0, ge=0, description="CPU threads for prompt processing (0: as --threads).")
    gpu_layers: GpuLayers = Field(
        "auto",
        description="Layers to offload to the GPU: auto (as many as its free memory holds, less 1 GiB), a count, "
        "or -1 for all.",
        json_schema_extra=_cli("-ngl"),
    )
    gpu_memory: int = Field(
        0, ge=0, description="MiB --gpu-layers auto may fill on the GPU (0: its free memory less 1 GiB)."
    )
    flash_attn: FlashAttn = Field(
        "auto",
        description="Flash attention. auto: on the CPU, on for sliding-window models (Gemma 3) and off for others "
        "(it halves their decode speed there at long contexts); llama.cpp's choice on a GPU or with a quantized KV "
        "cache.",
    )
    kv_type: KvType = Field("f16", description="KV cache precision.")
    kv_layout: KvLayout = Field(
        "per-seq",
        description="per-seq: each stream attends over its own share (--ctx-size / --parallel) only; "
        "unified: one pool, a stream may use the whole context but every stream reads every cell.",
    )
    cache_ram: int = Field(2048, ge=0, description="MiB of host RAM for finished conversations' KV (0: off).")
    cache_dir: Path | None = Field(None, description="Also keep finished conversations' KV here, across restarts.")
    cache_dir_max: int = Field(8192, ge=1, description="MiB the --cache-dir folder may hold.")
    max_queue: int = Field(
        64,
        ge=0,
        description="Waiting requests before new ones get 503.",
        json_schema_extra=_cli(commands=("serve",)),
    )
    spec: SpecMode = Field("auto", description="Speculative decoding; auto drafts only where its measured costs pay.")
    draft_model: Path | None = Field(None, description="Draft GGUF of the same vocabulary (for --spec draft/auto).")
    spec_max: int = Field(8, ge=1, le=32, description="Draft tokens per stream per step at most.")
    draft_p_min: float = Field(0.5, ge=0.0, lt=1.0, description="A draft model stops below this confidence.")
    draft_gpu_layers: GpuLayers = Field(
        "auto",
        description="The draft model's layers on the GPU: auto (all of them when the target is whole there and "
        "room remains), a count, or -1 for all.",
        json_schema_extra=_cli("-ngld"),
    )
    spec_verify: Literal["match", "rejection"] = Field(
        "match",
        description="How draft-model drafts are checked at temperature > 0: match (the stream's own sampler "
        "draws every token, so seeded output equals --spec off) or rejection (rejection sampling against the "
        "draft's probabilities: more drafts accepted, the same output law, but other seeded text).",
    )

    tool_format: ToolFormatName = Field(
        "auto",
        description="How tools and tool calls are written: auto picks the format the model's chat template was "
        "written for (hermes, llama3, mistral, qwen3-coder); generic describes the tools in a system message, "
        "for templates that know none.",
    )
    reasoning_format: ReasoningFormat = Field(
        "auto",
        description="Where a reasoning model's thinking goes: auto: apart from the answer (reasoning_content, "
        "a reasoning item, thinking blocks) when the chat template thinks; deepseek: apart always (<think> tags); "
        "none: left in the answer's text.",
    )
    reasoning_budget: int = Field(
        -1,
        ge=-1,
        description="Thinking tokens at most, unless a request asks otherwise (-1: no bound; 0: no thinking); "
        "at the budget the close tag is forced.",
    )

    rpc: str | None = Field(
        None,
        description="ggml RPC workers (`edgeinfer worker`), HOST:PORT[,HOST:PORT...]: the model's layers are split "
        "across this machine and them. Unauthenticated and unencrypted: trusted networks or tunnels only.",
    )
    tensor_split: str | None = Field(
        None,
        description="With --rpc: shares of the layers, this machine first, then each worker's device, e.g. 1,2,2 "
        "[default: by each device's free memory].",
    )

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with some options changed, checked like a new config."""
        return EngineConfig(**{**self.model_dump(), **changes})

    @field_validator("cache_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("model", "draft_model", mode="before")
    @classmethod
    def _resolve(cls, value: str | Path | None, info: Any) -> Path | None:
        # Model names are resolved once, here: a path, a catalog name, or the default model.
        if value is None and info.field_name == "draft_model":
            return None
        from edgeinfer.models.catalog import resolve_model

        return resolve_model(value)

    @field_validator("rpc", mode="after")
    @classmethod
    def _endpoints(cls, value: str | None) -> str | None:
        return None if value is None else ",".join(f"{h}:{p}" for h, p in parse_endpoints(value))

    @field_validator("tensor_split", mode="after")
    @classmethod
    def _shares(cls, value: str | None) -> str | None:
        return None if value is None else ",".join(f"{x:g}" for x in parse_shares(value))

    @property
    def rpc_endpoints(self) -> list[tuple[str, int]]:
        return parse_endpoints(self.rpc) if self.rpc else []

    @field_validator("gpu_layers", "draft_gpu_layers", mode="before")
    @classmethod
    def _layers(cls, value: Any) -> Any:
        if value == "auto":
            return value
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = -2
        if n < -1 or isinstance(value, float | bool):
            raise ValueError("a layer count, -1 for all of them, or auto")
        return n

    @field_validator("ctx_size", mode="after")
    @classmethod
    def _cells(cls, value: int) -> int:
        if 0 < value < 64:
            raise ValueError("at least 64 cells, or 0 for the model's trained context")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EngineConfig:
        if self.tensor_split is not None and not self.rpc:
            raise ValueError("--tensor-split needs --rpc (it shares the layers between this machine and workers)")
        if self.batch_size < self.parallel:
            raise ValueError(f"--batch-size {self.batch_size} must be at least --parallel ({self.parallel})")
        if self.spec == "draft" and self.draft_model is None:
            raise ValueError("--spec draft needs --draft-model PATH (a smaller model of the same vocabulary)")
        return self


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """'host:port,host:port' -> [(host, port)]; ValueError naming the bad entry."""
    out = []
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{part.strip()!r} is not HOST:PORT (e.g. 127.0.0.1:50052)")
        out.append((host.strip("[]"), int(port)))
    if len(set(out)) != len(out):
        raise ValueError("a worker is named twice")
    return out


def parse_shares(text: str) -> list[float]:
    """'1,2,2' -> [1.0, 2.0, 2.0]; ValueError unless numbers >= 0, not all 0."""
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of numbers (e.g. 1,2,2)") from None
    if any(not x >= 0 or x == float("inf") for x in shares) or not any(shares):
        raise ValueError(f"{text!r}: shares must be numbers >= 0, at least one above 0")
    return shares


class SamplingFields(BaseModel):
    """The sampling settings a client may send; the server's request schema inherits these fields."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    temperature: float = Field(0.8, ge=0.0, le=2.0, allow_inf_nan=False, description="0 is greedy.")
    top_k: int = Field(40, ge=0, description="Sample from the k most likely tokens (0: all).")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    min_p: float = Field(0.05, ge=0.0, le=1.0, description="Drop tokens below this share of the best one.")
    repeat_penalty: float = Field(1.0, gt=0.0, le=10.0, description="Penalty on recently seen tokens (1: off).")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Penalty growing with a token's count.")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Penalty on any token already present.")
    repeat_last_n: int = Field(64, ge=0, description="Tokens the penalties look back over.")
    seed: int | None = Field(None, ge=0, description="Seed for reproducible sampling.")
    stop: Annotated[list[str], Field(max_length=MAX_STOPS)] = Field(
        default_factory=list, description=f"Stop string (repeatable; at most {MAX_STOPS})."
    )
    ignore_eos: bool = Field(
        False,
        description="Generate exactly max_tokens, never picking an end-of-text token (as llama-server; benchmarks).",
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, values: Any) -> Any:
        # Clients send `"temperature": null` to mean "your default".
        if isinstance(values, dict):
            return {k: v for k, v in values.items() if v is not None or k not in SAMPLING_FIELDS}
        return values

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if any(not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop string must be 1 to {MAX_STOP_CHARS} characters")
        return stops

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def has_penalties(self) -> bool:
        """Penalties depend on every emitted token: the sampler must see the prompt, speculation must step aside."""
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


SAMPLING_FIELDS = frozenset(SamplingFields.model_fields)

# The sampling a model's makers recommend, in its GGUF (llama.cpp's general.sampling.* keys): the defaults of
# the fields a request leaves out, as on llama-server.
MODEL_SAMPLING_KEYS = {
    "temperature": "general.sampling.temp",
    "top_k": "general.sampling.top_k",
    "top_p": "general.sampling.top_p",
    "min_p": "general.sampling.min_p",
}


def model_sampling(metadata: dict[str, Any]) -> dict[str, Any]:
    """The recommended sampling a GGUF's metadata carries, each value checked as a request's would be (one out of
    range is left out: the usual default stands)."""
    out: dict[str, Any] = {}
    for field, key in MODEL_SAMPLING_KEYS.items():
        if key not in metadata:
            continue
        try:
            out[field] = getattr(SamplingFields.model_validate({field: metadata[key]}), field)
        except ValueError:
            continue
    return out


class Grammar(BaseModel):
    """An output constraint: a JSON Schema (as JSON text), a Lark grammar (llguidance's dialect) or a regex."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["json_schema", "lark", "regex"]
    source: str = Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)
    origin: str = "grammar"  # the request field it came from, named in errors


class SamplingParams(SamplingFields):
    """How one request samples, as the engine takes it; temperature 0 is greedy. Defaults follow llama.cpp's."""

    max_tokens: int | None = Field(
        None, ge=1, description="Tokens to generate at most [default: the engine's share of the context]."
    )
    logprobs: int | None = Field(None, ge=0, le=20, description="Log-probabilities of the top k alternatives.")
    grammar: Grammar | None = Field(None, description="Constrain the output to this schema or grammar.")
    logit_bias: Annotated[dict[int, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)] = (
        Field(default_factory=dict, description="Added to the logits of these token ids (-100 bans a token).")
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            first = e.errors()[0].get("loc", ("",))
            raise RequestError(problems(e), str(first[0]) if first else None) from None


@dataclass(slots=True)
class ContextParams:
    """llama.cpp context settings that matter on consumer hardware."""

    n_ctx: int = 8192
    n_batch: int = 512  # tokens per llama_decode (the per-step token budget)
    n_ubatch: int = 512  # tokens per physical compute pass
    n_seq_max: int = 16
    n_threads: int = 0  # 0: usable_cores()
    n_threads_batch: int = 0
    flash_attn: str = "auto"
    kv_type: str = "f16"
    kv_unified: bool = False  # one cell pool for all sequences; False: one KV stream of n_ctx / n_seq_max each
