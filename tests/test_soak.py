"""The soak test's short version: 60 s of mixed traffic on one server, then SIGTERM (scripts/soak.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import gate

pytestmark = pytest.mark.model

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"


def test_soak_one_minute_spec_off():
    args = [
        "--duration",
        "60",
        "--clients",
        "8",
        "--spec",
        "off",
        "--grace",
        "20",
        "--drift-cache",
        str(gate.DRIFT_CACHE),
    ]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    gate.contains(r.stdout, '"ok": true')  # the soak's own report
    gate.contains(r.stdout, "completed stream")
