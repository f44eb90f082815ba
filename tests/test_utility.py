"""llama-server's utility endpoints over the socket: /tokenize, /detokenize, /apply-template, /v1/embeddings.

Each is checked against something outside edgeinfer's own code path: the GGUF's vocabulary and
chat template read with the `gguf` package and rendered with jinja2, the official openai SDK.
"""

from __future__ import annotations

import json

import gguf
import jinja2
import numpy as np
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgeinfer import prepare as T
from edgeinfer.client import client
from edgeinfer.engine.embeddings import EMBED_CTX, pack
from edgeinfer.formats.generic import Generic
from edgeinfer.models.catalog import default_model_path
from edgeinfer.options import SamplingParams
from edgeinfer.server.schema import ChatRequest

from . import gate
from .conftest import raw
from .gate import same_or_near_tie

pytestmark = pytest.mark.model

MODEL = "default"
PARALLEL = 8  # the shared server's (conftest.SHARED_SERVERS): with --ctx-size 8192, 1,024 tokens a stream


@pytest.fixture(scope="module")
def http(server):
    return raw(server)


@pytest.fixture(scope="module")
def oai(server):
    return client(server)


@pytest.fixture(scope="module")
def gguf_file():
    """The default model's GGUF as the gguf package reads it: its vocabulary and chat template."""
    reader = gguf.GGUFReader(default_model_path())
    fields = reader.fields
    return {
        "tokens": fields["tokenizer.ggml.tokens"].contents(),
        "template": fields["tokenizer.chat_template"].contents(),
        "add_bos": bool(fields["tokenizer.ggml.add_bos_token"].contents())
        if "tokenizer.ggml.add_bos_token" in fields
        else False,
        "bos": int(fields["tokenizer.ggml.bos_token_id"].contents()),
    }


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character: printable Latin-1 bytes as
    themselves, the rest as the characters from U+0100 on, in byte order. This is its inverse."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


BYTE_OF = _gpt2_byte_decoder()


def vocab_bytes(entry: str) -> bytes:
    return bytes(BYTE_OF[c] for c in entry)


def piece_bytes(piece: str | list[int]) -> bytes:
    return piece.encode() if isinstance(piece, str) else bytes(piece)


def post(http, path, body):
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


