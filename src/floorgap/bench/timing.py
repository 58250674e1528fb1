"""What every benchmark shares: its result rows, the median of timed calls and the table it
prints."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Row:
    """One benchmark result."""

    name: str
    value: float | None
    unit: str
    note: str = ""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], Any], repeats: int, device: torch.device,
                warmup: int = 1) -> float:
    """Median wall time in seconds of ``repeats`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def format_table(rows: list[Row]) -> str:
    width = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        if r.value is None:
            val = "n/a"
        elif r.unit == "" and abs(r.value) < 1e-3:
            val = f"{r.value:.3e}"
        else:
            val = f"{r.value:,.3f}"
        lines.append(f"{r.name:<{width}}  {val:>14} {r.unit:<3} {r.note}")
    return "\n".join(lines)
