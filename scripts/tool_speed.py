"""Tool-call speed of two source trees, side by side: the same agent conversations with real tools.

    python scripts/tool_speed.py --tree before=/tmp/before --tree after=. [--n 16] [--repeats 3]

Each repeat starts `edgeinfer serve --parallel N --ctx-size 2048N` from each tree in turn (PYTHONPATH set to the
tree, so a checkout of an older commit runs its own code), sends N agent conversations of the
bench's agent workload at once with its six tools, tool_choice "required", greedy (once to warm
the prompt cache, then streamed and whole, timed), and stops the server. It prints each tree's
best wall time over the repeats, its completion tokens per second, how many replies were calls
whose arguments validate, and the ratio to the first tree. The conversations come from this
checkout for every tree, so both answer the same requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from edgeinfer.bench.targets import calls_validate
from edgeinfer.bench.workloads import agent_tools, messages
from edgeinfer.client import async_client


def start(tree: Path, sock: Path, parallel: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", str(sock), "--parallel", str(parallel)]
    cmd += ["--ctx-size", str(2048 * parallel)]  # an agent conversation is about 1,050 tokens
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    transport = httpx.HTTPTransport(uds=str(sock))
    deadline = time.monotonic() + 120
    with httpx.Client(transport=transport, base_url="http://edgeinfer") as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the server from {tree} exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            try:
                if http.get("/health").status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server from {tree} did not become healthy in 120 s")


async def ask(sock: Path, convs: list[Any], tools: list[Any], stream: bool) -> tuple[float, int, list[Any]]:
    """Every conversation at once: (wall seconds, completion tokens, the calls of each reply)."""
    client = async_client(sock)
    kw: dict[str, Any] = {"model": "default", "tools": tools, "tool_choice": "required", "temperature": 0.0}
    kw["max_tokens"] = 128

    async def one(msgs: Any) -> tuple[int, list[tuple[str, str]]]:
        if not stream:
            r = await client.chat.completions.create(messages=msgs, **kw)
            calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]
            return r.usage.completion_tokens if r.usage else 0, calls
        got: dict[int, list[str]] = {}
        tokens = 0
        chunks = await client.chat.completions.create(
            messages=msgs, stream=True, stream_options={"include_usage": True}, **kw
        )
        async for chunk in chunks:
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                for c in choice.delta.tool_calls or []:
                    entry = got.setdefault(c.index, ["", ""])
                    if c.function and c.function.name:
                        entry[0] += c.function.name
                    if c.function and c.function.arguments:
                        entry[1] += c.function.arguments
        return tokens, [(n, a) for n, a in (got[i] for i in sorted(got))]

    t0 = time.perf_counter()
    try:
        replies = await asyncio.gather(*(one(m) for m in convs))
    finally:
        await client.close()
    return time.perf_counter() - t0, sum(t for t, _ in replies), [calls for _, calls in replies]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree (twice or more)")
    ap.add_argument("--n", type=int, default=16, help="conversations at once, and the server's --parallel")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)]
    tools = agent_tools()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}  # type: ignore[index]
    convs = messages("agent", args.n, head="[tools] ")
    best: dict[tuple[str, bool], tuple[float, int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, tree in trees:
                sock = Path(tmp) / f"{name}-{r}.sock"
                proc = start(tree, sock, args.n)
                try:
                    asyncio.run(ask(sock, convs, tools, False))  # a warm-up: the shared prompts computed once
                    for stream in (True, False):
                        wall, tokens, calls = asyncio.run(ask(sock, convs, tools, stream))
                        ok = sum(calls_validate(c, schemas) for c in calls)
                        print(
                            f"repeat {r + 1} {name:>8} {'streamed' if stream else 'whole':>8}: {wall:6.2f} s, "
                            f"{tokens} tokens, {ok}/{len(calls)} valid calls",
                            flush=True,
                        )
                        if (name, stream) not in best or wall < best[(name, stream)][0]:
                            best[(name, stream)] = (wall, tokens, ok)
                finally:
                    proc.terminate()
                    proc.wait(30)
    print(f"\nbest of {args.repeats}, {args.n} agent conversations at once (tool_choice required, greedy):")
    for stream in (True, False):
        base = best[(trees[0][0], stream)][0]
        for name, _ in trees:
            wall, tokens, ok = best[(name, stream)]
            print(
                f"  {'streamed' if stream else 'whole':>8} {name:>8}: {wall:6.2f} s, {tokens / wall:7.1f} tokens/s, "
                f"{ok}/{args.n} valid, time {wall / base:.2f}x {trees[0][0]}"
            )


if __name__ == "__main__":
    main()
