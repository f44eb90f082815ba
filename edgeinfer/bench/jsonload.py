"""`bench --workload json`: constrained decoding against free decoding, the same work, in one engine.

At each concurrency, four runs (each repeated --repeats times, the best kept), each with its
own cold prompts (a fresh head per run):
- mixed: half the streams answer a battery schema (greedy, until the JSON closes), half write
  free text; every constrained answer is checked with jsonschema;
- mixed, free twin: the same prompts, all free, each stream generating exactly as many
  tokens as it did in the mixed run (end of text ignored);
- long keys: every stream fills the long-keys schema, where most tokens are forced;
- long keys, free twin: the same prompts, free, the same token counts.
Both sides of each pair generate the same tokens per stream, so the ratio of their
aggregate tok/s is the cost (below 1) or the gain (above 1) of the grammar.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from edgeinfer.bench.battery import CASES, Case, check, schema_text
from edgeinfer.bench.workloads import json_prompt
from edgeinfer.engine import Engine
from edgeinfer.options import Grammar, SamplingParams

LONG_KEYS = next(c for c in CASES if c.name == "long_keys")
Say = Callable[[str], None]


@dataclass(slots=True)
class JsonLevel:
    streams: int
    mixed_tps: float  # aggregate tok/s, half the streams constrained
    mixed_free_tps: float  # the same work, all free
    keys_tps: float  # every stream on the long-keys schema
    keys_free_tps: float
    valid: int  # constrained answers that parse and validate
    answers: int
    forced_share: float  # of the long-keys answers' tokens, the share the grammar forced

    @property
    def mixed_ratio(self) -> float:
        return self.mixed_tps / self.mixed_free_tps

    @property
    def keys_ratio(self) -> float:
        return self.keys_tps / self.keys_free_tps


@dataclass(slots=True)
class _Stream:
    prompt: str
    case: Case | None  # None: free text
    max_tokens: int


def _run(engine: Engine, streams: list[_Stream], head: str, free: bool) -> tuple[float, list[Any]]:
    """Submit every stream at once; (aggregate tok/s, the finishes)."""
    prompts = [engine.chat_prompt([{"role": "user", "content": f"{head}{s.prompt}"}]) for s in streams]
    params = []
    for s in streams:
        if s.case is None or free:
            params.append(SamplingParams(temperature=0.0, max_tokens=s.max_tokens, ignore_eos=True))
        else:
            grammar = Grammar(kind="json_schema", source=schema_text(s.case))
            params.append(SamplingParams(temperature=0.0, max_tokens=s.max_tokens, grammar=grammar))
    t0 = time.perf_counter()
    handles = [engine.submit(p, sp)[0] for p, sp in zip(prompts, params, strict=True)]
    finishes = [h.result() for h in handles]
    seconds = time.perf_counter() - t0
    return sum(f.stats.completion_tokens for f in finishes) / seconds, finishes


def _best(engine: Engine, streams: list[_Stream], head: str, free: bool, repeats: int) -> tuple[float, list[Any]]:
    """The best aggregate tok/s of `repeats` runs (each cold: its own head), and the first run's finishes."""
    runs = [_run(engine, streams, f"{head}{k}] ", free) for k in range(repeats)]
    return max(tps for tps, _ in runs), runs[0][1]


def _twin(streams: list[_Stream], finishes: list[Any]) -> list[_Stream]:
    """The same prompts, free, each generating the tokens its constrained run did."""
    return [_Stream(s.prompt, None, max(1, f.stats.completion_tokens)) for s, f in zip(streams, finishes, strict=True)]


def run_json_bench(engine: Engine, levels: list[int], max_tokens: int, repeats: int, say: Say) -> list[JsonLevel]:
    engine.grammars.tokenizer()  # built once per engine (about half a second): not part of any run
    out = []
    for n in levels:
        say(f"json: {n} streams")
        mixed = [_Stream(json_prompt(i), None if i % 2 else CASES[i // 2 % len(CASES)], max_tokens) for i in range(n)]
        mixed_tps, finishes = _best(engine, mixed, f"[mixed {n} ", False, repeats)
        mixed_free_tps, _ = _best(engine, _twin(mixed, finishes), f"[mixed free {n} ", True, repeats)
        answers = [(s.case, f) for s, f in zip(mixed, finishes, strict=True) if s.case is not None]
        keys = [_Stream(f"Customer {i}: {LONG_KEYS.prompt}", LONG_KEYS, max_tokens) for i in range(n)]
        forced_before = engine.metrics.forced_tokens
        keys_tps, key_finishes = _best(engine, keys, f"[keys {n} ", False, repeats)
        forced = (engine.metrics.forced_tokens - forced_before) / repeats
        keys_free_tps, _ = _best(engine, _twin(keys, key_finishes), f"[keys free {n} ", True, repeats)
        answers += [(LONG_KEYS, f) for f in key_finishes]
        valid = sum(1 for case, f in answers if f.finish_reason == "stop" and check(case, f.text) is None)
        key_tokens = sum(f.stats.completion_tokens for f in key_finishes)
        out.append(
            JsonLevel(n, mixed_tps, mixed_free_tps, keys_tps, keys_free_tps, valid, len(answers), forced / key_tokens)
        )
    return out


def print_json_bench(results: list[JsonLevel], echo: Say) -> None:
    echo("\nconstrained against free decoding (greedy; each free twin generates the same tokens per stream)")
    echo(
        f"{'streams':>7}  {'half JSON tok/s':>15}  {'all free':>8}  {'ratio':>5}  "
        f"{'long keys tok/s':>15}  {'free':>6}  {'ratio':>5}  {'forced':>6}  {'valid':>7}"
    )
    for r in results:
        echo(
            f"{r.streams:>7}  {r.mixed_tps:>15.1f}  {r.mixed_free_tps:>8.1f}  {r.mixed_ratio:>5.2f}  "
            f"{r.keys_tps:>15.1f}  {r.keys_free_tps:>6.1f}  {r.keys_ratio:>5.2f}  {r.forced_share:>6.0%}  "
            f"{r.valid:>3}/{r.answers:<3}"
        )


def json_report(results: list[JsonLevel]) -> dict[str, Any]:
    return {
        "workload": "json",
        "levels": [{**asdict(r), "mixed_ratio": r.mixed_ratio, "keys_ratio": r.keys_ratio} for r in results],
    }
