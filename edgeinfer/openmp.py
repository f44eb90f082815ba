"""libgomp's waiting policy, set before llama.cpp loads: a process of several engines keeps its threads spinning.

llama.cpp's CPU threads are OpenMP's (libgomp), one team per thread that calls llama_decode: each engine's
thread has its own. Once a process holds more of libgomp's threads than it has cores (two engines that have
both decoded: a server of several models), libgomp spins only 100 times at a barrier before a thread sleeps,
instead of 300,000, and every step of every engine slows: two engines on 2 cores decoded 54-72 tok/s against
107-110 alone (scripts/two_engines.py, docs/benchmarks.md run H). OMP_WAIT_POLICY=ACTIVE raises that to 1,000
spins (84-108 tok/s); GOMP_SPINCOUNT keeps the spinning at libgomp's default otherwise (about 3 ms, then a
thread sleeps: an idle server still uses no CPU). It is not everyone's default: a server of one model lost
7-9% at 16 agent streams with it, where its event loop shares the cores with llama.cpp's threads.

libgomp reads both as it loads, with llama.cpp: this module imports neither, so a command can decide first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

SPINNING = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}


def several_engines(models: int, folder: bool, max_models: int) -> bool:
    """Whether a server may hold two engines at once: more than one model named or a folder of them, and
    --max-models other than 1 (0: no bound)."""
    return (models > 1 or folder) and max_models != 1


def spin_at_barriers(environ: MutableMapping[str, str] | None = None, loaded: bool | None = None) -> bool:
    """Set SPINNING for libgomp unless the user chose a policy or llama.cpp is loaded already (libgomp has
    read the environment then: too late to matter). Returns whether it was set."""
    environ = os.environ if environ is None else environ
    loaded = "llama_cpp" in sys.modules if loaded is None else loaded
    if loaded or "OMP_WAIT_POLICY" in environ:
        return False
    environ["OMP_WAIT_POLICY"] = SPINNING["OMP_WAIT_POLICY"]
    environ.setdefault("GOMP_SPINCOUNT", SPINNING["GOMP_SPINCOUNT"])
    return True
