"""Where one stream's time goes as its context grows: llama_decode in each KV layout, and the engine around it.

    .venv/bin/python scripts/one_stream_breakdown.py

For each context length (a prompt of that many token ids, then --max-tokens greedy tokens)
it runs, taking turns, best of --repeats:

- a bare loop (edgeinfer.bench.rawloop: fill the batch, llama_decode, pick the largest logit)
  on a context with one KV stream per sequence (the engine's layout) and on one with a unified
  pool (llama-server --kv-unified's), both with --parallel sequences and --ctx-size cells;
- the engine itself with serve's settings (threads fitted), once with --spec off and once with
  --spec auto (its default), instrumented: per step,
  the time in llama_decode, in drafting, in the rest of the step (sampling, text, events),
  and between steps (handing events out, waiting); the slowest steps with what they held
  (drafts, a thread change, a garbage collection).

Prints a table per length and the slowest steps; --json writes everything.

    .venv/bin/python scripts/one_stream_breakdown.py --step-costs

instead times one llama_decode of 1, 2, 3, 4 and 8 tokens of one stream (with logits for every
row, as draft verification asks; 3 tokens also with the last row's only) after a context of
each length: what a speculative verify step costs against an ordinary one.

    .venv/bin/python scripts/one_stream_breakdown.py --estimates

instead gives one engine (--spec auto) a prompt of each length in turn, as a server meets them,
and prints every step with drafts: the time it took against the controller's estimate of it just
before, and each answer's ITL p50 and p99 (the speculation's step costs going stale as the context
grows showed here).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The bare loops run on this thread and each engine on its own: three OpenMP teams on a small machine, where
# libgomp's defaults throttle every team's spinning and slow them all (docs/benchmarks.md, run H). ACTIVE with
# libgomp's default spin count keeps them spinning as one team would; set before llama.cpp loads libgomp
# (edgeinfer.openmp imports nothing of it).
from edgeinfer.openmp import SPINNING

os.environ.setdefault("OMP_WAIT_POLICY", SPINNING["OMP_WAIT_POLICY"])
os.environ.setdefault("GOMP_SPINCOUNT", SPINNING["GOMP_SPINCOUNT"])

from one_stream import pct, prompt_ids

from edgeinfer.bench.rawloop import run_raw
from edgeinfer.llamacpp import Batch, Context, Model
from edgeinfer.models.catalog import resolve_model
from edgeinfer.options import ContextParams, EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine


def bare(model: Model, args: argparse.Namespace, unified: bool, prompt: list[int]) -> dict[str, Any]:
    params = ContextParams(
        n_ctx=args.ctx_size, n_seq_max=args.parallel, n_threads=args.threads, n_threads_batch=args.threads,
        flash_attn="off", kv_unified=unified,
    )  # fmt: skip
    ctx = Context(model, params)
    try:
        result = run_raw(ctx, [prompt], args.max_tokens)
    finally:
        ctx.close()
    arrivals = result.streams[0].arrivals
    gaps = [1000 * (b - a) for a, b in itertools.pairwise(arrivals)]
    return {
        "decode_tps": len(gaps) / (arrivals[-1] - arrivals[0]),
        "ttft_s": result.streams[0].ttft_s,
        "step_p50_ms": pct(gaps, 0.5),
        "step_p99_ms": pct(gaps, 0.99),
    }


def step_costs(model: Model, args: argparse.Namespace, length: int, rounds: int = 6) -> None:
    """Print the best (over rounds) median time of a decode of k tokens, against one token."""
    params = ContextParams(
        n_ctx=args.ctx_size, n_seq_max=args.parallel, n_threads=args.threads, n_threads_batch=args.threads,
        flash_attn="off",
    )  # fmt: skip
    ctx = Context(model, params)
    batch = Batch(ctx.n_batch)
    try:
        prompt = prompt_ids(length, length, lambda t: model.vocab.tokenize(t, add_special=False))
        for i in range(0, length, ctx.n_batch):
            batch.clear()
            chunk = prompt[i : i + ctx.n_batch]
            batch.add(0, chunk, i, i + len(chunk) == length)
            ctx.decode(batch)
        shapes = [(1, False), (2, True), (3, True), (3, False), (4, True), (8, True)]
        best: dict[tuple[int, bool], float] = {}
        for _ in range(rounds):
            for k, every_row in shapes:
                times = []
                for _ in range(8):
                    batch.clear()
                    batch.add(0, prompt[:k], length, True, 0 if every_row else -1)
                    t = time.perf_counter()
                    ctx.decode(batch)
                    times.append(1000 * (time.perf_counter() - t))
                    ctx.seq_rm(0, length, -1)  # back to the context alone, as rejected drafts leave it
                ms = statistics.median(times[1:])
                best[k, every_row] = min(best.get((k, every_row), ms), ms)
        one = best[1, False]
        for (k, every_row), ms in best.items():
            rows = "every row's logits" if every_row else "the last row's logits"
            print(f"{length:>6} tokens of context: {k} token(s), {rows:<22} {ms:7.2f} ms  {ms / one:.2f}x")
    finally:
        batch.close()
        ctx.close()


class Probe:
    """Wraps one engine's step, decode, drafting and event hand-out, and the garbage collector."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.steps: list[dict[str, Any]] = []
        self.gcs: list[tuple[float, float]] = []
        self._gc_start = 0.0
        self._cur: dict[str, Any] = {}
        iterate, propose, decode, flush = engine._iterate, engine._propose, engine.ctx.decode, engine._flush

        def timed_iterate() -> None:
            t = time.perf_counter()
            self._cur = {"start": t, "decode_ms": 0.0, "draft_ms": 0.0, "n_tokens": 0, "threads": engine.ctx.threads}
            iterate()
            self._cur["end"] = time.perf_counter()
            self.steps.append(self._cur)

        def timed_propose() -> Any:
            t = time.perf_counter()
            drafts = propose()
            self._cur["draft_ms"] = 1000 * (time.perf_counter() - t)
            self._cur["n_draft"] = sum(len(d) for d in drafts.values())
            return drafts

        def timed_decode(batch: Any) -> bool:
            t = time.perf_counter()
            ok = decode(batch)
            self._cur["decode_ms"] = 1000 * (time.perf_counter() - t)
            self._cur["n_tokens"] = batch.n
            self._cur["threads"] = engine.ctx.threads
            return bool(ok)

        def timed_flush() -> None:
            t = time.perf_counter()
            flush()
            if self.steps:
                self.steps[-1]["flush_ms"] = 1000 * (time.perf_counter() - t)

        engine._iterate, engine._propose, engine.ctx.decode, engine._flush = (
            timed_iterate,
            timed_propose,
            timed_decode,
            timed_flush,
        )
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gcs.append((self._gc_start, time.perf_counter()))

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


