"""Validity of constrained answers over the socket, through the official openai client.

    python scripts/json_validity.py [--spec off auto] [--llama-server BIN] [--temperature 0.8] [--max-tokens 400]

For each speculation mode, one `edgeinfer serve` on a Unix socket; every schema of the
battery (edgeinfer/bench/battery.py) is asked for with `response_format` json_schema,
streamed and whole, with n = 1..4 (all requests at once, so they share packed batches);
then tool calls with tool_choice "required" and with a named tool, over three tools, streamed
and whole, n = 1..4. Every answer is checked with the jsonschema library, cut by max_tokens
or not (a constrained answer near its budget is steered closed: finish_reason "length", text
whole); a call cut in half is left out of the reply, so that reply counts as invalid. With
--max-tokens 24 32 48, the battery runs once per budget; where a schema's shortest answer is
longer than the budget (edgeinfer's Grammars.shortest), no answer can validate, and the
count of those is shown beside the result. With --llama-server, llama.cpp's server (--jinja, the same model,
slots, context and threads) answers the same battery; it gets n as n separate requests. Last,
each server is sent a schema with a keyword no grammar can enforce (uniqueItems). Exit status
0 when every edgeinfer answer validates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai

from edgeinfer.bench.battery import CASES, WEATHER, check
from edgeinfer.client import async_client
from edgeinfer.models.catalog import resolve_model

TOOLS = [
    WEATHER,
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Book a restaurant table.",
            "parameters": {
                "type": "object",
                "$defs": {"time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}},
                "properties": {
                    "restaurant": {"type": "string", "maxLength": 40},
                    "people": {"type": "integer", "minimum": 1, "maximum": 12},
                    "time": {"$ref": "#/$defs/time"},
                    "notes": {"type": ["string", "null"], "maxLength": 60},
                },
                "required": ["restaurant", "people", "time"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "description": "Search the workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "maxLength": 80},
                    "kinds": {"type": "array", "items": {"enum": ["py", "md", "toml"]}, "maxItems": 3},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                },
                "required": ["query"],
            },
        },
    },
]
TOOL_PROMPTS = ["What's the weather in Lyon?", "Book a table for four at Chez Marie at 19:30.", "Find the README."]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}  # type: ignore[index]


def start(sock: Path, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://edgeinfer")
    for _ in range(1200):
        try:
            if http.get("/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not come up: {' '.join(cmd)}")


async def ask(oai: Any, stream: bool, n: int, split: bool, **kw: Any) -> list[tuple[str, list[tuple[str, str]], str]]:
    """(content, [(tool name, arguments)], finish_reason) for each of the n choices; `split`: as n requests."""
    if split and n > 1:
        parts = await asyncio.gather(*(ask(oai, stream, 1, False, **kw) for _ in range(n)))
        return [answer for part in parts for answer in part]
    try:
        return await _ask(oai, stream, n, **kw)
    except openai.APIStatusError as e:  # a refused request: each of its n answers counts as invalid
        return [("", [], f"HTTP {e.status_code}: {str(e.message)[:60]}")] * n
    except openai.APIConnectionError:  # the server dropped the connection (or died)
        return [("", [], "connection dropped")] * n


async def _ask(oai: Any, stream: bool, n: int, **kw: Any) -> list[tuple[str, list[tuple[str, str]], str]]:
    if not stream:
        r = await oai.chat.completions.create(n=n, **kw)
        out = []
        for c in r.choices:
            calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
            out.append((c.message.content or "", calls, c.finish_reason))
        return out
    text, reasons = [""] * n, [""] * n
    frags: list[dict[int, list[str]]] = [{} for _ in range(n)]  # by tool-call index: [name, arguments so far]
    async for chunk in await oai.chat.completions.create(n=n, stream=True, **kw):
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                call = frags[c.index].setdefault(t.index, ["", ""])
                call[0] = (t.function.name if t.function else None) or call[0]
                call[1] += (t.function.arguments if t.function else None) or ""
            reasons[c.index] = c.finish_reason or reasons[c.index]
    calls = [[(name, args) for name, args in f.values()] for f in frags]
    return list(zip(text, calls, reasons, strict=True))


async def unsupported_keyword(sock: Path) -> str:
    """What the server does with a schema keyword no grammar can enforce (uniqueItems)."""
    oai = async_client(sock).with_options(max_retries=0, timeout=300)
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "tags", "schema": schema}}
    try:
        await oai.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Tags?"}], response_format=fmt, max_tokens=30
        )
    except openai.APIStatusError as e:
        return f"HTTP {e.status_code}: {str(e.message)[:100]}"
    except openai.APIConnectionError:
        return "no answer (connection dropped)"
    return "HTTP 200 (answered without enforcing it)"


def calls_valid(calls: list[tuple[str, str]], reason: str, only: str | None) -> bool:
    if reason not in ("tool_calls", "length") or not calls:
        return False
    try:
        for name, arguments in calls:
            if only is not None and name != only:
                return False
            jsonschema.validate(json.loads(arguments), PARAMS[name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return True


async def battery(sock: Path, temperature: float, rounds: int, split: bool, max_tokens: int) -> dict[str, list[int]]:
    """Every request at once; the count of valid answers by kind: [valid, asked]."""
    oai = async_client(sock).with_options(max_retries=0, timeout=900)
    common = dict(model="default", temperature=temperature, max_tokens=max_tokens)
    jobs: list[tuple[str, Any, str | None, Any]] = []
    for r in range(rounds):
        for i, case in enumerate(CASES):
            fmt = {"type": "json_schema", "json_schema": {"name": case.name, "schema": case.schema, "strict": True}}
            messages = [{"role": "user", "content": f"({r}) {case.prompt}"}]
            for stream in (False, True):
                n = 1 + (i + stream) % 4
                coro = ask(oai, stream, n, split, messages=messages, response_format=fmt, **common)
                jobs.append(("json", case, None, coro))
        for i, prompt in enumerate(TOOL_PROMPTS * 2):
            named = i >= len(TOOL_PROMPTS)
            name = TOOLS[i % len(TOOLS)]["function"]["name"] if named else None  # type: ignore[index]
            choice: Any = {"type": "function", "function": {"name": name}} if named else "required"
            messages = [{"role": "user", "content": f"({r}) {prompt}"}]
            for stream in (False, True):
                n = 1 + (i + stream) % 4
                coro = ask(oai, stream, n, split, messages=messages, tools=TOOLS, tool_choice=choice, **common)
                jobs.append(("named" if named else "required", None, name, coro))
    tally: dict[str, list[int]] = {"json": [0, 0], "required": [0, 0], "named": [0, 0]}

    async def run(kind: str, case: Any, name: str | None, coro: Any) -> None:
        for content, calls, reason in await coro:
            if kind == "json":
                ok = reason in ("stop", "length") and check(case, content) is None
            else:
                ok = calls_valid(calls, reason, name)
            tally[kind][0] += ok
            tally[kind][1] += 1
            if not ok:
                print(f"  invalid {kind} {case.name if case else name}: {reason} {content[:80]!r} {calls[:1]}")

    await asyncio.gather(*(run(*job) for job in jobs))
    return tally


def too_short(model: str, budget: int, rounds: int) -> int | None:
    """JSON answers of the battery asked for with max_tokens below their schema's shortest answer (none can
    validate); None when this edgeinfer cannot tell (no Grammars.shortest)."""
    from edgeinfer.engine.grammar import Grammars
    from edgeinfer.llamacpp.core import Model
    from edgeinfer.options import Grammar

    if not hasattr(Grammars, "shortest"):
        return None
    if model not in _grammars:
        _grammars[model] = Grammars(Model(model).vocab)
    g = _grammars[model]
    n = 0
    for i, case in enumerate(CASES):
        text = g.compile(Grammar(kind="json_schema", source=json.dumps(case.schema)))
        if (g.shortest(text) or 0) > budget:
            n += (1 + i % 4) + (1 + (i + 1) % 4)  # its streams: n = 1 + (i + stream) % 4, whole and streamed
    return n * rounds


_grammars: dict[str, Any] = {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", nargs="+", default=["off", "auto"], help="edgeinfer's speculation modes to run")
    ap.add_argument("--llama-server", type=Path, help="also run this llama-server binary (with --jinja) side by side")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--rounds", type=int, default=1, help="times through the battery")
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[400], help="the battery once per budget")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    model = str(resolve_model(None))
    common = ["--parallel", "16", "--ctx-size", "16384", "--threads", str(args.threads)]
    runs: list[tuple[str, list[str], bool]] = []  # name, command line (the socket goes in {sock}), n as n requests
    for spec in args.spec:
        cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", "{sock}", *common, "--spec", spec]
        runs.append((f"edgeinfer --spec {spec}", cmd, False))
    if args.llama_server:
        cmd = [str(args.llama_server), "--model", model, "--host", "{sock}", *common, "--jinja", "--no-webui"]
        runs.append(("llama-server --jinja", cmd, True))
    failed = False
    for name, cmd, split in runs:
        with tempfile.TemporaryDirectory() as d:
            sock = Path(d) / "server.sock"
            log = Path(d) / "server.log"
            proc = start(sock, [str(sock) if part == "{sock}" else part for part in cmd], log)
            try:
                tallies = []
                for budget in args.max_tokens:
                    t0 = time.perf_counter()
                    tally = asyncio.run(battery(sock, args.temperature, args.rounds, split, budget))
                    tallies.append((budget, tally, time.perf_counter() - t0))
                keyword = asyncio.run(unsupported_keyword(sock))
                if proc.poll() is not None:
                    tail = log.read_text(errors="replace").splitlines()[-5:]
                    print(f"{name} exited ({proc.returncode}) during the run; its log ends:", *tail, sep="\n  ")
            finally:
                proc.terminate()
                proc.wait(60)
        for budget, tally, took in tallies:
            parts = [f"{kind} {ok}/{n}" for kind, (ok, n) in tally.items()]
            short = too_short(model, budget, args.rounds)
            beyond = f"; {short} JSON answers asked below their schema's shortest answer" if short else ""
            line = f"{name}, temperature {args.temperature}, max_tokens {budget}: valid " + ", ".join(parts)
            print(line + f"{beyond} ({took:.0f} s)")
            short_n = short or 0  # those cannot validate: not a failure of edgeinfer
            failed |= name.startswith("edgeinfer") and any(
                ok + (short_n if kind == "json" else 0) < n for kind, (ok, n) in tally.items()
            )
        print(f"{name}: a schema with uniqueItems: {keyword}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
