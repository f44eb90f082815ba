"""The benchmark's arithmetic, report, tuner, settings file and plot, on synthetic data;
then --quality and the settings file on the real default model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgeinfer import settings as settings_file
from edgeinfer.bench import schema
from edgeinfer.bench.command import kv_cells_needed
from edgeinfer.bench.knee import Knee
from edgeinfer.bench.plot import plot_sweep
from edgeinfer.bench.report import build_report, print_sweep
from edgeinfer.bench.results import RunResult, StreamResult, best, paired
from edgeinfer.bench.sweep import Level, SayProgress, Side, Sweep, run_sweep
from edgeinfer.bench.targets import Target
from edgeinfer.bench.tune import Trial, choose, tune
from edgeinfer.cli import main
from edgeinfer.errors import ConfigError
from edgeinfer.options import EngineConfig

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def runner():
    return CliRunner()


# --- figures ------------------------------------------------------------------------------


def stream(ttft: float, gap: float, n: int, drafted: int = 0, accepted: int = 0) -> StreamResult:
    """A stream whose n tokens arrive every `gap` seconds after the first."""
    return StreamResult(30, n, ttft, [ttft + i * gap for i in range(n)], drafted, accepted)


def test_stream_rates_and_gaps():
    s = stream(0.5, 0.02, 11)
    assert s.decode_tps == pytest.approx(10 / 0.2)
    assert s.gaps() == pytest.approx([0.02] * 10)
    assert stream(0.5, 0.02, 1).decode_tps is None  # one token has no decode rate


def test_run_percentiles_rates_and_acceptance():
    # 100 streams: TTFT 0.01 .. 1.00 s; stream i's tokens arrive every (i+1) ms.
    streams = [stream((i + 1) / 100, (i + 1) / 1000, 5, drafted=4, accepted=i % 5) for i in range(100)]
    run = RunResult(streams, t_start=0.0, t_end=2.0)
    assert run.t_all_first == pytest.approx(1.0)  # the last first token: stream 99's TTFT
    assert run.ttft(50) == pytest.approx(0.505)
    assert run.ttft(99) == pytest.approx(0.9901)
    gaps = sorted(g for s in streams for g in s.gaps())  # 400 gaps, four of each (i+1) ms
    assert run.itl(50) == pytest.approx((gaps[199] + gaps[200]) / 2)
    assert run.itl(99) == pytest.approx(gaps[395] + (gaps[396] - gaps[395]) * 0.01)
    assert run.total_tps == pytest.approx(500 / 2.0)
    assert run.decode_tps == pytest.approx(400 / 1.0)
    assert run.requests_per_s == pytest.approx(50.0)
    assert run.prefill_tps == pytest.approx(3000 / 1.0)
    assert run.acceptance == pytest.approx(sum(i % 5 for i in range(100)) / 400)
    assert RunResult([stream(0.1, 0.01, 4)], 0.0, 0.2).acceptance is None  # nothing drafted: unknown


def test_the_best_of_the_repeats_keeps_its_figures_and_every_repeats_gaps():
    """Throughput is the best run's; the ITL percentiles pool the gaps of every repeat, as one answer's p99 is
    its second-longest gap (a single noisy moment decided it)."""
    fast = RunResult([stream(0.1, 0.010, 101)], 0.0, 1.1)
    slow = RunResult([stream(0.1, 0.030, 101)], 0.0, 3.1)
    slower = RunResult([stream(0.1, 0.050, 101)], 0.0, 5.1)
    kept = best(best(best(None, slow), fast), slower)
    assert kept.total_tps == fast.total_tps and kept.streams == fast.streams
    assert len([g for s in (*kept.streams, *kept.repeats) for g in s.gaps()]) == 300
    assert kept.itl(50) == pytest.approx(0.030)
    assert kept.itl(99) == pytest.approx(0.050)  # the slowest repeat's gaps are the top third
    # Every repeat's aggregate rate stays, in the order run, for pairing with another target's.
    assert kept.repeat_tps == [slow.total_tps, fast.total_tps, slower.total_tps]


def test_paired_ratio_is_the_median_of_each_repeat_against_the_run_beside_it():
    """The machine slows in the third repeat: bests compare the fast repeat of one with that of the other,
    the pairing compares each repeat with the one run beside it."""

    def series(durations: list[float]) -> RunResult:
        kept = None
        for d in durations:
            kept = best(kept, RunResult([stream(0.1, (d - 0.1) / 100, 101)], 0.0, d))
        assert kept is not None
        return kept

    a = series([1.00, 1.10, 2.00])  # 101, 91.8, 50.5 tok/s
    b = series([1.05, 1.00, 2.10])  # 96.2, 101, 48.1
    assert a.total_tps == pytest.approx(b.total_tps)  # best of 3: level
    assert paired(a, b) == pytest.approx(1.05)  # each repeat: 1.05, 0.909, 1.05
    assert paired(b, a) == pytest.approx(1 / 1.05)
    assert paired(a, series([1.0, 1.0])) is None  # different repeats do not pair
    assert paired(series([1.0]), series([1.1])) is None  # one repeat: nothing to pair over


# --- a synthetic sweep: report, schema, plot ----------------------------------------------


class FakeTarget(Target):
    def __init__(self, name: str, kind: str = "url") -> None:
        self.name, self.kind = name, kind

    def describe(self) -> dict[str, Any]:
        return {"model": "fake", "where": "http://fake/v1"}


def synthetic_sweep(curves: dict[str, list[float]], levels: list[int]) -> Sweep:
    """Each target's aggregate tok/s at each level as given; TTFT grows with concurrency."""
    targets = [FakeTarget(name) for name in curves]
    sweep = Sweep("chat", 16, 1, list(targets))
    for k, c in enumerate(levels):
        sides = {}
        for name, tps in curves.items():
            duration = c * 16 / tps[k]
            run = RunResult([stream(0.05 * c, duration / 16, 16) for _ in range(c)], 0.0, duration)
            sides[name] = Side(cold=run, warm=run)
        sweep.levels.append(Level(c, sides))
    return sweep


