"""Exact TV barycentre against an LP solver, closed forms and invariances."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.barycentre import (
    Barycentre,
    tv_barycentre,
    tv_barycentre_lp,
    tv_distance,
)

TOL = 1e-9
F64 = torch.float64


def dirichlet(M: int, V: int, alpha: float, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.dirichlet(np.full(V, alpha), size=M), dtype=F64)
    return x / x.sum(-1, keepdim=True)


def objective(P: torch.Tensor, q: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    d = tv_distance(P, q)
    if w is None:
        return d.mean()
    return (w * d).sum() / w.sum()


def assert_on_simplex(q: torch.Tensor, atol: float = 1e-12) -> None:
    assert bool((q >= 0).all())
    assert abs(float(q.sum()) - 1.0) <= atol


def check_against_lp(P: torch.Tensor, w: torch.Tensor | None = None) -> None:
    q, value = tv_barycentre(P, w)
    q_lp, value_lp = tv_barycentre_lp(P, w)
    assert_on_simplex(q)
    assert abs(float(value) - float(value_lp)) <= TOL
    # The reported value is the objective at the returned q.
    assert abs(float(value) - float(objective(P, q, w))) <= 1e-12


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [0.05, 0.5, 3.0])
def test_unweighted_matches_lp(seed: int, alpha: float) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    M = int(torch.randint(2, 14, (1,), generator=g))
    V = int(torch.randint(2, 30, (1,), generator=g))
    check_against_lp(dirichlet(M, V, alpha, seed))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [0.05, 0.5, 3.0])
def test_weighted_matches_lp(seed: int, alpha: float) -> None:
    g = torch.Generator().manual_seed(200 + seed)
    M = int(torch.randint(2, 14, (1,), generator=g))
    V = int(torch.randint(2, 30, (1,), generator=g))
    w = torch.rand(M, dtype=F64, generator=g)
    w = w * (torch.rand(M, dtype=F64, generator=g) > 0.3)  # some zero weights
    w[0] = w[0] + 0.1  # positive total
    check_against_lp(dirichlet(M, V, alpha, seed), w)


def test_peaked_large_instance_matches_lp() -> None:
    check_against_lp(dirichlet(24, 60, 0.02, 7))
    w = torch.rand(24, dtype=F64, generator=torch.Generator().manual_seed(3))
    check_against_lp(dirichlet(24, 60, 0.02, 8), w)


def test_near_identical_rows() -> None:
    g = torch.Generator().manual_seed(5)
    base = dirichlet(1, 20, 1.0, 5)
    P = (base + 1e-9 * torch.rand(10, 20, dtype=F64, generator=g)).abs()
    P = P / P.sum(-1, keepdim=True)
    check_against_lp(P)
    check_against_lp(P, torch.rand(10, dtype=F64, generator=g))
    assert float(tv_barycentre(P).value) < 1e-8


@pytest.mark.parametrize("M", [1, 2, 3, 7])
def test_distinct_point_masses(M: int) -> None:
    P = torch.eye(M, dtype=F64)
    q, value = tv_barycentre(P)
    assert_on_simplex(q)
    assert abs(float(value) - (M - 1) / M) <= 1e-15
    # With extra tokens never used the answer is unchanged.
    P2 = torch.cat([P, torch.zeros(M, 3, dtype=F64)], dim=1)
    assert abs(float(tv_barycentre(P2).value) - (M - 1) / M) <= 1e-15


def test_weighted_point_masses() -> None:
    # Weighted point masses: q should sit on the heaviest atom; value = 1 - max weight.
    w = torch.tensor([0.2, 0.5, 0.3], dtype=F64)
    q, value = tv_barycentre(torch.eye(3, dtype=F64), w)
    assert_on_simplex(q)
    assert abs(float(value) - 0.5) <= 1e-15


def test_zero_weight_rows_are_ignored() -> None:
    P = dirichlet(9, 14, 0.3, 21)
    w = torch.tensor([1.0, 0.0, 2.0, 0.5, 0.0, 0.0, 3.0, 1.5, 0.0], dtype=F64)
    keep = w > 0
    v_all = float(tv_barycentre(P, w).value)
    v_kept = float(tv_barycentre(P[keep], w[keep]).value)
    assert v_all == pytest.approx(v_kept, abs=1e-14)


def test_weighted_float32() -> None:
    P = dirichlet(12, 30, 0.3, 22)
    w = torch.rand(12, dtype=F64, generator=torch.Generator().manual_seed(1))
    q32, v32 = tv_barycentre(P.float(), w.float())
    assert abs(float(v32) - float(tv_barycentre(P, w).value)) < 1e-5
    assert abs(float(q32.sum()) - 1) < 1e-5 and bool((q32 >= 0).all())


def test_identical_rows_give_exact_zero() -> None:
    row = dirichlet(1, 50, 0.3, 9)
    P = row.expand(6, 50).clone()
    q, value = tv_barycentre(P)
    assert float(value) == 0.0
    assert torch.equal(q, row[0])
    q, value = tv_barycentre(P, torch.tensor([0.1, 0.0, 2.0, 0.3, 0.0, 1.0], dtype=F64))
    assert float(value) == 0.0
    assert torch.equal(q, row[0])


def test_single_row_and_single_token() -> None:
    row = dirichlet(1, 9, 1.0, 1)
    q, value = tv_barycentre(row)
    assert float(value) == 0.0 and torch.equal(q, row[0])
    q, value = tv_barycentre(torch.ones(5, 1, dtype=F64))
    assert float(value) == 0.0 and float(q[0]) == 1.0
    q, value = tv_barycentre(torch.ones(5, 1, dtype=F64), torch.arange(5, dtype=F64))
    assert float(value) == 0.0 and float(q[0]) == 1.0


def test_result_unpacks_and_has_attributes() -> None:
    res = tv_barycentre(dirichlet(4, 6, 1.0, 2))
    assert isinstance(res, Barycentre)
    q, value = res
    assert q is res.q and value is res.value


def test_batched_matches_loop() -> None:
    P = dirichlet(5 * 3 * 8, 17, 0.4, 11).reshape(5, 3, 8, 17)
    W = torch.rand(5, 3, 8, dtype=F64, generator=torch.Generator().manual_seed(4))
    for w in (None, W):
        q, value = tv_barycentre(P, w)
        assert q.shape == (5, 3, 17) and value.shape == (5, 3)
        for i in range(5):
            for j in range(3):
                qi, vi = tv_barycentre(P[i, j], None if w is None else w[i, j])
                assert torch.allclose(q[i, j], qi, atol=1e-14)
                assert abs(float(vi - value[i, j])) <= 1e-14


def test_float32_input() -> None:
    P = dirichlet(16, 40, 0.3, 12)
    q32, v32 = tv_barycentre(P.float())
    assert q32.dtype == torch.float32
    assert abs(float(v32) - float(tv_barycentre(P).value)) < 1e-5
    assert abs(float(q32.sum()) - 1) < 1e-5


def test_invalid_weights_rejected() -> None:
    P = dirichlet(3, 4, 1.0, 0)
    with pytest.raises(ValueError):
        tv_barycentre(P, torch.tensor([1.0, -1.0, 1.0], dtype=F64))
    with pytest.raises(ValueError):
        tv_barycentre(P, torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError):
        tv_barycentre(P, torch.ones(4, dtype=F64))


# ---------------------------------------------------------------- property tests

@st.composite
def families(draw, weighted: bool = False):
    M = draw(st.integers(1, 8))
    V = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    alpha = draw(st.sampled_from([0.05, 0.3, 1.0, 5.0]))
    P = dirichlet(M, V, alpha, seed)
    if not weighted:
        return P, None
    # Zero or at least 1e-6: a subnormal weight times a scale underflows to an all-zero total,
    # which is invalid input, not a scale-invariance failure.
    weight = st.one_of(st.just(0.0), st.floats(1e-6, 10.0))
    w = torch.tensor(draw(st.lists(weight, min_size=M, max_size=M)), dtype=F64)
    if float(w.sum()) <= 0:
        w[0] = 1.0
    return P, w


@settings(max_examples=60, deadline=None)
@given(families(weighted=True), st.randoms(use_true_random=False))
def test_row_permutation_invariance(fam, rnd) -> None:
    P, w = fam
    perm = list(range(P.shape[0]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    v1 = tv_barycentre(P, w).value
    v2 = tv_barycentre(P[perm], None if w is None else w[perm]).value
    assert abs(float(v1 - v2)) <= 1e-12


@settings(max_examples=60, deadline=None)
@given(families(weighted=True), st.randoms(use_true_random=False))
def test_column_permutation_equivariance(fam, rnd) -> None:
    P, w = fam
    perm = list(range(P.shape[1]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    q1, v1 = tv_barycentre(P, w)
    q2, v2 = tv_barycentre(P[:, perm], w)
    assert abs(float(v1 - v2)) <= 1e-12
    assert torch.allclose(q2, q1[perm], atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(families(weighted=True), st.floats(1e-3, 1e3))
def test_weight_scale_invariance(fam, scale) -> None:
    P, w = fam
    v1 = tv_barycentre(P, w).value
    v2 = tv_barycentre(P, w * scale).value
    assert abs(float(v1 - v2)) <= 1e-12


@settings(max_examples=80, deadline=None)
@given(families(weighted=True))
def test_value_bounds_and_simplex(fam) -> None:
    P, w = fam
    q, value = tv_barycentre(P, w)
    assert_on_simplex(q)
    wn = torch.ones(P.shape[0], dtype=F64) if w is None else w
    # No candidate does better: the weighted mixture, every row, the uniform distribution.
    mixture = (wn[:, None] * P).sum(0) / wn.sum()
    candidates = [mixture, torch.full((P.shape[1],), 1.0 / P.shape[1], dtype=F64), *P]
    for c in candidates:
        assert float(value) <= float(objective(P, c, wn)) + 1e-12
    assert 0.0 <= float(value) <= 1.0
    # Point masses at each token bound the value by 1 - (weighted mean of the best column).
    assert float(value) <= 1 - float(((wn[:, None] * P).sum(0) / wn.sum()).max()) + 1e-12
