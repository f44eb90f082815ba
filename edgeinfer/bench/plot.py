"""`edgeinfer bench --plot FILE`: aggregate tok/s and TTFT p95 against concurrency, one line per target."""

from __future__ import annotations

from pathlib import Path

from edgeinfer.bench.sweep import Sweep


def plot_sweep(sweep: Sweep, dest: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    levels = [lv.concurrency for lv in sweep.levels]
    fig, (tps_ax, ttft_ax) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for t in sweep.targets:
        sides = sweep.series(t.name)
        tps_ax.plot(levels, [s.warm.total_tps for s in sides], marker="o", label=t.name)
        p95 = [s.warm.ttft(95) for s in sides]
        ttft_ax.plot(levels, [x * 1000 if x is not None else float("nan") for x in p95], marker="o", label=t.name)
        knee = sweep.knee(t.name)
        if knee is not None and knee.found:
            tps_ax.axvline(knee.parallel, linestyle=":", color=tps_ax.lines[-1].get_color(), alpha=0.7)
    for ax, ylabel in ((tps_ax, "aggregate tokens/s"), (ttft_ax, "TTFT p95 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"edgeinfer bench: {sweep.workload}, {sweep.max_tokens} tokens per stream (dotted: knee)")
    fig.savefig(dest, dpi=110)
    plt.close(fig)
