"""Several models on one server: `serve -m A -m B`, loads on demand, LRU and idle unload, per-model errors.

The pool's rules are tested first with fake engines (a load made slow or failing on purpose), through
the official openai client over an in-process transport; then the real default model and a Q8_0 copy of
it (made with `models quantize`) are served from one socket, with every answer checked against that
model's own greedy text, swapped under load with --max-models 1, and the process's memory read after
an unload.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from edgeinfer.client import async_client
from edgeinfer.errors import ModelNotFoundError
from edgeinfer.models.catalog import model_id_of
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.server.app import make_pool_app
from edgeinfer.server.pool import ModelPool, ModelSpec, dir_models, model_specs

from . import gate
from .conftest import raw, start_server, stop_process
from .gate import SYSTEM, chat, same_or_near_tie

pytestmark = pytest.mark.pure

# --- fake engines: the pool's rules without a model --------------------------------------------------


class _Requests:
    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0


class _Snapshot:
    def __init__(self, engine: FakeEngine) -> None:
        self.requests = _Requests()
        self.requests.running = engine.running


class _Embeddings:
    """Answers every input with a vector of the engine's mark: which model answered shows in the numbers."""

    n_embd = 4

    def __init__(self, mark: float) -> None:
        self.mark = mark

    async def aembed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        return [np.full(self.n_embd, self.mark, dtype=np.float32) for _ in inputs]


class FakeEngine:
    """Enough of an Engine for the pool and /v1/embeddings; `running` stands for streams in flight."""

    fatal_error = None
    offload = None  # no GPU plan: nothing is said at start-up

    def __init__(self, mark: float) -> None:
        self.embeddings = _Embeddings(mark)
        self.running = 0
        self.closed = False

    def snapshot(self) -> _Snapshot:
        return _Snapshot(self)

    def close(self) -> None:
        self.closed = True


class Factory:
    """Makes FakeEngines, counting calls; a gate holds the load until opened, `fail` makes it raise."""

    def __init__(self, mark: float, gate: threading.Event | None = None, fail: str | None = None) -> None:
        self.mark, self.gate, self.fail = mark, gate, fail
        self.calls = 0
        self.made: list[FakeEngine] = []

    def __call__(self) -> FakeEngine:
        self.calls += 1
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        if self.fail:
            raise RuntimeError(self.fail)
        engine = FakeEngine(self.mark)
        self.made.append(engine)
        return engine


def fake_pool(factories: dict[str, Factory], **kw: Any) -> ModelPool:
    specs = [ModelSpec(name, Path(f"/models/{name}.gguf"), f) for name, f in factories.items()]  # type: ignore[arg-type]
    return ModelPool(specs, **kw)


def served(pool: ModelPool) -> tuple[Any, openai.AsyncOpenAI]:
    """The app over pool (its default loaded, as at startup) and the openai client talking to it in process."""
    app = make_pool_app(pool, load_in_background=False)
    app.state.edgeinfer.load()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://edgeinfer/v1")
    return app, openai.AsyncOpenAI(api_key="none", base_url="http://edgeinfer/v1", http_client=http, max_retries=0)


async def mark_of(oai: openai.AsyncOpenAI, model: str) -> float:
    """Which engine answered: the number its fake embeddings carry."""
    r = await oai.embeddings.create(model=model, input=[[1, 2, 3]], encoding_format="float")
    return r.data[0].embedding[0]


def test_requests_pick_their_model_and_one_load_serves_every_waiter():
    a, b = Factory(1.0), Factory(2.0, gate=threading.Event())
    pool = fake_pool({"a": a, "b": b})
    _, oai = served(pool)

    async def go():
        waiting = [asyncio.create_task(mark_of(oai, "b")) for _ in range(5)]
        await asyncio.sleep(0.2)
        assert await mark_of(oai, "a") == 1.0  # the default serves while b loads
        assert await mark_of(oai, "default") == 1.0
        b.gate.set()
        return await asyncio.gather(*waiting)

    assert asyncio.run(go()) == [2.0] * 5
    assert b.calls == 1  # five requests, one load
    assert [(m["id"], m["status"], m["loaded"]) for m in pool.describe()] == [
        ("a", "loaded", True),
        ("b", "loaded", True),
    ]


