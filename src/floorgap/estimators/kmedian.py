"""Oracle-routed K-median in total variation (paper Sec. D.2).

    min over q^[1..K] of (1/M) sum_r min_j TV(p_r, q^[j]).

Lloyd iterations alternate two steps that can only lower the objective: assign every path to its
nearest centre in TV, then refit each centre as the TV barycentre of its members (the exact
minimiser for a fixed assignment). Seeding picks the first centre uniformly and each next one
with probability proportional to the TV distance to the nearest chosen centre (k-means++ with TV
as the distance, the k-median analogue). The best of several restarts is kept and the restart
spread (max - min objective) is reported. K = 1 returns the barycentre itself, so it reproduces
T^(0) on the same paths; after one refit any K >= 2 solution is no worse than K = 1, because the
in-sample barycentre value of a union is at least the mass-weighted sum over its parts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from floorgap.estimators.barycentre import tv_barycentre, tv_distance

__all__ = ["KMedian", "tv_kmedian", "tv_kmedian_objective"]


@dataclass(frozen=True)
class KMedian:
    """Result of :func:`tv_kmedian`.

    ``objective``: best mean over paths of the TV to the nearest centre (0-dim tensor);
    ``centres``: ``[K', V]`` with K' = min(K, M); ``assignment``: ``[M]`` centre index of each
    path; ``restart_objectives``: ``[restarts]``; ``spread``: max - min over restarts;
    ``n_iter``: Lloyd iterations of the best restart.
    """

    objective: torch.Tensor
    centres: torch.Tensor
    assignment: torch.Tensor
    restart_objectives: torch.Tensor
    spread: torch.Tensor
    n_iter: int


def tv_kmedian_objective(P: torch.Tensor, centres: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over the rows of ``P`` (``[M, V]``) of the TV to the nearest of ``centres``
    (``[K, V]``), and the nearest-centre index of each row (ties go to the lowest index).

    This is the objective of the oracle-routed K-median of paper Sec. D.2 for fixed centres.

    Parameters
    ----------
    P : torch.Tensor
        ``[M, V]`` path-conditioned target distributions p_k^(r).
    centres : torch.Tensor
        ``[K, V]`` candidate centres q^[j].

    Returns
    -------
    objective : torch.Tensor
        0-dim tensor, (1/M) sum_r min_j TV(p_r, q^[j]).
    assignment : torch.Tensor
        ``[M]`` int64 index of the nearest centre of each row.
    """
    dist = torch.stack([tv_distance(P, c) for c in centres], dim=-1)  # [M, K]
    best, assign = dist.min(-1)
    return best.mean(), assign


def _seed(P: torch.Tensor, K: int, generator: torch.Generator) -> torch.Tensor:
    M = P.shape[0]
    gdev = generator.device
    chosen = [int(torch.randint(M, (1,), generator=generator, device=gdev))]
    nearest = tv_distance(P, P[chosen[0]])
    for _ in range(1, K):
        d = nearest.to(device=gdev, dtype=torch.float64)
        if float(d.sum()) > 0:
            nxt = int(torch.multinomial(d, 1, generator=generator))
        else:  # fewer distinct rows than K: any row will do
            nxt = int(torch.randint(M, (1,), generator=generator, device=gdev))
        chosen.append(nxt)
        nearest = torch.minimum(nearest, tv_distance(P, P[nxt]))
    return P[chosen].clone()


def _lloyd(P: torch.Tensor, centres: torch.Tensor, max_iter: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    obj, assign = tv_kmedian_objective(P, centres)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        new_centres = centres.clone()
        for j in range(centres.shape[0]):
            members = assign == j
            if bool(members.any()):  # an empty cluster keeps its previous centre
                new_centres[j] = tv_barycentre(P[members]).q
        new_obj, new_assign = tv_kmedian_objective(P, new_centres)
        stable = bool((new_assign == assign).all())
        centres, assign, obj = new_centres, new_assign, new_obj
        if stable:
            break
    return obj, centres, assign, n_iter


def tv_kmedian(P: torch.Tensor, K: int, restarts: int = 3,
               generator: torch.Generator | None = None, max_iter: int = 100) -> KMedian:
    """Oracle-routed K-median in TV (paper Sec. D.2) over the M rows of ``P`` (``[M, V]``).

    ``generator`` drives the seeding (a CPU generator seeded with 0 when omitted, so the result
    is deterministic); ``restarts`` independent seedings are run from it in turn and the lowest
    objective is kept. ``max_iter`` (>= 1) caps Lloyd iterations per restart. K = 1 returns the
    TV barycentre directly (objective = T^(0) in-sample); K >= M puts every path on its own
    centre (objective 0).

    Parameters
    ----------
    P : torch.Tensor
        ``[M, V]`` path-conditioned target distributions p_k^(r) at one anchor and slot.
    K : int
        Number of centres (prototypes), at least 1.
    restarts : int, optional
        Number of independent seedings, at least 1 (the paper uses three).
    generator : torch.Generator or None, optional
        Random source of the seeding; ``None`` uses a CPU generator seeded with 0.
    max_iter : int, optional
        Cap on the Lloyd iterations of each restart, at least 1.

    Returns
    -------
    KMedian
        ``objective`` (0-dim, best restart), ``centres`` ``[K', V]`` with K' = min(K, M),
        ``assignment`` ``[M]``, ``restart_objectives`` ``[restarts]``, ``spread`` (0-dim,
        max - min over restarts) and ``n_iter`` of the best restart.
    """
    if P.dim() != 2:
        raise ValueError("P must have shape [M, V]")
    if K < 1 or restarts < 1 or max_iter < 1:
        raise ValueError("K, restarts and max_iter must be at least 1")
    M = P.shape[0]
    zero = torch.zeros((), dtype=P.dtype, device=P.device)
    if K == 1:
        q, value = tv_barycentre(P)
        return KMedian(objective=value, centres=q.unsqueeze(0),
                       assignment=torch.zeros(M, dtype=torch.long, device=P.device),
                       restart_objectives=value.reshape(1).expand(restarts).clone(),
                       spread=zero, n_iter=0)
    if K >= M:
        obj, assign = tv_kmedian_objective(P, P)
        return KMedian(objective=obj, centres=P.clone(), assignment=assign,
                       restart_objectives=obj.reshape(1).expand(restarts).clone(),
                       spread=zero, n_iter=0)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    best = None
    objectives = []
    for _ in range(restarts):
        res = _lloyd(P, _seed(P, K, generator), max_iter)
        objectives.append(res[0])
        if best is None or bool(res[0] < best[0]):
            best = res
    objs = torch.stack(objectives)
    obj, centres, assign, n_iter = best
    return KMedian(objective=obj, centres=centres, assignment=assign, restart_objectives=objs,
                   spread=objs.max() - objs.min(), n_iter=n_iter)
