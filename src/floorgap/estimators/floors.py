"""Information floors T_k^(m) at one anchor (paper Sec. 2, B.3; DESIGN Sec. 5).

Inputs are the target's full-vocabulary next-token distributions of one slot k along M sampled
paths, ``P[r] = p_k^(r) = p_T(. | X, Z^(r)_<k)`` (shape ``[M, V]``), and, for orders m >= 1,
the realised tokens of those paths before slot k.

* Order 0: one family of all M rows with weight 1/M (in-sample, or split-half).
* Order m >= 1 by grouping: partition the paths by their last m realised tokens; fit within each
  group. The split-half version fits on one half of a group and scores on the other (then swaps);
  groups of fewer than two paths cannot be split and are *uncovered*. With covered path mass c
  and covered floor T_cov, the order-m floor obeys c T_cov <= T <= c T_cov + (1 - c), since
  TV <= 1 on the uncovered mass.
* Order m by re-weighting (paper eq. for T_k^(m)(X, z*)): sampled prefixes are re-weighted by
  the probability of the revealed token(s) (self-normalised importance sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from floorgap.estimators.barycentre import tv_barycentre, tv_distance

__all__ = [
    "SplitFloor",
    "ReweightedFloor",
    "alternating_split",
    "group_ids",
    "floor_order0",
    "floor_order0_split",
    "order0_path_tv",
    "covered_by_grouping",
    "floor_orderm_plugin",
    "floor_order1_plugin",
    "floor_orderm_split",
    "floor_order1_split",
    "kish_ess",
    "reveal_weights",
    "floor_order1_reweighted",
    "floor_by_slot",
    "floor_order1_by_slot",
]


@dataclass(frozen=True)
class SplitFloor:
    """Split-half floor over groups (paper Sec. B.3).

    ``value_covered`` is T_cov, the frequency-weighted held-out floor over the groups large
    enough to split (NaN when none is); ``covered_mass`` is c, the fraction of paths in those
    groups; ``lower = c T_cov`` and ``upper = c T_cov + (1 - c)`` bound the floor, since
    T = c T_cov + (1 - c) T_uncov with 0 <= T_uncov <= 1. ``covered`` is the ``[M]`` mask of
    the covered paths, so that other per-path quantities (a drafter's risk, the order-0
    floor's per-path TV) can be restricted to the same population.
    """

    value_covered: torch.Tensor
    covered_mass: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    n_groups: int
    n_uncovered_groups: int
    n_uncovered_paths: int
    covered: torch.Tensor


@dataclass(frozen=True)
class ReweightedFloor:
    """Re-weighting route for T_k^(m)(X, z*) (paper Sec. B.3).

    ``value`` and ``q``: weighted barycentre of the revealed distributions; ``ess``: Kish
    effective sample size of the weights; ``marginal``: mean weight, which estimates
    Pr(z* | X) when the weights are the probabilities of the revealed token(s). Leading
    dimensions index revealed tokens when several are passed; a revealed token whose weights
    are all zero gets ``value`` NaN and ``ess`` 0.
    """

    value: torch.Tensor
    q: torch.Tensor
    ess: torch.Tensor
    marginal: torch.Tensor


def alternating_split(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """A deterministic split mask for n paths: True for even positions (half A), False for odd.

    Serves the split-half floor estimates of paper Sec. B.3.

    Parameters
    ----------
    n : int
        Number of paths.
    device : torch.device or str or None, optional
        Device of the mask; ``None`` is the default device.

    Returns
    -------
    torch.Tensor
        ``[n]`` bool mask, True at even positions.
    """
    return torch.arange(n, device=device) % 2 == 0


def _held_out_sum(P: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over all rows of TV to the barycentre fitted on the *other* half (cross-fit)."""
    PA, PB = P[..., mask, :], P[..., ~mask, :]
    qA, qB = tv_barycentre(PA).q.unsqueeze(-2), tv_barycentre(PB).q.unsqueeze(-2)
    return tv_distance(PB, qA).sum(-1) + tv_distance(PA, qB).sum(-1)


def floor_order0(P: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """In-sample order-0 floor T_hat_k^(0): the TV barycentre value of all paths (Sec. B.3/B.4).

    Reusing the paths to fit and score biases this estimate downwards (Sec. B.3).

    Parameters
    ----------
    P : torch.Tensor
        ``[..., M, V]`` target distributions p_k^(r) of one slot along M sampled paths.
    weights : torch.Tensor or None, optional
        Row weights, ``[M]`` or ``[..., M]``; ``None`` weights every path 1/M.

    Returns
    -------
    torch.Tensor
        ``[...]`` in-sample floor T_hat_k^(0).
    """
    return tv_barycentre(P, weights).value


def order0_path_tv(P: torch.Tensor) -> torch.Tensor:
    """``[..., M]``: TV(p_k^(r), q*) of every path to the in-sample order-0 barycentre q*.

    Their mean is T_hat_k^(0); their mean over a subset of paths is the order-0 floor's share
    on that subset, e.g. on the paths covered by the split-half order-1 estimate, so that
    T^(0) and T^(1) can be compared on one population (T^(0) = c T^(0)_cov + (1 - c)
    T^(0)_uncov holds exactly). The order-0 family and its floor: paper Sec. B.3.

    Parameters
    ----------
    P : torch.Tensor
        ``[..., M, V]`` target distributions p_k^(r) of one slot along M sampled paths.

    Returns
    -------
    torch.Tensor
        ``[..., M]`` TV of every path's distribution to the in-sample order-0 barycentre.
    """
    return tv_distance(P, tv_barycentre(P).q.unsqueeze(-2))


def floor_order0_split(P: torch.Tensor, split: torch.Tensor) -> torch.Tensor:
    """Split-half order-0 floor: fit q on half A, score on half B, swap, average over paths.

    ``split`` is chosen by the caller (e.g. :func:`alternating_split`). Every path is scored
    once, against the barycentre of the other half (the split-half rule of paper Sec. B.3).

    Parameters
    ----------
    P : torch.Tensor
        ``[..., M, V]`` target distributions p_k^(r) of one slot along M sampled paths.
    split : torch.Tensor
        ``[M]`` bool mask, True for half A; both halves must be non-empty.

    Returns
    -------
    torch.Tensor
        ``[...]`` held-out order-0 floor, the mean of the M held-out TVs.
    """
    split = torch.as_tensor(split, dtype=torch.bool, device=P.device)
    M = P.shape[-2]
    if split.shape != (M,):
        raise ValueError(f"split must be a boolean mask of length {M}")
    n_a = int(split.sum())
    if n_a == 0 or n_a == M:
        raise ValueError("both halves of the split must be non-empty")
    return _held_out_sum(P, split) / M


def group_ids(history: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group paths by their last ``m`` realised tokens: the partition of the grouping route
    for T_k^(m) (paper Sec. B.3).

    k may be 0; ``m >= k`` uses the whole realised prefix; ``m == 0`` puts every path in one
    group.

    Parameters
    ----------
    history : torch.Tensor
        ``[M, k]`` integer tokens realised before slot k (a ``[M]`` tensor counts as k = 1).
    m : int
        Conditioning order, m >= 0: the number of trailing tokens that define a group.

    Returns
    -------
    inverse : torch.Tensor
        ``[M]`` int64 group index of every path.
    counts : torch.Tensor
        ``[n_groups]`` int64 number of paths in each group.
    """
    if history.dim() == 1:
        history = history.unsqueeze(-1)
    if history.dim() != 2:
        raise ValueError("history must have shape [M, k]")
    if m < 0:
        raise ValueError("order m must be non-negative")
    M, k = history.shape
    if m == 0 or k == 0:
        inverse = torch.zeros(M, dtype=torch.long, device=history.device)
        return inverse, torch.tensor([M], dtype=torch.long, device=history.device)
    key = history[:, max(k - m, 0):]
    _, inverse, counts = torch.unique(key, dim=0, return_inverse=True, return_counts=True)
    return inverse, counts


def covered_by_grouping(history: torch.Tensor, m: int) -> torch.Tensor:
    """``[M]`` bool: the paths whose group (same last ``m`` realised tokens, :func:`group_ids`)
    holds at least two paths, i.e. the paths the split-half order-m floor covers (paper
    Sec. B.3).

    Parameters
    ----------
    history, m
        As in :func:`group_ids`.

    Returns
    -------
    torch.Tensor
        ``[M]`` bool, True for paths in groups of two or more.
    """
    inverse, counts = group_ids(history, m)
    return counts[inverse] >= 2


def floor_orderm_plugin(P: torch.Tensor, history: torch.Tensor, m: int) -> torch.Tensor:
    """In-sample order-m floor: sum over groups of (n_g / M) times the group's barycentre value.

    Groups are the paths sharing their last ``m`` realised tokens (:func:`group_ids`); every
    group is covered and a singleton contributes 0. Since refining a partition can only lower
    the sum of in-sample minima, this estimate is non-increasing in m, and it is 0 for m >= k.

    It is the in-sample counterpart of the grouping route of paper Sec. B.3.

    Parameters
    ----------
    P : torch.Tensor
        ``[M, V]`` target distributions p_k^(r) of slot k along M sampled paths.
    history, m
        As in :func:`group_ids`.

    Returns
    -------
    torch.Tensor
        0-dim in-sample order-m floor.
    """
    M = P.shape[-2]
    inverse, counts = group_ids(history.to(P.device), m)
    total = torch.zeros((), dtype=P.dtype, device=P.device)
    for g in torch.nonzero(counts > 1).flatten().tolist():
        members = P[inverse == g]
        total = total + members.shape[0] * tv_barycentre(members).value
    return total / M


def floor_order1_plugin(P: torch.Tensor, predecessor: torch.Tensor | None) -> torch.Tensor:
    """In-sample order-1 floor, grouping by the realised predecessor Z_{k-1} (paper Sec. B.3).

    At slot 0 (``predecessor`` None) the predecessor is the committed token shared by all paths
    (one group).

    Parameters
    ----------
    P : torch.Tensor
        ``[M, V]`` target distributions p_k^(r) of slot k along M sampled paths.
    predecessor : torch.Tensor or None
        ``[M]`` realised tokens at slot k-1, or ``None`` at slot 0.

    Returns
    -------
    torch.Tensor
        0-dim in-sample order-1 floor.
    """
    if predecessor is None:
        return floor_order0(P)
    return floor_orderm_plugin(P, predecessor.reshape(-1, 1), 1)


def floor_orderm_split(P: torch.Tensor, history: torch.Tensor, m: int,
                       generator: torch.Generator | None = None) -> SplitFloor:
    """Split-half order-m floor T_k^(m) by grouping on the last ``m`` realised tokens (Sec. B.3).

    Within each group of n_g >= 2 paths, members are dealt alternately into halves A and B in
    path order (or in a random order drawn from ``generator``, if given); q is fitted on A and
    scored on B and vice versa, and the group floor is the mean held-out TV over its n_g paths.
    Group floors are averaged with weights n_g. Groups of one path are uncovered.
    ``m >= k`` groups by the whole realised prefix, where every group shares one context and
    the floor is exactly 0.

    Parameters
    ----------
    P, history, m
        As in :func:`floor_orderm_plugin`.
    generator : torch.Generator or None, optional
        Random source for shuffling each group before dealing; ``None`` keeps path order.

    Returns
    -------
    SplitFloor
        ``value_covered`` T_cov, ``covered_mass`` c, the bounds ``lower`` = c T_cov and
        ``upper`` = c T_cov + (1 - c) (0-dim tensors), the group and uncovered counts, and
        the ``[M]`` ``covered`` mask.
    """
    M = P.shape[-2]
    inverse, counts = group_ids(history.to(P.device), m)
    covered_sum = torch.zeros((), dtype=P.dtype, device=P.device)
    n_cov = 0
    for g in torch.nonzero(counts > 1).flatten().tolist():
        idx = torch.nonzero(inverse == g).flatten()
        if generator is not None:
            perm = torch.randperm(idx.numel(), generator=generator, device=generator.device)
            idx = idx[perm.to(idx.device)]
        mask = alternating_split(idx.numel(), device=P.device)
        covered_sum = covered_sum + _held_out_sum(P[idx], mask)
        n_cov += idx.numel()
    n_unc_groups = int((counts < 2).sum())
    c = torch.tensor(n_cov / M, dtype=P.dtype, device=P.device)
    if n_cov > 0:
        t_cov = covered_sum / n_cov
        lower = c * t_cov
    else:
        t_cov = torch.full((), float("nan"), dtype=P.dtype, device=P.device)
        lower = torch.zeros((), dtype=P.dtype, device=P.device)
    return SplitFloor(value_covered=t_cov, covered_mass=c, lower=lower, upper=lower + (1 - c),
                      n_groups=int(counts.numel()), n_uncovered_groups=n_unc_groups,
                      n_uncovered_paths=M - n_cov, covered=counts[inverse] >= 2)


def floor_order1_split(P: torch.Tensor, predecessor: torch.Tensor | None,
                       generator: torch.Generator | None = None) -> SplitFloor:
    """Split-half order-1 floor T_k^(1), grouping paths by their realised predecessor Z_{k-1}
    (the order-1 grouping route of paper Sec. B.3).

    At slot 0 (``predecessor`` None) the committed token is shared by all paths, so there is
    one group; its rows are identical and the floor is 0. See :func:`floor_orderm_split` for
    the split rule and the covered-mass bounds.

    Parameters
    ----------
    P, predecessor
        As in :func:`floor_order1_plugin`.
    generator
        As in :func:`floor_orderm_split`.

    Returns
    -------
    SplitFloor
        Covered floor T_cov, covered mass c, the bounds on T_k^(1) and the ``[M]`` covered
        mask (see :class:`SplitFloor`).
    """
    M = P.shape[-2]
    if predecessor is None:
        predecessor = torch.zeros(M, dtype=torch.long, device=P.device)
    return floor_orderm_split(P, predecessor.reshape(-1, 1), 1, generator=generator)


def kish_ess(weights: torch.Tensor) -> torch.Tensor:
    """Kish effective sample size (sum_r w_r)^2 / sum_r w_r^2 over the last dimension (0 if
    all zero): how many sampled prefixes the re-weighting route of paper Sec. B.3 uses.

    Parameters
    ----------
    weights : torch.Tensor
        ``[..., M]`` non-negative weights (integer input is cast to float64).

    Returns
    -------
    torch.Tensor
        ``[...]`` effective sample size, between 0 and M.
    """
    w = torch.as_tensor(weights)
    if not w.is_floating_point():
        w = w.double()
    s1 = w.sum(-1)
    s2 = (w * w).sum(-1)
    return torch.where(s2 > 0, s1 * s1 / torch.where(s2 > 0, s2, torch.ones_like(s2)), 0.0)


def reveal_weights(P_prev: torch.Tensor, z_star: torch.Tensor | int) -> torch.Tensor:
    """Importance weights w_r = p_{k-1}^(r)(z*) for revealed predecessor token(s) z*: the
    weights of the re-weighting route of paper Sec. B.3.

    For m revealed tokens, multiply the per-slot weights of the revealed tokens instead.

    Parameters
    ----------
    P_prev : torch.Tensor
        ``[M, V]`` target distributions p_{k-1}^(r) at slot k-1.
    z_star : torch.Tensor or int
        Revealed token id, or a ``[Z]`` tensor of token ids.

    Returns
    -------
    torch.Tensor
        ``[M]`` weights for an int ``z_star``, ``[Z, M]`` for a tensor.
    """
    z = torch.as_tensor(z_star, device=P_prev.device, dtype=torch.long)
    return P_prev[:, z].transpose(0, -1) if z.dim() == 1 else P_prev[:, z]


def floor_order1_reweighted(revealed: torch.Tensor, weights: torch.Tensor) -> ReweightedFloor:
    """Re-weighting route for the order-1 floor at a revealed predecessor z* (paper Sec. B.3):

        T_k^(1)(X, z*) = min_q E_{S ~ mu(. | X, z*)} TV(p_T(. | X, S, z*), q),

    estimated with M sampled prefixes S^(r) = Z^(r)_<k-1 drawn from mu_X and self-normalised
    weights w_r proportional to p_{k-1}^(r)(z*) = p_T(z* | X, S^(r)).

    What the caller (a probe) must supply, per revealed token z*:
      * ``revealed``: ``[..., M, V]``, row r = p_T(. | X, S^(r), z*), the target's next-token
        distribution after *appending z* to path r's prefix* (not p_k^(r), which continues
        path r's own sampled token);
      * ``weights``: ``[..., M]``, w_r = p_T(z* | X, S^(r)) (see :func:`reveal_weights`); for
        m revealed tokens, the product of their probabilities along the prefix.
    Leading dimensions (e.g. several revealed tokens) are batched. Returns the weighted
    barycentre value and q, the Kish ESS of the weights, and their mean (an estimate of
    Pr(z* | X)). With equal weights this is the unweighted barycentre of ``revealed``.

    Parameters
    ----------
    revealed : torch.Tensor
        ``[..., M, V]`` distributions p_T(. | X, S^(r), z*), one row per sampled prefix.
    weights : torch.Tensor
        ``[..., M]`` non-negative weights w_r (broadcast to ``revealed.shape[:-1]``).

    Returns
    -------
    ReweightedFloor
        ``value`` ``[...]`` (NaN where all weights are zero), ``q`` ``[..., V]``, ``ess``
        ``[...]`` and ``marginal`` ``[...]``.
    """
    w = torch.as_tensor(weights, dtype=revealed.dtype, device=revealed.device)
    w = w.expand(revealed.shape[:-1])
    if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError("weights must be finite and non-negative")
    empty = w.sum(-1) <= 0
    # Families with no weight get uniform placeholder weights and a NaN value.
    w_safe = torch.where(empty.unsqueeze(-1), torch.ones_like(w), w)
    bary = tv_barycentre(revealed, w_safe)
    value = torch.where(empty, torch.full_like(bary.value, float("nan")), bary.value)
    return ReweightedFloor(value=value, q=bary.q, ess=kish_ess(w), marginal=w.mean(-1))


def floor_by_slot(P: torch.Tensor) -> torch.Tensor:
    """In-sample order-0 floors of all slots at one anchor in one batched call: the per-anchor
    order-0 floor curves of paper Sec. 3.1, estimated as in paper Sec. B.3.

    Slot 0 is 0 when all paths share the anchor's context (identical rows).

    Parameters
    ----------
    P : torch.Tensor
        ``[gamma, M, V]`` target distributions p_k^(r) of every slot k along M paths.

    Returns
    -------
    torch.Tensor
        ``[gamma]`` in-sample floors T_hat_k^(0).
    """
    return tv_barycentre(P).value


def floor_order1_by_slot(P: torch.Tensor, tokens: torch.Tensor,
                         generator: torch.Generator | None = None) -> list[SplitFloor]:
    """Split-half order-1 floors of all slots at one anchor, which feed the locality result of
    paper Sec. 3.2 (estimator: paper Sec. B.3).

    Slot 0 uses the committed token (one group); slot k >= 1 groups by ``tokens[:, k-1]``.

    Parameters
    ----------
    P : torch.Tensor
        ``[gamma, M, V]`` target distributions p_k^(r) of every slot k along M paths.
    tokens : torch.Tensor
        ``[M, gamma]`` integer realised block tokens of the paths.
    generator : torch.Generator or None, optional
        Random source for shuffling groups before the split; ``None`` keeps path order.

    Returns
    -------
    list of SplitFloor
        One split-half order-1 floor per slot, ``gamma`` entries.
    """
    return [floor_order1_split(P[k], None if k == 0 else tokens[:, k - 1], generator=generator)
            for k in range(P.shape[0])]

