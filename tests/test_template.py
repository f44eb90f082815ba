"""The chat template environment: what HF chat templates are written for (no model: templates built here)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from edgeinfer.engine.template import ChatTemplate, fallback, fold_system
from edgeinfer.errors import ModelLoadError, RequestError

pytestmark = pytest.mark.pure

USER = [{"role": "user", "content": "hi"}]


def render(source: str, messages: list[dict] | None = None, tools: list[dict] | None = None) -> str:
    return ChatTemplate(source, bos="<s>", eos="</s>").render(messages or USER, tools=tools)


def refusal(source: str, messages: list[dict] | None = None) -> str:
    with pytest.raises(RequestError) as e:
        render(source, messages)
    assert e.value.param == "messages" and e.value.http_status == 400
    return str(e.value)


def transformers_render(source: str, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The template rendered independently, by transformers (no tokenizer, no torch), with the same variables."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=source,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )
    return rendered[0]


# --- the environment -------------------------------------------------------------------------------------------


def test_loopcontrols_break_and_continue():
    source = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if m.content == 'stop' %}{% break %}{% endif %}[{{ m.content }}]{% endfor %}"
    )
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "stop"},
        {"role": "assistant", "content": "never"},
    ]
    assert render(source, messages) == "[a][b]"


def test_tojson_writes_json_as_is():
    # Jinja's own filter writes these as \u003c, \u003e, \u0026, \u0027 (for HTML) and escapes non-ASCII.
    text = "<b> & 'quoted' é 日本"
    assert render("{{ messages[0].content | tojson }}", [{"role": "user", "content": text}]) == json.dumps(
        text, ensure_ascii=False
    )
    assert render("{{ messages[0].content | tojson }}", [{"role": "user", "content": text}]) == (
        "\"<b> & 'quoted' é 日本\""
    )
    assert render("{{ 'é' | tojson(ensure_ascii=True) }}") == '"\\u00e9"'


def test_tojson_arguments():
    value = "{{ {'b': [1, 2], 'a': '<x>'} | tojson(indent=2) }}"
    assert render(value) == '{\n  "b": [\n    1,\n    2\n  ],\n  "a": "<x>"\n}'
    assert render("{{ {'b': 1, 'a': 2} | tojson(separators=(',', ':'), sort_keys=True) }}") == '{"a":2,"b":1}'


def test_raise_exception_reaches_the_user_as_written():
    source = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('A system message must come first.') }}{% endif %}"
    )
    message = refusal(source)
    assert message == "the model's chat template refused these messages: A system message must come first."


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("{{ messages[0].content + 1 }}", "TypeError"),  # str + int
        ("{{ messages[0].content.split('') }}", "ValueError: empty separator"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ range(10 ** 9) | list }}", "OverflowError"),  # the sandbox's bound on range
        ("{{ messages.append(1) }}", "SecurityError"),  # the sandbox is immutable
        ("{% set ns = namespace(_x=1) %}", "SecurityError"),  # no underscore names on a namespace
        ("{{ messages[0].content.items() }}", "UndefinedError: 'str object' has no attribute 'items'"),
        ("{{ dict.fromkeys(1) }}", "TypeError"),
    ],
)
def test_a_template_failing_inside_is_a_request_error_naming_it(source, named):
    message = refusal(source)
    assert message.startswith("the model's chat template refused these messages: it failed with ")
    assert named in message


def test_arguments_as_text_where_the_template_wants_a_mapping():
    # The failure the issue names: a template iterating arguments.items() when the arguments came as JSON text.
    source = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v }}{% endfor %}{% endfor %}{% endfor %}"
    )
    history = [
        *USER,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
    ]
    assert "has no attribute 'items'" in refusal(source, history)


def test_strftime_now():
    before = datetime.now().strftime("%d %B %Y")
    out = render("{{ strftime_now('%d %B %Y') }}")
    assert out in {before, datetime.now().strftime("%d %B %Y")}


def test_generation_block_renders_its_content():
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}"
        "{% generation %}<a>{{ m.content }}{% set inner = 'leaked' %}</a>{% endgeneration %}"
        "{% else %}<u>{{ m.content }}</u>{% endif %}{% endfor %}{{ inner | default('kept') }}"
    )
    messages = [*USER, {"role": "assistant", "content": "hello"}]
    assert render(source, messages) == "<u>hi</u><a>hello</a>kept"


def test_a_template_that_does_not_parse_is_a_load_error():
    with pytest.raises(ModelLoadError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")


def test_none_fields_are_undefined_and_reasoning_has_both_names():
    source = (
        "{% for m in messages %}{{ m.role }}:{{ 'name' in m }}:"
        "{{ m.reasoning_content | default('-') }}/{{ m.thinking | default('-') }};{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "q", "name": None},
        {"role": "assistant", "content": "a", "reasoning_content": "because"},
        {"role": "assistant", "content": "b", "thinking": "hmm", "name": "bob"},
    ]
    assert render(source, messages) == "user:False:-/-;assistant:False:because/because;assistant:True:hmm/hmm;"


def test_renders_tools():
    tools_template = "{% for t in tools or [] %}{{ t.function.name }}{% endfor %}{{ messages[0].content }}"
    assert ChatTemplate(tools_template).renders_tools
    assert not ChatTemplate(CHATML_LIKE).renders_tools
    # A template that refuses tools does not render them (and the probe does not raise).
    assert not ChatTemplate("{% if tools %}{{ raise_exception('no tools here') }}{% endif %}").renders_tools


# --- the same prompt as transformers renders --------------------------------------------------------------------

# The templates below are written for these tests, after the layouts of published ones: ChatML (Qwen2.5's, SmolLM2's
# family), a tool template in the Hermes/Qwen2.5 style (tools as JSON in the system turn, calls in <tool_call>
# with arguments through tojson, results in <tool_response>), and one using loopcontrols and generation blocks.
CHATML_LIKE = (
    "{% for message in messages %}"
    "{% if loop.first and message.role != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TOOLS_TOJSON = """{{- bos_token }}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\nFor each call, return <tool_call>{"name": <function-name>, "arguments": <args>}</tool_call>' }}
    {{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls or [] %}
            {{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- call.function.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response id="' + message.tool_call_id + '">\n' }}
        {{- message.content + '\n</tool_response><|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"""

LOOPS_AND_GENERATION = """{%- set ns = namespace(last_user=0) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
  {%- if m.role == 'system' %}{% continue %}{% endif %}
  {%- if m.role == 'assistant' %}
[A]{% generation %}
    {%- if m.reasoning_content and loop.index0 > ns.last_user %}<think>{{ m.reasoning_content }}</think>{% endif %}
    {%- for c in m.tool_calls or [] %}
      {%- for k, v in c.function.arguments | dictsort %}
        {%- if loop.index > 2 %}{% break %}{% endif %}
{{ c.id }}.{{ k }}={{ v | tojson(sort_keys=True) }};
      {%- endfor %}
    {%- endfor %}
{{ m.content }}{{ eos_token }}{% endgeneration %}
  {%- elif m.role == 'tool' %}
[T {{ m.tool_call_id }}]{{ m.content }}
  {%- else %}
[U]{{ m.content | trim }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
[A]{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city, <in °C> & 'dry' or not.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}

# A tool history as the server passes it to templates that render tools: arguments as a mapping, results by id.
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich & 東京, and 2+3?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Three calls.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}},
            {"id": "call_3", "type": "function", "function": {"name": "add", "arguments": {"b": 3, "a": 2, "c": 0}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"celsius": 24, "sky": "<clear>"}'},
    {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": '{"celsius": 19}'},
    {"role": "tool", "tool_call_id": "call_3", "name": "add", "content": "5"},
    {"role": "assistant", "content": "Zürich 24 °C, 東京 19 °C; 2+3 = 5."},
    {"role": "user", "content": "  Thanks!  "},
]


@pytest.mark.parametrize("source", [CHATML_LIKE, TOOLS_TOJSON, LOOPS_AND_GENERATION], ids=["chatml", "tools", "loops"])
@pytest.mark.parametrize("tools", [None, [WEATHER, CALC]], ids=["no-tools", "tools"])
@pytest.mark.parametrize("upto", [len(HISTORY), 6], ids=["whole", "ending-in-results"])
def test_the_prompt_equals_transformers_render(source, tools, upto):
    ours = render(source, HISTORY[:upto], tools=tools)
    assert ours == transformers_render(source, HISTORY[:upto], tools=tools)
    assert "Zürich" in ours  # kept as written, not escaped


def test_the_tool_template_writes_what_the_model_was_trained_on():
    # Beyond agreeing with transformers: the exact text, so that a change in both would be seen.
    ours = render(TOOLS_TOJSON, HISTORY, tools=[WEATHER])
    assert json.dumps(WEATHER, ensure_ascii=False) in ours  # <, &, ' and ° as written
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n</tool_call>' in ours
    assert '<tool_response id="call_3">\n5\n</tool_response>' in ours
    assert ours.startswith("<s><|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n")
    assert ours.endswith("<|im_start|>user\n  Thanks!  <|im_end|>\n<|im_start|>assistant\n")


def test_the_generation_template_breaks_and_continues():
    ours = render(LOOPS_AND_GENERATION, HISTORY)
    assert "Be brief" not in ours  # continue skipped the system message
    assert "call_3.a=2;call_3.b=3;</s>" in ours and "call_3.c" not in ours  # break after two arguments
    assert "<think>" not in ours  # reasoning before the last user message is dropped
    assert "<think>Three calls.</think>" in render(LOOPS_AND_GENERATION, HISTORY[:-2])  # and kept after it
    assert ours.endswith("</s>[U]Thanks![A]")


def test_a_template_that_refuses_a_later_system_message_gets_it_folded_into_the_next_user_turn():
    """Claude Code sends a system message among the turns; many templates raise on one that is not first."""
    strict = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('System message must be first') }}{% endif %}"
        "<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    )
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Oslo"},
        {"role": "user", "content": "weather?"},
    ]
    assert ChatTemplate(strict).render(msgs, add_generation_prompt=False) == (
        "<system>S</system><user>hi</user><user>Oslo\n\nweather?</user>"
    )
    # A template that takes it gets it in place.
    assert "<system>Oslo</system>" in ChatTemplate(strict.replace("not loop.first", "false")).render(msgs)
    # Last of all, it goes to the end of the last user turn.
    assert fold_system(msgs[:3])[1] == {"role": "user", "content": "hi\n\nOslo"}


class Vocab:
    def __init__(self, special: dict[str, int], eog: set[int]) -> None:
        self.special, self.eog = special, eog

    def special_token(self, text):
        return self.special.get(text)

    def is_eog(self, token):
        return token in self.eog


def test_a_model_without_a_template_gets_the_layout_its_vocabulary_knows_and_a_stop_at_its_end():
    gemma = Vocab({"<start_of_turn>": 105, "<end_of_turn>": 106}, eog={1})
    layout, stops = fallback(gemma)
    assert "<start_of_turn>" in layout and stops == ("<end_of_turn>",)  # written as a token, not ending generation
    assert fallback(Vocab({"<start_of_turn>": 105, "<end_of_turn>": 106}, eog={106}))[1] == ()
    layout, stops = fallback(Vocab({}, set()))
    assert "<|im_start|>" in layout and stops == ("<|im_end|>",)
    rendered = ChatTemplate(layout).render([{"role": "user", "content": "hi"}])
    assert rendered.endswith("<|im_start|>assistant\n")
