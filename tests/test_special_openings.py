"""Call tags that a vocabulary holds as one special token (Mistral Nemo's [TOOL_CALLS], Llama 3's <|python_tag|>,
Qwen's <tool_call>): the grammars name the token itself, the one the model was trained to write, under `required`
and `auto`; the engine shows it in the output as its text, so the parsers find the calls.

The default model has none of the families' tags as special tokens, so its own control tokens stand in for them
(SmolLM2's <jupyter_code>, <jupyter_output>, <jupyter_text>: control tokens that are not the end of generation)."""

from __future__ import annotations

import json

import jsonschema
import llguidance
import pytest

from edgeinfer.engine.grammar import Grammars
from edgeinfer.events import Chunk
from edgeinfer.formats import mistral
from edgeinfer.formats.base import CallStream, ToolFormat, ToolSpec
from edgeinfer.formats.hermes import Hermes
from edgeinfer.formats.llama3 import Llama3
from edgeinfer.formats.mistral import Mistral
from edgeinfer.formats.qwen3_coder import Qwen3Coder
from edgeinfer.formats.select import KNOWN
from edgeinfer.llamacpp import Model
from edgeinfer.options import EngineConfig, Grammar, SamplingParams
from edgeinfer.runtime import make_engine

from . import gate

pytestmark = pytest.mark.model

ADD = ToolSpec(
    "add",
    "Adds two integers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
)
TOOLS = [ADD]
STAND_INS = ("<jupyter_code>", "<jupyter_output>", "<jupyter_text>")


@pytest.fixture(scope="module")
def vocab(model_path):
    return Model(model_path).vocab


@pytest.fixture(scope="module")
def grammars(vocab):
    return Grammars(vocab)


def stand_in(vocab, tags: dict[str, str]):
    """A token_of that takes each family tag for the stand-in special token of the default vocabulary."""
    ids = {tag: vocab.special_token(text) for tag, text in tags.items()}
    assert None not in ids.values()
    return ids.get


def tokens(vocab, *parts: str | int) -> list[int]:
    """Token ids of text pieces (tokenized as plain text) and token ids, in a row."""
    out: list[int] = []
    for p in parts:
        out += [p] if isinstance(p, int) else vocab.tokenize(p, add_special=False, parse_special=False)
    return out


def takes(grammars, source: str, ids: list[int]) -> bool:
    """Whether the grammar, compiled as a request's would be, takes these tokens whole."""
    compiled = grammars.compile(Grammar.model_construct(kind="lark", source=source, origin="tools"))
    matcher = llguidance.LLMatcher(grammars.tokenizer(), compiled, log_level=0)
    return matcher.consume_tokens(ids) and matcher.is_accepting()


def test_special_token_finds_the_vocabularys_own_special_tokens_only(vocab):
    assert vocab.special_token("<|im_end|>") == vocab.tokenize("<|im_end|>", False, True)[0]
    code = vocab.special_token("<jupyter_code>")
    assert code is not None and vocab.piece(code) == b"" and vocab.piece(code, special=True) == b"<jupyter_code>"
    # Plain text, even a word that is one token, and text around a special token are not one.
    for text in ("[TOOL_CALLS]", "<tool_call>", "<|python_tag|>", "<think>", "Hello", " the", "<jupyter_code>x", ""):
        assert vocab.special_token(text) is None, text


def test_where_the_tags_are_text_the_grammars_are_the_same_as_without_a_vocabulary(vocab):
    """The default model's vocabulary holds no family's tag as a special token: every grammar stays text."""
    json_answer = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for cls in KNOWN.values():
        plain, looked_up = cls(TOOLS), cls(TOOLS)
        looked_up.token_of = vocab.special_token
        for required in (True, False):
            for parallel in (True, False):
                for schema in (None, json_answer):
                    answer = plain.answer_rule(schema)
                    assert plain.grammar(TOOLS, required, parallel, answer) == looked_up.grammar(
                        TOOLS, required, parallel, answer
                    ), cls.name