def test_report_matches_the_documented_schema():
    sweep = synthetic_sweep({"a": [50, 90, 160, 165], "b": [40, 80, 150, 250]}, [1, 2, 4, 8])
    doc = json.loads(build_report(sweep).model_dump_json(by_alias=True))
    assert doc["schema"] == schema.SCHEMA_VERSION and doc["kind"] == "sweep"
    schema.Report.model_validate(doc)  # extra="forbid": nothing undocumented slips in
    assert doc["knees"]["a"]["parallel"] == 4 and doc["knees"]["a"]["found"]
    assert not doc["knees"]["b"]["found"]
    lv = doc["levels"][2]["targets"]["a"]["warm"]
    assert lv["streams"] == 4 and lv["aggregate_tps"] == pytest.approx(160, rel=1e-3)
    documented = json.loads((ROOT / "docs" / "bench-schema.json").read_text())
    assert documented == schema.json_schema(), "docs/bench-schema.json is stale: python -m edgeinfer.bench.schema"


def test_tables_side_by_side_and_knee():
    sweep = synthetic_sweep({"edgeinfer": [50, 100, 200, 205], "llama-server": [50, 90, 150, 160]}, [1, 2, 4, 8])
    lines: list[str] = []
    print_sweep(sweep, lines.append)
    text = "\n".join(lines)
    assert "side by side" in text and "2/1 agg" in text
    side = lines[next(i for i, ln in enumerate(lines) if "side by side" in ln) :]
    row4 = next(ln.split() for ln in side if ln.split() and ln.split()[0] == "4")
    assert row4[1:4] == ["200.0", "150.0", "0.75"]
    assert "edgeinfer: knee: 4 streams give 98% of the best" in text and "recommended --parallel 4" in text
    assert "paired" not in text  # one repeat: nothing to pair


