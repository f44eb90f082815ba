"""Each extension point takes a newcomer's addition through its protocol, without editing another module: a toy
dialect (tests/toy_dialect.py), a toy tool-call family, a toy model source and a toy drafter, each one new
file (or class) plus its registration line."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from edgeinfer.server.app import APIS, make_app

from . import toy_dialect
from .fakes import ScriptedEngine

pytestmark = pytest.mark.pure


def ask(app, *requests):
    """Each (path, body) posted in process, in order: the responses."""

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://edgeinfer") as http:
            return [await http.post(path, json=body) for path, body in requests]

    return asyncio.run(go())


def test_a_new_dialect_is_one_module_and_its_line_in_the_apis():
    app = make_app(ScriptedEngine, "m", load_in_background=False, apis=[*APIS, toy_dialect.API])
    whole, streamed, missing, unknown, chat = ask(
        app,
        ("/v1/toy", {"say": "hi"}),
        ("/v1/toy", {"say": "hi", "stream": True}),
        ("/v1/toy", {}),
        ("/v1/toy", {"say": "hi", "colour": "red"}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    )
    assert whole.json() == {"toy": "Hello from the script.", "end": "stop", "tokens": 4}
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    pieces = [json.loads(line[6:]) for line in events]
    assert "".join(p.get("text", "") for p in pieces) == "Hello from the script." and pieces[-1] == {"end": "stop"}
    # Errors under its path take its shape, from the app's own handlers; the other APIs keep theirs.
    assert missing.status_code == 400 and missing.json()["toy_error"]["why"] == "say is required"
    assert unknown.status_code == 400 and unknown.json()["toy_error"]["why"] == "colour is not a supported field"
    assert chat.json()["choices"][0]["message"]["content"] == "Hello from the script."
    # An app without it does not speak it: an unknown path, in OpenAI's shape.
    (absent,) = ask(make_app(ScriptedEngine, "m", load_in_background=False), ("/v1/toy", {"say": "hi"}))
    assert absent.status_code == 404 and "no route POST /v1/toy" in absent.json()["error"]["message"]


TOY_TEMPLATE = (
    "{% if tools %}[[tools]] {{ tools | map(attribute='function.name') | join(', ') }}\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}[[call]]{{ c.function | tojson }}{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_a_new_tool_family_is_one_module_and_its_registration(monkeypatch):
    from edgeinfer.engine.template import ChatTemplate
    from edgeinfer.formats import select
    from edgeinfer.prepare import prepare
    from edgeinfer.server.output import ChoiceOutput, TextDelta, ToolCall
    from edgeinfer.server.schema import ChatRequest

    from .fakes import fake_facts
    from .toy_family import Toy

    monkeypatch.setattr(select, "FAMILIES", list(select.FAMILIES))  # the registry as it was, after the test
    monkeypatch.setattr(select, "KNOWN", dict(select.KNOWN))
    select.register_family(Toy)  # the registration line

    engine = ScriptedEngine()
    engine.template = ChatTemplate(TOY_TEMPLATE)
    engine.facts = fake_facts(engine.template)
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": WEATHER_CALL}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ]
    req = ChatRequest.model_validate({"model": "m", "messages": history, "tools": [WEATHER]})
    prompt, params, shape = prepare(engine, req.to_input())
    assert isinstance(shape.calls, Toy)  # the template picked the family
    text = "".join(map(chr, prompt))
    assert text.startswith("[[tools]] get_weather\n") and '[[call]]{"name": "get_weather"' in text
    assert params.grammar is not None and "body: %json" in params.grammar.source  # its grammar, for its syntax
    # Its answers read back through the one reader of calls, streamed a character at a time.
    answer = 'Checking. [[call]]{"name": "get_weather", "arguments": {"city": "Bergen"}}'
    out = ChoiceOutput(shape)
    events = [ev for ch in answer for ev in out.feed(_chunk(ch))] + out.end(_finish(answer))
    assert "".join(ev.text for ev in events if isinstance(ev, TextDelta)) == "Checking. "
    (call,) = [ev for ev in events if isinstance(ev, ToolCall)]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Bergen"})
    assert events[-1].reason == "tool_calls"
    with pytest.raises(ValueError, match="already registered"):
        select.register_family(Toy)


WEATHER_CALL = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


def _chunk(text):
    from edgeinfer.events import Chunk

    return Chunk(0, text, [1], 0.0)


def _finish(text):
    from edgeinfer.events import Finish, StreamStats

    return Finish(0, "stop", text, [1], StreamStats(1, 0, 1, 0.0, 1.0, 0.0))


def test_a_new_model_source_is_one_module_and_its_registration(tmp_path, monkeypatch):
    from edgeinfer.errors import ModelFileError
    from edgeinfer.models import catalog, stores

    from .toy_source import ToyBox

    monkeypatch.setattr(stores, "SOURCES", list(stores.SOURCES))  # the registry as it was, after the test
    stores.register_source(ToyBox())  # the registration line

    box = tmp_path / "box"
    box.mkdir()
    (box / "tiny-Q8_0.gguf").write_bytes(b"GGUF" + bytes(60))
    (box / "broken.gguf").write_bytes(b"nope")
    (box / "toybox.json").write_text(json.dumps({"tiny": "tiny-Q8_0.gguf", "broken": "broken.gguf"}))
    monkeypatch.setenv("TOYBOX_HOME", str(box))
    monkeypatch.delenv("EDGEINFER_STORES", raising=False)
    assert stores.Store("toybox", box) in [s for s in stores.default_stores() if s.source == "toybox"]
    assert stores.find("tiny") == box / "tiny-Q8_0.gguf"  # what --model tiny loads, in place
    assert catalog.resolve_model("tiny") == box / "tiny-Q8_0.gguf"
    with pytest.raises(ModelFileError, match="put it back in the toybox"):
        stores.find("broken")
    # A folder named in EDGEINFER_STORES is recognised by its layout.
    monkeypatch.setenv("EDGEINFER_STORES", str(box))
    assert [s.source for s in stores.candidates()] == ["toybox"]
    with pytest.raises(ValueError, match="already registered"):
        stores.register_source(ToyBox())
