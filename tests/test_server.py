"""`edgeinfer serve` over a Unix socket, through the official openai client and raw HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time

import httpx
import openai
import pytest

from edgeinfer.client import async_client, client

from . import gate
from .conftest import healthy, raw, sse_events, start_server, stop_process
from .fakes import fake_facts

pytestmark = pytest.mark.model

MODEL = "default"


@pytest.fixture
def oai(server):
    return client(server)


def msgs(text):
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": text}]


# A question whose greedy answer holds on every CPU: each token of "The capital of France is Paris."
# and its end led the runner-up by 2.9 nats or more on AVX2 (haswell, cold and from the prefix cache);
# batch shapes move such gaps by well under one nat (tests/gate.py, says). The plain "What is
# the capital of France?" opened with a near-tie there ("La" 0.13 nats over "The") and answered in French.
CAPITAL = "What is the capital of France? Answer with one word."


def test_chat_completion(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=msgs(CAPITAL), temperature=0, max_tokens=20, logprobs=True, top_logprobs=2
    )
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    gate.says("Paris", r.choices[0].message.content, msgs(CAPITAL), 20)
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    timings = r.model_extra["timings"]
    assert timings["ttft_s"][0] > 0


def test_chat_streaming_matches_non_streaming(oai):
    kw = dict(model=MODEL, messages=msgs("Name three fruits."), temperature=0, max_tokens=24)
    whole = oai.chat.completions.create(**kw)
    stream = oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    text, reasons, usage = "", [], None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.finish_reason:
                reasons.append(c.finish_reason)
        if chunk.usage:
            usage = chunk.usage
    # Two requests, the second warm from the prefix cache: each is the greedy answer, up to near-ties.
    gate.follows_greedy(text, kw["messages"], 24)
    gate.follows_greedy(whole.choices[0].message.content, kw["messages"], 24)
    assert len(reasons) == 1 and reasons[0] in ("stop", "length")
    assert 0 < usage.completion_tokens <= 24 and (reasons[0] == "length") == (usage.completion_tokens == 24)
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_plain_and_streaming(oai):
    r = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens == 8
    streamed = "".join(
        c.choices[0].text
        for c in oai.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    prompt = gate.reference().tokenize("The capital of France is")
    gate.follows_greedy(r.choices[0].text, prompt, 8)
    gate.follows_greedy(streamed, prompt, 8)


def test_n_choices_share_the_prompt(oai):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=msgs("Tell me a story."),
        n=3,
        temperature=1.0,
        seed=7,
        max_tokens=16,
        extra_body={"ignore_eos": True},  # each stream runs to max_tokens, so usage is known exactly
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1
    assert [c.finish_reason for c in r.choices] == ["length"] * 3
    assert r.usage.completion_tokens == 3 * 16


def test_logprobs(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=msgs("Say yes."), temperature=0, max_tokens=4, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert content[0].token == content[0].top_logprobs[0].token  # greedy picks the most likely


def test_models_and_health(server, oai):
    ids = [m.id for m in oai.models.list().data]
    assert ids == ["SmolLM2-135M-Instruct.Q4_1"]
    assert raw(server).get("/health").json() == {"status": "ok"}
    # A server of one model answers the name a client was built with (an agent's default): the answer says
    # which model it was.
    r = oai.chat.completions.create(model="gpt-9", messages=msgs("hi"), max_tokens=1)
    assert r.model == "SmolLM2-135M-Instruct.Q4_1"


async def test_32_concurrent_streams_complete_with_correct_usage(server):
    aoai = async_client(server)

    async def one(i):
        stream = await aoai.chat.completions.create(
            model=MODEL,
            messages=msgs(f"Count to {i + 3}."),
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage, reason = 0, None, None
        async for chunk in stream:
            for c in chunk.choices:
                pieces += bool(c.delta.content)
                reason = c.finish_reason or reason
            usage = chunk.usage or usage
        return pieces, usage, reason

    results = await asyncio.gather(*(one(i) for i in range(32)))
    for pieces, usage, reason in results:
        assert reason in ("stop", "length")
        assert usage.completion_tokens <= 12 and pieces <= usage.completion_tokens
        assert usage.completion_tokens == 12 if reason == "length" else usage.completion_tokens >= 1
    stats = raw(server).get("/v1/edgeinfer/stats").json()
    assert stats["requests"]["running"] == 0 and stats["requests"]["waiting"] == 0


BAD = [
    ("malformed JSON", "/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("messages missing", "/v1/chat/completions", {"model": MODEL}, 400, "messages is required"),
    ("messages empty", "/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    (
        "bad role",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]},
        400,
        "role",
    ),
    (
        "content wrong type",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
        400,
        "content",
    ),
    (
        "temperature too high",
        "/v1/chat/completions",
        {"model": MODEL, "messages": msgs("hi"), "temperature": 5},
        400,
        "temperature",
    ),
    (
        "temperature wrong type",
        "/v1/chat/completions",
        {"model": MODEL, "messages": msgs("hi"), "temperature": "hot"},
        400,
        "temperature",
    ),
    ("top_p zero", "/v1/chat/completions", {"model": MODEL, "messages": msgs("hi"), "top_p": 0}, 400, "top_p"),
    ("n zero", "/v1/chat/completions", {"model": MODEL, "messages": msgs("hi"), "n": 0}, 400, "n"),
    (
        "max_tokens negative",
        "/v1/chat/completions",
        {"model": MODEL, "messages": msgs("hi"), "max_tokens": -1},
        400,
        "max_tokens",
    ),
    (
        "prompt beyond context",
        "/v1/chat/completions",
        {"model": MODEL, "messages": msgs("word " * 40_000)},
        400,
        "prompt is too long",
    ),
    ("unknown field", "/v1/chat/completions", {"model": MODEL, "messages": msgs("hi"), "foo": 1}, 400, "foo"),
    ("empty stop string", "/v1/chat/completions", {"model": MODEL, "messages": msgs("hi"), "stop": [""]}, 400, "stop"),
    (
        "stop as an object",
        "/v1/chat/completions",
        {"model": MODEL, "messages": msgs("hi"), "stop": {"a": 1}, "max_tokens": 2},
        400,
        "stop must be a string or a list of strings",
    ),
    ("stop as a number", "/v1/completions", {"model": MODEL, "prompt": "hi", "stop": 5, "max_tokens": 2}, 400, "stop"),
    ("prompt longer than context", "/v1/completions", {"model": MODEL, "prompt": "hello " * 9000}, 400, "context"),
    ("empty prompt", "/v1/completions", {"model": MODEL, "prompt": ""}, 400, "empty"),
    ("echo unsupported", "/v1/completions", {"model": MODEL, "prompt": "hi", "echo": True}, 400, "echo"),
    ("logprobs too many", "/v1/completions", {"model": MODEL, "prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    ("token ids out of vocab", "/v1/completions", {"model": MODEL, "prompt": [10**7]}, 400, "vocabulary"),
    ("body is a list", "/v1/chat/completions", [1, 2], 400, "valid dictionary"),
    ("no such route", "/v1/nothing", {}, 404, "no route"),
    (
        "lone surrogate",
        "/v1/chat/completions",
        b'{"model": "default", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        400,
        "surrogate",
    ),
    (
        "lone surrogate in a stop string",
        "/v1/completions",
        b'{"model": "default", "prompt": "hi", "stop": ["\\udfff"]}',
        400,
        "surrogate",
    ),
    (
        "invalid UTF-8",
        "/v1/chat/completions",
        b'{"model": "default", "messages": [{"role": "user", "content": "\xff\xfe caf\xe9"}]}',
        400,
        "UTF-8",
    ),
    ("body over the cap", "/v1/completions", b'{"prompt": "' + b"x" * (9 << 20) + b'"}', 413, "--max-body-mb"),
    (
        "too many messages",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 5000},
        400,
        "messages",
    ),
    (
        "too many content parts",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 5000}]},
        400,
        "content",
    ),
    ("too many stop strings", "/v1/completions", {"model": MODEL, "prompt": "hi", "stop": ["x"] * 5000}, 400, "stop"),
    ("too many prompt tokens", "/v1/completions", {"model": MODEL, "prompt": [1] * 300000}, 400, "prompt"),
]


@pytest.mark.parametrize("name, path, body, status, needle", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_get_openai_style_errors(server, name, path, body, status, needle):
    http = raw(server)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"]
    assert http.get("/health").status_code == 200


def test_disconnect_mid_stream_cancels_the_stream(server):
    http = raw(server)
    body = {
        "model": MODEL,
        "messages": msgs("Write a very long essay about rivers."),
        "max_tokens": 900,  # a stream's share of the context is 1,024 cells
        "stream": True,
        "temperature": 0.8,
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break
        assert http.get("/v1/edgeinfer/stats").json()["requests"]["running"] == 1
    deadline = time.monotonic() + 10
    while http.get("/v1/edgeinfer/stats").json()["requests"]["running"] != 0:
        assert time.monotonic() < deadline, "the stream kept running after its client left"
        time.sleep(0.05)
    finished = http.get("/v1/edgeinfer/stats").json()["requests"]["finished"]
    assert finished.get("cancelled", 0) >= 1


def test_body_over_the_cap_without_content_length(server):
    def chunks():
        for _ in range(10):
            yield b"x" * (1 << 20)

    r = raw(server).post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "--max-body-mb" in r.json()["error"]["message"]


def test_disconnect_while_waiting_for_a_whole_answer_cancels_it(server):
    """A non-streaming request whose client leaves (a timeout, then the SDK's retry) stops generating."""
    http = raw(server)
    before = http.get("/v1/edgeinfer/stats").json()["requests"]["finished"]
    body = {"model": MODEL, "messages": msgs("Write a very long essay about rivers."), "max_tokens": 900}
    body |= {"ignore_eos": True, "temperature": 0.8}
    with pytest.raises(httpx.ReadTimeout), raw(server, timeout=1.5) as impatient:
        impatient.post("/v1/chat/completions", json=body)
    # Wait for the request to end, however it ends: on a loaded machine it may not even have been
    # submitted when the client gave up, so "nothing running" alone does not mean it is over.
    deadline = time.monotonic() + 300  # a guard against hanging only: 900 tokens end either way
    while sum((after := http.get("/v1/edgeinfer/stats").json()["requests"]["finished"]).values()) == sum(
        before.values()
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert after.get("cancelled", 0) == before.get("cancelled", 0) + 1, (before, after)
    assert after.get("length", 0) == before.get("length", 0)


def test_chat_cli_talks_to_the_server(server):
    session = "Hi, my name is Ada.\nWhat is my name?\n/exit\n"
    cmd = [
        sys.executable,
        "-m",
        "edgeinfer.cli",
        "chat",
        "--socket",
        str(server),
        "--temperature",
        "0",
        "--max-tokens",
        "20",
    ]
    r = subprocess.run(cmd, input=session, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    figures = [ln for ln in r.stdout.splitlines() if "tok/s" in ln]
    assert len(figures) == 2 and "TTFT" in figures[0]
    assert "prompt tokens reused" in figures[1]  # the server kept the first turn's KV


@pytest.mark.pure
def test_chat_cli_without_a_server_says_so(tmp_path):
    cmd = [sys.executable, "-m", "edgeinfer.cli", "chat", "--socket", str(tmp_path / "none.sock")]
    r = subprocess.run(cmd, input="hello\n/exit\n", capture_output=True, text=True, timeout=60)
    assert "no edgeinfer server answers" in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_socket_is_owner_only(server, tmp_path, monkeypatch):
    assert stat.S_IMODE(os.stat(server).st_mode) == 0o600
    # Owner-only from the moment it exists: with the chmod after bind taken away, only the
    # umask around bind keeps others out of the window between bind and chmod.
    from edgeinfer.server import listen

    monkeypatch.setattr(listen.os, "chmod", lambda *a, **k: None)
    old = os.umask(0o022)
    try:
        sock = listen.bind_unix_socket(tmp_path / "w.sock")
    finally:
        os.umask(old)
    sock.close()
    assert stat.S_IMODE(os.stat(tmp_path / "w.sock").st_mode) == 0o600


def test_a_socket_probe_without_permission_is_a_one_line_error(tmp_path, monkeypatch):
    import socket as so

    from edgeinfer.errors import ConfigError
    from edgeinfer.server import listen

    path = tmp_path / "theirs.sock"
    theirs = so.socket(so.AF_UNIX)
    theirs.bind(str(path))

    class Refused(so.socket):
        def connect(self, address):
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(listen.socket, "socket", Refused)
    with pytest.raises(ConfigError, match="permission") as err:
        listen.bind_unix_socket(path)
    assert str(path) in str(err.value) and "--socket" in str(err.value)
    assert path.exists()  # not ours to remove
    theirs.close()


def test_metrics_and_stats_stream(server):
    http = raw(server)
    text = http.get("/metrics").text
    for name in (
        "edgeinfer_requests_running",
        "edgeinfer_generation_tokens_total",
        "edgeinfer_kv_cells_used",
        "edgeinfer_time_to_first_token_seconds_bucket",
        "edgeinfer_prompt_tokens_cached_total",
        "edgeinfer_spec_drafted_tokens_total",  # serve speculates by default (--spec auto)
    ):
        gate.contains(text, name)
    with http.stream("GET", "/v1/edgeinfer/stats/stream", params={"interval": 0.1}) as r:
        snaps = []
        for line in r.iter_lines():
            if line.startswith("data:"):
                snaps.append(json.loads(line[5:]))
                if len(snaps) == 2:
                    break
    assert snaps[0]["model"]["ctx_size"] == 8192 and snaps[1]["time"] > snaps[0]["time"]


def test_second_server_on_a_live_socket_refuses(server):
    r = subprocess.run(
        [sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", str(server)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "already listening" in r.stderr and "Traceback" not in r.stderr
    assert raw(server).get("/health").status_code == 200


def test_stale_socket_is_replaced_and_sigterm_removes_it(tmp_path):
    import socket as so

    sock = tmp_path / "s.sock"
    dead = so.socket(so.AF_UNIX)
    dead.bind(str(sock))
    dead.close()  # a socket file with no server behind it
    proc = start_server(sock, "--parallel", "2")
    assert raw(sock).get("/health").status_code == 200
    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status says why it ended.
    assert proc.wait(20) in (0, -signal.SIGTERM)
    assert not sock.exists()


def test_sigterm_lets_streams_finish_within_grace(tmp_path):
    """Streams in flight at SIGTERM run to their end (inside --grace); then the server exits, socket gone."""
    sock = tmp_path / "g.sock"
    proc = start_server(sock, "--parallel", "2", "--grace", "600")
    body = {"model": MODEL, "messages": msgs("Write a long essay about rivers."), "max_tokens": 120}
    body |= {"ignore_eos": True, "stream": True, "temperature": 0}
    with raw(sock) as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        first = [next(lines) for _ in range(4)]  # the stream is under way
        proc.send_signal(signal.SIGTERM)
        rest = list(lines)
    events = sse_events(first + rest)
    assert "data: [DONE]" in rest, "the stream was cut before its end"
    assert not [e for e in events if "error" in e]
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["length"]
    assert proc.wait(60) in (0, -signal.SIGTERM)
    assert not sock.exists()


def test_streams_past_grace_end_with_an_error_and_the_server_exits(tmp_path):
    sock = tmp_path / "c.sock"
    proc = start_server(sock, "--parallel", "2", "--grace", "1")
    body = {"model": MODEL, "messages": msgs("Write a long essay about rivers."), "max_tokens": 4000}
    body |= {"ignore_eos": True, "stream": True}
    with raw(sock) as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        first = [next(lines) for _ in range(4)]
        proc.send_signal(signal.SIGTERM)
        rest = list(lines)
    events = sse_events(first + rest)
    errors = [e["error"]["message"] for e in events if "error" in e]
    assert len(errors) == 1 and "shutting down" in errors[0] and "--grace" in errors[0], errors
    assert proc.wait(60) in (0, -signal.SIGTERM)
    assert not sock.exists()


def test_shutdown_leaves_a_socket_file_that_is_no_longer_ours(tmp_path):
    """A newer server bound the path meanwhile: the old one's shutdown must not delete its socket."""
    import socket as so

    sock = tmp_path / "r.sock"
    proc = start_server(sock, "--parallel", "1")
    sock.unlink()
    newer = so.socket(so.AF_UNIX)
    newer.bind(str(sock))
    inode = sock.stat().st_ino
    stop_process(proc)
    assert sock.exists() and sock.stat().st_ino == inode
    newer.close()


def test_api_key_is_compared_in_constant_time(monkeypatch):
    """Either header carries the key (Anthropic's clients send x-api-key); both are compared every time."""
    from edgeinfer.server import state

    seen = []
    monkeypatch.setattr(state.hmac, "compare_digest", lambda a, b: seen.append((a, b)) or a == b)
    app = _fake_app(api_key="s3cret")
    sent = [
        {"authorization": b"Bearer s3cret"},
        {"authorization": b"Bearer wrong"},
        {"authorization": "Bearer sécret".encode()},
        {"x-api-key": b"s3cret"},
        {"x-api-key": b"wrong"},
        {"x-api-key": b"Bearer s3cret"},
        {},
    ]

    async def go():
        async with _in_process(app) as http:
            return [(await http.get("/v1/models", headers=h)).status_code for h in sent]

    assert asyncio.run(go()) == [200, 401, 401, 200, 401, 401, 401]
    assert len(seen) == 2 * len(sent) and all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in seen)


class _FakeEngine:
    """Records which thread templating and tokenizing ran on; refuses every request after that."""

    def __init__(self):
        from edgeinfer.engine.template import ChatTemplate

        self.threads: list[str] = []
        self.template = ChatTemplate(None)
        self.facts = fake_facts(self.template, self.special_token)  # what the server reads of the model

    def special_token(self, text):
        return None  # no tag is a special token here

    def chat_text(self, messages, tools=None):
        import threading

        self.threads.append(threading.current_thread().name)
        return self.template.render(messages, tools=tools)

    def chat_tokens(self, text):
        return [1, 2, 3]

    def tokenize(self, text, special=False):
        import threading

        self.threads.append(threading.current_thread().name)
        return [1, 2, 3]

    def submit(self, *a, **k):
        from edgeinfer.errors import RequestError

        raise RequestError("refused by the fake engine")

    asubmit = submit


def _fake_app(api_key=None):
    from edgeinfer.server.app import make_app

    app = make_app(_FakeEngine, "fake", api_key, load_in_background=False)
    app.state.edgeinfer.engine = _FakeEngine()
    return app


def _in_process(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://edgeinfer")


def test_templating_and_tokenizing_run_off_the_event_loop():
    """A huge prompt must not hold the event loop: other clients are served meanwhile."""
    import threading

    app = _fake_app()

    async def go():
        async with _in_process(app) as http:
            chat = {"model": "fake", "messages": msgs("hi")}
            r1 = await http.post("/v1/chat/completions", json=chat)
            r2 = await http.post("/v1/completions", json={"model": "fake", "prompt": "hello"})
            return r1, r2

    r1, r2 = asyncio.run(go())
    assert r1.status_code == r2.status_code == 400 and "fake engine" in r1.json()["error"]["message"]
    engine = app.state.edgeinfer.engine
    assert len(engine.threads) == 2 and threading.main_thread().name not in engine.threads, engine.threads


def test_api_key_and_queue_bound(tmp_path):
    sock = tmp_path / "k.sock"
    proc = start_server(sock, "--parallel", "1", "--max-queue", "1", "--api-key", "s3cret")
    try:
        http = raw(sock)
        assert http.get("/health").status_code == 200
        assert http.get("/v1/models").status_code == 401
        assert http.get("/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
        with pytest.raises(openai.AuthenticationError):
            client(sock).models.list()
        good = client(sock, api_key="s3cret")
        assert good.models.list().data

        async def burst():
            aoai = async_client(sock, api_key="s3cret").with_options(max_retries=0)  # see each 503

            async def one():
                try:
                    await aoai.chat.completions.create(model=MODEL, messages=msgs("Write a poem."), max_tokens=40)
                    return 200
                except openai.APIStatusError as e:
                    assert e.response.headers.get("retry-after") == "1"
                    assert "queue is full" in e.message
                    return e.status_code

            return await asyncio.gather(*(one() for _ in range(5)))

        codes = asyncio.run(burst())
        assert codes.count(200) >= 2 and 503 in codes
    finally:
        stop_process(proc)


def test_bench_sweep_over_the_socket_beside_in_process(server):
    from click.testing import CliRunner

    from edgeinfer.bench.schema import Report
    from edgeinfer.cli import main

    args = ["bench", "--socket", str(server), "--in-process", "--concurrency", "1,2", "--max-tokens", "4"]
    result = CliRunner().invoke(main, [*args, "--repeats", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    Report.model_validate(doc)
    socket_target, engine_target = doc["targets"]
    assert socket_target["kind"] == "socket" and engine_target["kind"] == "engine"
    assert engine_target["config"]["parallel"] == 8  # the server's own settings, read from its stats
    for lv in doc["levels"]:
        for side in lv["targets"].values():
            assert side["warm"]["aggregate_tps"] > 0 and side["warm"]["itl_p50_s"] > 0
            assert side["warm"]["completion_tokens"] == 4 * lv["concurrency"]
    assert "side by side" in result.stderr


def test_bench_any_openai_endpoint_by_url(tmp_path):
    import socket as so

    from click.testing import CliRunner

    from edgeinfer.cli import main

    with so.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = start_server(tmp_path / "u.sock", "--parallel", "2", "--port", str(port))
    try:
        url = f"http://127.0.0.1:{port}/v1"
        args = ["bench", "--url", url, "--workload", "agent", "--concurrency", "1,2", "--max-tokens", "4"]
        result = CliRunner().invoke(main, [*args, "--repeats", "1", "--json", "-"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["targets"] == [
            {"name": url, "kind": "url", "model": doc["targets"][0]["model"], "where": url, "config": None}
        ]
        assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
        for lv in doc["levels"]:
            side = lv["targets"][url]
            assert side["warm"]["aggregate_tps"] > 0 and side["warm"]["ttft_p50_s"] > 0
            assert side["warm"]["ttft_p50_s"] < side["cold"]["ttft_p50_s"]  # the agent's system prompt is reused
    finally:
        stop_process(proc)
    warning = proc.stderr.read()
    assert "WARNING" in warning and "--api-key" in warning
    gone = CliRunner().invoke(main, ["bench", "--url", url, "--concurrency", "1", "--max-tokens", "4"])
    assert gone.exit_code != 0 and "nothing answers at" in gone.output and "Traceback" not in gone.output


def test_a_server_stopped_in_this_process_leaves_the_next_ones_streams_alone(tmp_path, model_path):
    """Defect: sse-starlette (our SSE responses' library then) noted every uvicorn shutdown in one process-wide
    flag that nothing reset, so after one in-process server stopped (`serve --dashboard` quit, a test's server),
    every stats stream of the next server ended after its first snapshot, and its chat streams were cut at the
    grace's end."""
    from edgeinfer.options import EngineConfig
    from edgeinfer.server.app import make_server
    from edgeinfer.server.listen import serve

    config = EngineConfig(model=model_path, parallel=1, ctx_size=1024, threads=1, threads_batch=1)

    first = tmp_path / "a.sock"
    serve(make_server(config), first, None, grace_s=1, foreground=lambda: healthy(first).close())
    snapshots: list[str] = []

    def read_stats() -> None:
        http = healthy(second)
        try:
            with http.stream("GET", "/v1/edgeinfer/stats/stream", params={"interval": 0.1}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        snapshots.append(line)
                        if len(snapshots) == 20:
                            return
        finally:
            http.close()

    second = tmp_path / "b.sock"
    serve(make_server(config), second, None, grace_s=1, foreground=read_stats)
    assert len(snapshots) == 20, f"the stats stream ended after {len(snapshots)} snapshots"