# --- /tokenize and /detokenize ------------------------------------------------------------

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "héllo wörld — naïve café, 日本語のテキスト",
    "emoji 🦜🪿 and math ∮ E⋅da = Q",
    "def f(x):\n    return x ** 2  # code\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_round_trips_through_the_gguf_vocabulary(http, gguf_file, text):
    ids = post(http, "/tokenize", {"content": text})["tokens"]
    with_pieces = post(http, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [t["id"] for t in with_pieces] == ids and ids
    # Each piece is the GGUF's own vocabulary entry for that id, and the pieces make the text.
    for t in with_pieces:
        assert piece_bytes(t["piece"]) == vocab_bytes(gguf_file["tokens"][t["id"]]), t
    assert b"".join(piece_bytes(t["piece"]) for t in with_pieces) == text.encode()
    gate.written(post(http, "/detokenize", {"tokens": ids})["content"], text)


def test_a_piece_that_is_part_of_a_character_comes_as_bytes(http):
    pieces = post(http, "/tokenize", {"content": "🦜🪿", "with_pieces": True})["tokens"]
    partial = [t["piece"] for t in pieces if isinstance(t["piece"], list)]
    assert partial and all(all(0 <= b < 256 for b in p) for p in partial)


def test_special_tokens_add_special_and_parse_special(http, gguf_file):
    text = "<|im_start|>user\nhi<|im_end|>"
    parsed = post(http, "/tokenize", {"content": text})["tokens"]
    start = gguf_file["tokens"].index("<|im_start|>")
    assert parsed[0] == start  # parse_special defaults to true, as in llama-server
    literal = post(http, "/tokenize", {"content": text, "parse_special": False})["tokens"]
    assert start not in literal and len(literal) > len(parsed)
    gate.written(post(http, "/detokenize", {"tokens": parsed})["content"], text)
    plain = post(http, "/tokenize", {"content": "hi"})["tokens"]
    special = post(http, "/tokenize", {"content": "hi", "add_special": True})["tokens"]
    assert special == ([gguf_file["bos"]] if gguf_file["add_bos"] else []) + plain


# --- /apply-template ----------------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def render_independently(template: str, messages: list[dict]) -> str:
    """The GGUF's template in jinja2, as Hugging Face's apply_chat_template runs it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def test_apply_template_equals_the_template_rendered_independently(http, oai, gguf_file):
    prompt = post(http, "/apply-template", {"messages": CHAT})["prompt"]
    assert prompt == render_independently(gguf_file["template"], CHAT)
    # The prompt is what a chat completion of the same body reads: as many tokens as it reports.
    r = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1, temperature=0)
    assert len(post(http, "/tokenize", {"content": prompt, "add_special": True})["tokens"]) == r.usage.prompt_tokens


def test_apply_template_includes_the_tools(http, oai, gguf_file):
    body = {"messages": CHAT, "tools": [WEATHER_TOOL]}
    prompt = post(http, "/apply-template", body)["prompt"]
    # SmolLM2's template writes no tools: edgeinfer describes them in the system message.
    system = f"{CHAT[0]['content']}\n\n{T.described(ChatRequest(model=MODEL, **body).to_input(), Generic())}"
    expected = render_independently(gguf_file["template"], [{"role": "system", "content": system}, *CHAT[1:]])
    assert prompt == expected and "get_weather" in prompt
    r = oai.chat.completions.create(model=MODEL, max_tokens=1, temperature=0, **body)
    assert len(post(http, "/tokenize", {"content": prompt, "add_special": True})["tokens"]) == r.usage.prompt_tokens
    assert post(http, "/apply-template", {**body, "tool_choice": "none"})["prompt"] == prompt.replace(
        f"\n\n{T.described(ChatRequest(model=MODEL, **body).to_input(), Generic())}", ""
    )


# --- /v1/embeddings -----------------------------------------------------------------------

CAT = "The cat is sleeping on the warm windowsill."
CAT_PARAPHRASE = "A cat naps on the sunny window ledge."
BANK = "The central bank raised interest rates by half a percent."
KERNEL = "Compile the Linux kernel with the default configuration."


def embed(http, inputs, **kw):
    body = post(http, "/v1/embeddings", {"model": MODEL, "input": inputs, **kw})
    assert body["object"] == "list" and body["model"]
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    assert all(d["object"] == "embedding" for d in body["data"])
    return np.array([d["embedding"] for d in body["data"]]), body["usage"]


def test_a_paraphrase_is_closer_than_unrelated_text(http):
    v, _ = embed(http, [CAT, CAT_PARAPHRASE, BANK, KERNEL])
    cos = v @ v.T  # unit vectors: the dot product is the cosine
    assert cos[0, 1] > max(cos[0, 2], cos[0, 3], cos[1, 2], cos[1, 3]), cos


def test_a_batch_equals_the_texts_one_by_one_and_vectors_are_unit(http):
    texts = [CAT, CAT_PARAPHRASE, BANK, KERNEL, "short"]
    batch, usage = embed(http, texts)
    alone = np.concatenate([embed(http, t)[0] for t in texts])
    assert batch.shape == (len(texts), batch.shape[1]) and batch.shape[1] > 100
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(batch, alone, atol=2e-3)  # llama.cpp's kernels round by batch shape
    ids = [post(http, "/tokenize", {"content": t, "add_special": True})["tokens"] for t in texts]
    assert usage == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids))}
    # Token ids embed as the text they spell; one list of ids is one input.
    by_ids, _ = embed(http, ids)
    np.testing.assert_allclose(by_ids, batch, atol=1e-6)
    np.testing.assert_allclose(embed(http, ids[0])[0][0], batch[0], atol=2e-3)


def test_the_openai_sdk_parses_embeddings(http, oai):
    floats, _ = embed(http, [CAT, BANK])
    r = oai.embeddings.create(model=MODEL, input=[CAT, BANK])  # the SDK asks for base64 and decodes it
    assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens > 0
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32), floats.astype(np.float32))
    dims = len(r.data[0].embedding)
    r = oai.embeddings.create(model=MODEL, input=CAT, encoding_format="float", dimensions=dims)
    np.testing.assert_allclose(r.data[0].embedding, floats[0], atol=2e-3)


def test_embedding_inputs_over_the_context_are_refused_naming_the_limit(http):
    limit = min(EMBED_CTX, 8192 // PARALLEL)  # what one stream holds
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": [[42] * (limit + 1)]})
    assert r.status_code == 400 and str(limit) in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "input"
    assert embed(http, [[42] * limit])[0].shape[0] == 1  # exactly the limit fits


def test_embeddings_and_generation_share_the_engine(engine):
    """In-process: a request bigger than one decode is split, and its vectors equal the same inputs
    decoded together; embeddings decoded while a stream generates leave its tokens as they were alone."""
    emb = engine.embeddings
    texts = [engine.vocab.tokenize(t) for t in (CAT, CAT_PARAPHRASE, BANK, KERNEL)]
    together = emb.embed(texts)
    decodes = emb.decodes
    emb.max_tokens = max(map(len, texts)) + 1  # the context is already made: only the packing changes
    split = emb.embed(texts)
    assert emb.decodes - decodes == len(pack([len(t) for t in texts], emb.max_tokens, 64)) > 1
    np.testing.assert_allclose(split, together, atol=2e-3)

    params = SamplingParams(temperature=0, max_tokens=16, logprobs=5)
    prompt = engine.tokenize("Once upon a time")
    alone = engine.generate(prompt, params)
    engine.reset_prefixes()  # both runs compute the prompt alike (a restored prefix decodes in other shapes)
    handle = engine.submit(prompt, params)[0]
    queued = emb.submit(texts)  # its decodes run between the stream's steps, one a pass of the engine loop
    # The stream's own batches are untouched by the embeddings' decodes; speculation (auto) may still draft
    # in one run and not the other, so the two agree up to near-ties.
    same_or_near_tie(alone, handle.result(), engine, prompt)
    np.testing.assert_allclose(queued.result(timeout=120), together, atol=2e-3)


@pytest.mark.pure
def test_pack_fills_decodes_in_order():
    assert pack([3, 3, 3], 6, 64) == [[0, 1], [2]]
    assert pack([1] * 5, 100, 2) == [[0, 1], [2, 3], [4]]
    assert pack([6, 1], 6, 64) == [[0], [1]]
    assert pack([], 6, 64) == []


# --- bad bodies ------------------------------------------------------------------------------

BIG = 10**9
OK_MSG = [{"role": "user", "content": "hi"}]
BAD = [
    # /tokenize
    ("/tokenize", {}, 400, "content is required"),
    ("/tokenize", {"content": 5}, 400, "content"),
    ("/tokenize", {"content": ["a"]}, 400, "content"),
    ("/tokenize", {"content": "hi", "add_special": "yes"}, 400, "add_special"),
    ("/tokenize", {"content": "hi", "with_pieces": 1}, 400, "with_pieces"),
    ("/tokenize", {"content": "hi", "bogus": 1}, 400, "bogus is not a supported field"),
    ("/tokenize", b'{"content": "\\ud800"}', 400, "surrogate"),
    ("/tokenize", b"content=hi", 400, "not valid JSON"),
    ("/tokenize", b"[1, 2]", 400, ""),
    # /detokenize
    ("/detokenize", {}, 400, "tokens is required"),
    ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, "2"]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1.5]}, 400, "tokens"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, -1]}, 400, "tokens[1] is -1"),
    ("/detokenize", {"tokens": [BIG]}, 400, "vocabulary"),
    ("/detokenize", {"tokens": [1] * 300_000}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "special": True}, 400, "special is not a supported field"),
    # /apply-template
    ("/apply-template", {}, 400, "messages is required"),
    ("/apply-template", {"messages": []}, 400, "messages"),
    ("/apply-template", {"messages": "hi"}, 400, "messages"),
    ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/apply-template", {"messages": [{"role": "user", "content": 3}]}, 400, "content"),
    ("/apply-template", {"messages": [{"role": "tool", "content": "x"}]}, 400, "tool_call_id"),
    (
        "/apply-template",
        {"messages": OK_MSG, "tools": [{"type": "function", "function": {"name": "a b"}}]},
        400,
        "name",
    ),
    (
        "/apply-template",
        {
            "messages": OK_MSG,
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        400,
        "nope",
    ),
    ("/apply-template", {"messages": OK_MSG, "frobnicate": 1}, 400, "frobnicate is not a supported field"),
    # /v1/embeddings
    ("/v1/embeddings", {"model": MODEL}, 400, "input is required"),
    ("/v1/embeddings", {"input": "hi"}, 400, "model is required"),
    ("/v1/embeddings", {"model": MODEL, "input": ""}, 400, "empty string"),
    ("/v1/embeddings", {"model": MODEL, "input": ["a", ""]}, 400, "input[1] is an empty string"),
    ("/v1/embeddings", {"model": MODEL, "input": []}, 400, "empty list"),
    ("/v1/embeddings", {"model": MODEL, "input": [1, "a"]}, 400, "mixes"),
    ("/v1/embeddings", {"model": MODEL, "input": [[1], []]}, 400, "input[1] is empty"),
    ("/v1/embeddings", {"model": MODEL, "input": [[1, "x"]]}, 400, "input[0] holds a string"),
    ("/v1/embeddings", {"model": MODEL, "input": {"text": "hi"}}, 400, "not an object"),
    ("/v1/embeddings", {"model": MODEL, "input": True}, 400, "not a boolean"),
    ("/v1/embeddings", {"model": MODEL, "input": [1.5]}, 400, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": [-1]}, 400, "token id -1"),
    ("/v1/embeddings", {"model": MODEL, "input": [[5], [BIG]]}, 400, f"input[1] holds token id {BIG}"),
    ("/v1/embeddings", {"model": MODEL, "input": ["a"] * 2049}, 400, "at most 2048"),
    ("/v1/embeddings", {"model": MODEL, "input": "hi", "encoding_format": "hex"}, 400, "encoding_format"),
    ("/v1/embeddings", {"model": MODEL, "input": "hi", "dimensions": 3}, 400, "dimensions is 3"),
    ("/v1/embeddings", {"model": MODEL, "input": "hi", "dimensions": "576"}, 400, "dimensions"),
    ("/v1/embeddings", {"model": MODEL, "input": "hi", "n": 2}, 400, "n is not a supported field"),
    ("/v1/embeddings", b'{"model": "default", "input": ["ok", "\\udc00"]}', 400, "surrogate"),
]


@pytest.mark.parametrize("path, body, status, needle", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_bodies_are_openai_errors_and_the_server_goes_on(http, path, body, status, needle):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"], err
    assert needle in err["message"], err
    assert http.get("/health").status_code == 200
