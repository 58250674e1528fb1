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
