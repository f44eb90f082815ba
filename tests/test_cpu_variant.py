"""EDGEINFER_CPU_VARIANT: a CPU variant of the portable build in place of the best (docs/testing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from edgeinfer.llamacpp import ggml

pytestmark = pytest.mark.pure

LIB = Path(llama_cpp.__file__).parent / "lib"
PROBE = "from edgeinfer.llamacpp import core, ggml; core.init_backend(); print(ggml.loaded_cpu_variant())"


def run(variant: str | None, code: str = PROBE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ggml.CPU_VARIANT_ENV}
    if variant is not None:
        env[ggml.CPU_VARIANT_ENV] = variant
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_best_variant_loads_by_default_and_a_named_one_in_its_place():
    runnable = ggml.cpu_variants(LIB)
    assert len(runnable) >= 2, f"the portable build should ship several variants this CPU runs: {runnable}"
    assert run(None).stdout.strip() == runnable[-1]
    assert run(runnable[0]).stdout.strip() == runnable[0]


def test_a_variant_that_is_not_there_or_not_runnable_is_a_one_line_error():
    cli = "from edgeinfer.cli import main; main(['generate', 'hi', '--max-tokens', '1'])"
    r = run("no-such-variant", cli)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "EDGEINFER_CPU_VARIANT=no-such-variant: this build has no such variant; this CPU runs" in r.stderr
    built = sorted(p.name.removeprefix("libggml-cpu-").removesuffix(".so") for p in LIB.glob("libggml-cpu-*.so"))
    beyond = [v for v in built if v not in ggml.cpu_variants(LIB)]
    if beyond:  # an AVX-512 variant on an AVX2 machine, say
        r = run(beyond[0], cli)
        assert r.returncode != 0 and "this CPU lacks the instructions it needs" in r.stderr
    else:  # a CPU that runs every variant built (an AVX-512 machine with every extension)
        assert built == sorted(ggml.cpu_variants(LIB))