def test_the_sweep_rotates_the_targets_every_repeat():
    """Each target runs first in one repeat, last in another: no target always follows the same one."""
    calls: list[tuple[str, str]] = []

    class Recording(FakeTarget):
        def run(self, messages: Any, max_tokens: int, done: Any) -> RunResult:
            calls.append((self.name, messages[0][0]["content"]))
            return RunResult([stream(0.1, 0.01, 4)], 0.0, 1.0)

    targets = [Recording(n) for n in ("a", "b", "c")]
    sweep = run_sweep(targets, "chat", [1], 4, 3, SayProgress(lambda _: None))
    runs = calls[3:]  # after each target's warm-up
    order = [name for name, _ in runs[::2]]  # a cold run, then its warm run
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [name for name, _ in runs[1::2]] == order  # each cold run straight before its own warm run
    assert len({text for _, text in runs[::2]}) == 9  # every cold run opens anew
    assert sweep.levels[0].sides["a"].warm.repeat_tps == [4.0, 4.0, 4.0]


def test_side_by_side_pairs_the_repeats():
    sweep = synthetic_sweep({"edgeinfer": [50, 100], "llama-server": [50, 90]}, [1, 2])
    sweep.repeats = 2
    for lv in sweep.levels:
        one, other = lv.sides["edgeinfer"], lv.sides["llama-server"]
        one.warm.each_tps = [100.0, 80.0]
        other.warm.each_tps = [110.0, 70.0]
    lines: list[str] = []
    print_sweep(sweep, lines.append)
    side = lines[next(i for i, ln in enumerate(lines) if "side by side" in ln) :]
    assert "2/1 paired" in side[1]
    row = next(ln.split() for ln in side if ln.split() and ln.split()[0] == "2")
    assert row[5] == f"{(110 / 100 + 70 / 80) / 2:.3f}"  # the median of two: their mean
    doc = json.loads(build_report(sweep).model_dump_json(by_alias=True))
    assert doc["levels"][0]["targets"]["llama-server"]["warm"]["aggregate_tps_each"] == [110.0, 70.0]


