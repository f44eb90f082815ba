"""`bench --api chat,responses,messages`: the three request and stream shapes, against a scripted server on a socket.

The server here answers as the three APIs' streams do (no model): what is checked is what bench
sends (the bodies and key headers) and how it counts what comes back, for any server speaking them.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import uvicorn
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from edgeinfer.bench.apis import messages_body, parse_apis, responses_body
from edgeinfer.cli import main
from edgeinfer.errors import ConfigError

pytestmark = pytest.mark.pure

WORDS = ["one", " two", " three", " four", " five", " six"]
SEEN: list[tuple[str, dict, dict]] = []  # (path, body, headers) of every request the scripted server got


def sse(events):
    """(event name or None, data: an object sent as JSON, or text as is) as a text/event-stream."""

    async def gen():
        for name, data in events:
            text = data if isinstance(data, str) else json.dumps(data)
            yield (f"event: {name}\n" if name else "") + f"data: {text}\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})


async def chat(request: Request):
    body = await request.json()
    SEEN.append(("chat", body, dict(request.headers)))
    n = body["max_tokens"]
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "scripted"}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in WORDS[:n]]
    usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
    chunks.append({**base, "choices": [], "usage": usage})
    return sse([(None, c) for c in chunks] + [(None, "[DONE]")])


async def responses(request: Request):
    body = await request.json()
    SEEN.append(("responses", body, dict(request.headers)))
    n = body["max_output_tokens"]
    events = [("response.created", {"type": "response.created", "sequence_number": 0})]
    # As the real server: two tokens may reach the client as one delta (a character split over tokens is
    # held back), and an answer cut by max_output_tokens ends in response.incomplete, whose usage counts.
    words = [*WORDS[: n - 2], "".join(WORDS[n - 2 : n])]
    events += [("response.output_text.delta", {"type": "response.output_text.delta", "delta": w}) for w in words]
    usage = {"input_tokens": 5, "output_tokens": n, "total_tokens": 5 + n}
    done = {"type": "response.incomplete", "response": {"status": "incomplete", "usage": usage}}
    events.append(("response.incomplete", done))
    return sse(events)


async def messages(request: Request):
    body = await request.json()
    SEEN.append(("messages", body, dict(request.headers)))
    n = body["max_tokens"]
    events = [("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 5}}})]
    events.append(("ping", {"type": "ping"}))
    events += [
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": w}})
        for w in WORDS[:n]
    ]
    events.append(("message_delta", {"type": "message_delta", "usage": {"output_tokens": n}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(events)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    sock = tmp_path_factory.mktemp("scripted") / "s.sock"
    routes = [
        Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
    ]
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=routes), uds=str(sock), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the scripted server did not start"
        time.sleep(0.02)
    yield sock
    server.should_exit = True
    thread.join(10)


def test_bench_streams_each_api_side_by_side(scripted):
    SEEN.clear()
    args = ["bench", "--socket", str(scripted), "--api", "chat,responses,messages", "--concurrency", "1,2"]
    result = CliRunner().invoke(main, [*args, "--max-tokens", "4", "--repeats", "1", "--api-key", "k", "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    names = [t["name"] for t in doc["targets"]]
    assert names == [str(scripted), f"{scripted} (responses)", f"{scripted} (messages)"]
    for lv in doc["levels"]:
        for name in names:
            warm = lv["targets"][name]["warm"]
            assert warm["completion_tokens"] == 4 * lv["concurrency"] and warm["aggregate_tps"] > 0
            assert warm["ttft_p50_s"] > 0
    by_api = {api: (body, headers) for api, body, headers in SEEN}
    body, headers = by_api["responses"]
    assert body["max_output_tokens"] == 4 and body["stream"] and body["ignore_eos"] and body["temperature"] == 0
    assert headers["authorization"] == "Bearer k" and isinstance(body["input"], list)
    body, headers = by_api["messages"]
    assert body["max_tokens"] == 4 and body["stream"] and body["ignore_eos"]
    assert headers["x-api-key"] == "k" and headers["anthropic-version"] and "authorization" not in headers
    assert all(m["role"] != "system" for m in body["messages"])


def test_request_bodies_put_the_system_text_where_each_api_wants_it():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = responses_body("m", msgs, 8)
    assert r["instructions"] == "Be brief." and r["input"] == [{"role": "user", "content": "Hi"}]
    m = messages_body("m", msgs, 8)
    assert m["system"] == "Be brief." and m["messages"] == [{"role": "user", "content": "Hi"}]
    assert "system" not in messages_body("m", msgs[1:], 8)


def test_api_choices_are_checked():
    assert parse_apis("chat, messages") == ["chat", "messages"]
    for bad in ("grpc", "chat,chat", ""):
        with pytest.raises(ConfigError, match="--api"):
            parse_apis(bad)
    result = CliRunner().invoke(main, ["bench", "--api", "responses", "--concurrency", "1"])
    assert result.exit_code != 0 and "--socket/--url" in result.output
