"""What the agents people run send, as captured from the real clients (tests/data/agents), read without a model:
every field and item is taken, the ones that mean nothing here are counted, and the request the model gets is
the one the client meant (namespaced functions offered by name, hosted tools left out, a system message kept in
place, Claude Code's billing line out of the prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.server.lenient import ignored_fields
from edgeinfer.server.messages import ignored_in
from edgeinfer.server.messages import to_input as messages_to_input
from edgeinfer.server.messages_schema import MessagesRequest
from edgeinfer.server.responses import to_input as responses_to_input
from edgeinfer.server.responses_schema import ResponsesRequest, parse_items, parse_tools

pytestmark = pytest.mark.pure

DATA = Path(__file__).parent / "data" / "agents"
CODEX = sorted(DATA.glob("codex-*.json"))
CLAUDE = sorted(DATA.glob("claude-code-*.json"))


def body(path: Path) -> dict:
    return json.loads(path.read_text())["body"]


def test_the_captures_are_there():
    assert len(CODEX) >= 2 and len(CLAUDE) >= 3


@pytest.mark.parametrize("path", CODEX, ids=[p.stem for p in CODEX])
def test_codex_requests_are_taken(path):
    raw = body(path)
    req = ResponsesRequest.model_validate(raw)
    tools = parse_tools(req.tools)
    chat = responses_to_input(req, tools, parse_items(req.input), 0)
    offered = {t.name for t in chat.tools}
    # Every function the client offered, a namespace's among them, is the model's to call by a name it can map back.
    for t in raw.get("tools", []):
        if t["type"] == "function":
            assert t["name"] in offered
        elif t["type"] == "namespace":
            for inner in t["tools"]:
                internal = tools.internal(t["name"], inner["name"])
                assert internal in offered and tools.origin[internal] == (t["name"], inner["name"])
    hosted = [t["type"] for t in raw.get("tools", []) if t["type"] not in ("function", "namespace")]
    assert tools.left_out == hosted
    # Its developer messages lead, as system turns (what the templates know); the fields that mean
    # nothing here are counted.
    assert raw["input"][0]["role"] == "developer" and chat.turns[0].role == "system"
    ignored = ignored_fields(req)
    assert "client_metadata" in ignored or "client_metadata" not in raw
    assert {"prompt_cache_key", "include"} & set(raw) <= set(ignored)


@pytest.mark.parametrize("path", CLAUDE, ids=[p.stem for p in CLAUDE])
def test_claude_code_requests_are_taken(path):
    raw = body(path)
    req = MessagesRequest.model_validate(raw)
    chat = messages_to_input(req)
    system = chat.turns[0]
    assert system.role == "system" and "x-anthropic-billing-header" not in system.text
    assert "system.x-anthropic-billing-header" in ignored_in(req)
    # A system message among the messages stays where it was sent, between the turns around it.
    inner = [i for i, m in enumerate(raw["messages"]) if m["role"] == "system"]
    if inner:
        roles = [t.role for t in chat.turns]
        assert roles.count("system") == 1 + len(inner) and roles[1] == "user"
    # Deferred tools are left out until the client loads them; the others are offered.
    offered = {t.name for t in chat.tools}
    assert offered == {t["name"] for t in raw["tools"] if not t.get("defer_loading")}
    ignored = {field.split(".")[0] for field in ignored_in(req)}
    for field in ("context_management", "output_config", "metadata"):
        assert field not in raw or field in ignored, field


def test_a_system_message_among_the_messages_is_taken_in_place():
    req = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 8,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "The user is in Oslo."}]},
                {"role": "user", "content": "weather?"},
            ],
        }
    )
    chat = messages_to_input(req)
    assert [(t.role, t.text) for t in chat.turns] == [
        ("system", "Be brief."),
        ("user", "hi"),
        ("system", "The user is in Oslo."),
        ("user", "weather?"),
    ]
