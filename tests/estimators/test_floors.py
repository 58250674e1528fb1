"""Floors by grouping, split-half and re-weighting: identities, bounds and monotonicity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.barycentre import tv_barycentre
from floorgap.estimators.floors import (
    alternating_split,
    floor_by_slot,
    floor_order0,
    floor_order0_split,
    floor_order1_by_slot,
    floor_order1_plugin,
    floor_order1_reweighted,
    floor_order1_split,
    floor_orderm_plugin,
    floor_orderm_split,
    group_ids,
    kish_ess,
    reveal_weights,
)

F64 = torch.float64


def dirichlet(M: int, V: int, alpha: float, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.dirichlet(np.full(V, alpha), size=M), dtype=F64)
    return x / x.sum(-1, keepdim=True)


def tokens(M: int, k: int, alphabet: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.as_tensor(rng.integers(0, alphabet, size=(M, k)), dtype=torch.long)


def rows_from_prefix(history: torch.Tensor, V: int, seed: int) -> torch.Tensor:
    """Next-token rows that depend on the whole realised prefix only (as for the target)."""
    _, inverse = torch.unique(history, dim=0, return_inverse=True)
    table = dirichlet(int(inverse.max()) + 1, V, 0.3, seed)
    return table[inverse]


def test_slot0_identical_rows_give_exact_zero() -> None:
    P = dirichlet(1, 30, 0.2, 1).expand(16, 30).clone()
    assert float(floor_order0(P)) == 0.0
    assert float(floor_order0_split(P, alternating_split(16))) == 0.0
    res = floor_order1_split(P, None)
    assert float(res.value_covered) == 0.0
    assert float(res.covered_mass) == 1.0
    assert float(res.lower) == 0.0 and float(res.upper) == 0.0
    assert res.n_groups == 1 and res.n_uncovered_paths == 0
    assert float(floor_order1_plugin(P, None)) == 0.0


@pytest.mark.parametrize("k", [1, 2, 4])
def test_full_prefix_order_gives_exact_zero(k: int) -> None:
    M = 40
    hist = tokens(M, k, 3, seed=k)
    P = rows_from_prefix(hist, 25, seed=10 + k)
    for m in (k, k + 2):
        assert float(floor_orderm_plugin(P, hist, m)) == 0.0
        res = floor_orderm_split(P, hist, m)
        assert float(res.lower) == 0.0
        if res.n_uncovered_paths < M:
            assert float(res.value_covered) == 0.0
        assert float(res.upper) == pytest.approx(1 - float(res.covered_mass))
    # Lower orders do lose information on this instance.
    assert float(floor_orderm_plugin(P, hist, 0)) > 0.0


def test_order0_plugin_matches_barycentre_and_m0_grouping() -> None:
    P = dirichlet(20, 15, 0.5, 3)
    hist = tokens(20, 3, 2, 3)
    assert float(floor_orderm_plugin(P, hist, 0)) == pytest.approx(float(floor_order0(P)), abs=1e-15)
    inv, counts = group_ids(hist, 0)
    assert counts.tolist() == [20] and bool((inv == 0).all())
    # m larger than k means the whole prefix.
    inv_k, counts_k = group_ids(hist, 3)
    inv_big, counts_big = group_ids(hist, 9)
    assert torch.equal(inv_k, inv_big) and torch.equal(counts_k, counts_big)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 24), st.integers(0, 4), st.integers(2, 4), st.integers(0, 10**6))
def test_plugin_nonincreasing_in_m(M: int, k: int, alphabet: int, seed: int) -> None:
    P = dirichlet(M, 10, 0.4, seed)
    hist = tokens(M, k, alphabet, seed + 1)
    values = [float(floor_orderm_plugin(P, hist, m)) for m in range(k + 2)]
    for a, b in zip(values, values[1:]):
        assert b <= a + 1e-12
    assert values[0] == pytest.approx(float(floor_order0(P)), abs=1e-15)


def test_split_half_order0_bounds() -> None:
    for seed in range(5):
        P = dirichlet(17, 12, 0.5, seed)
        mask = alternating_split(17)
        v = float(floor_order0_split(P, mask))
        # Held-out scoring can only do worse than refitting on the scored half itself.
        inner = (int(mask.sum()) * float(tv_barycentre(P[mask]).value)
                 + int((~mask).sum()) * float(tv_barycentre(P[~mask]).value)) / 17
        assert inner - 1e-12 <= v <= 1.0
    with pytest.raises(ValueError):
        floor_order0_split(P, torch.ones(17, dtype=torch.bool))


def test_split_half_order0_batched() -> None:
    P = dirichlet(3 * 10, 8, 0.5, 2).reshape(3, 10, 8)
    mask = alternating_split(10)
    v = floor_order0_split(P, mask)
    for i in range(3):
        assert float(v[i]) == pytest.approx(float(floor_order0_split(P[i], mask)), abs=1e-15)


def test_order1_split_closed_forms() -> None:
    a, b = dirichlet(2, 9, 0.5, 4)
    # Two groups of identical rows: zero floor, full coverage.
    P = torch.stack([a, a, b, b, a])
    pred = torch.tensor([7, 7, 3, 3, 7])
    res = floor_order1_split(P, pred)
    assert float(res.value_covered) == 0.0 and float(res.covered_mass) == 1.0
    # A group of two distinct rows scores each against the other: TV(a, b).
    P = torch.stack([a, b, a])
    pred = torch.tensor([1, 1, 2])
    res = floor_order1_split(P, pred)
    tv_ab = 0.5 * float((a - b).abs().sum())
    assert float(res.value_covered) == pytest.approx(tv_ab, abs=1e-15)
    assert float(res.covered_mass) == pytest.approx(2 / 3)
    assert res.n_groups == 2 and res.n_uncovered_groups == 1 and res.n_uncovered_paths == 1
    assert float(res.lower) == pytest.approx(2 / 3 * tv_ab, abs=1e-15)
    assert float(res.upper) == pytest.approx(2 / 3 * tv_ab + 1 / 3, abs=1e-15)


def test_order1_split_all_singletons_uncovered() -> None:
    P = dirichlet(6, 5, 1.0, 5)
    res = floor_order1_split(P, torch.arange(6))
    assert math.isnan(float(res.value_covered))
    assert float(res.covered_mass) == 0.0
    assert float(res.lower) == 0.0 and float(res.upper) == 1.0
    assert res.n_uncovered_paths == 6 and res.n_uncovered_groups == 6
    # The plug-in treats singletons as exact fits.
    assert float(floor_order1_plugin(P, torch.arange(6))) == 0.0


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 30), st.integers(1, 6), st.integers(0, 10**6))
def test_order1_split_bounds_are_consistent(M: int, alphabet: int, seed: int) -> None:
    P = dirichlet(M, 8, 0.4, seed)
    pred = tokens(M, 1, alphabet, seed)[:, 0]
    res = floor_order1_split(P, pred)
    counts = torch.unique(pred, return_counts=True)[1]
    n_cov = int(counts[counts > 1].sum())
    assert float(res.covered_mass) == pytest.approx(n_cov / M)
    assert res.n_uncovered_paths == M - n_cov
    assert 0.0 <= float(res.lower) <= float(res.upper) <= 1.0 + 1e-12
    assert float(res.upper - res.lower) == pytest.approx(1 - n_cov / M, abs=1e-12)
    # Same grouping via the order-m entry point.
    res_m = floor_orderm_split(P, pred[:, None], 1)
    assert float(res_m.lower) == float(res.lower)


def test_split_with_generator_is_deterministic() -> None:
    P = dirichlet(30, 10, 0.4, 6)
    pred = tokens(30, 1, 3, 6)[:, 0]
    r1 = floor_order1_split(P, pred, generator=torch.Generator().manual_seed(9))
    r2 = floor_order1_split(P, pred, generator=torch.Generator().manual_seed(9))
    assert float(r1.value_covered) == float(r2.value_covered)


def test_reweighted_uniform_equals_unweighted() -> None:
    R = dirichlet(12, 20, 0.3, 7)
    base = tv_barycentre(R)
    for w in (torch.ones(12, dtype=F64), torch.full((12,), 0.37, dtype=F64)):
        res = floor_order1_reweighted(R, w)
        assert float(res.value) == float(base.value)
        assert torch.equal(res.q, base.q)
        assert float(res.ess) == pytest.approx(12.0)


def test_reweighted_matches_weighted_barycentre_and_batches() -> None:
    R = dirichlet(3 * 12, 20, 0.3, 8).reshape(3, 12, 20)
    P_prev = dirichlet(12, 5, 0.5, 9)
    z = torch.tensor([0, 2, 4])
    w = reveal_weights(P_prev, z)
    assert w.shape == (3, 12)
    assert torch.equal(w[1], P_prev[:, 2]) and torch.equal(reveal_weights(P_prev, 2), P_prev[:, 2])
    res = floor_order1_reweighted(R, w)
    for i in range(3):
        assert float(res.value[i]) == pytest.approx(float(tv_barycentre(R[i], w[i]).value),
                                                    abs=1e-14)
    assert torch.allclose(res.marginal, P_prev[:, z].mean(0))
    assert torch.allclose(res.ess, kish_ess(w))


def test_reweighted_zero_weights_give_nan() -> None:
    R = dirichlet(2 * 4, 6, 0.5, 10).reshape(2, 4, 6)
    w = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.1, 0.0, 0.2, 0.0]], dtype=F64)
    res = floor_order1_reweighted(R, w)
    assert math.isnan(float(res.value[0])) and float(res.ess[0]) == 0.0
    assert float(res.value[1]) == pytest.approx(float(tv_barycentre(R[1], w[1]).value))


def test_kish_ess_closed_forms() -> None:
    assert float(kish_ess(torch.ones(7, dtype=F64))) == pytest.approx(7.0)
    assert float(kish_ess(torch.tensor([0.0, 3.0, 0.0]))) == pytest.approx(1.0)
    assert float(kish_ess(torch.tensor([1.0, 1.0, 0.0, 0.0]))) == pytest.approx(2.0)
    assert float(kish_ess(torch.tensor([1.0, 2.0]))) == pytest.approx(9 / 5)
    assert float(kish_ess(torch.zeros(3))) == 0.0
    assert kish_ess(torch.ones(2, 5)).tolist() == pytest.approx([5.0, 5.0])


def test_by_slot_helpers() -> None:
    gamma, M, V = 4, 12, 10
    P = dirichlet(gamma * M, V, 0.5, 11).reshape(gamma, M, V)
    P[0] = P[0, :1].expand(M, V)  # slot 0: all paths share the anchor context
    vals = floor_by_slot(P)
    assert float(vals[0]) == 0.0
    for k in range(gamma):
        assert float(vals[k]) == pytest.approx(float(floor_order0(P[k])), abs=1e-15)
    toks = tokens(M, gamma, 3, 11)
    res = floor_order1_by_slot(P, toks)
    assert len(res) == gamma and float(res[0].value_covered) == 0.0 and res[0].n_groups == 1
    assert float(res[2].lower) == float(floor_order1_split(P[2], toks[:, 1]).lower)
