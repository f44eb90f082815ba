"""The four tool-call families end to end, each on the default model's weights with its real published template.

For each family a copy of the default GGUF gets the family's template as its `tokenizer.chat_template`
(the `gguf` package rewrites the copy) and a server runs on it, one family after another. Shown for
each: the prompt with tools and a tool history is what transformers renders from the same template;
forced calls at temperature 0.8 all validate against their schemas, streamed and not, through chat
completions, Responses and Messages; and the family's calls, fed back as history, render in its
syntax and the model's next answer parses again.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import jsonschema
import pytest

from edgeinfer.client import anthropic_client, async_client, client
from edgeinfer.formats.base import ToolFormat, ToolSpec
from edgeinfer.formats.select import FAMILIES as KNOWN_FAMILIES

from . import gate
from .conftest import raw, rewrite_gguf, start_server, stop_process

pytestmark = pytest.mark.model

MODEL = "default"
TEMPLATES = Path(__file__).parent / "data" / "templates"  # where each came from: SOURCES.md there
FAMILIES = {
    "hermes": "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "qwen3-coder": "Qwen3-Coder.jinja",
    "llama3": "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
}
# Where the assistant's turn begins and ends in each family's template (to cut the calls out of a prompt).
TURN = {
    "hermes": ("<|im_start|>assistant", "<|im_end|>"),
    "qwen3-coder": ("<|im_start|>assistant", "<|im_end|>"),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistral": ("[/INST]", "[TOOL_RESULTS]"),
}


def function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    # Every property has a description: Hermes 3's template writes one for each.
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


WEATHER = function(
    "get_weather",
    "The weather forecast for a city.",
    {
        "city": {"type": "string", "description": "The city's name."},
        "days": {"type": "integer", "minimum": 1, "maximum": 7, "description": "Days ahead, 1 to 7."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "The temperature unit."},
    },
    ["city", "days"],
)
CLOCK = function(
    "get_time",
    "The time now in a time zone.",
    {"zone": {"type": "string", "enum": ["UTC", "CET", "EST", "JST"], "description": "The time zone."}},
    ["zone"],
)
BOOKING = function(
    "book_table",
    "Books a table at a restaurant.",
    {
        "restaurant": {"type": "string", "description": "The restaurant's name."},
        "people": {"type": "integer", "minimum": 1, "maximum": 12, "description": "How many people."},
        "outside": {"type": "boolean", "description": "A table outside."},
        "dishes": {"type": "array", "items": {"type": "string"}, "maxItems": 3, "description": "Dishes to order."},
    },
    ["restaurant", "people", "outside"],
)
TOOLS = [WEATHER, CLOCK, BOOKING]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MAX_TOKENS = 160  # a call here takes 20 to 60 tokens; a run-away string is cut and closed
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
QUESTION = "What is the weather in Paris for the next two days?"


def ask(text: str) -> list[dict[str, Any]]:
    return [SYSTEM, {"role": "user", "content": text}]


# --- a server per family ------------------------------------------------------------------------


@dataclass
class Family:
    name: str
    template: str
    sock: Path
    bos: str
    eos: str

    def format(self, tools: list[dict[str, Any]] | None = None) -> ToolFormat:
        """The family's format object, knowing these tools (OpenAI's shape)."""
        cls = next(f for f in KNOWN_FAMILIES if f.name == self.name)
        specs = [
            ToolSpec(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in tools or []
        ]
        return cls(specs)


def with_template(src: Path, dst: Path, template: str) -> tuple[str, str]:
    """Copy the GGUF at src to dst with its chat template replaced; the BOS and EOS tokens' texts."""
    reader = rewrite_gguf(
        src, dst, drop=(gguf.Keys.Tokenizer.CHAT_TEMPLATE,), add=lambda writer: writer.add_chat_template(template)
    )
    tokens = reader.get_field(gguf.Keys.Tokenizer.LIST)
    bos = reader.get_field(gguf.Keys.Tokenizer.BOS_ID).contents()
    eos = reader.get_field(gguf.Keys.Tokenizer.EOS_ID).contents()
    return tokens.contents(bos), tokens.contents(eos)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, model_path, tmp_path_factory):
    """A server on the default weights with this family's template (module scope: one server at a time)."""
    name = request.param
    template = (TEMPLATES / FAMILIES[name]).read_text()
    root = tmp_path_factory.mktemp(f"family-{name}")
    bos, eos = with_template(model_path, root / "model.gguf", template)
    sock = root / "edgeinfer.sock"
    proc = start_server(sock, "--model", str(root / "model.gguf"), "--parallel", "8", "--ctx-size", "16384")
    yield Family(name, template, sock, bos, eos)
    stop_process(proc)
    (root / "model.gguf").unlink()


