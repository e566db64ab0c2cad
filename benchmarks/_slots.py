"""What benchmarks/ray_slots.py and benchmarks/trial_slots.py share: run one experiment whose
chief prints a ``BENCH {json}`` line, and print the 2-slot / 1-slot ratios of the medians."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from pathlib import Path


def run_bench(cmd: list[str], cwd: Path, env: dict[str, str], slots: int) -> dict[str, float]:
    """Run ``cmd``; the figures of the chief's last ``BENCH`` line, checked to come from
    ``slots`` workers."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    found = re.findall(
        r"BENCH (\{.*?\})", done.stdout + done.stderr
    )  # flat JSON; a worker's line may follow
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{slots}-slot run failed:\n{(done.stdout + done.stderr)[-3000:]}")
    figures = json.loads(found[-1])
    if figures["size"] != slots:
        raise RuntimeError(f"expected {slots} workers, the chief saw {figures['size']}")
    return figures


def print_ratios(figures: dict[int, list[dict[str, float]]]) -> None:
    """The median time per batch and checkpoint stall of each slot count, and 2 / 1."""
    med = {
        s: {k: statistics.median(f[k] for f in runs) for k in ("batch", "stall")}
        for s, runs in figures.items()
    }
    print(f"{'measure':<24}{'1 slot s':>10}{'2 slots s':>11}{'2/1':>8}")
    for key, label in (("batch", "time per batch"), ("stall", "checkpoint stall")):
        one, two = med[1][key], med[2][key]
        print(f"{label:<24}{one:>10.3f}{two:>11.3f}{two / one:>7.2f}x")
