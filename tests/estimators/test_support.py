"""Effective support N_eff = M(M-1) / sum_c n_c(n_c-1) (paper Sec. B.6, D.1)."""

from __future__ import annotations

import pytest
import torch

from floorgap.estimators.support import effective_support, effective_support_by_depth


def test_all_identical_is_one() -> None:
    res = effective_support(torch.full((32, 6), 5))
    assert res.n_eff == 1.0 and res.collision == 1.0 and res.n_distinct == 1


def test_empty_prefix_is_one() -> None:
    assert effective_support(torch.zeros(10, 0, dtype=torch.long)).n_eff == 1.0


def test_all_distinct_records_m() -> None:
    res = effective_support(torch.arange(20).reshape(20, 1))
    assert res.n_eff == 20.0 and res.collision == 0.0 and res.n_distinct == 20


@pytest.mark.parametrize("M", [4, 10, 64])
def test_two_equal_halves(M: int) -> None:
    paths = torch.cat([torch.zeros(M // 2, 3), torch.ones(M // 2, 3)]).long()
    res = effective_support(paths)
    h = M // 2
    assert res.n_eff == pytest.approx(M * (M - 1) / (2 * h * (h - 1)), rel=1e-15)
    assert res.collision == pytest.approx(2 * h * (h - 1) / (M * (M - 1)), rel=1e-15)


def test_prefixes_differ_only_late() -> None:
    # Identical first token, distinct second: depth 1 gives 1, depth 2 gives M.
    paths = torch.stack([torch.zeros(8), torch.arange(8)], dim=1).long()
    by_depth = effective_support_by_depth(paths)
    assert [r.n_eff for r in by_depth] == [1.0, 8.0]


def test_needs_two_paths() -> None:
    with pytest.raises(ValueError):
        effective_support(torch.zeros(1, 3, dtype=torch.long))


def test_one_collision_is_not_capped_at_the_path_count():
    """App. B.6 records M only when no pair collides; one colliding pair gives
    1/lambda_hat = M(M-1)/2, above M, and that is what is recorded."""
    paths = torch.arange(12).reshape(12, 1)
    paths[1] = paths[0]
    res = effective_support(paths)
    assert res.collision == pytest.approx(2 / (12 * 11))
    assert res.n_eff == pytest.approx(12 * 11 / 2)


def test_collision_free_family_records_m_and_one_collision_exceeds_it():
    """A collision-free family of M prefixes records exactly M; adding collisions lowers the
    value monotonically from M(M-1)/2 (one pair) towards 1 (all equal)."""
    M = 16
    free = torch.arange(M * 3).reshape(M, 3)
    assert effective_support(free).n_eff == float(M)
    values = []
    for n_equal in range(2, M + 1):
        paths = free.clone()
        paths[:n_equal] = paths[0]
        values.append(effective_support(paths).n_eff)
    assert values[0] == pytest.approx(M * (M - 1) / 2)
    assert all(a > b for a, b in zip(values, values[1:]))
    assert values[-1] == 1.0