def test_mistral_opens_with_the_special_token(vocab, grammars):
    fmt = Mistral(TOOLS)
    fmt.token_of = stand_in(vocab, {"[TOOL_CALLS]": "<jupyter_code>"})
    tag = fmt.token_of("[TOOL_CALLS]")
    items = '[{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abcdefghi"}]'
    two = '[{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abcdefghi"}, ' + items[1:]
    forced = fmt.grammar(TOOLS, required=True, parallel=True, answer="")
    assert f"<[{tag}]>" in forced
    assert takes(grammars, forced, tokens(vocab, tag, items))
    assert takes(grammars, forced, tokens(vocab, tag, two))
    assert not takes(grammars, forced, tokens(vocab, "[TOOL_CALLS]" + items))  # spelled out: not the model's token
    short = '[{"name": "add", "arguments": {"a": 1}, "id": "abcdefghi"}]'  # b left out
    assert not takes(grammars, forced, tokens(vocab, tag, short))
    auto = fmt.grammar(TOOLS, required=False, parallel=True, answer=fmt.answer_rule(None))
    assert takes(grammars, auto, tokens(vocab, "It is sunny in Paris."))  # free text
    assert takes(grammars, auto, tokens(vocab, tag, items))
    assert takes(grammars, auto, tokens(vocab, "I will add them. ", tag, two))  # text, then the calls
    assert not takes(grammars, auto, tokens(vocab, "I will add them. ", tag, "[{}]"))
    json_answer = fmt.answer_rule({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    auto_json = fmt.grammar(TOOLS, required=False, parallel=False, answer=json_answer)
    assert takes(grammars, auto_json, tokens(vocab, '{"a": 1}'))
    assert takes(grammars, auto_json, tokens(vocab, tag, items))
    assert not takes(grammars, auto_json, tokens(vocab, "Text. ", tag, items))


@pytest.mark.parametrize("family", [Hermes, Qwen3Coder], ids=lambda f: f.name)
def test_tagged_calls_open_and_close_with_special_tokens(vocab, grammars, family: type[ToolFormat]):
    fmt = family(TOOLS)
    fmt.token_of = stand_in(vocab, {"<tool_call>": "<jupyter_code>", "</tool_call>": "<jupyter_output>"})
    open_, close = fmt.token_of("<tool_call>"), fmt.token_of("</tool_call>")

    def call(text: str) -> list[int]:  # a call as the family writes it, its tags as the special tokens
        body = text.removeprefix("<tool_call>").removesuffix("</tool_call>")
        assert body != text
        return tokens(vocab, open_, body, close)

    one = call(fmt.write_calls([("add", {"a": 1, "b": 2})]))
    two = [*one, *tokens(vocab, "\n"), *call(fmt.write_calls([("add", {"a": 3, "b": 4})]))]
    forced = fmt.grammar(TOOLS, required=True, parallel=True, answer="")
    assert takes(grammars, forced, one) and takes(grammars, forced, two)
    assert not takes(grammars, forced, tokens(vocab, fmt.write_calls([("add", {"a": 1, "b": 2})])))  # spelled out
    auto = fmt.grammar(TOOLS, required=False, parallel=True, answer=fmt.answer_rule(None))
    assert takes(grammars, auto, tokens(vocab, "It is sunny in Paris."))
    assert takes(grammars, auto, tokens(vocab, "Let me add them.\n", *two))
    assert not takes(grammars, auto, [*tokens(vocab, "Text "), open_, *tokens(vocab, "\nnot a call\n"), close])


def test_llama3_may_begin_a_call_with_its_python_tag_token(vocab, grammars):
    fmt = Llama3(TOOLS)
    fmt.token_of = stand_in(vocab, {"<|python_tag|>": "<jupyter_code>"})
    tag = fmt.token_of("<|python_tag|>")
    call = fmt.write_calls([("add", {"a": 1, "b": 2})])
    for required in (True, False):
        source = fmt.grammar(TOOLS, required=required, parallel=False, answer=fmt.answer_rule(None))
        assert takes(grammars, source, tokens(vocab, call)) and takes(grammars, source, tokens(vocab, tag, call))
        assert takes(grammars, source, tokens(vocab, "Text.")) is not required
    assert not takes(grammars, fmt.grammar(TOOLS, True, False, ""), tokens(vocab, tag, "Text."))


# --- on the engine: the special token shown as its text, and the calls read from it ---------------------------


@pytest.fixture(scope="module")
def shown_engine(model_path):
    """An engine started while Mistral's opening is a special token of the default vocabulary (<jupyter_code>)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mistral, "OPEN", "<jupyter_code>")  # the parser and the grammar read the module's tag
        mp.setattr(Mistral, "opening", "<jupyter_code>")
        mp.setattr(Mistral, "markers", ("<jupyter_code>",))
        engine = make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=2048, spec="off"))
        try:
            yield engine
        finally:
            engine.close()


def test_the_engine_shows_the_tags_special_tokens_and_the_calls_parse(shown_engine):
    engine = shown_engine
    tag = engine.vocab.special_token("<jupyter_code>")
    assert engine.vocab.shown == {tag}  # marked at start from the formats' markers; no other token of this vocab
    assert engine.vocab.piece(tag) == b"<jupyter_code>"
    fmt = Mistral(TOOLS)
    fmt.token_of = engine.vocab.special_token  # as the server sets it
    source = fmt.grammar(TOOLS, required=True, parallel=True, answer="")
    assert f"<[{tag}]>" in source
    prompt = engine.chat_prompt([{"role": "user", "content": "Add 2 and 3."}])
    params = SamplingParams(
        temperature=0.8, seed=5, max_tokens=200, grammar=Grammar.model_construct(kind="lark", source=source)
    )
    for handle in engine.submit(prompt, params, n=4):
        events = handle.collect()
        finish = events[-1]
        assert finish.finish_reason == "stop", finish.text
        gate.ruled(finish.token_ids[0], tag, "the grammar opens every answer with the call's special token")
        gate.begins(finish.text, "<jupyter_code>[")
        before, calls = fmt.parse(finish.text, final=True)
        assert before is None and calls, finish.text
        for call in calls:
            assert call.name == "add"
            jsonschema.validate(json.loads(call.arguments), ADD.parameters)
        # Streamed, the chunks carry the tag too, and the calls come out of them.
        stream = CallStream(fmt)
        found = []
        content = ""
        for e in events:
            if isinstance(e, Chunk):
                text, new = stream.feed(e.text)
                content, found = content + text, found + new
        text, new = stream.end()
        assert (content + text).strip() == "" and [c.name for c in found + new] == [c.name for c in calls]
