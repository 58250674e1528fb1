"""The examples in the package's docstrings run and give what they show."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "floorgap"
WITH_EXAMPLES = sorted(p for p in SRC.rglob("*.py") if ">>> " in p.read_text())


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_some_module_has_examples():
    assert WITH_EXAMPLES


@pytest.mark.parametrize("path", WITH_EXAMPLES, ids=lambda p: _module(p))
def test_docstring_examples(path: Path):
    result = doctest.testmod(importlib.import_module(_module(path)))
    assert result.attempted > 0 and result.failed == 0
