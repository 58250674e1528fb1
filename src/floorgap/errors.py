"""Errors every layer may raise; the bottom of the import graph (imports nothing of floorgap).

:class:`StageError` is an expected failure whose message tells the user what to do: the stage
command prints it as one line (no traceback) and exits with status 2. :class:`RecordMismatch`
is a :class:`StageError` raised when record files do not describe the same anchors or run.
"""

from __future__ import annotations


class StageError(RuntimeError):
    """An expected failure whose message tells the user what to do (no traceback needed)."""


class RecordMismatch(StageError, ValueError):
    """Record files that should describe the same anchors (or the same run) do not."""
