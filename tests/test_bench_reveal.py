"""The summary of ``floorgap bench reveal`` (per-j floors -> per-J rows), without a model."""

from __future__ import annotations

import math

import pytest
import torch

from floorgap.estimators.aggregate import prompt_bootstrap
from floorgap.bench.reveal import reveal_summary

GAMMA, J_MAX, N = 7, 4, 12
PROMPTS = [f"p{i // 2}" for i in range(N)]  # two anchors per prompt


def _pi() -> torch.Tensor:
    return torch.linspace(0.1, 0.9, N, dtype=torch.float64)


def _rows(floors: torch.Tensor, grid=(1, 2, 4)) -> dict[str, object]:
    rows = reveal_summary(floors, _pi(), PROMPTS, list(grid), n_boot=400, seed=7)
    return {r.name: r for r in rows}


def _per_anchor_floors(seed: int = 0) -> torch.Tensor:
    """Each anchor's floor by slot, the same for every j."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(N, GAMMA, 1, generator=g, dtype=torch.float64)
    floors = base.expand(N, GAMMA, J_MAX).clone()
    floors[:, 0] = float("nan")  # slot 0 has no predecessor
    return floors


def test_identical_j_values_give_zero_sd_and_widths_independent_of_j() -> None:
    rows = _rows(_per_anchor_floors())
    for J in (2, 4):
        assert rows[f"J={J} within-anchor sd over j"].value == pytest.approx(0.0, abs=1e-12)
        assert rows[f"J={J} within-j variance share"].value == pytest.approx(0.0, abs=1e-12)
        for label in ("slot 6", "slots 1-6 mean"):
            for stat in ("T1 reweighted", "interval width"):
                assert rows[f"J={J} {label}: {stat}"].value == pytest.approx(
                    rows[f"J=1 {label}: {stat}"].value, abs=1e-12)
            assert rows[f"J={J} {label}: width ratio vs J=1"].value == pytest.approx(1.0)
    assert rows["J=1 within-anchor sd over j"].value is None
    assert rows["J=4 decode forwards per step"].value == 5.0
    assert rows["J=4 undefined (j, slot, anchor) cells"].value == 0.0


def test_estimate_is_the_hajek_mean_with_the_prompt_bootstrap() -> None:
    floors = _per_anchor_floors(1)
    floors[:, :, 1] += 0.1  # j = 1 differs: J = 2 averages the two
    rows = _rows(floors)
    y = floors[:, -1, :2].mean(-1)
    res = prompt_bootstrap(y.unsqueeze(1), PROMPTS, _pi(), n_boot=400, seed=7)
    assert rows["J=2 slot 6: T1 reweighted"].value == pytest.approx(float(res.estimate[0]))
    assert rows["J=2 slot 6: interval width"].value == pytest.approx(
        float(res.upper[0] - res.lower[0]))
    # a constant shift of one j: sd 0.1 / sqrt(2) in every cell
    assert rows["J=2 within-anchor sd over j"].value == pytest.approx(0.1 / math.sqrt(2))


def test_undefined_j_are_left_out_not_propagated() -> None:
    floors = _per_anchor_floors(2)
    floors[:, :, 1] = 5.0  # would move every mean if it were used
    floors[:, 1:, 1] = float("nan")  # j = 1 undefined at every anchor and slot
    rows = _rows(floors, grid=(1, 2))
    for label in ("slot 6", "slots 1-6 mean"):
        j1, j2 = rows[f"J=1 {label}: T1 reweighted"].value, rows[f"J=2 {label}: T1 reweighted"].value
        assert math.isfinite(j2) and j2 == pytest.approx(j1)
    assert rows["J=2 undefined (j, slot, anchor) cells"].value == N * (GAMMA - 1)


def test_anchor_with_no_defined_j_is_left_out_of_the_mean() -> None:
    floors = _per_anchor_floors(3)
    floors[0, -1, :] = float("nan")  # anchor 0 undefined at the last slot for every j
    rows = _rows(floors, grid=(1, 2))
    keep = torch.arange(1, N)
    y, pi = floors[keep, -1, 0], _pi()[keep]
    expected = float((y / pi).sum() / (1 / pi).sum())
    assert rows["J=2 slot 6: T1 reweighted"].value == pytest.approx(expected)
    assert "11 anchors" in rows["J=2 slot 6: T1 reweighted"].note
    assert "no defined j: 1" in rows["J=2 undefined (j, slot, anchor) cells"].note
    assert math.isfinite(rows["J=2 slots 1-6 mean: T1 reweighted"].value)


def test_grid_beyond_the_revealed_paths_is_refused() -> None:
    with pytest.raises(ValueError):
        reveal_summary(_per_anchor_floors(), _pi(), PROMPTS, [1, J_MAX + 1], n_boot=10)
