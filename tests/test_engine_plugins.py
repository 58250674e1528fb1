"""The project's vLLM plugin (floorgap.engine_plugins): its expand fallback against the kernel's
semantics, in every dtype the rejection sampler uses (temperatures, top-k, top-p)."""

from __future__ import annotations

import pytest
import torch

from floorgap.engine_plugins import expand_to_tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_spreads_each_request_over_its_tokens(dtype: torch.dtype) -> None:
    values = torch.tensor([0, 3, 5, 0], dtype=dtype)
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)     # request 1 has no draft tokens
    out = torch.full((7,), -1, dtype=dtype)                 # one spare slot stays untouched
    expand_to_tokens(out, values, cu, 0, 1)
    assert out.tolist() == [1, 1, 5, 5, 5, 1, -1]


def test_expand_keeps_fractional_values() -> None:
    out = torch.empty(3, dtype=torch.float32)
    expand_to_tokens(out, torch.tensor([0.7, 0.0]), torch.tensor([1, 3]), 0, 1)
    assert out.tolist() == pytest.approx([0.7, 1.0, 1.0])
