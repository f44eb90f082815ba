"""Faults inside the engine thread: every caller is told, nothing hangs, new work is refused with the reason."""

from __future__ import annotations

import threading

import pytest

from edgeinfer.errors import EngineFailedError
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

from . import gate
from .conftest import healthy
from .gate import chat, same_or_near_tie

pytestmark = pytest.mark.model


def test_a_fault_outside_the_decode_fails_every_request_and_refuses_new_ones(model_path, monkeypatch):
    """Defect: only the decode call was guarded; an exception while scheduling killed the thread and
    every request then waited for ever (and the server kept saying it was healthy)."""
    eng = make_engine(EngineConfig(model=model_path, parallel=2, ctx_size=2048, spec="off"))
    try:
        running = eng.submit(chat(eng, "Write a long poem about the sea."), SamplingParams(max_tokens=200))[0]
        next(iter(running))  # it has started
        waiting = [eng.submit(chat(eng, f"Question {i}?"), SamplingParams(max_tokens=8))[0] for i in range(3)]
        broken = threading.Event()

        def schedule(*args, **kwargs):
            broken.set()
            raise RuntimeError("scheduler bug")

        monkeypatch.setattr(eng.sched, "schedule", schedule)
        done = threading.Event()
        finishes = []

        def collect():
            finishes.extend(h.result() for h in [running, *waiting])
            done.set()

        threading.Thread(target=collect, daemon=True).start()
        assert done.wait(30), "requests hung after the engine thread failed"
        assert broken.is_set()
        assert all(f.finish_reason == "error" and "scheduler bug" in (f.error or "") for f in finishes)
        assert eng.fatal_error is not None and "scheduler bug" in eng.fatal_error
        with pytest.raises(EngineFailedError, match="scheduler bug"):
            eng.submit(chat(eng, "hi"), SamplingParams(max_tokens=4))
    finally:
        eng.close()  # returns: the thread is gone, nothing waits for it


def test_a_group_whose_first_stream_is_cancelled_at_once_still_finishes(model_path):
    """Defect: with n > 1, a first stream that ended before the prompt was computed left its siblings
    waiting for ever, their cells reserved, the engine loop spinning."""
    with make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=4096, spec="off")) as eng:
        handles = eng.submit(chat(eng, "Name a colour."), SamplingParams(temperature=0, max_tokens=12), n=3)
        handles[0].cancel()
        done = threading.Event()
        results = []

        def collect():
            results.extend(h.result() for h in handles)
            done.set()

        threading.Thread(target=collect, daemon=True).start()
        assert done.wait(60), "the siblings of a cancelled first stream never finished"
        assert results[0].finish_reason == "cancelled"
        assert all(r.finish_reason in ("stop", "length") and r.token_ids for r in results[1:])
        gate.same_shapes(results[1].token_ids, results[2].token_ids, "greedy forks of one prompt, nothing drafted")
        assert eng.wait_idle(10) and eng.snapshot().kv.used_cells == 0


def test_a_full_kv_cache_preempts_a_stream_and_its_text_is_unchanged(model_path):
    """Defect: a full KV cache ended the youngest stream and called it `length`; it is preempted instead
    (its KV saved to RAM, its place kept) and resumes once another stream ends, with the same text."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    config = EngineConfig(model=model_path, parallel=2, ctx_size=2048, kv_layout="unified", spec="off")
    with make_engine(config) as eng:
        prompts = [chat(eng, "Describe a forest."), chat(eng, "Describe a desert.")]
        # The reference runs the two packed too; logprobs tell near-ties (batch shapes round differently).
        ref = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=5)
        want = [h.result() for h in [eng.submit(p, ref)[0] for p in prompts]]
        eng.reset_prefixes()
        real = eng.ctx.decode
        calls = {"n": 0}

        def decode(batch):
            calls["n"] += 1
            if calls["n"] == 6 and len(eng.sched.running) == 2:
                return False  # llama.cpp's "no room for this batch"
            return real(batch)

        eng.ctx.decode = decode  # type: ignore[method-assign]
        got = [h.result() for h in [eng.submit(p, params)[0] for p in prompts]]
        assert eng.sched.preemptions == 1
        assert [(g.finish_reason, g.stats.completion_tokens) for g in got] == [("length", 40), ("length", 40)]
        eng.ctx.decode = real  # type: ignore[method-assign]
        for w, g, p in zip(want, got, prompts, strict=True):
            same_or_near_tie(w, g, eng, p)


def test_a_server_whose_engine_stopped_says_so_and_exits_non_zero(model_path, tmp_path, monkeypatch):
    """Defect: /health said ok and the process kept running after the engine thread had died."""

    from edgeinfer.server.app import make_server
    from edgeinfer.server.listen import serve

    sock = tmp_path / "s.sock"
    app = make_server(EngineConfig(model=model_path, parallel=2, ctx_size=2048, spec="off"), load_in_background=False)
    outcome: dict[str, BaseException] = {}

    def run():
        try:
            serve(app, sock, None, grace_s=1)
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    http = healthy(sock, timeout=30)
    engine = app.state.edgeinfer.engine

    def schedule(*args, **kwargs):
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine.sched, "schedule", schedule)
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 500 and "scheduler bug" in r.json()["error"]["message"]
    thread.join(30)
    assert not thread.is_alive(), "the server kept running after its engine stopped"
    assert isinstance(outcome.get("error"), EngineFailedError) and "scheduler bug" in str(outcome["error"])
    assert not sock.exists()


def test_stats_are_read_under_the_engines_lock(model_path, monkeypatch):
    """Defect: snapshot() read the metrics windows outside the engine's lock, so an append in the same
    instant could end /metrics or the stats stream with "deque mutated during iteration" (seen when
    two threads read stats while eight streams decoded). The engine is idle here, so its own thread
    holds no lock: the lock is held during the read only if snapshot() took it."""
    import edgeinfer.engine.engine as engine_module

    with make_engine(EngineConfig(model=model_path, parallel=2, ctx_size=2048, spec="off")) as eng:
        eng.generate(chat(eng, "Hi."), SamplingParams(max_tokens=4))  # something in the windows
        held = []
        real = engine_module.build_stats

        def build_stats(view):
            held.append(eng.lock.locked())
            return real(view)

        monkeypatch.setattr(engine_module, "build_stats", build_stats)
        stats = eng.snapshot()
        assert held == [True] and stats.requests.total == 1
