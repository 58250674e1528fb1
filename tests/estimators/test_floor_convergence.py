"""Order-1 floors on an enumerable synthetic target: both routes converge to the exact value.

The target has a vocabulary of V = 6 tokens and a block of gamma = 4 slots; the next-token
distribution after every prefix is a fixed Dirichlet draw, so every prefix's probability and
distribution is known and the order-1 floor is exact by enumeration:

    T_k^(1) = sum_z Pr(Z_{k-1} = z) min_q sum_s Pr(S = s | Z_{k-1} = z) TV(p(. | s, z), q),

solved here as a linear programme (HiGHS), independently of the estimators' barycentre.
Paths are sampled from the target and passed, as a hand-made rollout block, through the
probe's record code (:func:`floorgap.probes.rollouts.anchor_records`): the headline
split-half grouping estimate and the importance route, exactly as the workflow computes them.

Tolerances (stated per check below), with SE the standard error of the mean over seeds: the
split-half estimate is held out, so its seed mean lies above the exact value up to noise
(error >= -3 SE - 0.001) at every M = 64 ... 4096, its error at M = 4096 is below its error at
M = 64, and it is within 0.01 of the exact value at M = 4096 (measured: +0.03 at M = 64, within
0.004 at 4096). The importance route (J = 64 revealed predecessors) is within 0.01 at
M = 4096 and no farther than at M = 64 plus 3 SE.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from floorgap.estimators.barycentre import tv_barycentre_lp
from floorgap.probes.rollouts import SampledBlock, anchor_records

V, GAMMA = 6, 4
SEEDS = {64: 16, 256: 16, 1024: 8, 4096: 4}  # paths -> seeds (fewer where each is costly)
PATH_COUNTS = tuple(SEEDS)
REVEAL = 64

pytestmark = pytest.mark.slow


def _target(seed: int = 7) -> list[torch.Tensor]:
    """dist[k][index of the k-token prefix] = p(. | prefix), shape [V^k, V] (float64)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(GAMMA):
        g = torch.distributions.Gamma(torch.full((V ** k, V), 0.6), torch.ones(V ** k, V))
        # torch.distributions draws from the global generator: seed it from ours
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        x = g.sample().double() + 1e-3
        out.append(x / x.sum(-1, keepdim=True))
    return out


def _index(prefix: torch.Tensor) -> torch.Tensor:
    """Base-V index of each row of ``prefix`` ([M, k]); 0 for the empty prefix."""
    idx = torch.zeros(prefix.shape[0], dtype=torch.long)
    for j in range(prefix.shape[1]):
        idx = idx * V + prefix[:, j]
    return idx


def exact_order1_floor(dist: list[torch.Tensor], k: int) -> float:
    """T_k^(1) by enumeration of every (k-1)-token prefix s and predecessor z."""
    if k == 0:
        return 0.0
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=k - 1)),
                            dtype=torch.long).reshape(V ** (k - 1), k - 1)
    prob = torch.ones(prefixes.shape[0], dtype=torch.float64)
    for j in range(k - 1):
        prob = prob * dist[j][_index(prefixes[:, :j]), prefixes[:, j]]
    total = 0.0
    for z in range(V):
        w = prob * dist[k - 1][_index(prefixes), z]  # Pr(S = s, Z_{k-1} = z)
        full = torch.cat([prefixes, torch.full((prefixes.shape[0], 1), z)], 1)
        rows = dist[k][_index(full)]
        mass = float(w.sum())
        total += mass * float(tv_barycentre_lp(rows, w / mass).value)
    return total


def sample_block(dist: list[torch.Tensor], M: int, J: int, seed: int) -> SampledBlock:
    """M paths of the target with their p_k^(r), and the revealed distributions
    p(. | Z^(s)_{<k-1}, z*_j) of the first J paths' predecessors (float32, as the probe)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.empty((M, GAMMA), dtype=torch.long)
    probs = torch.empty((GAMMA, M, V), dtype=torch.float64)
    for k in range(GAMMA):
        probs[k] = dist[k][_index(tokens[:, :k])]
        tokens[:, k] = torch.multinomial(probs[k], 1, generator=gen).squeeze(-1)
    revealed = torch.zeros((GAMMA, J, M, V), dtype=torch.float64)
    for k in range(1, GAMMA):
        for j in range(J):
            head = torch.cat([tokens[:, :k - 1],
                              tokens[j, k - 1].expand(M, 1)], 1)
            revealed[k, j] = dist[k][_index(head)]
    return SampledBlock(tokens=tokens, probs=probs.float(), revealed=revealed.float(),
                        seconds=0.0)


@pytest.fixture(scope="module")
def runs() -> tuple[list[float], dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Exact floors per slot, and per M the [seeds, slots] split-half and importance values."""
    dist = _target()
    exact = [exact_order1_floor(dist, k) for k in range(GAMMA)]
    split, importance = {}, {}
    for M in PATH_COUNTS:
        s_rows, i_rows = [], []
        for seed in range(SEEDS[M]):
            block = sample_block(dist, M, min(REVEAL, M), seed=1000 * M + seed)
            _, floors = anchor_records("synthetic", block, store_top_k=V)
            s_rows.append([f.t1_split_cov for f in floors])
            i_rows.append([f.t1_reweighted for f in floors])
        split[M] = torch.tensor(s_rows, dtype=torch.float64)
        importance[M] = torch.tensor(i_rows, dtype=torch.float64)
    return exact, split, importance


def _se(values: torch.Tensor) -> float:
    return float(values.std() / len(values) ** 0.5)


def test_the_exact_floor_is_non_trivial() -> None:
    dist = _target()
    exact = [exact_order1_floor(dist, k) for k in range(GAMMA)]
    assert exact[0] == 0.0 and exact[1] == pytest.approx(0.0, abs=1e-9)  # Z_0 fixes the prefix
    assert exact[2] > 0.02 and exact[3] > 0.02


@pytest.mark.parametrize("k", [2, 3])
def test_split_half_converges_from_above(runs, k: int) -> None:
    exact, split, _ = runs
    errors = [float(split[M][:, k].mean()) - exact[k] for M in PATH_COUNTS]
    # Held-out scoring is biased up: the seed mean is above the exact value up to noise.
    for M, err in zip(PATH_COUNTS, errors):
        assert err >= -3 * _se(split[M][:, k]) - 1e-3, (M, errors)
    # ... and it converges: within 0.01 at M = 4096, from farther above at M = 64.
    assert abs(errors[-1]) <= 0.01, errors
    assert errors[0] > abs(errors[-1]), errors


@pytest.mark.parametrize("k", [2, 3])
def test_importance_route_converges(runs, k: int) -> None:
    exact, _, importance = runs
    errors = [float(importance[M][:, k].mean()) - exact[k] for M in PATH_COUNTS]
    assert abs(errors[-1]) <= 0.01, errors
    assert abs(errors[-1]) <= abs(errors[0]) + 3 * _se(importance[4096][:, k]), errors


def test_slot_one_is_zero_by_identity(runs) -> None:
    _, split, importance = runs
    for M in PATH_COUNTS:
        assert float(split[M][:, 1].abs().max()) <= 1e-6
        assert float(importance[M][:, 1].abs().max()) <= 1e-6
