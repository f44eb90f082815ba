"""The engine's seams: fault handling, the stats and the benchmark use the engine's public interface only.

A private attribute (`x._name`) of an object other than `self` or `cls` ties a module to another's
inside; these modules go through the engine's methods, faults.Host and stats.EngineView instead.
"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent
CHECKED = [
    ROOT / "edgeinfer" / "engine" / "faults.py",
    ROOT / "edgeinfer" / "engine" / "stats.py",
    *sorted((ROOT / "edgeinfer" / "bench").glob("*.py")),
]


def private_reads(source: str) -> list[str]:
    """`x._name` in the source where x is not self or cls (dunders such as `__name__` are public), with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_check_finds_a_private_attribute_of_another_object():
    source = (
        "def f(eng, self):\n"
        "    self._ok = 1\n"
        "    with eng._lock:  # a deliberately added case\n"
        "        return eng.sched._queued(), f.__name__\n"
    )
    assert private_reads(source) == ["3: eng._lock", "4: eng.sched._queued"]


def test_faults_stats_and_the_benchmark_read_no_private_attribute():
    assert len(CHECKED) > 5
    found = {str(p.relative_to(ROOT)): hits for p in CHECKED if (hits := private_reads(p.read_text()))}
    assert found == {}, f"use the engine's public interface instead: {found}"
