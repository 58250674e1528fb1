"""The rollout probe's per-slot floor records on hand-made blocks (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from floorgap.estimators.floors import floor_order1_reweighted, order0_path_tv
from floorgap.probes.rollouts import SampledBlock, anchor_records


def _dist(*rows: list[float]) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.sum(-1, keepdim=True)


def _block_with_zero_weight_reveal() -> SampledBlock:
    """M = 4 paths, gamma = 3, V = 4. At slot 1 path 0 puts all its mass on token 2 and
    realises it; no other path gives token 2 any probability, so revealing path 0's
    predecessor at slot 2 has all-zero importance weights. Path 1 reveals token 0, which
    paths 2 and 3 can produce."""
    p0 = _dist([1, 1, 1, 1]).expand(4, 4)
    p1 = _dist([0, 0, 1, 0], [1, 1, 0, 0], [2, 1, 0, 1], [1, 3, 0, 0])
    p2 = _dist([1, 2, 3, 4], [4, 3, 2, 1], [1, 1, 1, 1], [5, 1, 1, 1])
    probs = torch.stack([p0, p1, p2])  # [gamma, M, V]
    tokens = torch.tensor([[0, 2, 3], [1, 0, 0], [2, 1, 2], [3, 1, 0]])
    revealed = torch.stack([_dist([1, 1, 1, 1], [1, 2, 1, 1], [3, 1, 1, 1], [1, 1, 1, 4])
                            for _ in range(2)]).unsqueeze(0).expand(3, 2, 4, 4).clone()
    revealed[2, 1] = _dist([1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1])
    return SampledBlock(tokens=tokens, probs=probs, revealed=revealed, seconds=0.0)


def test_an_undefined_revealed_token_is_left_out_and_counted() -> None:
    block = _block_with_zero_weight_reveal()
    _, floors = anchor_records("a", block, store_top_k=4)
    f = floors[2]
    assert f.t1_reweighted_undefined == 1
    # Only path 1's revealed token is defined; its floor is the cell's value.
    w = block.probs[1][:, block.tokens[1, 1]].clone()
    w[1] = 0.0
    expected = floor_order1_reweighted(block.revealed[2, 1], w)
    assert math.isfinite(f.t1_reweighted)
    assert f.t1_reweighted == pytest.approx(float(expected.value), abs=1e-7)
    assert f.t1_reweighted_ess_min == pytest.approx(float(expected.ess))
    assert floors[1].t1_reweighted_undefined == 0  # slot 0's distribution is shared


def test_every_revealed_token_undefined_gives_nan() -> None:
    block = _block_with_zero_weight_reveal()
    block = SampledBlock(tokens=block.tokens, probs=block.probs,
                         revealed=block.revealed[:, :1].clone(), seconds=0.0)
    _, floors = anchor_records("a", block, store_top_k=4)
    assert math.isnan(floors[2].t1_reweighted) and floors[2].t1_reweighted_undefined == 1


def test_order0_floor_on_the_covered_paths() -> None:
    """t0_covered is the order-0 barycentre's mean TV over the paths the split-half order-1
    estimate covers; with every path covered it is T^(0)."""
    block = _block_with_zero_weight_reveal()
    _, floors = anchor_records("a", block, store_top_k=4)
    tv = order0_path_tv(block.probs)
    # Slot 2 groups by slot-1 tokens (2, 0, 1, 1): only paths 2 and 3 are covered.
    assert floors[2].t1_covered_mass == pytest.approx(0.5)
    assert floors[2].t0_covered == pytest.approx(float(tv[2, 2:].mean()), abs=1e-7)
    assert floors[2].t0 == pytest.approx(float(tv[2].mean()), abs=1e-7)
    # Slot 0: one group of all paths, so the covered order-0 floor is T^(0) itself.
    assert floors[0].t0_covered == pytest.approx(floors[0].t0, abs=1e-7)
