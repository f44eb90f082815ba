"""Engine configuration and per-request sampling parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.errors import ConfigError, RequestError

SPEC_MODES = ("off", "ngram", "draft", "auto")


@dataclass(slots=True)
class EngineConfig:
    """How to load the model and size the engine; every field maps to a CLI option."""

    model: Path | None = None  # None: the default model (SmolLM2-135M-Instruct Q4_1)
    parallel: int = 8  # streams decoded together at most
    ctx_size: int = 8192  # KV cells shared by all streams
    batch_size: int = 512  # tokens per llama_decode: the per-step token budget
    ubatch_size: int = 512
    threads: int = 0  # 0: one per core
    threads_batch: int = 0
    gpu_layers: int = 0
    flash_attn: str = "auto"
    kv_type: str = "f16"
    max_queue: int | None = None  # waiting requests at most; None: unbounded
    keep_prefixes: int | None = None  # finished streams whose KV is kept for reuse; None: = parallel
    spec: str = "off"  # off | ngram | draft | auto (adaptive; the draft model if given, else n-gram)
    draft_model: Path | None = None
    spec_max: int = 8  # draft tokens per stream per step at most
    draft_p_min: float = 0.5  # a draft model stops drafting below this confidence

    def validate(self) -> None:
        if not 1 <= self.parallel <= 128:
            raise ConfigError(f"--parallel {self.parallel} is out of range; use 1 to 128")
        if self.ctx_size < 64:
            raise ConfigError(f"--ctx-size {self.ctx_size} is too small; use at least 64")
        if self.batch_size < self.parallel:
            raise ConfigError(f"--batch-size {self.batch_size} must be at least --parallel ({self.parallel})")
        if self.ubatch_size < 1 or self.threads < 0 or self.threads_batch < 0 or self.gpu_layers < -1:
            raise ConfigError("--ubatch-size must be positive; --threads and --gpu-layers must not be negative")
        if self.max_queue is not None and self.max_queue < 0:
            raise ConfigError("--max-queue must not be negative")
        if self.spec not in SPEC_MODES:
            raise ConfigError(f"--spec {self.spec!r} is not one of {', '.join(SPEC_MODES)}")
        if self.spec == "draft" and self.draft_model is None:
            raise ConfigError("--spec draft needs --draft-model PATH (a smaller model of the same vocabulary)")
        if not 1 <= self.spec_max <= 32:
            raise ConfigError(f"--spec-max {self.spec_max} is out of range; use 1 to 32")
        if not 0.0 <= self.draft_p_min < 1.0:
            raise ConfigError("--draft-p-min must be in [0, 1)")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling; temperature 0 is greedy. Defaults follow llama.cpp's."""

    max_tokens: int | None = None  # None: the engine's default share of the context
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # benchmarks: generate exactly max_tokens
    logprobs: int | None = None  # None: off; k >= 0: the chosen token's logprob and the top k

    def validate(self) -> None:
        def bad(name: str, rule: str) -> RequestError:
            return RequestError(f"{name} is {getattr(self, name)!r}; it must be {rule}", name)

        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", "at least 1")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 10.0):
            raise bad("temperature", "between 0 and 10")
        if self.top_k < 0:
            raise bad("top_k", "0 (off) or more")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "above 0 and at most 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "between 0 and 1")
        if not 0.0 < self.repeat_penalty <= 10.0:
            raise bad("repeat_penalty", "above 0 and at most 10")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "between -2 and 2")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "between -2 and 2")
        if self.repeat_last_n < 0:
            raise bad("repeat_last_n", "0 or more")
        if self.seed is not None and self.seed < 0:
            raise bad("seed", "0 or more")
        if len(self.stop) > 16 or any(not isinstance(s, str) or not s for s in self.stop):
            raise RequestError("stop takes at most 16 non-empty strings", "stop")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", "between 0 and 20")
