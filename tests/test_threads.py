"""The thread count follows the cores the machine has free (engine/threads.py), and it changes no number."""

from __future__ import annotations

import hashlib
import os

import pytest

from edgeinfer.engine.threads import AGREE, WINDOW_S, CpuSample, ThreadTuner, read_cpu
from edgeinfer.options import EngineConfig, usable_cores
from edgeinfer.runtime import make_engine

from . import gate

pytestmark = pytest.mark.pure


class Machine:
    """A fake machine: each window, this process ran `ours` cores and `idle` cores stood unused."""

    def __init__(self) -> None:
        self.t, self.idle, self.ours = 0.0, 0.0, 0.0

    def read(self) -> CpuSample:
        return CpuSample(self.t, self.idle, self.ours)

    def clock(self) -> float:
        return self.t

    def window(self, ours: float, idle: float) -> None:
        self.t += WINDOW_S
        self.ours += ours * WINDOW_S
        self.idle += idle * WINDOW_S


def counts(tuner: ThreadTuner, machine: Machine, windows: list[tuple[float, float]]) -> list[int]:
    out = []
    for ours, idle in windows:
        machine.window(ours, idle)
        out.append(tuner.threads())
    return out


def tuner_on(n: int) -> tuple[ThreadTuner, Machine]:
    m = Machine()
    return ThreadTuner(n, read=m.read, clock=m.clock), m


def test_an_idle_machine_keeps_every_core():
    tuner, m = tuner_on(2)
    # Our threads ran both cores, or stood idle between requests: both cores are ours either way.
    assert counts(tuner, m, [(1.9, 0.1), (2.0, 0.0), (0.0, 2.0), (1.2, 0.8)] * 3) == [2] * 12
    assert tuner.changes == 0


def test_other_work_on_the_cores_lowers_the_count_after_two_windows_and_its_end_raises_it():
    tuner, m = tuner_on(2)
    # Two busy processes beside us on 2 cores: our 2 threads got one core between them, none stood idle.
    busy = counts(tuner, m, [(1.0, 0.0)] * AGREE)
    assert busy == [2] * (AGREE - 1) + [1]
    # Alone on one thread with the other work running: two thirds of a core, nothing idle: stay.
    assert counts(tuner, m, [(0.7, 0.0)] * 4) == [1] * 4
    # The other work ended: a core stands idle beside ours.
    assert counts(tuner, m, [(1.0, 1.0)] * AGREE)[-1] == 2
    assert tuner.changes == 2


def test_one_busy_window_changes_nothing():
    tuner, m = tuner_on(2)
    assert counts(tuner, m, [(2.0, 0.0), (1.0, 0.0), (2.0, 0.0), (1.0, 0.0), (2.0, 0.0)]) == [2] * 5


def test_eight_cores_three_busy_give_five_threads():
    tuner, m = tuner_on(8)
    assert counts(tuner, m, [(5.1, 0.0)] * AGREE)[-1] == 5
    assert counts(tuner, m, [(5.0, 0.1)] * 3) == [5] * 3  # our 5 threads stay busy: keep them


def test_the_counters_are_read_once_a_window():
    reads = []
    m = Machine()

    def read():
        reads.append(m.t)
        return m.read()

    tuner = ThreadTuner(2, read=read, clock=m.clock)
    for _ in range(100):  # steps within one window
        m.t += WINDOW_S / 200
        tuner.threads()
    assert reads == [0.0]


def test_without_proc_stat_the_count_stays_put():
    tuner = ThreadTuner(4, read=lambda: None)
    assert [tuner.threads() for _ in range(3)] == [4, 4, 4]


def test_this_machine_is_read():
    a = read_cpu()
    assert a is not None and a.idle > 0 and a.ours > 0  # Linux: /proc/stat is there


@pytest.mark.model
def test_the_default_thread_count_follows_the_cores_this_process_may_use():
    """taskset or a container's cpuset: a thread per core of the machine would wait at every barrier."""
    if not hasattr(os, "sched_getaffinity"):  # not Linux: every core
        assert usable_cores() == os.cpu_count()
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, before)
    assert usable_cores() == len(before)


@pytest.mark.model
def test_thread_counts_give_the_same_logits_bit_for_bit(model_path):
    from edgeinfer.bench.exclusive import run_exclusive
    from edgeinfer.llamacpp import Batch

    def logits_at(threads: int):
        def run(ctx):
            ctx.set_threads(threads)
            batch = Batch(len(prompt))
            try:
                row = batch.add(0, prompt, 0, True)
                assert ctx.decode(batch)
                return ctx.logits(row)
            finally:
                ctx.seq_rm(0)
                batch.close()

        return run

    with make_engine(EngineConfig(model=model_path, parallel=2, ctx_size=1024, threads=2)) as eng:
        prompt = eng.vocab.tokenize("The three primary colours are red, yellow and")
        one, two = run_exclusive(eng, logits_at(1)), run_exclusive(eng, logits_at(2))
    gate.same_shapes(
        hashlib.sha256(one.tobytes()).hexdigest(),
        hashlib.sha256(two.tobytes()).hexdigest(),
        "one prompt in one batch; only the thread count differs, and each output is summed by one thread",
    )


