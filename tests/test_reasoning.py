"""Reasoning models: thinking tags found in the template, the streamed split into thinking and answer, the
grammar that bounds the thinking (on the default model's vocabulary), and, on the default model's weights
under QwQ-32B's published template, thinking apart from the answer in all three APIs with its budget kept."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.formats.reasoning import (
    EFFORT_BUDGET,
    ReasoningSplit,
    Thinking,
    budget_of,
    opened,
    split,
    thinking_for,
    thinking_of,
    with_thinking,
)
from edgeinfer.options import Grammar
from edgeinfer.server.schema import ChatRequest

from . import gate

pytestmark = pytest.mark.model

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWQ = (TEMPLATES / "Qwen-QwQ-32B.jinja").read_text()  # llama.cpp's models/templates copy (SOURCES.md)
THINK = Thinking()

# --- the template -----------------------------------------------------------------


@pytest.mark.pure
def test_the_template_names_its_thinking_tags():
    assert thinking_of(QWQ) == THINK
    assert thinking_of((TEMPLATES / "Qwen3-Coder.jinja").read_text()) is None  # a coder template does not think
    assert thinking_of("{{ '[THINK]' }}{{ messages[0].content }}{{ '[/THINK]' }}") == Thinking("[THINK]", "[/THINK]")
    # --reasoning-format: none keeps the thinking in the text, deepseek splits at <think> even where nothing says so.
    assert thinking_for("none", QWQ) is None
    assert thinking_for("auto", QWQ) == THINK
    assert thinking_for("auto", "{{ messages }}") is None
    assert thinking_for("deepseek", "{{ messages }}") == THINK


@pytest.mark.pure
def test_a_prompt_ending_inside_the_block_is_opened():
    assert opened("<|im_start|>assistant\n<think>\n", THINK)
    # Qwen3 with thinking off closes the block in the prompt; earlier turns' blocks are closed.
    assert not opened("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)
    assert not opened("<think>a</think>b<|im_start|>assistant\n", THINK)
    assert not opened("<|im_start|>assistant\n", THINK)


@pytest.mark.pure
def test_budgets_from_the_request_and_the_server():
    assert budget_of(None, -1) is None
    assert budget_of(None, 300) == 300
    assert budget_of(0, 300) == 0
    assert budget_of(-1, 300) is None
    msgs = [{"role": "user", "content": "hi"}]
    assert ChatRequest(model="m", messages=msgs, reasoning_effort="low").reasoning_budget == EFFORT_BUDGET["low"]
    both = ChatRequest(model="m", messages=msgs, reasoning_effort="high", reasoning_budget=7)
    assert both.reasoning_budget == 7  # the exact budget wins over the effort
    assert ChatRequest(model="m", messages=msgs).reasoning_budget is None
    with pytest.raises(ValueError, match="reasoning_effort"):
        ChatRequest(model="m", messages=msgs, reasoning_effort="extreme")
    with pytest.raises(ValueError, match="reasoning_budget"):
        ChatRequest(model="m", messages=msgs, reasoning_budget=-2)


# --- the split --------------------------------------------------------------------

# (text, started, thinking, answer)
CASES = [
    ("Let me think.\nStill thinking.\n</think>\n\nThe answer.", True, "Let me think.\nStill thinking.", "The answer."),
    ("<think>\nhmm\n</think>\n\nYes.", False, "hmm", "Yes."),
    ("  \n<think>hmm</think>Yes.", False, "hmm", "Yes."),
    ("Just an answer, </think> and <think> in it.", False, None, "Just an answer, </think> and <think> in it."),
    ("thinking that never ends", True, "thinking that never ends", ""),
    ("a </thin k> b <</think>c </think> d <think>e", True, "a </thin k> b <", "c </think> d <think>e"),
    ("<thinking about it", False, None, "<thinking about it"),
    ("<thi", False, None, "<thi"),
    ("</think>The answer at once.", True, None, "The answer at once."),
    ("", True, None, ""),
]


def stream(text: str, started: bool, cuts: list[int], tags: Thinking = THINK) -> tuple[str, str, list[str]]:
    """text fed in pieces cut at `cuts`: the joined thinking and answer, and the order of the kinds emitted."""
    s = ReasoningSplit(tags, started)
    reasoning, content, order = "", "", []
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    for out in [*(s.feed(p) for p in pieces), s.end()]:
        reasoning += out[0]
        content += out[1]
        order += ["r"] * bool(out[0]) + ["c"] * bool(out[1])
    return reasoning, content, order


@pytest.mark.pure
@pytest.mark.parametrize(("text", "started", "thinking", "answer"), CASES)
def test_split_at_every_position_equals_the_whole(text, started, thinking, answer):
    assert split(text, THINK, started) == (thinking, answer)
    for cut in range(len(text) + 1):
        r, c, order = stream(text, started, [cut])
        assert (r or None, c) == (thinking, answer), f"cut at {cut}: {text[:cut]!r} | {text[cut:]!r}"
        assert order == sorted(order, key="rc".index), f"an answer piece came before thinking (cut at {cut})"
    r, c, _ = stream(text, started, list(range(1, len(text))))  # one character at a time
    assert (r or None, c) == (thinking, answer)


@pytest.mark.pure
def test_only_a_possible_tag_is_held_back():
    s = ReasoningSplit(THINK, started=True)
    assert s.feed("abc</th") == ("abc", "")  # "</th" may begin the close tag
    assert s.thinking_now
    assert s.feed("ey") == ("</they", "")  # it did not
    assert s.feed(" and then \n") == (" and then", "")  # whitespace may precede the close: held
    assert s.feed("more</think>") == (" \nmore", "")
    assert not s.thinking_now
    assert s.feed("\n\n") == ("", "")  # blank lines between the block and the answer are dropped
    assert s.feed("Answer <th") == ("", "Answer <th")  # after the block, nothing is held
    assert s.end() == ("", "")


@pytest.mark.pure
def test_other_tags_split_alike():
    tags = Thinking("[THINK]", "[/THINK]")
    text = "[THINK]weigh it[/THINK]Done."
    assert split(text, tags, started=False) == ("weigh it", "Done.")
    for cut in range(len(text) + 1):
        r, c, _ = stream(text, False, [cut], tags)
        assert (r, c) == ("weigh it", "Done.")


# --- the grammar, on the default model's vocabulary -------------------------------


@pytest.fixture(scope="module")
def grammars(model_path):
    from edgeinfer.engine.grammar import Grammars
    from edgeinfer.llamacpp.core import Model

    model = Model(model_path)
    yield Grammars(model.vocab)
    model.close()


class Driven:
    """A model stand-in that wants to write `text` under a grammar: each token is checked against the mask, as the
    engine samples; what the grammar forces is taken; a refused token stops it (refused says where)."""

    def __init__(self, grammars, grammar: Grammar) -> None:
        self.vocab = grammars.vocab
        self.guide = grammars.states(grammars.compile(grammar), 1)[0]
        self.text = ""  # written so far, forced tokens included
        self.tokens = 0  # tokens written by choice (not forced)
        self.forced = ""  # the text of the last forced tokens

    def write(self, text: str) -> bool:
        """Write text token by token; False at the first token the grammar refuses, or when it forces other text."""
        while text:
            t = self.vocab.tokenize(text, add_special=False)[0]
            if not self.guide.allowed()[t]:
                return False
            forced = self.guide.advance(t)
            self.tokens += 1
            piece = self.vocab.detokenize([t])
            self.forced = self.vocab.detokenize([f for f in forced if f != self.vocab.eos])
            self.text += piece + self.forced
            text = text[len(piece) :]
            if not text.startswith(self.forced):
                return False
            text = text[len(self.forced) :]
        return True

    def ends(self) -> bool:
        return bool(self.guide.allowed()[self.vocab.eos]) or self.guide.matcher.is_stopped()


LONG = "I wonder what the user means by this, so let me go through it step by step and slowly. " * 4


def test_a_budget_of_n_tokens_forces_the_close_tag(grammars):
    n = 12
    d = Driven(grammars, with_thinking(None, THINK, n, started=True))
    assert not d.write(LONG), "the budget did not stop the thinking"
    assert d.tokens == n  # exactly n tokens of thinking, then only the close tag
    assert d.forced and THINK.close.startswith(d.forced), f"forced {d.forced!r}"
    assert d.write(THINK.close[len(d.forced) :] + "\n\nThe answer is 4.")
    assert d.ends()
    reasoning, answer = split(d.text, THINK, started=True)
    gate.written(answer, "The answer is 4.")  # the test wrote it
    assert len(grammars.vocab.tokenize(reasoning, add_special=False)) <= n


def test_the_model_may_close_within_the_budget(grammars):
    d = Driven(grammars, with_thinking(None, THINK, 40, started=True))
    assert d.write("Short thought.\n</think>\n\nAnswer <think> free.")
    assert d.ends()
    # Without a budget and without a grammar there is nothing to hold.
    assert with_thinking(None, THINK, None, started=True) is None


def test_a_budget_of_zero_closes_the_block_at_once(grammars):
    d = Driven(grammars, with_thinking(None, THINK, 0, started=True))
    assert not d.write("Let me think")
    assert d.write(THINK.close + "\n\nNo thinking.")
    # Where the prompt opened none, the model may not open one.
    d = Driven(grammars, with_thinking(None, THINK, 0, started=False))
    assert not d.write("<think>\nhmm")
    d = Driven(grammars, with_thinking(None, THINK, 0, started=False))
    assert d.write("A plain answer.")


def test_the_model_may_open_the_block_itself(grammars):
    g = with_thinking(None, THINK, 8, started=False)
    d = Driven(grammars, g)
    assert d.write("A plain answer, no thinking.")
    d = Driven(grammars, g)
    assert not d.write("<think>\n" + LONG)
    assert d.forced and THINK.close.startswith(d.forced)


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.mark.parametrize(
    ("grammar", "good", "bad"),
    [
        (Grammar(kind="json_schema", source=json.dumps(SCHEMA), origin="response_format"), '{"answer": 4}', "Four."),
        (Grammar(kind="lark", source='start: "yes" | "no"'), "yes", "maybe"),
        (Grammar(kind="regex", source=r"[0-9]+/[0-9]+"), "3/4", "three quarters"),
    ],
)
def test_the_answer_after_the_thinking_keeps_its_grammar(grammars, grammar, good, bad):
    for budget in (None, 10):
        g = with_thinking(grammar, THINK, budget, started=True)
        assert g is not None and g.origin == grammar.origin  # errors still name the client's field
        d = Driven(grammars, g)
        assert d.write("Some thought.\n</think>\n\n" + good)
        assert d.ends()
        d = Driven(grammars, g)
        assert not d.write("Some thought.\n</think>\n\n" + bad)
    d = Driven(grammars, with_thinking(grammar, THINK, 6, started=True))
    assert not d.write(LONG)
    assert d.tokens == 6


# --- edgeinfer chat ----------------------------------------------------------------


class ThinkingBackend:
    """A backend whose replies think, then answer."""

    def __init__(self) -> None:
        self.seen: list[list[dict[str, str]]] = []

    def reply(self, messages, params):
        from edgeinfer.chat_repl import Thought
        from edgeinfer.events import Chunk, Finish, StreamStats

        self.seen.append([dict(m) for m in messages])
        yield Thought("Two and two ")
        yield Thought("make four.")
        yield Chunk(0, "It is ", [], 0.0)
        yield Chunk(0, "4.", [], 0.0)
        yield Finish(0, "stop", "It is 4.", [], StreamStats(5, 0, 9, None, None, 0.0))

    def cancel(self) -> None:
        pass

    def reset(self) -> None:
        pass


@pytest.mark.pure
def test_chat_shows_thinking_apart_and_hides_it_on_request(monkeypatch, capsys):
    from edgeinfer.chat_repl import chat_loop
    from edgeinfer.options import SamplingParams

    lines = iter(["What is 2+2?", "/think", "And again?"])

    def fake_input(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    backend = ThinkingBackend()
    chat_loop(backend, None, SamplingParams())
    out = capsys.readouterr().out
    assert "thinking: Two and two make four.\nIt is 4." in out  # shown, the answer on its own line
    assert "thinking hidden" in out
    assert "thinking... It is 4." in out  # hidden: a marker, then the answer
    assert out.count("make four") == 1
    # The conversation keeps the answers only.
    assert backend.seen[1][1] == {"role": "assistant", "content": "It is 4."}


# --- rendering: the neutral events in each API --------------------------------------


@pytest.mark.pure
def test_responses_stream_a_reasoning_item_before_the_message():
    from openai.types.responses import Response

    from edgeinfer.server.output import ReasoningDelta, TextDelta

    from .test_responses import _done, _stream

    done = _done("stop", "x")
    done.reasoning_tokens = 2
    events = _stream([ReasoningDelta(0, "Two and "), ReasoningDelta(0, "two."), TextDelta(0, "4"), done])
    assert [e["type"] for e in events][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["item"]["type"] == "reasoning" and events[3]["part"]["type"] == "reasoning_text"
    assert events[6]["text"] == "Two and two."
    final = Response.model_validate(events[-1]["response"])
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "Two and two." and final.output_text == "4"
    assert final.output[1].id != final.output[0].id
    assert final.usage.output_tokens_details.reasoning_tokens == 2
    # Cut by max_output_tokens while thinking: the reasoning item is incomplete, and an empty message follows.
    cut = _stream([ReasoningDelta(0, "Hmm"), _done("length", "Hmm")])
    final = Response.model_validate(cut[-1]["response"])
    assert [(o.type, o.status) for o in final.output] == [("reasoning", "incomplete"), ("message", "incomplete")]


@pytest.mark.pure
def test_a_whole_response_has_the_reasoning_item_first():
    from openai.types.responses import Response

    from edgeinfer.server.output import ReasoningDelta, TextDelta
    from edgeinfer.server.responses_render import ResponsesDialect

    from .test_responses import _done

    done = _done("stop", "x")
    d = ResponsesDialect("m", {"tools": [], "tool_choice": "auto", "parallel_tool_calls": False})
    r = Response.model_validate(d.response([done], [ReasoningDelta(0, "Think."), TextDelta(0, "Answer."), done]))
    assert [(o.type, o.status) for o in r.output] == [("reasoning", "completed"), ("message", "completed")]
    assert r.output[0].content[0].text == "Think." and r.output_text == "Answer."


@pytest.mark.pure
def test_messages_stream_a_thinking_block_with_its_signature():
    from anthropic.types import Message

    from edgeinfer.server.messages import MessagesDialect
    from edgeinfer.server.output import Done, ReasoningDelta, TextDelta

    from .test_messages import events_of, finish

    d = MessagesDialect("m")
    done = Done(0, "stop", finish())
    evs = [ReasoningDelta(0, "Paris is "), ReasoningDelta(0, "the capital."), TextDelta(0, "Paris."), done]
    items = d.start(1) + [item for ev in evs for item in d.on(ev)] + d.end([done])
    seq = [(n, e.get("content_block", e.get("delta", {})).get("type")) for n, e in events_of(items)]
    assert seq[1:9] == [
        ("content_block_start", "thinking"),
        ("ping", None),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
    ]
    msg = Message.model_validate(MessagesDialect("m").response([done], evs))
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.content[0].thinking == "Paris is the capital."


@pytest.mark.pure
def test_each_api_asks_for_a_budget_in_its_own_words():
    from edgeinfer.server.messages import to_input as messages_to_input
    from edgeinfer.server.messages_schema import MessagesRequest
    from edgeinfer.server.responses import to_input as responses_to_input
    from edgeinfer.server.responses_schema import ResponsesRequest, parse_items, parse_tools

    def anthropic(thinking):
        body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "thinking": thinking}
        return messages_to_input(MessagesRequest.model_validate(body)).reasoning_budget

    assert anthropic({"type": "enabled", "budget_tokens": 40}) == 40
    assert anthropic({"type": "disabled"}) == 0
    assert anthropic({"type": "adaptive"}) is None

    def openai(reasoning):
        req = ResponsesRequest.model_validate({"model": "m", "input": "hi", "reasoning": reasoning})
        return responses_to_input(req, parse_tools(None), parse_items(req.input), 0).reasoning_budget

    assert openai({"effort": "medium"}) == EFFORT_BUDGET["medium"]
    assert openai({"effort": "none"}) == 0
    assert openai({"summary": "auto"}) is None
    with pytest.raises(ValueError, match="effort"):
        openai({"effort": "enormous"})


# --- end to end: QwQ-32B's template on the default model's weights -------------------

BUDGET = 12  # thinking tokens at most in the budget tests
QUESTION = [{"role": "user", "content": "What is 2+2? Think first."}]


@pytest.fixture(scope="module")
def qwq_server(model_path, tmp_path_factory):
    """`edgeinfer serve` on a copy of the default model whose chat template is QwQ-32B's (it opens `<think>\\n`)."""
    from .conftest import start_server, stop_process

    folder = tmp_path_factory.mktemp("qwq")
    copy = folder / "smollm2-qwq-template.gguf"
    cmd = [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(model_path), str(copy)]
    subprocess.run([*cmd, "--chat-template-file", str(TEMPLATES / "Qwen-QwQ-32B.jinja"), "--force"], check=True,
                   capture_output=True)  # fmt: skip
    proc = start_server(folder / "edgeinfer.sock", "--model", str(copy), "--parallel", "2")
    yield folder / "edgeinfer.sock"
    stop_process(proc)


