"""Exact total-variation barycentre (paper Sec. B.4).

The empirical floor at one anchor and slot is

    T_hat = min_q sum_r w_r TV(p_r, q) / sum_r w_r,   TV(p, q) = 1/2 sum_v |p(v) - q(v)|,

over q in the probability simplex. The objective separates by token into convex piecewise-linear
pieces f_v(x) = 1/2 sum_r w~_r |p_r(v) - x| (w~ = normalised weights). The right slope of f_v at x
is C_v(x) - 1/2, where C_v(x) is the weight of the rows with p_r(v) <= x. With one Lagrange
multiplier for sum_v q(v) = 1, optimality says every coordinate sits at a weighted quantile of its
column {p_r(v)} at one common level t in [0, 1]. Non-negativity is automatic because every
quantile lies between the column's minimum and maximum, both in [0, 1].

So the solver searches the level t: the sum over columns of the quantile is a non-decreasing
step function of t, equal to sum_v min_r p_r(v) <= 1 at t = 0 and to sum_v max_r p_r(v) >= 1 at
t = 1. At the crossing level, the columns that jump there are interpolated with one common
fraction so that the mass is exactly one (any split would be optimal; a common fraction keeps
the answer invariant under permutations of tokens).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "Barycentre",
    "tv_barycentre",
    "tv_barycentre_lp",
    "tv_distance",
    "normalise_weights",
]


class Barycentre(NamedTuple):
    """Result of :func:`tv_barycentre`: the optimal proposal ``q`` and the floor ``value``.

    ``q`` has shape ``[..., V]`` and ``value`` shape ``[...]`` (0-dim for a single family).
    Being a named tuple, it unpacks as ``q, value = tv_barycentre(P)``.
    """

    q: torch.Tensor
    value: torch.Tensor


def tv_distance(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """TV(p, q) = 1/2 sum_v |p(v) - q(v)| along ``dim`` (broadcasting).

    TV is the distance in which the floors and drafter risks of paper Sec. 2 are measured;
    the barycentre objective of paper Sec. B.4 averages it over the rows of a family.

    Parameters
    ----------
    p : torch.Tensor
        Distributions over tokens, e.g. ``[..., V]``.
    q : torch.Tensor
        Distributions broadcastable against ``p``.
    dim : int, optional
        The token dimension that is summed over.

    Returns
    -------
    torch.Tensor
        TV distances, the broadcast shape of ``p`` and ``q`` without ``dim`` (in [0, 1] for
        probability vectors).
    """
    return 0.5 * (p - q).abs().sum(dim)


def normalise_weights(weights: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """Weights w_r cast to ``P``'s dtype/device and normalised to w~_r = w_r / sum_r w_r.

    ``weights`` has shape ``[M]`` or ``[..., M]`` broadcastable to ``P.shape[:-1]``. Raises
    ``ValueError`` on negative or non-finite weights or on a zero total.

    These are the normalised row weights w~_r of the barycentre objective (paper Sec. B.4).

    Parameters
    ----------
    weights : torch.Tensor
        Raw row weights w_r, shape ``[M]`` or ``[..., M]``.
    P : torch.Tensor
        The family ``[..., M, V]`` the weights belong to; supplies dtype, device and the
        batch shape.

    Returns
    -------
    torch.Tensor
        Normalised weights w~_r of shape ``P.shape[:-1]`` = ``[..., M]``, summing to one over
        the last dimension.
    """
    w = torch.as_tensor(weights, dtype=P.dtype, device=P.device)
    if w.shape[-1:] != P.shape[-2:-1]:
        raise ValueError(f"weights of shape {tuple(w.shape)} do not match {P.shape[-2]} rows")
    w = w.expand(P.shape[:-1])
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("weights must be finite and non-negative")
    total = w.sum(-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("weights must have a positive sum")
    return w / total


def _check_family(P: torch.Tensor) -> None:
    if P.dim() < 2:
        raise ValueError(f"P must have shape [..., M, V]; got {tuple(P.shape)}")
    if P.shape[-2] < 1 or P.shape[-1] < 1:
        raise ValueError(f"P needs at least one row and one column; got {tuple(P.shape)}")
    if not P.is_floating_point():
        raise TypeError("P must be a floating-point tensor")


def tv_barycentre(P: torch.Tensor, weights: torch.Tensor | None = None) -> Barycentre:
    """Exact TV barycentre: argmin and min over the simplex of sum_r w~_r TV(p_r, q).

    This is the empirical floor T_hat of paper Sec. B.4 (eq. for T_hat): with ``weights=None``
    every row has weight 1/M (the order-0 family of Sec. B.3); otherwise rows are weighted by
    ``weights`` (non-negative, positive sum; zero weights are allowed and ignored by the
    objective).

    ``P`` has shape ``[M, V]`` or ``[..., M, V]`` (a batch of families, e.g. one per slot);
    rows should lie on the simplex. Returns ``Barycentre(q, value)`` with ``q`` of shape
    ``[..., V]`` (non-negative, summing to one up to the rounding of the input rows) and
    ``value`` of shape ``[...]``.

    Uniform weights cost one sort of each column plus two passes over ``P``; the weighted
    case additionally sorts all column breakpoints to find the crossing level exactly.

    Parameters
    ----------
    P : torch.Tensor
        Floating-point family of distributions, ``[M, V]`` or ``[..., M, V]``; row r is p_r
        (e.g. the target's p_k^(r) along path r).
    weights : torch.Tensor or None, optional
        Row weights w_r, shape ``[M]`` or ``[..., M]``; ``None`` weights every row 1/M.

    Returns
    -------
    q : torch.Tensor
        ``[..., V]`` optimal proposal (a minimiser of the weighted mean TV).
    value : torch.Tensor
        ``[...]`` minimum weighted mean TV, the empirical floor T_hat.
    """
    _check_family(P)
    if weights is None or P.shape[-2] == 1:
        if weights is not None:
            normalise_weights(weights, P)  # still reject invalid weights
        return _uniform_barycentre(P)
    w = normalise_weights(weights, P)
    # Equal weights have identical levels in every column: take the exact fast path.
    if bool((w == w[..., :1]).all()):
        return _uniform_barycentre(P)
    return _weighted_barycentre(P, w)


def _uniform_barycentre(P: torch.Tensor) -> Barycentre:
    M = P.shape[-2]
    # Sorting the contiguous transpose along its last dimension is faster than sorting
    # along dim -2 directly; only the sorted values are needed.
    srt = torch.sort(P.transpose(-1, -2).contiguous(), dim=-1).values  # [..., V, M]
    s = srt.sum(-2)  # s_j = sum_v (j-th smallest p_r(v)), non-decreasing in j: [..., M]
    # j = first index with s_j >= 1; the optimal level lies between sorted rows j-1 and j.
    j = (s < 1).sum(-1, keepdim=True)
    lo = (j - 1).clamp(min=0)
    hi = j.clamp(max=M - 1)
    s_lo = s.gather(-1, lo)
    s_hi = s.gather(-1, hi)
    den = s_hi - s_lo
    pos = den > 0
    theta = torch.where(pos, (1 - s_lo) / torch.where(pos, den, torch.ones_like(den)), 0.0)
    theta = theta.clamp(0.0, 1.0)
    shape = srt.shape[:-1] + (1,)
    row_lo = srt.gather(-1, lo.unsqueeze(-2).expand(shape)).squeeze(-1)  # [..., V]
    row_hi = srt.gather(-1, hi.unsqueeze(-2).expand(shape)).squeeze(-1)
    q = row_lo + theta * (row_hi - row_lo)
    value = tv_distance(P, q.unsqueeze(-2)).mean(-1)
    return Barycentre(q, value)


def _weighted_barycentre(P: torch.Tensor, w: torch.Tensor) -> Barycentre:
    # Columns sorted: [..., M, V]. As in the uniform case, sorting the contiguous transpose along
    # its last dimension is ~2.5x faster than sorting along dim -2 (same values, same order).
    srt_t, idx_t = torch.sort(P.transpose(-1, -2).contiguous(), dim=-1, stable=True)
    ws_t = w.unsqueeze(-2).expand(idx_t.shape).gather(-1, idx_t)
    srt, ws = srt_t.transpose(-1, -2).contiguous(), ws_t.transpose(-1, -2).contiguous()
    C = ws.cumsum(-2)  # C_{v,j}: cumulative weight of the j smallest entries of column v
    # Passing level C_{v,j} the quantile of column v jumps from sorted row j to row j+1.
    L = C[..., :-1, :]
    d = srt[..., 1:, :] - srt[..., :-1, :]
    base = srt[..., 0, :]  # quantiles just above level 0 start from the column minima
    s_base = base.sum(-1)
    batch = P.shape[:-2]
    Lf = L.reshape(batch + (-1,))
    df = d.reshape(batch + (-1,))
    Ls, order = torch.sort(Lf, dim=-1)
    cum = s_base.unsqueeze(-1) + df.gather(-1, order).cumsum(-1)
    # Crossing level t: the first breakpoint at which the quantile mass reaches one.
    i = (cum < 1).sum(-1, keepdim=True).clamp(max=Lf.shape[-1] - 1)
    t = Ls.gather(-1, i).unsqueeze(-1)  # [..., 1, 1]
    zero = torch.zeros((), dtype=P.dtype, device=P.device)
    d_below = torch.where(L < t, d, zero).sum(-2)  # [..., V]
    d_at = torch.where(L == t, d, zero).sum(-2)
    s_minus = s_base + d_below.sum(-1)
    s_at = d_at.sum(-1)
    pos = s_at > 0
    theta = torch.where(pos, (1 - s_minus) / torch.where(pos, s_at, torch.ones_like(s_at)), 0.0)
    theta = theta.clamp(0.0, 1.0)
    q = base + d_below + theta.unsqueeze(-1) * d_at
    value = (w * tv_distance(P, q.unsqueeze(-2))).sum(-1)
    return Barycentre(q, value)


def tv_barycentre_lp(P: torch.Tensor, weights: torch.Tensor | None = None,
                     tol: float = 1e-10, method: str = "highs") -> Barycentre:
    """Reference solver: the same barycentre as a linear programme solved by HiGHS (scipy).

    min 1/2 sum_{r,v} w~_r t_{r,v}  s.t.  t_{r,v} >= p_r(v) - q(v),  t_{r,v} >= q(v) - p_r(v),
    sum_v q(v) = 1,  q >= 0.  For checks and benchmarks only (a single ``[M, V]`` family);
    computed in float64 on the CPU. ``method`` is a scipy HiGHS method ("highs", "highs-ipm",
    "highs-ds"); ``tol`` sets the primal and dual feasibility tolerances.

    Parameters
    ----------
    P : torch.Tensor
        A single family ``[M, V]`` of distributions.
    weights : torch.Tensor or None, optional
        Row weights w_r, shape ``[M]``; ``None`` weights every row 1/M.
    tol : float, optional
        Primal and dual feasibility tolerance passed to HiGHS.
    method : str, optional
        scipy HiGHS method name.

    Returns
    -------
    q : torch.Tensor
        ``[V]`` float64 CPU tensor, the LP's optimal proposal.
    value : torch.Tensor
        0-dim float64 tensor, the LP optimum (the floor T_hat of paper Sec. B.4).
    """
    import scipy.sparse as sp
    from scipy.optimize import linprog

    if P.dim() != 2:
        raise ValueError("tv_barycentre_lp takes a single [M, V] family")
    Pn = P.detach().to("cpu", torch.float64).numpy()
    M, V = Pn.shape
    if weights is None:
        wn = np.full(M, 1.0 / M)
    else:
        wn = normalise_weights(weights, P.detach().to("cpu", torch.float64)).numpy()
    n_t = M * V
    c = np.concatenate([np.zeros(V), 0.5 * np.repeat(wn, V)])
    eye_t = sp.identity(n_t, format="csr")
    q_of_t = sp.csr_matrix((np.ones(n_t), (np.arange(n_t), np.tile(np.arange(V), M))),
                           shape=(n_t, V))
    # -q - t <= -p   and   q - t <= p
    A_ub = sp.vstack([sp.hstack([-q_of_t, -eye_t]), sp.hstack([q_of_t, -eye_t])], format="csr")
    b_ub = np.concatenate([-Pn.ravel(), Pn.ravel()])
    A_eq = sp.csr_matrix(np.concatenate([np.ones(V), np.zeros(n_t)])[None, :])
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[1.0], bounds=(0, None),
                  method=method,
                  options={"primal_feasibility_tolerance": tol,
                           "dual_feasibility_tolerance": tol})
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed: {res.message}")
    q = torch.as_tensor(res.x[:V], dtype=torch.float64)
    return Barycentre(q, torch.tensor(float(res.fun), dtype=torch.float64))
