"""Mutual-information recovery rho_{k,m} (paper Sec. 3.2, App. A.3, B.2, C.5, D.3).

For a realised target block Z at anchor X and slot k, three log-losses of the scored token Z_k:

    C_{k,k} = -log p(Z_k | X, Z_<k)                        teacher forced on the realised path
    C_{k,0} = -log Pr(Z_k | X)        ~ -log sum_s w_s p(Z_k | X, S_s) / sum_s w_s
    C_{k,m} = -log Pr(Z_k | X, Z_{k-m..k-1})
            ~ -log sum_s w_s r_s p(Z_k | X, S_s[:k-m], Z_{k-m..k-1}) / sum_s w_s r_s

where S_s are prefixes of length k drawn from the target independently of the realised path
(w_s = 1), and r_s = p(Z_{k-m..k-1} | X, S_s[:k-m]) re-weights the truncated prefix by the
probability of the m revealed tokens (self-normalised importance sampling).  In expectation
over the realised path, C_{k,0} - C_{k,k} is I(Z_k; Z_<k | X) and C_{k,0} - C_{k,m} is
I(Z_k; Z_{k-m..k-1} | X), so

    rho_{k,m} = sum_i n_{i,k,m} / pi_i  /  sum_i d_{i,k} / pi_i,
    n_{i,k,m} = C_{k,0} - C_{k,m},   d_{i,k} = C_{k,0} - C_{k,k}                 (B.2)

per slot, and pooled over slots by summing numerators and denominators over the cells used.
Everything is computed from log-probabilities with logsumexp.  The probe that runs the model
supplies these arrays; this module does no model work.

Shapes (leading batch dims ``...`` are free, e.g. anchors x slots):
    logp_teacher  (...)        log p(Z_k | X, Z_<k)
    logp_blind    (..., S)     log p(Z_k | X, S_s) for S sampled full-length prefixes
    logp_cond     (..., S, J)  log p(Z_k | X, S_s[:k-m_j], Z_{k-m_j..k-1}) for J orders m_j
    logw_reveal   (..., S, J)  log p(Z_{k-m_j..k-1} | X, S_s[:k-m_j])
    logw_prefix   (..., S) or (..., S, J), optional: log weights of the prefixes themselves
                  (zero for draws from the target; log mu(s) when prefixes are enumerated;
                  -inf pads unequal prefix counts).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace


import torch
from torch import Tensor

from .aggregate import DEFAULT_BOOT_SEED, DEFAULT_N_BOOT, BootstrapResult, prompt_bootstrap

__all__ = [
    "MICellLosses",
    "RecoveryBootstrap",
    "RecoveryEstimate",
    "ess_gate_sensitivity",
    "kish_ess_log",
    "leave_one_out_missing_information",
    "log_mixture",
    "mi_cell_losses",
    "recovery_bootstrap",
    "recovery_fraction",
    "recovery_terms",
    "screen_anchors",
]

SCREEN_THRESHOLD_NATS = 0.05


def log_mixture(logp: Tensor, logw: Tensor | None = None, dim: int = -1) -> Tensor:
    """log( sum_s w_s p_s / sum_s w_s ) from log p_s and log w_s (uniform w by default).

    Stable for arbitrarily small probabilities: both sums go through logsumexp.

    This is the mixture behind the blind and the partly conditioned losses C_{k,0} and C_{k,m}
    (paper App. A.3, B.2).

    Parameters
    ----------
    logp : Tensor
        Log-probabilities log p_s of the mixture components, the components on ``dim``.
    logw : Tensor or None, optional
        Log-weights log w_s, broadcastable to ``logp``; -inf removes a component. None gives
        every component the same weight.
    dim : int, optional
        The dimension that holds the components s.

    Returns
    -------
    Tensor
        The log of the weighted mean of the p_s: ``logp``'s shape without ``dim``.
    """
    if logw is None:
        n = torch.tensor(float(logp.shape[dim]), dtype=logp.dtype, device=logp.device)
        return torch.logsumexp(logp, dim=dim) - torch.log(n)
    logw = torch.broadcast_to(logw, logp.shape)
    return torch.logsumexp(logw + logp, dim=dim) - torch.logsumexp(logw, dim=dim)


def kish_ess_log(logw: Tensor, dim: int = -1) -> Tensor:
    """Kish effective sample size (sum w)^2 / sum w^2 of weights given as logs.

    It measures how many prefixes effectively carry the self-normalised reveal weights behind
    C_{k,m}, the quantity the ESS gates act on (paper App. C.5, D.3).

    Parameters
    ----------
    logw : Tensor
        Log-weights log w_s; -inf entries count as weight zero.
    dim : int, optional
        The dimension that holds the weights.

    Returns
    -------
    Tensor
        The ESS, between 1 and the number of nonzero weights: ``logw``'s shape without ``dim``.
    """
    return torch.exp(2.0 * torch.logsumexp(logw, dim=dim) - torch.logsumexp(2.0 * logw, dim=dim))


@dataclass(frozen=True)
class MICellLosses:
    """Per-cell log-losses (nats): c_kk (...), c_k0 (...), c_km (..., J) and the Kish ESS
    (..., J) of the self-normalised weights behind each c_km."""

    c_kk: Tensor
    c_k0: Tensor
    c_km: Tensor
    ess: Tensor


def mi_cell_losses(logp_teacher: Tensor, logp_blind: Tensor, logp_cond: Tensor,
                   logw_reveal: Tensor, logw_prefix: Tensor | None = None) -> MICellLosses:
    """C_{k,k}, C_{k,0} and C_{k,m} with the ESS of the reveal weights (App. A.3, D.3).

    See the module docstring for shapes.  ``logw_prefix`` of shape (..., S) weights the blind
    mixture and every conditioned mixture; of shape (..., S, J) it weights only the
    conditioned ones (the blind mixture is then uniform), which lets enumerated prefix sets
    differ by order.

    Parameters
    ----------
    logp_teacher : Tensor
        ``[...]`` log p(Z_k | X, Z_<k): the realised token scored on its own prefix.
    logp_blind : Tensor
        ``[..., S]`` log p(Z_k | X, S_s) for S prefixes drawn independently of the realised path.
    logp_cond : Tensor
        ``[..., S, J]`` log p(Z_k | X, S_s[:k-m_j], Z_{k-m_j..k-1}): the sampled prefixes with
        their last m_j tokens replaced by the realised ones, for J orders m_j.
    logw_reveal : Tensor
        ``[..., S, J]`` log p(Z_{k-m_j..k-1} | X, S_s[:k-m_j]), the importance weight of each
        truncated prefix.
    logw_prefix : Tensor or None, optional
        ``[..., S]`` or ``[..., S, J]`` log weights of the prefixes themselves (see above). None
        when the prefixes are draws from the target (weight 1 each).

    Returns
    -------
    MICellLosses
        ``c_kk`` and ``c_k0`` ``[...]`` and ``c_km`` ``[..., J]``, all in nats, and ``ess``
        ``[..., J]``, the Kish ESS of the weights behind each c_km.
    """
    if logp_cond.shape != logw_reveal.shape:
        raise ValueError("logp_cond and logw_reveal must both be (..., S, J)")
    if logw_prefix is None:
        lw_blind, lw_cond = None, logw_reveal
    elif logw_prefix.dim() == logp_blind.dim():
        lw_blind, lw_cond = logw_prefix, logw_reveal + logw_prefix.unsqueeze(-1)
    else:
        lw_blind, lw_cond = None, logw_reveal + logw_prefix
    return MICellLosses(c_kk=-logp_teacher, c_k0=-log_mixture(logp_blind, lw_blind, dim=-1),
                        c_km=-log_mixture(logp_cond, lw_cond, dim=-2),
                        ess=kish_ess_log(lw_cond, dim=-2))


def recovery_terms(losses: MICellLosses) -> tuple[Tensor, Tensor]:
    """(n, d): n_{i,k,m} = C_{k,0} - C_{k,m} (..., J) and d_{i,k} = C_{k,0} - C_{k,k} (...).

    These are the per-cell numerator and denominator of rho_{k,m} (paper App. B.2); in
    expectation d is I(Z_k; Z_<k | X) and n is I(Z_k; Z_{k-m..k-1} | X) (paper App. A.3).

    Parameters
    ----------
    losses : MICellLosses
        The cell losses from :func:`mi_cell_losses`.

    Returns
    -------
    n : Tensor
        ``[..., J]`` n_{i,k,m} = C_{k,0} - C_{k,m} in nats, one per order m.
    d : Tensor
        ``[...]`` d_{i,k} = C_{k,0} - C_{k,k} in nats, the missing information of the cell.
    """
    return losses.c_k0.unsqueeze(-1) - losses.c_km, losses.c_k0 - losses.c_kk


def screen_anchors(values: Tensor, threshold: float = SCREEN_THRESHOLD_NATS) -> Tensor:
    """Screen of B.2: keep anchors whose final-slot missing information exceeds ``threshold``.

    ``values`` are the final-slot d estimates from an independent screening pass; the
    recovery measurement itself re-estimates d from fresh paths.

    See paper App. B.2 for the screening pass.

    Parameters
    ----------
    values : Tensor
        Final-slot missing-information estimates d in nats, one per anchor (any shape, e.g.
        ``[A]``).
    threshold : float, optional
        The cut-off in nats (0.05 by default, as in the paper).

    Returns
    -------
    Tensor
        Boolean mask of ``values``' shape: True for the anchors that get the recovery
        measurement.
    """
    return values > threshold


def leave_one_out_missing_information(logp_cross: Tensor) -> Tensor:
    """Per-path missing information d_r = C_{k,0} - C_{k,k} from S paths scored against each other.

    ``logp_cross`` (..., S, S): entry [r, s] is log p(Z_k^(r) | X, Z^(s)_<k), the log-probability
    of path r's token at slot k under the next-token distribution along path s.  Path r's token
    is teacher forced on its own prefix (the diagonal) and mixed over the other S - 1 prefixes,
    which are independent of it:

        d_r = -log mean_{s != r} p^(s)(Z_k^(r)) + log p^(r)(Z_k^(r))          (..., S)

    Every d_r estimates I(Z_k; Z_<k | X) with S - 1 prefixes; their mean is the screening
    value of B.2 at the final slot.

    This is the screening estimator of paper App. B.2.

    Parameters
    ----------
    logp_cross : Tensor
        ``[..., S, S]`` with S >= 2: entry [r, s] is log p(Z_k^(r) | X, Z^(s)_<k).

    Returns
    -------
    Tensor
        ``[..., S]`` the per-path missing information d_r in nats.
    """
    S = logp_cross.shape[-1]
    if S < 2 or logp_cross.shape[-2] != S:
        raise ValueError("logp_cross must be (..., S, S) with S >= 2")
    diag = torch.diagonal(logp_cross, dim1=-2, dim2=-1)
    off = ~torch.eye(S, dtype=torch.bool, device=logp_cross.device)
    others = logp_cross[..., off].reshape(logp_cross.shape[:-2] + (S, S - 1))
    return -log_mixture(others, dim=-1) + diag


def _cell_mask(n: Tensor, mask: Tensor | None) -> Tensor:
    # a cell with non-finite losses cannot enter a sum; callers see it in the cell counts
    finite = torch.isfinite(n)
    return finite if mask is None else torch.broadcast_to(mask, n.shape) & finite



@dataclass(frozen=True)
class RecoveryEstimate:
    """rho_{k,m} per slot (K, J), pooled over slots (J,), and the number of cells in each."""

    per_slot: Tensor
    pooled: Tensor
    n_cells: Tensor
    n_cells_pooled: Tensor


def _num_den(n: Tensor, d: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    if n.dim() != 3 or d.shape != n.shape[:2]:
        raise ValueError("n must be (anchors, slots, orders) and d (anchors, slots)")
    m = _cell_mask(n, mask) & torch.isfinite(d).unsqueeze(-1)
    num = torch.where(m, n, torch.zeros_like(n))
    den = torch.where(m, d.unsqueeze(-1).expand_as(n), torch.zeros_like(n))
    return num, den, m.to(n.dtype)


def recovery_fraction(n: Tensor, d: Tensor, pi: Tensor | None = None,
                      mask: Tensor | None = None) -> RecoveryEstimate:
    """rho_{k,m} = sum_i n_{i,k,m}/pi_i / sum_i d_{i,k}/pi_i over the cells in ``mask`` (B.2).

    ``n`` (A, K, J), ``d`` (A, K), ``pi`` (A,), ``mask`` (A, K, J) bool: which anchor-slot-order
    cells enter (e.g. m < k and an ESS gate).  A dropped cell leaves both sums for that order.
    Slots with no cells give NaN.

    The ratio is the Hajek-weighted estimator of paper App. B.2 for the fraction defined in paper
    Sec. 3.2.

    Parameters
    ----------
    n : Tensor
        ``[A, K, J]`` numerator terms n_{i,k,m} in nats, for A anchors, K slots and J orders.
    d : Tensor
        ``[A, K]`` denominator terms d_{i,k} in nats.
    pi : Tensor or None, optional
        ``[A]`` inclusion probabilities pi_i of the anchors; None weights them equally.
    mask : Tensor or None, optional
        ``[A, K, J]`` (or broadcastable) bool: the cells that enter. None keeps every cell;
        cells with a non-finite n or d never enter.

    Returns
    -------
    RecoveryEstimate
        ``per_slot`` rho ``[K, J]``, ``pooled`` rho ``[J]`` (numerators and denominators summed
        over slots), and the cell counts ``n_cells`` ``[K, J]`` and ``n_cells_pooled`` ``[J]``.
    """
    num, den, mf = _num_den(n, d, mask)
    w = (torch.ones(n.shape[0], dtype=n.dtype, device=n.device) if pi is None
         else 1.0 / pi.to(n.dtype)).view(-1, 1, 1)
    sn, sd = (num * w).sum(0), (den * w).sum(0)
    return RecoveryEstimate(per_slot=sn / sd, pooled=sn.sum(0) / sd.sum(0), n_cells=mf.sum(0),
                            n_cells_pooled=mf.sum((0, 1)))


@dataclass(frozen=True)
class RecoveryBootstrap:
    """Prompt-bootstrap results for rho per slot (K, J) and pooled over slots (J,)."""

    per_slot: BootstrapResult
    pooled: BootstrapResult


def recovery_bootstrap(n: Tensor, d: Tensor, clusters: Tensor | Sequence[Hashable],
                       pi: Tensor | None = None, mask: Tensor | None = None, *,
                       n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_BOOT_SEED,
                       level: float = 0.95, return_replicates: bool = False) -> RecoveryBootstrap:
    """Percentile intervals for rho_{k,m} as ratios of resampled sums (Table 4).

    Per-slot and pooled statistics are resampled together in one call, so they are paired.

    Prompts are resampled with all their anchors, as in paper App. B.2; the intervals are those
    of Table 4 (paper App. D.3).

    Parameters
    ----------
    n, d, pi, mask
        As in :func:`recovery_fraction`.
    clusters : Tensor or Sequence[Hashable]
        ``[A]`` the prompt of each anchor; a prompt's anchors are drawn together.
    n_boot : int, optional
        Number of bootstrap replicates B.
    seed : int, optional
        Seed of the resampling.
    level : float, optional
        Coverage of the percentile interval (0.95: the 2.5th and 97.5th percentiles).
    return_replicates : bool, optional
        Keep the replicates (``[B, K, J]`` and ``[B, J]``) in the results.

    Returns
    -------
    RecoveryBootstrap
        ``per_slot`` (``[K, J]``) and ``pooled`` (``[J]``) bootstrap results, each with the
        estimate and its lower and upper bounds, from the same resamples.
    """
    num, den, _ = _num_den(n, d, mask)
    A, K, J = n.shape
    num_cols = torch.cat([num.reshape(A, K * J), num.sum(1)], dim=1)
    den_cols = torch.cat([den.reshape(A, K * J), den.sum(1)], dim=1)
    res = prompt_bootstrap(num_cols, clusters, pi, den=den_cols, n_boot=n_boot, seed=seed,
                           level=level, return_replicates=return_replicates)

    def part(sl: slice, shape: tuple[int, ...]) -> BootstrapResult:
        reps = None if res.replicates is None else res.replicates[:, sl].reshape((-1,) + shape)
        return replace(res, estimate=res.estimate[sl].reshape(shape),
                       lower=res.lower[sl].reshape(shape), upper=res.upper[sl].reshape(shape),
                       replicates=reps)

    return RecoveryBootstrap(per_slot=part(slice(0, K * J), (K, J)),
                             pooled=part(slice(K * J, K * J + J), (J,)))


def ess_gate_sensitivity(n: Tensor, d: Tensor, ess: Tensor, thresholds: Sequence[float],
                         pi: Tensor | None = None, mask: Tensor | None = None
                         ) -> list[tuple[float, RecoveryEstimate]]:
    """rho recomputed on the cells whose ESS >= each threshold (App. C.5, D.3).

    ``ess`` is (A, K, J) like ``n``; a threshold of 0 keeps every cell in ``mask``.

    Parameters
    ----------
    n, d, pi
        As in :func:`recovery_fraction`.
    ess : Tensor
        ``[A, K, J]`` Kish ESS of each cell's reveal weights (``MICellLosses.ess``).
    thresholds : Sequence[float]
        The ESS cut-offs to try (the paper uses 0, 32 and M/2).
    mask : Tensor or None, optional
        ``[A, K, J]`` bool, the cells eligible before any gate.

    Returns
    -------
    list[tuple[float, RecoveryEstimate]]
        One pair per threshold, in the given order: the threshold and rho on the cells that
        pass it (paper App. C.5).
    """
    base = _cell_mask(n, mask)
    return [(float(t), recovery_fraction(n, d, pi, base & (ess >= t))) for t in thresholds]