def thinking_tokens(tokens: list[str], thinking: str) -> int:
    """How many of the sampled tokens (logprobs list those; forced ones have none) wrote the thinking."""
    n = 0
    while n < len(tokens) and thinking.startswith("".join(tokens[: n + 1]).lstrip()):
        n += 1
    return n


def test_chat_completions_think_apart_within_the_budget(qwq_server):
    from edgeinfer.client import client

    oai = client(qwq_server)
    args = {"model": "default", "messages": QUESTION, "max_tokens": 40, "temperature": 0}
    for budget in (5, BUDGET):
        r = oai.chat.completions.create(**args, logprobs=True, extra_body={"reasoning_budget": budget})
        m = r.choices[0].message
        thinking = (m.model_extra or {}).get("reasoning_content")
        tokens = [lp.token for lp in r.choices[0].logprobs.content]
        # The model, which never learnt to close a block, thinks until the budget; then the close tag is
        # forced (it is in neither field) and the answer follows.
        assert thinking and THINK.close not in thinking
        assert 0 < thinking_tokens(tokens, thinking) <= budget
        assert "".join(tokens).lstrip().startswith(thinking)
        assert m.content
        gate.not_begins(m.content, THINK.close)

    # Streamed: the thinking's deltas, then the answer's; the usage counts the thinking's tokens.
    kinds, thought, answer, usage = [], "", "", None
    stream = oai.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}, extra_body={"reasoning_budget": BUDGET}
    )
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            if r_text := (c.delta.model_extra or {}).get("reasoning_content"):
                kinds.append("r")
                thought += r_text
            if c.delta.content:
                kinds.append("c")
                answer += c.delta.content
    assert thought and answer and kinds == sorted(kinds, key="rc".index)
    gate.absent(THINK.close, thought)
    gate.not_begins(answer, THINK.close)
    assert usage is not None and 0 < usage.completion_tokens_details.reasoning_tokens <= BUDGET + 4  # + the tag


