"""One stream, a growing context: edgeinfer against both of llama-server's KV layouts, side by side.

    python scripts/one_stream.py --llama-server ~/.cache/edgeinfer/llama-server/bin/llama-server

A person chatting, or an agent working alone, is one stream whose context grows. For each
context length (256, 1k, 4k and 7.5k tokens by default) this sends one streamed completion
of a fresh prompt of exactly that many tokens (token ids of Python's standard library
source, so every server reads the same ones, and none has it cached) and times its answer:
TTFT, the decode rate after the first token, and the inter-token latencies' p50 and p99.
The four servers (llama-server with --kv-unified, llama-server with a KV stream per slot,
`edgeinfer serve` with its default --spec auto and with --spec off) take turns, in a rotated
order each repeat; each figure is the best of the repeats (decode rate, TTFT) or their
median (ITL). Beside the best, each edgeinfer row's paired ratio: in each repeat its decode rate
over each llama-server layout's in that same repeat (the same prompt, answered one after another),
the median over the repeats against the layout it pairs lowest with, and how many reached 1.0. On
a shared machine whose speed drifts by more than the differences asked about, that pairing says
more than bests taken minutes apart. (Not over the better of the two layouts in each repeat: the
higher of two noisy figures puts even an equal third server at about 0.95.)

All four get the same model, threads, slots and cells, on Unix sockets. The defaults are
`edgeinfer serve`'s own shape for the default model: 8 slots of 8,192 cells.

    python scripts/one_stream.py --llama-server ... --workloads chat,agent,multi-agent --lengths ''

also (or instead) times stream 0 of `edgeinfer bench`'s workloads as a streamed chat completion,
greedy, `ignore_eos`, the workload's own answer length: the same request every repeat, so from the
second on every server answers it with its prompt cached and the decode is what differs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from vs_llama_server import llama_server_command, running_servers, server_flags

from edgeinfer.bench.workloads import MAX_TOKENS, messages
from edgeinfer.llamacpp import Model
from edgeinfer.models.catalog import resolve_model


def prompt_ids(length: int, seed: int, tokenize: Callable[[str], list[int]]) -> list[int]:
    """`length` tokens of Python's own standard library source, from a file and offset the seed picks: the
    code an agent reads, different for every seed (so no server has it cached), the same for every server."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.name)
    rng = random.Random(seed)
    tokens: list[int] = []
    while len(tokens) < length:
        text = rng.choice(files).read_text(encoding="utf-8", errors="replace")
        start = rng.randrange(max(1, len(text) // 2))
        tokens += tokenize(text[start:])
    return tokens[:length]


def pct(values: list[float], q: float) -> float:
    """The q-quantile of values (the nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def workload_turn(workload: str, max_tokens: int | None = None) -> dict[str, Any]:
    """Stream 0 of an `edgeinfer bench` workload as a streamed chat completion: greedy, `ignore_eos` (as the
    benchmarks send it), the workload's own answer length unless max_tokens says otherwise."""
    return {
        "model": "default",
        "messages": messages(workload, 1)[0],
        "max_tokens": max_tokens or MAX_TOKENS[workload],
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }


def text_arrivals(http: httpx.Client, path: str, body: dict[str, Any], name: str) -> list[float]:
    """POST a streamed request; the time (perf_counter) of each chunk that carries text: a completion's `text`
    or a chat completion's `delta.content`."""
    stamps: list[float] = []
    with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            r.read()
            sys.exit(f"{name}: {r.status_code} {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any(c.get("text") or c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                stamps.append(time.perf_counter())
    return stamps


def completion(prompt: list[int], max_tokens: int) -> tuple[str, dict[str, Any]]:
    """A streamed, greedy, `ignore_eos` completion of token ids: where to POST it, and the body."""
    body = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return "/v1/completions", body | {"ignore_eos": True, "stream": True}


def one_answer(sock: Path, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Stream one answer; the time of each token's arrival gives TTFT, decode rate and ITL."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://server", timeout=600) as http:
        start = time.perf_counter()
        stamps = text_arrivals(http, path, body, sock.name)
    if len(stamps) < 2:
        sys.exit(f"{sock.name}: {len(stamps)} tokens came back; expected {body['max_tokens']}")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "ttft_s": stamps[0] - start,
        "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
        "itl_p50_ms": 1000 * pct(gaps, 0.5),
        "itl_p99_ms": 1000 * pct(gaps, 0.99),
        "chunks": len(stamps),
    }


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "decode_tps": max(r["decode_tps"] for r in runs),
        "ttft_s": min(r["ttft_s"] for r in runs),
        "itl_p50_ms": statistics.median(r["itl_p50_ms"] for r in runs),
        "itl_p99_ms": statistics.median(r["itl_p99_ms"] for r in runs),
        "runs": runs,
    }


def paired(runs: dict[str, list[dict[str, Any]]], name: str, against: list[str]) -> tuple[str, list[float]]:
    """Per repeat, `name`'s decode rate over each of `against` in that repeat; the one whose ratios have the
    lowest median (the server `name` is furthest behind, or least ahead of), and those ratios."""
    ratios = {
        other: [mine["decode_tps"] / theirs["decode_tps"] for mine, theirs in zip(runs[name], runs[other], strict=True)]
        for other in against
    }
    return min(ratios.items(), key=lambda kv: statistics.median(kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, type=Path, help="The llama-server binary.")
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--lengths", default="256,1024,4096,7680", help="Prompt tokens, comma-separated ('': none).")
    ap.add_argument("--workloads", default="", help="Also `edgeinfer bench` workloads' first turn, comma-separated.")
    ap.add_argument(
        "--max-tokens", type=int, default=128, help="Tokens generated per answer to --lengths (a workload: its own)."
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--parallel", type=int, default=8, help="Slots in each server.")
    ap.add_argument("--ctx-size", type=int, default=65536, help="KV cells in each server (per slot: / --parallel).")
    ap.add_argument("--flash-attn", default="off", choices=["on", "off"])
    ap.add_argument("--edgeinfer-args", default="", help="More flags for `edgeinfer serve`, e.g. '--spec off'.")
    ap.add_argument("--only", default="", help="Comma-separated server names to run (default: all four).")
    ap.add_argument("--json", type=Path, default=None, help="Write every run's figures here.")
    args = ap.parse_args()

    binary = args.llama_server.expanduser().resolve()
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} is not an executable; build one with scripts/build_llama_server.sh")
    lengths: list[int | str] = [int(x) for x in args.lengths.split(",") if x]
    for w in filter(None, args.workloads.split(",")):
        if w not in MAX_TOKENS:
            sys.exit(f"unknown workload {w!r}; use one of {', '.join(MAX_TOKENS)}")
        lengths.append(w)
    if not lengths:
        sys.exit("nothing to time: give --lengths or --workloads")
    longest = max((n for n in lengths if isinstance(n, int)), default=0)
    if longest + args.max_tokens > args.ctx_size // args.parallel:
        sys.exit(f"{longest} + {args.max_tokens} tokens do not fit a slot of {args.ctx_size // args.parallel} cells")
    model = resolve_model(args.model)
    tokenizer = Model(model)  # the prompts' token ids (kept open: its vocabulary lives in the model)

    def words(text: str) -> list[int]:
        return tokenizer.vocab.tokenize(text, add_special=False)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    common = server_flags(args.threads, args.ctx_size, args.parallel, flash_attn=args.flash_attn)

    with tempfile.TemporaryDirectory(prefix="edgeinfer-one-") as tmp:
        folder = Path(tmp)
        edge = [sys.executable, "-m", "edgeinfer.cli", "serve", "--model", str(model), *common]
        sockets = {
            name: folder / f"{name.replace(' ', '_')}.sock"
            for name in ("llama-server --kv-unified", "llama-server", "edgeinfer", "edgeinfer --spec off")
        }
        commands = {
            "llama-server --kv-unified": [
                *llama_server_command(binary, model, common, sockets["llama-server --kv-unified"]),
                "--kv-unified",
            ],
            "llama-server": llama_server_command(binary, model, common, sockets["llama-server"]),
            "edgeinfer": [*edge, "--socket", str(sockets["edgeinfer"]), *args.edgeinfer_args.split()],
            # Its default speculation (auto) beside none, which is what llama-server does by default.
            "edgeinfer --spec off": [*edge, "--socket", str(sockets["edgeinfer --spec off"]), "--spec", "off"],
        }
        if args.only:
            commands = {k: v for k, v in commands.items() if k in args.only.split(",")}
        for name, cmd in commands.items():
            print(f"{name}: {' '.join(cmd)}", file=sys.stderr)
        runs: dict[str, dict[int | str, list[dict[str, Any]]]] = {name: {n: [] for n in lengths} for name in commands}
        with running_servers(commands, sockets, folder):
            names = list(commands)
            for rep in range(args.repeats):
                for n in lengths:
                    order = names[rep % len(names) :] + names[: rep % len(names)]
                    if isinstance(n, int):
                        # One prompt per repeat and length, the same for every server (each sees it once, so
                        # none answers it from a cache); another one each repeat.
                        path, body = completion(prompt_ids(n, 1000 * n + rep, words), args.max_tokens)
                    else:
                        path, body = "/v1/chat/completions", workload_turn(n)
                    for name in order:
                        got = one_answer(sockets[name], path, body)
                        runs[name][n].append(got)
                        if args.json:  # every run as it comes: a long run cut short keeps what it measured
                            args.json.write_text(json.dumps({"commands": commands, "runs": runs}, indent=2) + "\n")
                        print(
                            f"repeat {rep + 1} {n:>11} {name:<26} {got['decode_tps']:6.1f} tok/s  "
                            f"TTFT {1000 * got['ttft_s']:7.0f} ms  "
                            f"ITL p50 {got['itl_p50_ms']:5.1f} p99 {got['itl_p99_ms']:5.1f} ms",
                            file=sys.stderr,
                        )

    table = {name: {n: best(r) for n, r in by_len.items()} for name, by_len in runs.items()}
    llama = [name for name in table if name.startswith("llama-server")]
    print(f"\none stream, best of {args.repeats} (decode tok/s and TTFT: the best run; ITL: the runs' median)")
    print(
        f"{'context':>11}  {'server':<26} {'tok/s':>7} {'/ best llama-server':>20} {'TTFT ms':>8}"
        f" {'ITL p50/p99 ms':>15} {'paired: median, >= 1.0, against':>45}"
    )
    for n in lengths:
        bar = max((table[name][n]["decode_tps"] for name in llama), default=None)
        for name, by_len in table.items():
            b = by_len[n]
            ratio = f"{b['decode_tps'] / bar:.2f}" if bar else "-"
            pair = "-"
            if llama and not name.startswith("llama-server"):
                other, ratios = paired({k: v[n] for k, v in runs.items()}, name, llama)
                b["paired"] = {"against": other, "ratios": ratios}
                pair = f"{statistics.median(ratios):.3f}, {sum(r >= 1.0 for r in ratios)} of {len(ratios)}, {other}"
            print(
                f"{n:>11}  {name:<26} {b['decode_tps']:>7.1f} {ratio:>20} {1000 * b['ttft_s']:>8.0f}"
                f" {b['itl_p50_ms']:>7.1f}/{b['itl_p99_ms']:<7.1f} {pair:>45}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "commands": commands,
                    "args": vars(args) | {"llama_server": str(binary), "json": str(args.json)},
                    "table": table,
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
