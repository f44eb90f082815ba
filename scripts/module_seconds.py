"""Each test module's seconds in a run, from pytest's JUnit XML: the order `make test` hands modules to workers.

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=run.xml
    .venv/bin/python scripts/module_seconds.py run.xml > tests/module_seconds.json

tests/conftest.py starts the costliest modules first, so that the last module a worker takes is a short one
and both workers end near together (the longest-first rule); a module the file does not name goes last.
Only the order depends on these figures: a stale file makes the run longer, never wrong.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def module_seconds(junit_xml: str) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        path = case.get("classname", "").split(".")
        # classname "tests.test_spec" (or "tests.test_spec.TestClass"): the module is the first two parts.
        module = "/".join(path[:2]) + ".py"
        seconds[module] += float(case.get("time") or 0)
    return dict(sorted(((m, round(s, 1)) for m, s in seconds.items()), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    json.dump(module_seconds(sys.argv[1]), sys.stdout, indent=1)
    print()
