"""Soak test: many clients on one `edgeinfer serve` for a set time, then SIGTERM with streams in flight.

    python scripts/soak.py --duration 600 --spec off|ngram|draft

Clients (the official openai client over the Unix socket, raw httpx for malformed bodies) mix
streaming and whole chats, n > 1, disconnects mid-answer, prompts over the context and bad
bodies. At the end it checks: no 5xx, no hung request (every one answered or failed cleanly
within --hang-s), streamed text equal to the whole answer for the same greedy request, KV cells
back to the kept prefixes' when idle, resident memory growth under --rss-mb, no socket left.
Exit status 0 when every check passes. All traffic stays on the Unix socket.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from near_ties import check_greedy_texts, tie_summary

from edgeinfer.client import async_client

PROMPTS = [f"Tell me {k} facts about {t}." for k in (2, 3) for t in ("rivers", "owls", "tea", "Rome", "glass")]
GREEDY_TOKENS = 48
BAD_BODIES = {
    "malformed": b"{not json",
    "invalid-utf8": b'{"model": "default", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "surrogate": b'{"model": "default", "messages": [{"role": "user", "content": "\\ud800"}]}',
    "unknown-field": b'{"model": "default", "messages": [{"role": "user", "content": "hi"}], "x": 1}',
}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Soak:
    def __init__(self, sock: Path, hang_s: float) -> None:
        self.sock, self.hang_s = sock, hang_s
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.greedy: dict[str, str] = {}  # prompt -> whole greedy answer
        self.greedy_all: list[tuple[str, str]] = []  # (prompt, whole greedy answer), every one
        self.streamed: list[tuple[str, str]] = []  # (prompt, streamed greedy text)
        self.hung: list[str] = []
        self.longest_stall = 0.0  # seconds the engine had work but was not in llama_decode
        self.stall_picture = ""
        self.oai = async_client(sock, timeout=hang_s).with_options(max_retries=0)
        self.http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(sock)), base_url="http://edgeinfer", timeout=hang_s
        )

    def msgs(self, text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": text}]

    async def one(self, rng: random.Random) -> None:
        kind = rng.choices(["chat", "stream", "n", "disconnect", "too-long", "bad"], [3, 4, 1, 1, 1, 1])[0]
        prompt = rng.choice(PROMPTS)
        try:
            await asyncio.wait_for(self._do(kind, prompt, rng), self.hang_s)
        except TimeoutError:
            self.hung.append(kind)
            self.outcomes["hung"] += 1
        except openai.APIStatusError as e:
            self.outcomes[f"{e.status_code} {kind}"] += 1
        except (openai.APIConnectionError, httpx.TransportError):
            self.outcomes["connection lost"] += 1

    async def _do(self, kind: str, prompt: str, rng: random.Random) -> None:
        greedy = dict(model="default", messages=self.msgs(prompt), temperature=0, max_tokens=GREEDY_TOKENS)
        if kind == "chat":
            r = await self.oai.chat.completions.create(**greedy)
            self.greedy.setdefault(prompt, r.choices[0].message.content or "")
            self.greedy_all.append((prompt, r.choices[0].message.content or ""))
            self.outcomes["completed chat"] += 1
        elif kind == "stream":
            stream = await self.oai.chat.completions.create(**greedy, stream=True)
            text, reason = "", None
            async for chunk in stream:
                for c in chunk.choices:
                    text += c.delta.content or ""
                    reason = c.finish_reason or reason
            if reason is None:
                self.outcomes["stream without end"] += 1
                return
            self.streamed.append((prompt, text))
            self.outcomes["completed stream"] += 1
        elif kind == "n":
            r = await self.oai.chat.completions.create(
                model="default", messages=self.msgs(prompt), n=3, temperature=0.9, seed=rng.randrange(99), max_tokens=32
            )
            self.outcomes["completed n=3"] += 1 if len(r.choices) == 3 else 0
        elif kind == "disconnect":
            stream = await self.oai.chat.completions.create(
                model="default", messages=self.msgs(prompt), max_tokens=400, stream=True
            )
            seen = 0
            async for _ in stream:
                seen += 1
                if seen >= rng.randint(2, 10):
                    break
            await stream.close()
            self.outcomes["cancelled (client left)"] += 1
        elif kind == "too-long":
            await self.oai.completions.create(model="default", prompt="word " * 20000, max_tokens=4)
            self.outcomes["too-long accepted?!"] += 1
        else:
            name, body = rng.choice(list(BAD_BODIES.items()))
            r = await self.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            ok = 400 <= r.status_code < 500 and "error" in r.json()
            self.outcomes[f"{r.status_code} bad body ({name})" if ok else f"{r.status_code} bad body NOT 4xx json"] += 1

    async def worker(self, seed: int, until: float) -> None:
        rng = random.Random(seed)
        while time.monotonic() < until:
            await self.one(rng)

    async def stats(self) -> dict[str, Any]:
        return (await self.http.get("/v1/edgeinfer/stats")).json()  # type: ignore[no-any-return]

    async def watch(self, until: float) -> None:
        """Once a second: the engine must step while it has work; note the longest time it did not.

        Time inside llama_decode is not a stall: the engine is stepping, however slowly the CPU lets it (on a
        machine whose cores other work holds, one step can take seconds). A stall is time with work and no decode.
        """
        last_steps, since, decoded0 = -1, time.monotonic(), 0.0
        while time.monotonic() < until:
            await asyncio.sleep(1.0)
            try:
                st = await self.stats()
            except httpx.HTTPError:
                continue
            now, steps = time.monotonic(), st["steps"]["count"]
            decoded = st["steps"]["decode_seconds"] + st["steps"]["decoding_s"]  # finished calls and the one running
            busy = st["requests"]["running"] + st["requests"]["waiting"] > 0
            if steps != last_steps or not busy:
                last_steps, since, decoded0 = steps, now, decoded
            elif (stalled := now - since - (decoded - decoded0)) > self.longest_stall:
                self.longest_stall = stalled
                rows = [(r["id"], r["state"], r["prompt_tokens"], r["generated_tokens"]) for r in st["streams"]]
                self.stall_picture = f"running {st['requests']['running']}, waiting {st['requests']['waiting']}, "
                kv = st["kv"]["used_cells"]
                self.stall_picture += f"KV {kv} cells; streams (id, state, prompt, generated): {rows}"


async def in_flight_at_sigterm(soak: Soak, proc: subprocess.Popen[str], streams: int) -> collections.Counter[str]:
    """Start streams, SIGTERM once they run, and see how each ends."""
    ends: collections.Counter[str] = collections.Counter()
    started = asyncio.Event()

    async def one(i: int) -> None:
        try:
            stream = await soak.oai.chat.completions.create(
                model="default", messages=soak.msgs(PROMPTS[i % len(PROMPTS)]), max_tokens=64, stream=True
            )
            reason = None
            async for chunk in stream:
                started.set()
                for c in chunk.choices:
                    reason = c.finish_reason or reason
            ends[f"at SIGTERM: finished ({reason})" if reason else "at SIGTERM: ended without finish"] += 1
        except openai.APIError as e:
            ends[f"at SIGTERM: error ({str(e)[:40]})"] += 1

    tasks = [asyncio.create_task(one(i)) for i in range(streams)]
    await asyncio.wait_for(started.wait(), soak.hang_s)
    proc.send_signal(signal.SIGTERM)
    _, pending = await asyncio.wait(tasks, timeout=soak.hang_s)
    ends["at SIGTERM: hung"] += len(pending)
    return ends


def recheck(path: Path, flash_attn: str, drift_cache: Path | None) -> int:
    """--check-answers: the near-tie check alone, on answers a soak saved."""
    texts = {p: set(t) for p, t in json.loads(path.read_text()).items()}
    ties, gaps, drift = check_greedy_texts(texts, flash_attn, GREEDY_TOKENS, drift_cache)
    print(f"{sum(map(len, texts.values()))} answers; parting other than at near-ties: {len(ties)}")
    for line in ties[:10]:
        print(f"  {line}")
    print(f"  {tie_summary(gaps)}\n  {drift}")
    return 1 if ties else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600, help="seconds of traffic [600]")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--spec", choices=["off", "ngram", "draft"], default="off")
    ap.add_argument("--draft-model", default="default", help="with --spec draft [the default model itself]")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx-size", type=int, default=8192)
    ap.add_argument("--grace", type=float, default=30)
    ap.add_argument("--hang-s", type=float, default=180, help="a request unanswered this long is hung")
    ap.add_argument("--stall-s", type=float, default=10, help="the engine idle this long with work is stalled")
    ap.add_argument("--cache-ram", type=int, default=256, help="the server's --cache-ram, MiB [256]")
    ap.add_argument(
        "--rss-mb", type=float, default=300, help="largest allowed resident memory growth beyond --cache-ram [300]"
    )
    ap.add_argument(
        "--flash-attn", choices=["auto", "on", "off"], default="auto", help="the server's --flash-attn [auto]"
    )
    ap.add_argument("--strict-text", action="store_true", help="fail, not only report, on stream/whole differences")
    ap.add_argument("--check-answers", type=Path, help="only check the greedy answers a soak saved (its JSON)")
    ap.add_argument(
        "--drift-cache", type=Path, help="keep the near-tie check's drift measurement here and reuse it (near_ties.py)"
    )
    args = ap.parse_args(argv)
    if args.check_answers:
        return recheck(args.check_answers, args.flash_attn, args.drift_cache)

    sock = Path(tempfile.mkdtemp(prefix="soak-")) / "s.sock"
    cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", str(sock), "--parallel", str(args.parallel)]
    cmd += ["--ctx-size", str(args.ctx_size), "--grace", str(args.grace), "--spec", args.spec]
    cmd += ["--cache-ram", str(args.cache_ram), "--flash-attn", args.flash_attn]
    if args.spec == "draft":
        cmd += ["--draft-model", args.draft_model]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        return asyncio.run(_run(args, sock, proc))
    finally:
        if proc.poll() is None:
            proc.kill()


async def _run(args: argparse.Namespace, sock: Path, proc: subprocess.Popen[str]) -> int:
    soak = Soak(sock, args.hang_s)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"server did not start: {proc.stderr.read() if proc.stderr else ''}")
            return 2
        try:
            if (await soak.http.get("/health")).status_code == 200:
                break
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    rss0 = rss_kb(proc.pid)
    until = time.monotonic() + args.duration
    await asyncio.gather(soak.watch(until), *(soak.worker(i, until) for i in range(args.clients)))
    await asyncio.sleep(1.0)  # cancelled streams' last step
    stats = await soak.stats()
    rss1 = rss_kb(proc.pid)
    ends = await in_flight_at_sigterm(soak, proc, args.parallel)
    try:
        code = proc.wait(args.grace + 30)
    except subprocess.TimeoutExpired:
        code = None
    kv, req = stats["kv"], stats["requests"]
    cache = stats.get("cache", {})
    mismatched = [(p, t) for p, t in soak.streamed if p in soak.greedy and soak.greedy[p] != t]
    compared = sum(p in soak.greedy for p, _ in soak.streamed)
    fivexx = sum(n for k, n in soak.outcomes.items() if k[:1] == "5") + sum(n for k, n in ends.items() if "50" in k)
    checks = {
        "zero 5xx": fivexx == 0,
        "zero hung requests": soak.outcomes["hung"] == 0 and ends["at SIGTERM: hung"] == 0,
        f"the engine never stalled {args.stall_s:g} s with work": soak.longest_stall < args.stall_s,
        "no connection lost mid-request": soak.outcomes["connection lost"] == 0,
        "bad bodies answered 4xx with JSON": not any("NOT 4xx" in k for k in soak.outcomes),
        "idle: nothing running or waiting": req["running"] == 0 and req["waiting"] == 0,
        "idle: no KV cells reserved (finished conversations kept, or in RAM)": kv["used_cells"] == 0,
        f"RAM tier within --cache-ram {args.cache_ram} MiB": cache.get("ram_bytes", 0) <= args.cache_ram << 20,
        f"RSS growth under --cache-ram + {args.rss_mb:g} MB": (rss1 - rss0) / 1024 < args.cache_ram + args.rss_mb,
        "server exited after SIGTERM": code is not None,
        "no socket file left": not sock.exists(),
    }
    texts: dict[str, set[str]] = collections.defaultdict(set)
    for p, t in [*soak.greedy_all, *soak.streamed]:
        texts[p].add(t)
    answers_file = sock.parent / "greedy-answers.json"
    answers_file.write_text(json.dumps({p: sorted(t) for p, t in texts.items()}, indent=1))
    ties, gaps, drift = check_greedy_texts(texts, args.flash_attn, GREEDY_TOKENS, args.drift_cache)
    checks["every greedy answer equals the alone one, or parts from it only at near-ties"] = not ties
    if args.strict_text:
        checks["streamed text == whole text (greedy)"] = not mismatched
    print(
        f"soak: {args.duration:g} s, {args.clients} clients, spec {args.spec}, parallel {args.parallel}, "
        f"flash attention {args.flash_attn}"
    )
    print("requests by outcome:")
    for k, n in sorted({**soak.outcomes, **ends}.items()):
        print(f"  {k:<44} {n}")
    print(f"engine finished streams: {req['finished']}")
    if soak.hung:
        print(f"hung requests by kind: {dict(collections.Counter(soak.hung))}")
    print(f"longest time the engine had work but was not decoding: {soak.longest_stall:.1f} s")
    if soak.stall_picture:
        print(f"  then: {soak.stall_picture[:2000]}")
    saved = f"{cache.get('ram_entries', 0)} saved conversations, {cache.get('ram_bytes', 0) >> 20} MiB"
    print(f"KV used {kv['used_cells']} cells; RAM tier {saved}; RSS {rss0 // 1024} -> {rss1 // 1024} MB")
    print(f"streamed vs whole greedy text: {compared - len(mismatched)}/{compared} equal", end="")
    print("" if not mismatched else " (differences can be batch-shape near-ties; see docs/testing.md)")
    n_texts = sum(map(len, texts.values()))
    print(f"distinct greedy answers: {n_texts} for {len(texts)} prompts (in {answers_file}); ", end="")
    print(f"parting from the alone answer other than at near-ties: {len(ties)}")
    print(f"  {tie_summary(gaps)}\n  {drift}")
    for line in ties[:10]:
        print(f"  {line}")
    print(f"server exit status {code}")
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    print(json.dumps({"ok": all(checks.values())}))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
