"""Streams and context sized from the model's own figures and the memory budget, before anything loads."""

from __future__ import annotations

import pytest

from edgeinfer.engine.sizing import MAX_AUTO_STREAMS, cell_bytes, size

pytestmark = pytest.mark.pure

MIB = 1 << 20
# SmolLM2-135M's figures (its GGUF): 30 layers, 3 KV heads of 64; trained for 8,192 tokens.
SMOLLM2 = {
    "general.architecture": "llama",
    "llama.block_count": 30,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
    "llama.embedding_length": 576,
    "llama.context_length": 8192,
}
# An 8B model trained for 131,072 tokens: 32 layers, 8 KV heads of 128.
BIG = {
    "general.architecture": "llama",
    "llama.block_count": 32,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.embedding_length": 4096,
    "llama.context_length": 131072,
}


def test_a_cell_holds_every_layers_keys_and_values():
    assert cell_bytes(SMOLLM2, "f16") == 30 * 3 * (64 + 64) * 2  # 23,040 bytes
    assert cell_bytes(BIG, "q8_0") == int(32 * 8 * 256 * 34 / 32)
    gemma = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 18,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.embedding_length": 640,
    }
    assert cell_bytes(gemma, "f16") == 18 * 1 * 512 * 2
    per_layer = {**SMOLLM2, "llama.attention.head_count_kv": [3, 0, 3]}  # a layer without attention keeps nothing
    assert cell_bytes(per_layer, "f16") == 2 * 3 * 128 * 2


def test_by_default_each_stream_holds_the_trained_context_and_memory_sets_the_streams():
    s = size(SMOLLM2, 0, 0, "f16", 1024, unified=False)
    assert s.per_stream == 8192 and s.parallel == 1024 * MIB // (8192 * 23040) == 5
    assert s.ctx_size == 5 * 8192 and "trained context, 8192" in s.why and "5 streams" in s.why
    roomy = size(SMOLLM2, 0, 0, "f16", 64 * 1024, unified=False)
    assert roomy.parallel == MAX_AUTO_STREAMS and roomy.per_stream == 8192


def test_a_model_trained_for_more_than_the_budget_holds_gets_what_it_holds_in_one_stream():
    s = size(BIG, 0, 0, "f16", 4096, unified=False)
    assert s.parallel == 1 and s.per_stream == 4096 * MIB // cell_bytes(BIG, "f16") // 256 * 256
    assert s.per_stream < 131072 and "holds no more" in s.why and "131072" in s.why


def test_flags_set_by_hand_win():
    both = size(SMOLLM2, 8192, 8, "f16", 0, unified=False)
    assert (both.parallel, both.ctx_size, both.per_stream) == (8, 8192, 1024)
    cells = size(SMOLLM2, 16384, 0, "f16", 0, unified=False)
    assert (cells.parallel, cells.per_stream) == (2, 8192)  # as many trained contexts as the cells hold
    streams = size(SMOLLM2, 0, 3, "f16", 64 * 1024, unified=False)
    assert (streams.parallel, streams.per_stream, streams.ctx_size) == (3, 8192, 3 * 8192)
    tight = size(SMOLLM2, 0, 4, "f16", 256, unified=False)  # 4 streams asked, the budget holds 11,650 cells
    assert tight.parallel == 4 and tight.per_stream == 2816 and tight.ctx_size <= 256 * MIB // 23040


def test_a_gguf_that_names_no_context_gets_4096():
    bare = {k: v for k, v in SMOLLM2.items() if k != "llama.context_length"}
    s = size(bare, 0, 0, "f16", 64 * 1024, unified=False)
    assert s.trained is None and s.per_stream == 4096 and "4096" in s.why


def test_a_gguf_that_recommends_sampling_sets_the_defaults_of_what_a_request_leaves_out():
    """llama.cpp's general.sampling.* keys: a request that names a field keeps its own value."""
    from edgeinfer.options import SamplingParams, model_sampling
    from edgeinfer.prepare import model_defaults
    from edgeinfer.server.schema import ChatRequest

    meta = {"general.sampling.temp": 0.0, "general.sampling.top_k": 20, "general.sampling.top_p": 7.5}
    assert model_sampling(meta) == {"temperature": 0.0, "top_k": 20}  # a value out of range is left out
    recommended = model_sampling(meta)
    msgs = [{"role": "user", "content": "hi"}]
    left_out = ChatRequest.model_validate({"model": "m", "messages": msgs, "temperature": None})
    params = model_defaults(left_out.to_sampling(), left_out.model_fields_set, recommended)
    assert (params.temperature, params.top_k, params.top_p) == (0.0, 20, SamplingParams().top_p)
    named = ChatRequest.model_validate({"model": "m", "messages": msgs, "temperature": 0.7})
    params = model_defaults(named.to_sampling(), named.model_fields_set, recommended)
    assert (params.temperature, params.top_k) == (0.7, 20)
    assert model_sampling({}) == {}
