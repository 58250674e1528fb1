"""Oracle-routed K-median in TV (paper Sec. D.2)."""

from __future__ import annotations

import numpy as np
import torch

from floorgap.estimators.barycentre import tv_barycentre
from floorgap.estimators.kmedian import tv_kmedian, tv_kmedian_objective

F64 = torch.float64


def dirichlet(M: int, V: int, alpha: float, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.dirichlet(np.full(V, alpha), size=M), dtype=F64)
    return x / x.sum(-1, keepdim=True)


def test_k1_is_the_barycentre() -> None:
    P = dirichlet(30, 25, 0.3, 1)
    res = tv_kmedian(P, 1)
    q, value = tv_barycentre(P)
    assert float(res.objective) == float(value)
    assert torch.equal(res.centres[0], q)
    assert float(res.spread) == 0.0 and bool((res.assignment == 0).all())


def test_k2_no_worse_than_k1() -> None:
    for seed in range(6):
        P = dirichlet(24, 15, [0.1, 0.5, 2.0][seed % 3], seed)
        k1 = float(tv_kmedian(P, 1).objective)
        k2 = tv_kmedian(P, 2, generator=torch.Generator().manual_seed(seed))
        assert float(k2.objective) <= k1 + 1e-12
        # Every restart is feasible and so no better than its reported best.
        assert float(k2.objective) == float(k2.restart_objectives.min())
        assert float(k2.spread) == float(k2.restart_objectives.max() - k2.restart_objectives.min())


def test_reported_objective_matches_centres() -> None:
    P = dirichlet(40, 12, 0.3, 7)
    res = tv_kmedian(P, 3, generator=torch.Generator().manual_seed(2))
    obj, assign = tv_kmedian_objective(P, res.centres)
    assert float(obj) == float(res.objective)
    assert torch.equal(assign, res.assignment)
    assert res.centres.shape == (3, 12)
    assert torch.allclose(res.centres.sum(-1), torch.ones(3, dtype=F64))


def test_recovers_true_prototypes() -> None:
    K = 4
    protos = dirichlet(K, 30, 0.3, 3)
    labels = torch.arange(48) % K
    P = protos[labels]
    res = tv_kmedian(P, K, generator=torch.Generator().manual_seed(0))
    assert float(res.objective) == 0.0
    # Each found cluster is one prototype's paths.
    for j in range(K):
        assert len(torch.unique(labels[res.assignment == j])) == 1
    # With a little noise the objective stays near zero.
    noisy = P + 1e-6 * torch.rand(P.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    noisy = noisy / noisy.sum(-1, keepdim=True)
    assert float(tv_kmedian(noisy, K).objective) < 1e-4


def test_deterministic_under_same_seed() -> None:
    P = dirichlet(36, 20, 0.3, 9)
    a = tv_kmedian(P, 3, generator=torch.Generator().manual_seed(5))
    b = tv_kmedian(P, 3, generator=torch.Generator().manual_seed(5))
    assert float(a.objective) == float(b.objective)
    assert torch.equal(a.centres, b.centres) and torch.equal(a.assignment, b.assignment)
    assert torch.equal(a.restart_objectives, b.restart_objectives)


def test_k_at_least_m_gives_zero() -> None:
    P = dirichlet(5, 8, 0.5, 4)
    res = tv_kmedian(P, 7)
    assert float(res.objective) == 0.0 and res.centres.shape == (5, 8)