def test_no_budget_thinks_to_max_tokens_and_zero_thinks_not_at_all(qwq_server):
    from edgeinfer.client import client

    oai = client(qwq_server)
    r = oai.chat.completions.create(model="default", messages=QUESTION, max_tokens=16, temperature=0)
    m = r.choices[0].message
    # Unbounded, this model never closes the block: all it writes, to its end or max_tokens, is thinking.
    assert (m.model_extra or {}).get("reasoning_content") and not m.content
    r = oai.chat.completions.create(
        model="default", messages=QUESTION, max_tokens=16, temperature=0, reasoning_effort="none"
    )
    m = r.choices[0].message
    assert not (m.model_extra or {}).get("reasoning_content")
    gate.absent(THINK.close, m.content or "")


def test_responses_give_a_reasoning_item_before_the_message(qwq_server):
    from openai.types.responses import Response

    from edgeinfer.client import client

    oai = client(qwq_server)
    args = {"model": "default", "input": QUESTION, "max_output_tokens": 48, "temperature": 0}
    args["extra_body"] = {"reasoning": {"effort": "minimal"}}  # 64 tokens: bounded by max_output_tokens here
    r = oai.responses.create(**args)
    assert r.output[0].type == "reasoning" and r.output[0].content[0].text
    assert [o.type for o in r.output] == ["reasoning", "message"]
    gate.absent(THINK.close, r.output[0].content[0].text)
    gate.not_begins(r.output_text, THINK.close)

    events = list(oai.responses.create(**args, stream=True))
    types = [e.type for e in events]
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    assert "response.reasoning_text.delta" in types
    if "response.output_text.delta" in types:
        assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    final = Response.model_validate(events[-1].response.model_dump())
    assert final.usage.output_tokens_details.reasoning_tokens > 0
    gate.one_generation(
        final.output[0].content[0].text, "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    )


def test_messages_give_thinking_blocks_before_the_text(qwq_server):
    from edgeinfer.client import anthropic_client

    claude = anthropic_client(qwq_server)
    # This SDK release sends no sampling fields of its own: the body takes them.
    args = {"model": "default", "messages": QUESTION, "max_tokens": 40, "extra_body": {"temperature": 0}}
    msg = claude.messages.create(**args, thinking={"type": "enabled", "budget_tokens": BUDGET})
    kinds = [b.type for b in msg.content]
    assert kinds[0] == "thinking" and msg.content[0].thinking and set(kinds[1:]) <= {"text"}
    gate.absent(THINK.close, msg.content[0].thinking)

    with claude.messages.stream(**args, thinking={"type": "enabled", "budget_tokens": BUDGET}) as s:
        events = list(s)
        final = s.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert starts[0] == "thinking" and set(starts[1:]) <= {"text"}
    assert deltas[0] == "thinking_delta" and "signature_delta" in deltas
    assert final.content[0].type == "thinking" and final.content[0].thinking

    off = claude.messages.create(**args, thinking={"type": "disabled"})
    assert all(b.type == "text" for b in off.content)


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def test_thinking_then_a_required_tool_call(qwq_server):
    from edgeinfer.client import client

    oai = client(qwq_server)
    args = {"model": "default", "messages": QUESTION, "tools": [ADD], "tool_choice": "required", "max_tokens": 64}
    args |= {"temperature": 0, "extra_body": {"reasoning_budget": 8}}
    r = oai.chat.completions.create(**args)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and (m.model_extra or {}).get("reasoning_content")
    call = m.tool_calls[0].function
    assert call.name == "add" and set(json.loads(call.arguments)) == {"a", "b"}
    kinds = []
    for chunk in oai.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            thinking = (c.delta.model_extra or {}).get("reasoning_content")
            kinds += ["r"] * bool(thinking) + ["t"] * bool(c.delta.tool_calls)
    assert "r" in kinds and kinds[-1] == "t" and kinds == sorted(kinds, key="rt".index)


def test_chat_in_the_terminal_thinks_apart_on_the_engine(model_path, qwq_server):
    """edgeinfer chat's in-process backend splits and bounds the thinking as the server does."""
    from edgeinfer.chat_repl import EngineBackend, Thought
    from edgeinfer.events import Chunk, Finish
    from edgeinfer.options import EngineConfig, SamplingParams
    from edgeinfer.runtime import make_engine

    copy = qwq_server.parent / "smollm2-qwq-template.gguf"
    engine = make_engine(EngineConfig(model=copy, parallel=1, ctx_size=512, reasoning_budget=6, spec="off"))
    try:
        events = list(EngineBackend(engine).reply(QUESTION, SamplingParams(temperature=0, max_tokens=24)))
    finally:
        engine.close()
    kinds = ["r" if isinstance(e, Thought) else "c" for e in events if isinstance(e, Thought | Chunk) and e.text]
    assert "r" in kinds and kinds == sorted(kinds, key="rc".index)
    thought = "".join(e.text for e in events if isinstance(e, Thought))
    answer = "".join(e.text for e in events if isinstance(e, Chunk))
    finish = events[-1]
    assert isinstance(finish, Finish)
    gate.one_generation(finish.text, answer)  # the conversation keeps the answer alone
    gate.absent(THINK.close, thought)
    gate.not_begins(answer, THINK.close)