@pytest.mark.model
def test_the_engine_fits_threads_only_when_the_user_left_them_to_it(model_path):
    with make_engine(EngineConfig(model=model_path, parallel=1, ctx_size=512)) as auto:
        steps = auto.snapshot().steps
        assert steps.threads_fitted and steps.threads >= 1
    with make_engine(EngineConfig(model=model_path, parallel=1, ctx_size=512, threads=1)) as fixed:
        steps = fixed.snapshot().steps
        assert not steps.threads_fitted and steps.threads == 1 and fixed.thread_tuner is None


def test_the_dashboard_says_when_other_work_holds_cores():
    from edgeinfer.engine.stats import EngineStats, StepStats
    from edgeinfer.tui.figures import threads_text

    def text(**steps):
        return threads_text(EngineStats(steps=StepStats(**steps)))

    assert text(threads=1, threads_max=2, threads_fitted=True) == "threads 1 of 2 (other work holds the rest)"
    assert text(threads=2, threads_max=2, threads_fitted=True) == "threads 2"
    assert text(threads=3, threads_max=3, threads_fitted=False) == "threads 3"


def test_libgomp_spins_at_barriers_where_a_server_may_hold_two_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines in one process throttle libgomp's spinning (each decoded about half as fast here): serve sets
    OMP_WAIT_POLICY=ACTIVE for a server of several models, before llama.cpp loads, unless the user chose."""
    from click.testing import CliRunner

    from edgeinfer import openmp
    from edgeinfer.cli import main
    from edgeinfer.server import app

    env: dict[str, str] = {}
    assert openmp.spin_at_barriers(env, loaded=False) and env == openmp.SPINNING
    mine = {"OMP_WAIT_POLICY": "PASSIVE"}
    assert not openmp.spin_at_barriers(mine, loaded=False) and mine == {"OMP_WAIT_POLICY": "PASSIVE"}
    late: dict[str, str] = {}
    assert not openmp.spin_at_barriers(late, loaded=True) and late == {}  # libgomp has read its environment
    count = {"GOMP_SPINCOUNT": "1000"}
    assert openmp.spin_at_barriers(count, loaded=False) and count["GOMP_SPINCOUNT"] == "1000"

    calls: list[bool] = []

    class Stop(Exception):
        pass

    def no_server(*args: object, **kwargs: object) -> None:
        raise Stop

    monkeypatch.setattr(openmp, "spin_at_barriers", lambda: calls.append(True) or True)
    monkeypatch.setattr(app, "make_server", no_server)
    for args, several in [
        (["-m", "a.gguf", "-m", "b.gguf"], True),
        (["-m", "a.gguf"], False),
        (["-m", "a.gguf", "-m", "b.gguf", "--max-models", "1"], False),
        (["--models-dir", "."], True),
    ]:
        calls.clear()
        result = CliRunner().invoke(main, ["serve", *args, "--socket", "/tmp/never.sock"])
        assert isinstance(result.exception, Stop), result.output
        assert calls == ([True] if several else []), args


def test_serve_decides_libgomp_s_policy_before_llama_cpp_loads() -> None:
    """libgomp reads OMP_WAIT_POLICY as it loads, with llama.cpp: serve must decide before anything imports it
    (its server modules did, at first), and libgomp then runs with what was decided."""
    import subprocess
    import sys

    probe = (
        "import os, sys\n"
        "import edgeinfer.openmp as o\n"
        "real = o.spin_at_barriers\n"
        "def spy():\n"
        "    print('llama_cpp' in sys.modules, real(), os.environ['OMP_WAIT_POLICY'], flush=True)\n"
        "    import ctypes, edgeinfer.llamacpp.core as core\n"
        "    core.init_backend()\n"
        "    assert 'libgomp' in open('/proc/self/maps').read(), 'the CPU backend loaded no libgomp'\n"
        "    ctypes.CDLL('libgomp.so.1').omp_display_env(1)  # what libgomp itself read, on stderr\n"
        "    sys.exit(0)\n"
        "o.spin_at_barriers = spy\n"
        "from edgeinfer.cli import main\n"
        "main(['serve', '-m', 'a.gguf', '-m', 'b.gguf', '--socket', '/tmp/never.sock'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["False", "True", "ACTIVE"], out.stdout + out.stderr
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in out.stderr and "GOMP_SPINCOUNT = '300000'" in out.stderr, out.stderr