def test_a_load_past_the_timeout_is_a_503_with_retry_after_and_then_serves():
    gate = threading.Event()
    slow = Factory(2.0, gate=gate)
    pool = fake_pool({"a": Factory(1.0), "slow": slow}, load_timeout_s=0.3)
    _, oai = served(pool)

    async def go():
        with pytest.raises(openai.APIStatusError) as e:
            await mark_of(oai, "slow")
        gate.set()
        for _ in range(100):  # the load went on without the request that started it
            if pool.slots["slow"].state == "loaded":
                break
            await asyncio.sleep(0.05)
        return e.value, await mark_of(oai, "slow")

    err, mark = asyncio.run(go())
    assert err.status_code == 503 and err.response.headers["retry-after"] == "1"
    assert "'slow' is still loading" in err.message and err.code == "model_loading"
    assert mark == 2.0 and slow.calls == 1


def test_a_model_that_fails_to_load_answers_why_and_the_others_keep_serving():
    broken = Factory(2.0, fail="unknown model architecture: 'frobnicator'")
    pool = fake_pool({"a": Factory(1.0), "broken": broken})
    _, oai = served(pool)

    async def go():
        errors = []
        for _ in range(2):  # each request tries the load again, and says why it failed
            with pytest.raises(openai.InternalServerError) as e:
                await mark_of(oai, "broken")
            errors.append(e.value)
        return errors, await mark_of(oai, "a")

    errors, mark = asyncio.run(go())
    for e in errors:
        assert e.status_code == 500 and e.code == "model_load_failed"
        assert "/models/broken.gguf" in e.message and "frobnicator" in e.message
    assert mark == 1.0 and broken.calls == 2
    entry = next(m for m in pool.describe() if m["id"] == "broken")
    assert entry["status"] == "unloaded" and "frobnicator" in entry["error"]


def test_a_draft_of_another_vocabulary_is_skipped_with_a_note():
    from edgeinfer.errors import ConfigError

    def with_draft():
        raise ConfigError("draft model d.gguf has 100 tokens, the target 200: a draft must share its vocabulary")

    plain = Factory(2.0)
    specs = [ModelSpec("a", None, Factory(1.0)), ModelSpec("big", Path("/m/big.gguf"), with_draft, (), plain)]
    pool = ModelPool(specs)  # type: ignore[arg-type]
    _, oai = served(pool)
    assert asyncio.run(mark_of(oai, "big")) == 2.0 and plain.calls == 1
    note = next(m for m in pool.describe() if m["id"] == "big")["note"]
    assert note.startswith("served without the draft model") and "vocabulary" in note


def test_unknown_model_is_a_404_naming_the_models_in_each_api_shape():
    _, oai = served(fake_pool({"a": Factory(1.0), "b": Factory(2.0)}))
    with pytest.raises(openai.NotFoundError) as e:
        asyncio.run(mark_of(oai, "gpt-9"))
    assert e.value.code == "model_not_found" and "'gpt-9'" in e.value.message
    assert "'a', 'b'" in e.value.message and "--alias NAME=MODEL" in e.value.message


def test_one_model_answers_any_name_and_aliases_map_names_to_models():
    """Claude Code sends its main model's name and a small model's for background work; Codex its own."""
    _, oai = served(fake_pool({"a": Factory(1.0)}))
    assert asyncio.run(mark_of(oai, "claude-haiku-4-5")) == 1.0
    specs = [ModelSpec("a", None, Factory(1.0)), ModelSpec("b", None, Factory(2.0))]
    pool = ModelPool(specs, aliases={"claude-sonnet-4-5": "b", "claude-haiku-4-5": "a"})  # type: ignore[arg-type]
    _, oai = served(pool)
    assert asyncio.run(mark_of(oai, "claude-sonnet-4-5")) == 2.0
    assert asyncio.run(mark_of(oai, "claude-haiku-4-5")) == 1.0
    with pytest.raises(openai.NotFoundError):
        asyncio.run(mark_of(oai, "gpt-9"))
    with pytest.raises(ModelNotFoundError, match="'c' is not served here"):
        ModelPool(specs, aliases={"x": "c"})  # type: ignore[arg-type]