def engine_run(engine: Any, prompt: list[int], args: argparse.Namespace) -> dict[str, Any]:
    probe = Probe(engine)
    arrivals: list[float] = []
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        (handle,) = engine.submit(prompt, params)
        t0 = time.perf_counter()
        for _ in handle:  # Chunks and the Finish, as the engine hands them out
            arrivals.append(time.perf_counter())
        ttft = arrivals[0] - t0
    finally:
        probe.close()
        for attr in ("_iterate", "_propose", "_flush"):
            engine.__dict__.pop(attr, None)
        engine.ctx.__dict__.pop("decode", None)
    arrivals = arrivals[:-1]  # the last event is the Finish
    gaps = [1000 * (b - a) for a, b in itertools.pairwise(arrivals)]
    # Decode steps: one token and its drafts (at most --spec-max 8 of them); prompt chunks are longer.
    decode_steps = [s for s in probe.steps if 0 < s["n_tokens"] <= 16]
    for s in decode_steps:
        s["wall_ms"] = 1000 * (s["end"] - s["start"])
        s["gc_ms"] = 1000 * sum(
            min(b, s["end"]) - max(a, s["start"]) for a, b in probe.gcs if b > s["start"] and a < s["end"]
        )
    # The time from one step's end to the next one's start: events handed out, the engine waiting.
    between = [1000 * (b["start"] - a["end"]) for a, b in itertools.pairwise(probe.steps)]
    mean = statistics.fmean
    slow = sorted(decode_steps, key=lambda s: s["wall_ms"], reverse=True)[:5]
    return {
        "decode_tps": len(gaps) / (sum(gaps) / 1000) if gaps else 0.0,
        "ttft_s": ttft,
        "itl_p50_ms": pct(gaps, 0.5),
        "itl_p99_ms": pct(gaps, 0.99),
        "steps": len(decode_steps),
        "step_p50_ms": pct([s["wall_ms"] for s in decode_steps], 0.5),
        "step_p99_ms": pct([s["wall_ms"] for s in decode_steps], 0.99),
        "decode_ms": mean([s["decode_ms"] for s in decode_steps]),
        "draft_ms": mean([s["draft_ms"] for s in decode_steps]),
        "rest_ms": mean([s["wall_ms"] - s["decode_ms"] - s["draft_ms"] for s in decode_steps]),
        "between_ms": mean(between) if between else 0.0,
        "drafted_steps": sum(1 for s in decode_steps if s.get("n_draft")),
        "thread_counts": sorted({s["threads"] for s in decode_steps}),
        "gc_ms": sum(1000 * (b - a) for a, b in probe.gcs),
        "slowest": [
            {k: round(v, 2) if isinstance(v, float) else v for k, v in s.items() if k not in ("start", "end")}
            for s in slow
        ],
    }


