"""A sliding-window model (Gemma 3: most layers attend over the last 512 tokens) keeps its prefix reuse
across turns, and the reuse is correct.

An agent's next turn shares its start with the conversation before it, not its end: the stream that
served the last turn holds the shared prefix and, well past it, everything the last turn added, beyond
the sliding layers' window. The later turn must still reuse the shared prefix (not recompute the whole
prompt, as a server that cannot trust a sliding-window cache does) and answer as a cold start would."""

from __future__ import annotations

import pytest

from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine
from models.catalog import resolve_model

from .gate import chat, same_or_near_tie

pytestmark = pytest.mark.model

GEMMA = "gemma3-270m-q4_k_m"  # trained for 32k tokens, sliding window 512
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, logprobs=5)
# Each part more than twice the window (about 1,300 tokens each): the smallest prompts that still show it.
SHARED = " ".join(f"Item {i}: the {w} is kept in drawer {i % 7}." for i, w in enumerate(["key", "map", "pen"] * 30))
EARLIER = SHARED + "\n\n" + " ".join(f"Note {i}: nothing changed on day {i}." for i in range(110))
LATER = SHARED + "\n\nWhich drawer holds item 4?"


def test_a_turn_that_shares_only_the_start_of_the_last_one_answers_as_a_cold_start():
    config = EngineConfig(model=resolve_model(GEMMA), parallel=4, ctx_size=4 * 8192, spec="off", flash_attn="off")
    with make_engine(config.replace(cache_ram=0)) as cold:
        want = cold.generate(chat(cold, LATER), GREEDY)
    with make_engine(config) as warm:
        earlier = warm.generate(chat(warm, EARLIER), SamplingParams(temperature=0.0, max_tokens=8))
        got = warm.generate(chat(warm, LATER), GREEDY)
        shared = got.stats.cached_tokens
        # The earlier turn ran well past the shared part: more than a window beyond where the turns part.
        assert earlier.stats.prompt_tokens - shared > 1024 and shared > 1024, (earlier.stats, got.stats)
        assert shared >= got.stats.prompt_tokens - 16  # all but the new question came from the cache
        same_or_near_tie(want, got, warm, chat(warm, LATER))