def test_the_least_recently_used_idle_model_makes_room_never_a_busy_one():
    made = {name: Factory(mark) for name, mark in (("a", 1.0), ("b", 2.0), ("c", 3.0))}
    pool = fake_pool(made, max_models=2)
    _, oai = served(pool)

    async def go():
        assert await mark_of(oai, "b") == 2.0  # a (the default, at startup) and b loaded: the pool is full
        a_engine = made["a"].made[0]
        a_engine.running = 1  # a stream of a's is running: a is the least recently used, but busy
        assert await mark_of(oai, "c") == 3.0
        return a_engine

    a_engine = asyncio.run(go())
    assert made["b"].made[0].closed and not a_engine.closed
    assert {m["id"] for m in pool.describe() if m["loaded"]} == {"a", "c"}


def test_a_load_waits_while_every_loaded_model_is_busy():
    made = {"a": Factory(1.0), "b": Factory(2.0)}
    pool = fake_pool(made, max_models=1, load_timeout_s=0.5)
    _, oai = served(pool)

    async def go():
        a_engine = made["a"].made[0]
        a_engine.running = 2
        with pytest.raises(openai.APIStatusError) as e:  # a is busy: b waits, bounded, then 503
            await mark_of(oai, "b")
        assert e.value.status_code == 503 and not a_engine.closed
        a_engine.running = 0  # a's streams end: the waiting load goes ahead
        for _ in range(100):
            if pool.slots["b"].state == "loaded":
                break
            await asyncio.sleep(0.05)
        return a_engine, await mark_of(oai, "b")

    a_engine, mark = asyncio.run(go())
    assert a_engine.closed and mark == 2.0


def test_idle_models_unload_and_load_again_on_demand():
    made = {"a": Factory(1.0), "b": Factory(2.0)}
    pool = fake_pool(made, idle_unload_s=0.2)
    _, oai = served(pool)

    async def go():
        assert await mark_of(oai, "b") == 2.0
        await asyncio.sleep(0.3)
        gone = pool.sweep_once()
        for _ in range(100):
            if not pool.engines():
                break
            await asyncio.sleep(0.02)
        return gone, await mark_of(oai, "b")

    gone, mark = asyncio.run(go())
    assert sorted(gone) == ["a", "b"] and made["b"].made[0].closed
    assert mark == 2.0 and made["b"].calls == 2


def test_metrics_label_each_loaded_model():
    from edgeinfer.engine.metrics import Metrics
    from edgeinfer.engine.stats import EngineStats
    from edgeinfer.server.prometheus import EngineCollector

    class Figures:
        metrics = Metrics()

        def snapshot(self):
            return EngineStats()

    engines: list[tuple[str, Any]] = []
    collector = EngineCollector(lambda: [(name, (e.snapshot(), e.metrics)) for name, e in engines])
    assert list(collector.collect()) == []  # nothing loaded, nothing to say
    engines += [("a", Figures()), ("b", Figures())]
    families = {f.name: f for f in collector.collect()}
    running = families["edgeinfer_requests_running"]
    assert sorted(s.labels["model"] for s in running.samples) == ["a", "b"]
    ttft = families["edgeinfer_time_to_first_token_seconds"]
    assert {s.labels["model"] for s in ttft.samples} == {"a", "b"} and all(
        "le" in s.labels for s in ttft.samples if s.name.endswith("_bucket")
    )


@pytest.mark.model
def test_models_dir_takes_every_gguf_by_name(tmp_path, model_path):
    for name in ("b-model.gguf", "a-model.gguf", "mmproj-a.gguf", "big-00002-of-00002.gguf", "notes.txt"):
        (tmp_path / name).symlink_to(model_path)
    (tmp_path / "big-00001-of-00002.gguf").symlink_to(model_path)
    assert [p.name for p in dir_models(tmp_path)] == ["a-model.gguf", "b-model.gguf", "big-00001-of-00002.gguf"]
    specs = model_specs(EngineConfig(model=model_path), [], tmp_path)
    assert [s.name for s in specs] == ["a-model", "b-model", "big-00001-of-00002"]
    # -m first (the default), then the folder's others; a file named twice is served once.
    specs = model_specs(EngineConfig(model=model_path), [str(tmp_path / "b-model.gguf")], tmp_path)
    assert [s.name for s in specs] == ["b-model", "a-model", "big-00001-of-00002"]
    assert str(tmp_path / "b-model.gguf") in specs[0].aliases