def estimates(path: Path, args: argparse.Namespace, lengths: list[int], words: Callable[[str], list[int]]) -> None:
    config = EngineConfig(model=path, parallel=args.parallel, ctx_size=args.ctx_size, flash_attn="off", spec="auto")
    with contextlib.closing(make_engine(config)) as engine:
        spec = engine.speculator
        assert spec is not None
        steps: list[tuple[int, float, float]] = []
        observe = spec.observe_step

        def timed(n_tokens: int, n_draft: int, seconds: float) -> None:
            if n_draft:
                estimate = spec.controller.target.estimate(n_tokens, n_tokens - n_draft) or 0.0
                steps.append((n_tokens, 1000 * seconds, 1000 * estimate))
            observe(n_tokens, n_draft, seconds)

        spec.observe_step = timed  # type: ignore[method-assign]
        for rep in range(args.repeats):
            for n in lengths:
                steps.clear()
                params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
                (handle,) = engine.submit(prompt_ids(n, 1000 * n + rep, words), params)
                arrivals = [time.perf_counter() for _ in handle][:-1]  # the last event is the Finish
                gaps = [1000 * (b - a) for a, b in itertools.pairwise(arrivals)]
                t_plain = spec.controller.target.estimate(1)
                plain = "-" if t_plain is None else f"{1000 * t_plain:.1f} ms"
                print(
                    f"repeat {rep + 1} {n:>5} tokens: ITL p50 {pct(gaps, 0.5):.1f} p99 {pct(gaps, 0.99):.1f} ms;"
                    f" a plain step now {plain}; {len(steps)} steps with drafts"
                    + (f", the longest {max(s[1] for s in steps):.1f} ms" if steps else "")
                )
                for n_tokens, took, guess in steps:
                    print(f"    {n_tokens} tokens: {took:5.1f} ms, estimated {guess:5.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--lengths", default="256,1024,4096,7680", help="Prompt tokens, comma-separated.")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="Threads of the bare loops.")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx-size", type=int, default=65536)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--step-costs", action="store_true", help="Time decodes of 1-8 tokens after each context instead.")
    ap.add_argument(
        "--estimates", action="store_true", help="Each step with drafts against its estimate, lengths in turn, instead."
    )
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    path = resolve_model(args.model)
    if args.step_costs:
        with contextlib.closing(Model(path)) as model:
            for n in lengths:
                step_costs(model, args, n)
        return 0

    if args.estimates:
        with contextlib.closing(Model(path)) as model:
            estimates(path, args, lengths, lambda text: model.vocab.tokenize(text, add_special=False))
        return 0

    config = EngineConfig(model=path, parallel=args.parallel, ctx_size=args.ctx_size, flash_attn="off")
    engines = {spec: make_engine(config.model_copy(update={"spec": spec})) for spec in ("off", "auto")}
    model = Model(path)

    def words(text: str) -> list[int]:
        return model.vocab.tokenize(text, add_special=False)

    results: dict[int, dict[str, list[dict[str, Any]]]] = {
        n: {"per-seq": [], "unified": [], "spec off": [], "spec auto": []} for n in lengths
    }
    try:
        for rep in range(args.repeats):
            for n in lengths:
                jobs = {
                    "per-seq": lambda p: bare(model, args, False, p),
                    "unified": lambda p: bare(model, args, True, p),
                    "spec off": lambda p: engine_run(engines["off"], p, args),
                    "spec auto": lambda p: engine_run(engines["auto"], p, args),
                }
                names = list(jobs)
                order = names[rep % len(names) :] + names[: rep % len(names)]
                prompt = prompt_ids(n, 1000 * n + rep, words)  # the same for each, never seen before by any
                for name in order:
                    got = jobs[name](prompt)
                    results[n][name].append(got)
                    if args.json:  # every run as it comes: a long run cut short keeps what it measured
                        args.json.write_text(json.dumps({"results": results}, indent=2) + "\n")
                    print(
                        f"repeat {rep + 1} {n:>5} tokens {name:<8} {got['decode_tps']:6.1f} tok/s"
                        + (
                            f"  ITL p50 {got['itl_p50_ms']:.1f} p99 {got['itl_p99_ms']:.1f} ms"
                            if "itl_p50_ms" in got
                            else ""
                        ),
                        file=sys.stderr,
                    )
    finally:
        for engine in engines.values():
            engine.close()
        model.close()

    print(f"\none stream, best of {args.repeats}: decode tok/s; the engine's figures from its best run, in ms per step")
    head = f"{'context':>8} {'bare per-seq':>13} {'bare unified':>13} {'engine':>10} {'tok/s':>6} {'/bare':>6}"
    head += f" {'decode':>7} {'drafting':>9} {'rest':>6} {'between':>8} {'step p50/p99':>13} {'ITL p99':>8}"
    print(head + f" {'drafted':>8} {'threads':>8} {'gc ms':>6}")
    for n in lengths:
        r = results[n]
        ps, un = (max(x["decode_tps"] for x in r[k]) for k in ("per-seq", "unified"))
        for i, name in enumerate(("spec off", "spec auto")):
            e = max(r[name], key=lambda x: x["decode_tps"])
            bare_cols = f"{n:>8} {ps:>13.1f} {un:>13.1f}" if i == 0 else " " * 36
            print(
                f"{bare_cols} {name:>10} {e['decode_tps']:>6.1f} {e['decode_tps'] / max(ps, un):>6.2f}"
                f" {e['decode_ms']:>7.2f} {e['draft_ms']:>9.2f} {e['rest_ms']:>6.2f} {e['between_ms']:>8.2f}"
                f" {e['step_p50_ms']:>6.1f}/{e['step_p99_ms']:<6.1f} {e['itl_p99_ms']:>8.1f} {e['drafted_steps']:>8}"
                f" {e['thread_counts']!s:>8} {e['gc_ms']:>6.1f}"
            )
    print("\nthe engine's slowest decode steps (its best run at each length):")
    for n in lengths:
        for name in ("spec off", "spec auto"):
            e = max(results[n][name], key=lambda x: x["decode_tps"])
            for step in e["slowest"]:
                print(f"{n:>8} {name:>10}  {json.dumps(step)}")
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results}, indent=2) + "\n"
        )
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
