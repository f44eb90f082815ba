#!/usr/bin/env python3
"""An agent's session replayed against edgeinfer and llama-server side by side: TTFT per turn, the session's total.

    scripts/agent_session.py --client codex --model gemma3-270m-q4_k_m \
        --llama-server ~/.cache/edgeinfer/llama-server/bin/llama-server

The session begins with the first request the real client sent (tests/data/agents: Codex 0.171.0's
Responses body, Claude Code 2.1.332's Messages body, as captured, prose replaced by filler of the
same length). Each later turn is what the client sends after a tool ran: the whole history again,
with the model's call and the tool's output (a file of this repository, as `cat` would print it)
appended. Every turn is streamed, greedy, its answer bounded (--max-tokens), so that the time is
the prompt's: TTFT is the time to the first event that carries generated text.

Both servers get the same model, the same context (--ctx-size, one stream) and the same machine,
one after the other in one run; each is started by this script on a loopback port and stopped
after its session. What this shows: turn N computes only what is new when the cache pays (each
turn after the first a small fraction of the first), and the whole session's time on each server.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "agents"
CAPTURES = {
    "codex": ("codex-0.171.0-tool-result.json", "/v1/responses"),
    "claude": ("claude-code-2.1.332-tool-result.json", "/v1/messages"),
}
# The files the scripted tool calls print, in turn (a repository's own sources: what an agent reads first).
FILES = [
    "README.md",
    "edgeinfer/server/output.py",
    "edgeinfer/formats/partial.py",
    "edgeinfer/engine/sizing.py",
    "edgeinfer/server/lenient.py",
    "edgeinfer/formats/hermes.py",
    "edgeinfer/engine/requests.py",
    "edgeinfer/formats/generic.py",
]
DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta", "content_block_delta")


def first_request(client: str, max_tokens: int, tools: bool = True) -> dict:
    """The client's first request of a session: its captured body, the tool history taken off (and its tools,
    unless `tools`: llama-server renders none of them for a model without a chat template, so that its
    prompt is half as long; without them both servers read the same prompt)."""
    name, _ = CAPTURES[client]
    body = copy.deepcopy(json.loads((DATA / name).read_text())["body"])
    if not tools:
        body.pop("tools", None)
        body.pop("tool_choice", None)
    body["stream"] = True
    body["temperature"] = 0
    if client == "codex":
        body["input"] = [item for item in body["input"] if item.get("type", "message") == "message"]
        body["max_output_tokens"] = max_tokens
    else:
        while body["messages"][-1]["role"] != "user" or any(
            block.get("type") == "tool_result" for block in body["messages"][-1]["content"]
        ):
            body["messages"].pop()
        body.pop("thinking", None)  # llama-server would think (Gemma does not); the same answer length for both
        body["max_tokens"] = max_tokens
    return body


def next_turn(client: str, body: dict, turn: int) -> dict:
    """The request after the model called a tool that printed FILES[turn]: the history, the call, its output."""
    body = copy.deepcopy(body)
    path = FILES[turn % len(FILES)]
    output = (ROOT / path).read_text()[:6000]
    command = f"cat {path}"
    if client == "codex":
        call_id = f"call_{turn:04d}"
        body["input"] += [
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "exec_command",
                "arguments": json.dumps({"cmd": command}),
            },
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]
    else:
        use_id = f"toolu_{turn:04d}"
        body["messages"] += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": use_id, "name": "Bash", "input": {"command": command}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id, "content": output}]},
        ]
    return body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited ({proc.returncode}) before it was ready")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit(f"{url} was not ready within {timeout:.0f} s")


def turn_time(url: str, path: str, body: dict) -> tuple[float, float, int]:
    """(TTFT, total seconds, prompt tokens as the server counted them) of one streamed request."""
    start = time.perf_counter()
    ttft = None
    prompt = 0
    with httpx.stream("POST", url + path, json=body, timeout=1800) as r:
        if r.status_code != 200:
            sys.exit(f"{url}{path}: {r.status_code}: {r.read().decode()[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            if ttft is None and any(d in line for d in DELTAS):
                ttft = time.perf_counter() - start
            if '"usage"' in line:
                prompt = max(prompt, _prompt_tokens(json.loads(line[5:])))
    total = time.perf_counter() - start
    return ttft if ttft is not None else total, total, prompt


def _prompt_tokens(event: dict) -> int:
    """The prompt's tokens an event's usage counts (Responses' input_tokens; Messages' three parts)."""
    usage = (event.get("response") or event.get("message") or event).get("usage") or {}
    parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    return sum(int(usage.get(k) or 0) for k in parts)


def session(
    name: str, cmd: list[str], url: str, client: str, turns: int, max_tokens: int, tools: bool
) -> list[tuple[float, float, int]]:
    _, path = CAPTURES[client]
    print(f"{name}: {' '.join(cmd)}", file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_ready(url, proc)
        out = []
        body = first_request(client, max_tokens, tools)
        for turn in range(turns):
            if turn:
                body = next_turn(client, body, turn)
            ttft, total, prompt = turn_time(url, path, body)
            print(
                f"  {name} turn {turn + 1}: {prompt} prompt tokens, TTFT {ttft:.2f} s, total {total:.2f} s",
                file=sys.stderr,
            )
            out.append((ttft, total, prompt))
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", choices=sorted(CAPTURES), required=True)
    ap.add_argument("--model", required=True, help="a catalog name or GGUF path edgeinfer takes")
    ap.add_argument(
        "--llama-server", help="the llama-server binary (scripts/build_llama_server.sh); none: edgeinfer only"
    )
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--ctx-size", type=int, default=32768)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--no-tools", action="store_true", help="send the session without the client's tools")
    ap.add_argument("--serve-arg", action="append", default=[], help="an extra option for edgeinfer serve (repeat)")
    ap.add_argument("--llama-arg", action="append", default=[], help="an extra option for llama-server (repeat)")
    args = ap.parse_args()

    edge = [sys.executable, "-m", "edgeinfer.cli", "serve", "-m", args.model, "--no-socket"]
    results = {}
    port = free_port()
    cmd = [*edge, "--port", str(port), "--ctx-size", str(args.ctx_size), "--parallel", "1", *args.serve_arg]
    results["edgeinfer"] = session(
        "edgeinfer", cmd, f"http://127.0.0.1:{port}", args.client, args.turns, args.max_tokens, not args.no_tools
    )
    if args.llama_server:
        sys.path.insert(0, str(ROOT))
        from models.catalog import resolve_model

        gguf = str(resolve_model(args.model))
        port = free_port()
        cmd = [
            args.llama_server,
            "-m",
            gguf,
            "--port",
            str(port),
            "-c",
            str(args.ctx_size),
            "-np",
            "1",
            "--jinja",
            *args.llama_arg,
        ]
        results["llama-server"] = session(
            "llama-server", cmd, f"http://127.0.0.1:{port}", args.client, args.turns, args.max_tokens, not args.no_tools
        )

    names = list(results)
    print(f"\n{args.client} session, {args.model}, {args.turns} turns, {args.max_tokens} tokens an answer")
    print("turn | " + " | ".join(f"{n} prompt tokens | {n} TTFT s" for n in names))
    for t in range(args.turns):
        print(f"{t + 1} | " + " | ".join(f"{results[n][t][2]} | {results[n][t][0]:.2f}" for n in names))
    totals = {n: sum(total for _, total, _ in results[n]) for n in names}
    print("session total s | " + " | ".join(f"{totals[n]:.1f}" for n in names))
    for n in names:
        later = max(ttft for ttft, _, _ in results[n][1:]) if args.turns > 1 else float("nan")
        print(f"{n}: the slowest later turn's TTFT is {later / results[n][0][0]:.1%} of the first's")
    if "llama-server" in totals:
        print(f"edgeinfer's session is {totals['llama-server'] / totals['edgeinfer']:.2f}x llama-server's speed")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "turns": results, "totals": totals}, indent=1))


if __name__ == "__main__":
    main()