def valid(name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    """The arguments, checked against their tool's schema."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])
    return args


# --- the prompt ---------------------------------------------------------------------------------

# A client's tool history: a call, its result, an answer, then another call and its result. One call
# per assistant message: Llama 3's template refuses more.
IDS = ["call_7f3a9c2e41b04d8e9a6b1c5d", "call_0b1c2d3e4f5a6b7c8d9e0f1a"]
HISTORY: list[dict[str, Any]] = [
    SYSTEM,
    {"role": "user", "content": QUESTION},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": IDS[0],
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": IDS[0], "content": '{"sky": "clear", "high": 24}'},
    {"role": "assistant", "content": "Clear skies, with highs of 24 degrees."},
    {"role": "user", "content": "And what time is it in Tokyo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": IDS[1], "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "JST"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": IDS[1], "content": "09:41"},
]


def transformers_render(fam: Family, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The template rendered by transformers (no tokenizer, no torch), from messages as HF's templates take
    them: arguments as a mapping, the result naming its call (by an id the family's template accepts)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    fmt = fam.format()
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
    hf = []
    for m in messages:
        m = {**m, "content": m["content"] or ""}
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {"id": fmt.history_id(c["id"]), "type": "function",
                 "function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]  # fmt: skip
        if m["role"] == "tool":
            m = {**m, "tool_call_id": fmt.history_id(m["tool_call_id"]), "name": names[m["tool_call_id"]]}
        hf.append(m)
    rendered, _ = render_jinja_template(
        conversations=[hf],
        tools=tools,
        chat_template=fam.template,
        add_generation_prompt=True,
        bos_token=fam.bos,
        eos_token=fam.eos,
    )
    return rendered[0]


def apply_template(fam: Family, messages: list[dict[str, Any]], **body: Any) -> str:
    r = raw(fam.sock).post("/apply-template", json={"messages": messages, **body})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_the_family_is_chosen_by_its_template(family):
    assert next(f for f in KNOWN_FAMILIES if f.detect(family.template)).name == family.name


def test_the_prompt_with_tools_and_history_is_transformers_render(family):
    ours = apply_template(family, HISTORY, tools=TOOLS)
    assert ours == transformers_render(family, HISTORY, TOOLS)
    assert "book_table" in ours and "09:41" in ours  # the tools and the results are in it


# --- forced calls -------------------------------------------------------------------------------

ASKS = [
    ("required", "What is the weather in Oslo this week, and the time in New York?"),
    ({"type": "function", "function": {"name": "book_table"}}, "Book a table for four at Luigi's, inside."),
    ({"type": "function", "function": {"name": "get_weather"}}, "Will it rain in Lisbon tomorrow?"),
]


async def forced_calls(fam: Family, stream: bool, n: int, repeats: int) -> list[tuple[Any, str, list[tuple[str, str]]]]:
    """Each ASKS request sent `repeats` times with n choices, at temperature 0.8, all at once: (tool_choice,
    finish_reason, the calls as (name, arguments)) for each answer."""
    oai = async_client(fam.sock)

    async def one(choice: Any, text: str) -> list[tuple[Any, str, list[tuple[str, str]]]]:
        kw = dict(
            model=MODEL,
            messages=ask(text),
            tools=TOOLS,
            tool_choice=choice,
            temperature=0.8,
            n=n,
            max_tokens=MAX_TOKENS,
        )
        if not stream:
            r = await oai.chat.completions.create(**kw)
            return [
                (choice, c.finish_reason, [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []])
                for c in r.choices
            ]
        # Streamed: each call's name arrives once, its arguments in pieces, per choice and call index.
        calls: dict[int, dict[int, list[str]]] = {i: {} for i in range(n)}
        finish: dict[int, str] = {}
        async for chunk in await oai.chat.completions.create(**kw, stream=True):
            for c in chunk.choices:
                for t in c.delta.tool_calls or []:
                    got = calls[c.index].setdefault(t.index, ["", ""])
                    if t.function is not None:
                        got[0] += t.function.name or ""
                        got[1] += t.function.arguments or ""
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
        return [(choice, finish.get(i, ""), [(a, b) for _, (a, b) in sorted(calls[i].items())]) for i in range(n)]

    answers = await asyncio.gather(*(one(choice, text) for choice, text in ASKS for _ in range(repeats)))
    return [a for group in answers for a in group]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_forced_calls_at_temperature_validate(family, stream):
    """18 answers streamed and 9 whole (6 and 3 per tool_choice), each one or more calls whose arguments
    validate against the schema. Streamed answers are parsed as they come, the harder path; a whole
    answer is read at its end."""
    repeats = 2 if stream else 1
    answers = asyncio.run(forced_calls(family, stream, n=3, repeats=repeats))
    assert len(answers) == 9 * repeats
    problems = []
    for choice, finish, calls in answers:
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        try:
            # Cut by max_tokens, an answer still closes its calls validly (and says "length").
            assert finish in ("tool_calls", "length"), f"finish_reason {finish!r}"
            assert calls, "no call"
            assert named is None or [n for n, _ in calls] == [named], f"named {named}, called {calls}"
            for name, arguments in calls:
                valid(name, arguments)
        except (AssertionError, jsonschema.ValidationError, json.JSONDecodeError, KeyError) as e:
            problems.append((choice if named is None else named, str(e).splitlines()[0], calls))
    assert problems == []


def test_calls_arrive_as_function_call_items_in_responses(family):
    oai = client(family.sock)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    r = oai.responses.create(
        model=MODEL, input=QUESTION, tools=tools, tool_choice="required", temperature=0.8, max_output_tokens=MAX_TOKENS
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and r.status in ("completed", "incomplete")  # incomplete: cut by max_output_tokens, still valid
    for c in calls:
        valid(c.name, c.arguments)
        assert c.call_id


def test_calls_arrive_as_tool_use_blocks_in_messages(family):
    claude = anthropic_client(family.sock)
    fs = [t["function"] for t in TOOLS]
    tools = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]} for f in fs]
    m = claude.messages.create(
        model=MODEL,
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": QUESTION}],
        tools=tools,
        tool_choice={"type": "any"},
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and m.stop_reason in ("tool_use", "max_tokens")
    for b in uses:
        valid(b.name, b.input)
        assert b.id


# --- the calls fed back ----------------------------------------------------------------------------


def test_the_calls_fed_back_render_in_the_family_syntax_and_the_next_answer_parses(family):
    oai = client(family.sock)
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = oai.chat.completions.create(
        model=MODEL, messages=ask(QUESTION), tools=TOOLS, tool_choice=named, temperature=0.8, max_tokens=MAX_TOKENS
    )
    call = first.choices[0].message.tool_calls[0]
    args = valid(call.function.name, call.function.arguments)
    history = [
        *ask(QUESTION),
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "rain", "high": 12}'},
    ]  # ending in the result: Mistral's template refuses two user messages in a row
    # The template writes the call in the family's own syntax, which its parser reads back.
    prompt = apply_template(family, history, tools=TOOLS)
    opens, closes = TURN[family.name]
    said = prompt[prompt.index(opens, prompt.index(QUESTION)) + len(opens) :]
    said = said[: said.index(closes)]
    _, read = family.format(TOOLS).parse(said, final=True)
    gate.written([(c.name, json.loads(c.arguments)) for c in read], [("get_weather", args)])  # the template wrote it
    # And the model, reading it, answers with calls that parse and validate.
    again = oai.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="required", temperature=0.8, n=4, max_tokens=MAX_TOKENS
    )
    for c in again.choices:
        assert c.finish_reason in ("tool_calls", "length") and c.message.tool_calls
        for t in c.message.tool_calls:
            valid(t.function.name, t.function.arguments)
