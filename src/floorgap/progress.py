"""Progress bars, timers and batching shared by every layer that runs long loops.

Imports nothing of floorgap, so data, models and probes use it without reaching up into the
stage commands.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(iterable: Iterable[T] | None = None, **kwargs: Any) -> tqdm:
    """A tqdm progress bar on stderr; keyword arguments go to :class:`tqdm.tqdm`."""
    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("mininterval", 1.0)
    return tqdm(iterable, **kwargs)


class Timer:
    """Wall-clock timer used for the per-step timings written to the logs."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def iter_batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of ``items`` of length ``size`` (the last may be shorter)."""
    if size < 1:
        raise ValueError("batch size must be >= 1")
    for start in range(0, len(items), size):
        yield items[start:start + size]