def test_plot_writes_a_png(tmp_path):
    sweep = synthetic_sweep({"a": [50, 90, 160, 165], "b": [40, 80, 150, 250]}, [1, 2, 4, 8])
    out = tmp_path / "sweep.png"
    plot_sweep(sweep, out)
    import matplotlib.image

    image = matplotlib.image.imread(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[0] > 300 and image.shape[1] > 800


def test_kv_cells_fit_the_sweep():
    agent = kv_cells_needed("agent", 16, 64)
    assert agent % 1024 == 0 and agent >= 16 * (668 + 64)  # the agent prompt is 668 tokens for SmolLM2
    assert kv_cells_needed("code-edit", 1, 0) >= 193  # the densest: 2.7 characters per token
    assert kv_cells_needed("chat", 1, 128) <= 1024


# --- the tuner on synthetic curves ------------------------------------------------------------


def test_choose_keeps_the_current_value_unless_clearly_beaten():
    trials = [Trial("kv_type", "f16", 100.0), Trial("kv_type", "q8_0", 104.0)]
    assert choose("f16", trials).value == "f16"  # 4% is within the margin
    trials[1].tps = 110.0
    assert choose("f16", trials).value == "q8_0"
    assert choose("f16", [Trial("kv_type", "q8_0", 90.0)]).value == "q8_0"  # the only one measured


def test_tune_settles_each_setting_on_a_synthetic_machine(monkeypatch):
    monkeypatch.setattr("edgeinfer.bench.tune.usable_cores", lambda: 8)

    # This machine: 8 streams is the knee; 4 threads beat 8 (memory-bound); batch size barely matters;
    # q8_0 KV gains 1% (noise: keep f16); a unified KV cache loses 30%; speculation gains 20%.
    def measure(c: EngineConfig) -> float:
        tps = 100.0 * {8: 1.0, 4: 1.25, 7: 1.02}[c.threads]
        tps *= {512: 1.0, 256: 0.97, 1024: 1.01}[c.batch_size]
        tps *= {"f16": 1.0, "q8_0": 1.01}[c.kv_type]
        tps *= {"per-seq": 1.0, "unified": 0.7}[c.kv_layout]
        return tps * {"off": 1.0, "auto": 1.2}[c.spec]

    seen: list[EngineConfig] = []
    knee = Knee(8, True, 0.03, "beyond 8 streams a doubling adds +3%")
    calls = lambda c: seen.append(c) or knee  # noqa: E731

    class Quiet:
        def begin(self, label: str) -> None: ...
        def advance(self) -> None: ...
        def remaining(self, n: int) -> None: ...

    result = tune(EngineConfig(spec="auto"), calls, measure, Quiet())
    assert seen[0].spec == "off"  # the sweep for parallel runs without speculation
    want = {"threads": 4, "batch_size": 512, "kv_type": "f16", "kv_layout": "per-seq", "spec": "auto"}
    assert result.chosen == {"parallel": 8, **want}
    assert result.tps == pytest.approx(100 * 1.25 * 1.2)
    assert {t.setting for t in result.trials} == set(want)


# --- the settings file --------------------------------------------------------------------


def test_settings_file_round_trip_and_clear_errors(tmp_path, monkeypatch):
    path = tmp_path / "edgeinfer" / "config.toml"
    monkeypatch.setenv(settings_file.ENV, str(path))
    assert settings_file.load() == {}
    settings_file.save({"parallel": 16, "threads": 0, "kv_type": "q8_0", "spec": "auto"}, "a note")
    assert settings_file.load() == {"parallel": 16, "threads": 0, "kv_type": "q8_0", "spec": "auto"}
    assert "# a note" in path.read_text()
    for body, words in [
        ("[engine]\nparallel = -1\n", "parallel"),
        ("[engine]\nkv_type = 'q3'\n", "kv_type"),
        ("[engine]\nparallel = '4'\n", "parallel"),
        ("[engine]\nmodels = 2\n", "models"),
        ("[server]\n", "unknown table"),
        ("[engine\n", "cannot read"),
    ]:
        path.write_text(body)
        with pytest.raises(ConfigError, match=words) as err:
            settings_file.load()
        assert str(path) in str(err.value) and "delete" in str(err.value)


def test_saving_merges_keeps_a_backup_and_is_atomic(tmp_path, monkeypatch):
    """--tune keeps the keys it does not tune, leaves the old file as config.toml.bak, and a
    write that fails half-way leaves the old file whole."""
    path = tmp_path / "config.toml"
    monkeypatch.setenv(settings_file.ENV, str(path))
    old = "[engine]\ngpu_layers = 10\nflash_attn = 'on'\nspec_max = 4\nparallel = 2\n"
    path.write_text(old)
    settings_file.save({"parallel": 16, "threads": 0}, "tuned")
    assert settings_file.load() == {"gpu_layers": 10, "flash_attn": "on", "spec_max": 4, "parallel": 16, "threads": 0}
    assert (tmp_path / "config.toml.bak").read_text() == old
    before = path.read_text()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(settings_file.os, "replace", broken_replace)
    with pytest.raises(OSError):
        settings_file.save({"parallel": 3}, "interrupted")
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml", "config.toml.bak"]  # no temp file left


class Captured(Exception):
    pass


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_serve_and_chat_start_from_the_settings_file(command, tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    monkeypatch.setenv(settings_file.ENV, str(path))
    settings_file.save({"parallel": 3, "threads": 1, "kv_type": "q8_0", "batch_size": 256}, "test")
    configs: list[EngineConfig] = []

    def capture(config: EngineConfig, *_: Any, **__: Any) -> Any:
        configs.append(config)
        raise Captured

    target = "edgeinfer.server.app.make_server" if command == "serve" else "edgeinfer.runtime.make_engine"
    monkeypatch.setattr(target, capture)
    args = [command, "--socket", str(tmp_path / "s.sock")] if command == "serve" else [command]
    result = CliRunner().invoke(main, [*args, "--kv-type", "f16"])
    assert isinstance(result.exception, Captured), result.output
    c = configs[0]
    assert (c.threads, c.batch_size, c.kv_type) == (1, 256, "f16")  # the flag wins over the file
    assert c.parallel == (3 if command == "serve" else 2)  # chat caps its streams at 2
    assert f"settings from {path}" in result.stderr and "kv_type" not in result.stderr.split("settings from")[1]

    path.write_text("[engine]\nthreads = -2\n")
    bad = CliRunner().invoke(main, args)
    assert bad.exit_code != 0 and "threads" in bad.output and str(path) in bad.output
    assert "Traceback" not in bad.output


# --- --quality on the real model ------------------------------------------------------------


@pytest.mark.model
def test_quality_of_a_configuration_against_itself(runner, model_path):
    """Teacher forcing on the reference's own settings must agree almost everywhere: only batch-shape
    rounding at near-ties can part them. A misaligned position would drop this towards zero."""
    args = ["bench", "--quality", "--model", str(model_path), "--max-tokens", "24", "--ctx-size", "4096"]
    result = runner.invoke(main, [*args, "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "quality" and doc["prompts"] == 16
    assert doc["forced_agreement"] >= 0.95 and doc["forced_agreement_floor"] >= 0.95
    assert doc["identical"] >= 8
    assert all(0 <= it["common_prefix"] <= it["reference_tokens"] for it in doc["items"])
    assert "settings are the same" in result.stderr


@pytest.mark.model
def test_quality_of_a_quantized_kv_cache(runner, model_path):
    args = ["bench", "--quality", "--model", str(model_path), "--kv-type", "q4_0", "--max-tokens", "24"]
    result = runner.invoke(main, [*args, "--ctx-size", "4096"])
    assert result.exit_code == 0, result.output
    assert "KV f16" in result.output and "KV q4_0" in result.output
    forced = float(result.output.split("forced agreement:")[1].split("%")[0])
    assert 50.0 <= forced <= 100.0


# --- --tune on the real model -----------------------------------------------------------------


@pytest.mark.model
def test_tune_writes_settings_that_serve_reads(runner, tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    monkeypatch.setenv(settings_file.ENV, str(path))
    args = ["bench", "--tune", "--concurrency", "1,2", "--max-tokens", "4", "--repeats", "1", "--ctx-size", "2048"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    saved = settings_file.load()
    assert saved["parallel"] in (1, 2) and saved["kv_type"] in ("f16", "q8_0") and saved["spec"] in ("off", "auto")
    assert saved["ctx_size"] == 2048  # given on the command line, so kept
    for setting in ("threads", "batch_size", "kv_type", "spec"):
        assert f"  {setting} " in result.output  # each setting's trials are shown
    assert f"wrote {path}" in result.output and "cold run" in result.stderr  # progress lines off a terminal


# --- the json workload and tool-call validity, on the real model -----------------------------


@pytest.mark.model
def test_json_workload_runs_both_sides_and_checks_every_answer(model_path):
    from edgeinfer.bench.jsonload import print_json_bench, run_json_bench
    from edgeinfer.runtime import make_engine

    with make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=4096, spec="off")) as engine:
        results = run_json_bench(engine, [2], 200, 1, lambda line: None)
    (r,) = results
    assert r.streams == 2 and r.answers == 3 and r.valid == 3  # one battery answer, two long-keys answers
    assert r.mixed_tps > 0 and r.mixed_free_tps > 0 and r.keys_tps > 0 and r.keys_free_tps > 0
    assert 0.5 < r.forced_share < 1  # most of a long-keys answer is forced, not all
    lines: list[str] = []
    print_json_bench(results, lines.append)
    assert lines[-1].split()[0] == "2" and lines[-1].split()[-1] == "3/3"


@pytest.mark.model
def test_agent_tool_validity_counts_valid_calls(model_path, monkeypatch):
    from edgeinfer.bench import targets as targets_module
    from edgeinfer.bench.command import _tool_validity
    from edgeinfer.bench.targets import EngineTarget
    from edgeinfer.runtime import make_engine

    with make_engine(EngineConfig(model=model_path, parallel=2, ctx_size=8192, spec="off")) as engine:
        lines = _tool_validity([EngineTarget(engine)], 2)
        assert lines[-1].strip() == "edgeinfer: 2/2 replies are tool calls whose arguments validate"
        # A reply whose arguments break the schema, or that makes no call, is not counted.
        fake = [("", [("read_file", '{"path": 3}')]), ("text", [])]
        monkeypatch.setattr(targets_module, "tool_replies", lambda *a: fake)
        assert _tool_validity([EngineTarget(engine)], 2)[-1].strip().startswith("edgeinfer: 0/2")
