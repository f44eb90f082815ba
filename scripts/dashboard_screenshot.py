"""Save an SVG of the dashboard in the middle of a real in-process benchmark (the README's docs/dashboard.svg).

    .venv/bin/python scripts/dashboard_screenshot.py --out docs/dashboard.svg

Runs `edgeinfer bench --dashboard`'s code path headless: the benchmark on a background thread,
the dashboard on the same engine, and a screenshot a few seconds into the largest level's engine run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from edgeinfer.bench.sweep import SayProgress, run_sweep
from edgeinfer.bench.targets import EngineTarget
from edgeinfer.models.catalog import default_model_path
from edgeinfer.options import EngineConfig
from edgeinfer.runtime import make_engine
from edgeinfer.tui.app import Dashboard
from edgeinfer.tui.launch import bench_with_dashboard, run_headless


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/dashboard.svg"))
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--after", type=float, default=6.0, help="Seconds into the last level's warm run.")
    ap.add_argument("--size", default="120x36", help="Terminal columns x rows.")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    cols, rows = (int(x) for x in args.size.split("x"))
    engine = make_engine(EngineConfig(model=default_model_path(), parallel=max(levels), ctx_size=8192))

    async def script(app: Dashboard, pilot: Any) -> None:
        cue = f"{levels[-1]} streams, edgeinfer: warm run"
        while cue not in app.job_line:
            await pilot.pause(0.1)
        end = time.monotonic() + args.after
        while time.monotonic() < end:
            await pilot.pause(0.1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(app.export_screenshot(title="edgeinfer bench --dashboard"))
        print(f"wrote {args.out} ({app.job_line})", file=sys.stderr)
        while "finished" not in app.job_line and "failed" not in app.job_line:
            await pilot.pause(0.2)
        await pilot.press("q")

    try:
        target = EngineTarget(engine)
        job = lambda say: run_sweep([target], "chat", levels, args.max_tokens, 1, SayProgress(say))  # noqa: E731
        bench_with_dashboard(engine, job, interval=0.5, run=run_headless(script, (cols, rows)))
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