@pytest.mark.model
def test_a_draft_model_drafts_for_the_others_not_for_itself(tmp_path, model_path):
    draft = tmp_path / "draft.gguf"
    draft.symlink_to(model_path)
    config = EngineConfig(model=model_path, spec="draft", draft_model=draft)
    specs = model_specs(config, [str(model_path), str(draft)], None)
    target, itself = specs
    assert target.make_plain is not None  # should the draft not fit the target, it is served without one
    assert itself.make_plain is None


# --- the real models: the default and a Q8_0 copy of it, on one socket --------------------------------

SERVE = ("--spec", "off", "--flash-attn", "off", "--parallel", "8")  # greedy texts comparable token for token
PROMPTS = [  # the two models answer most of these differently (checked below), in a few tokens
    "What is the capital of France? Answer with one word.",
    "Name a color.",
    "Say hello in Spanish.",
    "Name a planet.",
]
MAX_TOKENS = 8


@pytest.fixture(scope="session")
def q8_model(model_path, tmp_path_factory):
    dst = tmp_path_factory.mktemp("q8") / "SmolLM2-135M-Instruct.Q8_0.gguf"
    cmd = [sys.executable, "-m", "edgeinfer.cli", "models", "quantize", str(model_path), str(dst), "Q8_0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and dst.is_file(), r.stderr
    return dst


@pytest.fixture(scope="module")
def references(model_path, q8_model):
    """Each model alone (an engine of its own, the server's settings): its greedy answer to each prompt,
    with the top five logprobs the near-tie check reads."""
    from edgeinfer.runtime import make_engine

    out = {}
    for path in (model_path, q8_model):
        config = EngineConfig(model=path, parallel=8, ctx_size=8192, spec="off", flash_attn="off")
        eng = make_engine(config)
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=5)
        out[model_id_of(path)] = (eng, {p: eng.generate(chat(eng, p), params) for p in PROMPTS})
    yield out
    for eng, _ in out.values():
        eng.close()


def check_answer(references, model: str, prompt: str, text: str) -> None:
    """text is model's own greedy answer to prompt, as served alone; or parts from it only at a near-tie
    that batch shapes on this CPU could turn (conftest.same_or_near_tie)."""
    eng, refs = references[model]
    ref = refs[prompt]
    if text != ref.text:
        got = SimpleNamespace(token_ids=eng.tokenize(text))
        same_or_near_tie(ref, got, eng, chat(eng, prompt))


async def ask(oai: openai.AsyncOpenAI, model: str, prompt: str) -> tuple[str, str, str]:
    r = await oai.chat.completions.create(
        model=model, messages=[SYSTEM, {"role": "user", "content": prompt}], temperature=0, max_tokens=MAX_TOKENS
    )
    return r.model, prompt, r.choices[0].message.content or ""


def loaded(sock: Path) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in raw(sock).get("/v1/models").json()["data"]}


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


@pytest.fixture(scope="module")
def two(tmp_path_factory, model_path, q8_model):
    sock = tmp_path_factory.mktemp("pool") / "p.sock"
    proc = start_server(sock, "-m", str(model_path), "-m", str(q8_model), *SERVE)
    yield sock
    stop_process(proc)


@pytest.mark.model
def test_two_models_at_once_each_answers_as_it_would_alone(two, references, model_path, q8_model):
    a, b = model_id_of(model_path), model_id_of(q8_model)
    gate.differ(
        [references[a][1][p].text for p in PROMPTS],
        [references[b][1][p].text for p in PROMPTS],
        "Q4_1 and Q8_0 weights should answer some prompt apart, so that an answer shows which model wrote it",
    )
    listed = raw(two).get("/v1/models").json()["data"]
    assert [(m["id"], m["status"], m["loaded"]) for m in listed] == [(a, "loaded", True), (b, "unloaded", False)]

    async def burst():
        oai = async_client(two).with_options(max_retries=0)
        asks = [ask(oai, model, PROMPTS[i % len(PROMPTS)]) for i in range(8) for model in (a, b)]
        return await asyncio.gather(*asks)

    answers = asyncio.run(burst())
    assert len(answers) == 16
    for model, prompt, text in answers:
        check_answer(references, model, prompt, text)
    assert loaded(two) == {a: True, b: True}
    metrics = raw(two).get("/metrics").text
    for name in (a, b):
        gate.contains(metrics, f'edgeinfer_requests_total{{model="{name}"}} 8.0')
    stats = raw(two).get("/v1/edgeinfer/stats", params={"model": b}).json()
    assert stats["served_model"] == b and stats["model"]["name"] and stats["requests"]["total"] == 8
    # The name given on the command line (here the path) is accepted too, and "default" is the first model.
    asyncio.run(ask(async_client(two), str(q8_model), PROMPTS[0]))
    assert asyncio.run(ask(async_client(two), "default", PROMPTS[0]))[0] == a


