"""Top-K reads: renormalisation and the residual band |T - T~| <= E[r] (paper Sec. C.6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from floorgap.estimators.barycentre import tv_barycentre, tv_distance
from floorgap.estimators.truncation import (
    renormalised_dense,
    topk_sparse,
    truncated_floor,
)

F64 = torch.float64


def dirichlet(M: int, V: int, alpha: float, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.dirichlet(np.full(V, alpha), size=M), dtype=F64)
    return x / x.sum(-1, keepdim=True)


def test_topk_sparse_and_dense() -> None:
    P = dirichlet(6, 30, 0.3, 1)
    indices, values, residual = topk_sparse(P, 4)
    assert indices.shape == (6, 4) and values.shape == (6, 4)
    assert torch.allclose(residual, 1 - values.sum(-1))
    assert bool((values[:, :-1] >= values[:, 1:]).all())
    dense = renormalised_dense(indices, values, 30)
    assert torch.allclose(dense.sum(-1), torch.ones(6, dtype=F64))
    # TV between a row and its renormalised top-K read equals the residual mass.
    assert torch.allclose(tv_distance(P, dense), residual, atol=1e-15)
    # K >= V keeps everything.
    full = topk_sparse(P, 50)
    assert full.indices.shape == (6, 30) and float(full.residual.max()) < 1e-12


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("K", [1, 3, 10])
def test_band_contains_full_vocab_floor(seed: int, K: int) -> None:
    alpha = [0.05, 0.3, 1.0, 3.0][seed % 4]
    P = dirichlet(24, 60, alpha, seed)
    full = float(tv_barycentre(P).value)
    read = topk_sparse(P, K)
    res = truncated_floor(read.indices, read.values)
    assert float(res.band) == pytest.approx(float(read.residual.mean()), abs=1e-15)
    assert float(res.lower) - 1e-12 <= full <= float(res.upper) + 1e-12
    # Same floor as the dense renormalised family on the full vocabulary.
    dense = renormalised_dense(read.indices, read.values, 60)
    assert float(res.value) == pytest.approx(float(tv_barycentre(dense).value), abs=1e-14)


def test_weighted_band_contains_weighted_floor() -> None:
    g = torch.Generator().manual_seed(3)
    for seed in range(5):
        P = dirichlet(16, 40, 0.2, 50 + seed)
        w = torch.rand(16, dtype=F64, generator=g)
        full = float(tv_barycentre(P, w).value)
        read = topk_sparse(P, 3)
        res = truncated_floor(read.indices, read.values, read.residual, weights=w)
        assert float(res.band) == pytest.approx(float((w * read.residual).sum() / w.sum()))
        assert float(res.lower) - 1e-12 <= full <= float(res.upper) + 1e-12


# ------------------------------------------------------------ truncated_slot_floors (API reads)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from floorgap.estimators.floors import floor_order0, floor_order1_plugin  # noqa: E402
from floorgap.estimators.truncation import (  # noqa: E402
    renormalised_family,
    truncated_slot_floors,
)


def test_renormalised_family_pads_and_matches_dense_rows() -> None:
    """Padded reads (-1, 0) give the same rows as the dense renormalisation on the union."""
    idx = torch.tensor([[5, 2, -1], [2, 9, 5]])
    val = torch.tensor([[0.5, 0.3, 0.0], [0.4, 0.4, 0.1]], dtype=F64)
    dense = renormalised_family(idx, val)
    # union {2, 5, 9} in sorted order
    expected = torch.tensor([[0.3 / 0.8, 0.5 / 0.8, 0.0], [0.4 / 0.9, 0.1 / 0.9, 0.4 / 0.9]],
                            dtype=F64)
    assert torch.allclose(dense, expected)
    with pytest.raises(ValueError, match="padded"):
        renormalised_family(torch.tensor([[1, -1]]), torch.tensor([[0.5, 0.1]], dtype=F64))


def test_identical_reads_have_zero_floors_and_a_band_of_their_residual() -> None:
    P = dirichlet(1, 40, 0.5, 3).expand(8, 40)
    read = topk_sparse(P, 5)
    out = truncated_slot_floors(read.indices, read.values, read.residual, None)
    assert out.t0 == pytest.approx(0, abs=1e-12) and out.t1_plugin == pytest.approx(0, abs=1e-12)
    assert out.omitted == pytest.approx(float(read.residual[0]))
    assert out.t0_upper == pytest.approx(out.omitted)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.integers(1, 12), alpha=st.floats(0.05, 2.0),
       groups=st.integers(1, 4))
def test_bounds_contain_the_full_vocabulary_floors(seed: int, K: int, alpha: float,
                                                   groups: int) -> None:
    """|T - T~| <= E[r] for the in-sample T^(0) and the order-1 plug-in, whatever the reads."""
    P = dirichlet(12, 25, alpha, seed)
    pred = torch.as_tensor(np.random.default_rng(seed).integers(0, groups, 12))
    read = topk_sparse(P, K)
    out = truncated_slot_floors(read.indices, read.values, read.residual, pred)
    t0, t1 = float(floor_order0(P)), float(floor_order1_plugin(P, pred))
    assert out.t0_lower - 1e-12 <= t0 <= out.t0_upper + 1e-12
    assert out.t1_plugin_lower - 1e-12 <= t1 <= out.t1_plugin_upper + 1e-12
    assert out.t1_plugin <= out.t0 + 1e-12  # refining the partition never raises the floor


def test_full_reads_reproduce_the_exact_floors() -> None:
    """K = V: no omitted mass, and the values are the full-vocabulary floors."""
    P = dirichlet(10, 15, 0.4, 7)
    pred = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0, 1, 2])
    read = topk_sparse(P, 15)
    out = truncated_slot_floors(read.indices, read.values, read.residual, pred)
    assert out.omitted == pytest.approx(0, abs=1e-12)
    assert out.t0 == pytest.approx(float(floor_order0(P)), abs=1e-9)
    assert out.t1_plugin == pytest.approx(float(floor_order1_plugin(P, pred)), abs=1e-9)