@pytest.mark.model
def test_an_unknown_model_is_a_404_naming_the_served_ones(two, model_path, q8_model):
    http = raw(two)
    openai_shape = http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [SYSTEM]})
    anthropic_shape = http.post(
        "/v1/messages", json={"model": "claude-9", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert openai_shape.status_code == anthropic_shape.status_code == 404
    err = openai_shape.json()["error"]
    assert err["code"] == "model_not_found" and "'gpt-9'" in err["message"]
    assert anthropic_shape.json()["type"] == "error" and anthropic_shape.json()["error"]["type"] == "not_found_error"
    for message in (err["message"], anthropic_shape.json()["error"]["message"]):
        assert model_id_of(model_path) in message and model_id_of(q8_model) in message


@pytest.mark.model
def test_max_models_1_swaps_under_load_and_memory_returns(tmp_path, model_path, q8_model, references):
    a, b = model_id_of(model_path), model_id_of(q8_model)
    sock = tmp_path / "one.sock"
    # The wait for a swap is bounded by --load-timeout (60 s), a product setting this test does not measure: on a
    # busy machine the other model's 8 streams can take longer than that to finish. Nothing lost is what it checks.
    timeout = ("--load-timeout", "600")
    proc = start_server(sock, "-m", str(model_path), "-m", str(q8_model), "--max-models", "1", *timeout, *SERVE)
    try:
        oai = async_client(sock).with_options(max_retries=0)  # any 503 would show: nothing may be lost

        async def load(models: tuple[str, ...]):
            return await asyncio.gather(*(ask(oai, m, PROMPTS[i % len(PROMPTS)]) for i in range(8) for m in models))

        asyncio.run(ask(oai, a, PROMPTS[0]))
        one_model = rss_kib(proc.pid)  # a loaded, one answer given
        for model, prompt, text in asyncio.run(load((a,))):  # a alone, warm: the one-model level
            check_answer(references, model, prompt, text)
        answers = asyncio.run(load((a, b)))  # both at once, one in memory at a time: they swap
        assert len(answers) == 16
        for model, prompt, text in answers:
            check_answer(references, model, prompt, text)
        asyncio.run(ask(oai, b, PROMPTS[0]))
        asyncio.run(ask(oai, a, PROMPTS[0]))  # b is unloaded to make room: a loaded again, one answer given
        assert loaded(sock) == {a: True, b: False}
        after = rss_kib(proc.pid)
        # b answered, so all its weights were read and stay resident while it is mapped: b kept would add its
        # file's size. RSS follows use (the KV cache takes memory as it fills), so the two figures are taken in
        # the same state.
        b_kib = q8_model.stat().st_size >> 10
        assert after - one_model < b_kib // 2, f"RSS {one_model} KiB with {a} alone, {after} KiB after ({b} {b_kib})"
    finally:
        stop_process(proc)


async def test_the_dashboard_shows_which_models_are_loaded():
    import json

    from edgeinfer.engine.stats import EngineStats
    from edgeinfer.tui.app import make_dashboard
    from edgeinfer.tui.messages import StatsUpdate
    from edgeinfer.tui.sources import served_of

    from .test_tui import snapshot, until

    served = [{"id": "a", "status": "loaded", "loaded": True}, {"id": "b", "status": "unloaded", "loaded": False}]
    data = json.dumps(snapshot() | {"served_model": "a", "served": served})  # as /v1/edgeinfer/stats/stream sends

    class OneServer:
        label = "unix:test"

        async def events(self):
            yield StatsUpdate(EngineStats.model_validate_json(data), served_of(data))
            await asyncio.Event().wait()

    app = make_dashboard(OneServer())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.draws >= 1, "the first draw")
        shown = str(app.query_one("#model").content)  # type: ignore[attr-defined]
    assert "models: ● a · ○ b" in shown
