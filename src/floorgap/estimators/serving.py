"""Serving-risk reweighting and dependence among accept factors (paper Sec. 3.5, App. F.1-F.2).

On a target path Z (drawn from the target's block law) the accept factor of slot i is

    a_i = min(1, q_i(Z_i) / p_i(Z_i)),

computed from the probabilities the target and the proposal give the realised token.  With
chain verification, Pr(J >= j+1) = E_mu[prod_{i<=j} a_i], so the expected returned length is

    tau = 1 + sum_j S_j,     S_j = E[prod_{i<=j} a_i]            (joint survival, eq. in Sec. 2)

The reach of slot k is W_{k-1} = prod_{i<k} a_i (W_{-1} = 1), and the serving risk is

    R^serve_k = Pr(J = k | J >= k) = E[W_{k-1} TV(p_k, q_k)] / E[W_{k-1}]        (eq. 6)

formed as a ratio of population sums over anchors (F.1).  The independence approximation
replaces S_k by prod_{i<=k} E[a_i]; D_k = S_k / prod_{i<=k} E[a_i] (F.2).  Using the realised
a_i for the marginals (not 1 - TV) makes D_0 = 1 exactly.

Per-path tensors are (..., M, gamma): paths on dim -2, slots on dim -1; per-anchor results
are (..., gamma).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregate import (DEFAULT_BOOT_SEED, DEFAULT_N_BOOT, BootstrapResult, bootstrap_transform,
                        cluster_resample, paired_difference, prompt_bootstrap)

__all__ = [
    "ServeRiskSums",
    "ServingSummary",
    "accept_factors",
    "accepted_length",
    "dependence_ratio",
    "exact_chain_survival",
    "exact_chain_tau",
    "independent_accepted_length",
    "joint_survival",
    "largest_risk_lower_bound",
    "marginal_acceptance",
    "risk_bound_accepted_length",
    "reach",
    "serving_risk_sums",
    "serving_summary",
    "survival_products",
]


def accept_factors(p_tok: Tensor, q_tok: Tensor) -> Tensor:
    """a_i = min(1, q_i(Z_i)/p_i(Z_i)) from the realised tokens' probabilities.

    Written as q >= p -> 1 so that a token the target gives zero mass (possible only under a
    truncated law and a caller bug) does not produce NaN.

    See paper App. A.1 (Table 2) for a_i and paper Sec. 2 for its role in tau.

    Parameters
    ----------
    p_tok : Tensor
        The target's probabilities p_i(Z_i) of the realised tokens, e.g. ``[..., M, gamma]``.
    q_tok : Tensor
        The proposal's probabilities q_i(Z_i) of the same tokens, same shape.

    Returns
    -------
    Tensor
        The accept factors a_i in [0, 1], same shape as the inputs.
    """
    return torch.where(q_tok >= p_tok, torch.ones_like(q_tok), q_tok / p_tok)


def survival_products(a: Tensor) -> Tensor:
    """Per-path prod_{i<=k} a_i along the slot dim (inclusive cumulative product).

    Their path mean is the joint survival S_k that gives tau (paper Sec. 2).

    Parameters
    ----------
    a : Tensor
        Accept factors a_i with slots on the last dim, e.g. ``[..., M, gamma]``.

    Returns
    -------
    Tensor
        Same shape: entry k is prod_{i<=k} a_i.
    """
    return torch.cumprod(a, dim=-1)


def reach(a: Tensor) -> Tensor:
    """Per-path reach W_{k-1} = prod_{i<k} a_i, with W_{-1} = 1 for slot 0.

    The reach weights the serving risk (paper Sec. 3.5, App. F.1).

    Parameters
    ----------
    a : Tensor
        As in :func:`survival_products`.

    Returns
    -------
    Tensor
        Same shape: entry k is W_{k-1}.
    """
    ones = torch.ones_like(a[..., :1])
    return torch.cat([ones, torch.cumprod(a[..., :-1], dim=-1)], dim=-1)


@dataclass(frozen=True)
class ServeRiskSums:
    """Per-anchor pieces of R^serve_k: num = E_paths[W_{k-1} TV_k], den = E_paths[W_{k-1}].

    R^serve over anchors is sum_i num_i/pi_i / sum_i den_i/pi_i (``weighted_ratio`` or
    ``prompt_bootstrap(num, clusters, pi, den=den)``); per anchor, num/den.
    """

    num: Tensor
    den: Tensor

    @property
    def ratio(self) -> Tensor:
        return self.num / self.den


def serving_risk_sums(a: Tensor, tv: Tensor) -> ServeRiskSums:
    """Numerator and denominator of R^serve_k = E[W_{k-1} TV_k] / E[W_{k-1}] per anchor (eq. 6).

    ``a`` and ``tv`` are (..., M, gamma); TV is the per-path TV(p_k^(r), q_k^(r)).

    See paper Sec. 3.5 for eq. 6 and paper App. F.1 for the ratio of population sums.

    Parameters
    ----------
    a : Tensor
        ``[..., M, gamma]`` accept factors a_i on the M paths.
    tv : Tensor
        ``[..., M, gamma]`` TV(p_k^(r), q_k^(r)) on the same paths.

    Returns
    -------
    ServeRiskSums
        ``num`` = E_paths[W_{k-1} TV_k] and ``den`` = E_paths[W_{k-1}], each ``[..., gamma]``.
    """
    w = reach(a)
    return ServeRiskSums(num=(w * tv).mean(-2), den=w.mean(-2))


def joint_survival(a: Tensor) -> Tensor:
    """S_k = E[prod_{i<=k} a_i] per anchor (path mean) -> (..., gamma).

    See paper Sec. 2 (tau) and App. F.2 (the numerator of D_k).

    Parameters
    ----------
    a : Tensor
        ``[..., M, gamma]`` accept factors a_i on the M paths.

    Returns
    -------
    Tensor
        ``[..., gamma]`` S_k per anchor.
    """
    return survival_products(a).mean(-2)


def marginal_acceptance(a: Tensor) -> Tensor:
    """E[a_k] per anchor (path mean of the realised accept factors) -> (..., gamma).

    These are the marginals of the independence approximation (paper App. F.2).

    Parameters
    ----------
    a : Tensor
        As in :func:`joint_survival`.

    Returns
    -------
    Tensor
        ``[..., gamma]`` E[a_k] per anchor.
    """
    return a.mean(-2)


def accepted_length(survival: Tensor) -> Tensor:
    """tau = 1 + sum_k S_k from joint survival (..., gamma).

    See paper Sec. 2 for the identity.

    Parameters
    ----------
    survival : Tensor
        ``[..., gamma]`` joint survival S_k (or per-path survival products).

    Returns
    -------
    Tensor
        ``[...]`` the expected returned length tau (a per-path value when given per-path
        products).
    """
    return 1.0 + survival.sum(-1)


def independent_accepted_length(marginal: Tensor) -> Tensor:
    """tau under independence: 1 + sum_k prod_{i<=k} E[a_i].

    This is the tau that ignores dependence among accept factors (paper App. F.2).

    Parameters
    ----------
    marginal : Tensor
        ``[..., gamma]`` marginal acceptances E[a_k].

    Returns
    -------
    Tensor
        ``[...]`` tau under independence.
    """
    return 1.0 + torch.cumprod(marginal, dim=-1).sum(-1)


def risk_bound_accepted_length(r: float, gamma: int) -> float:
    """The least accepted length a drafter whose per-slot risks are all at most r can have
    (paper App. F.3): by the union bound E[prod_{i<=j} a_i] >= 1 - sum_{i<=j} R_i
    >= [1 - (j + 1) r]_+, so tau >= 1 + sum_{j<gamma} [1 - (j + 1) r]_+. No independence
    between slots is assumed.

    Parameters
    ----------
    r : float
        Common upper bound on the per-slot risks R_k, in [0, 1].
    gamma : int
        Block length (at least 1).

    Returns
    -------
    float
        The least accepted length, 1 + sum_{j<gamma} [1 - (j + 1) r]_+.
    """
    if gamma < 1:
        raise ValueError("gamma must be >= 1")
    return 1.0 + sum(max(0.0, 1.0 - (j + 1) * float(r)) for j in range(gamma))


def largest_risk_lower_bound(tau: float, gamma: int) -> float:
    """r_min: the lower bound on the largest per-slot risk max_k R_k implied by a reported
    accepted length tau at block length gamma alone (paper App. F.3).

    :func:`risk_bound_accepted_length` is continuous and strictly decreasing in r on [0, 1], so
    tau < f(r) for every r below r_min = inf{r : f(r) <= tau}. Closed form: where exactly n
    terms are positive, f(r) = 1 + n - r n (n + 1) / 2, solved on that piece. With gamma = 1,
    tau = 1 + E[a_0] exactly and r_min = 2 - tau = R_0.

    Parameters
    ----------
    tau : float
        Reported accepted length (at least 1).
    gamma : int
        Block length (at least 1).

    Returns
    -------
    float
        r_min in [0, 1]; 0 when tau >= gamma + 1.
    """
    if gamma < 1:
        raise ValueError("gamma must be >= 1")
    tau = float(tau)
    if not tau >= 1.0:
        raise ValueError(f"an accepted length is at least 1, got {tau}")
    if tau >= gamma + 1:
        return 0.0
    for n in range(gamma, 0, -1):
        lo, hi = (0.0 if n == gamma else 1.0 / (n + 1)), 1.0 / n
        r = 2.0 * (1.0 + n - tau) / (n * (n + 1))
        if lo - 1e-15 <= r <= hi + 1e-15:
            return min(max(r, lo), hi)
    return 1.0


def dependence_ratio(joint: Tensor, marginal: Tensor) -> Tensor:
    """D_k = E[prod_{i<=k} a_i] / prod_{i<=k} E[a_i] (App. F.2); D_0 = 1 by construction.

    Pass population (Hajek) means, or bootstrap replicates (B x gamma) of both.

    Parameters
    ----------
    joint : Tensor
        ``[..., gamma]`` joint survival S_k, e.g. population means or ``[B, gamma]`` replicates.
    marginal : Tensor
        ``[..., gamma]`` marginal acceptances E[a_k] of the same population.

    Returns
    -------
    Tensor
        ``[..., gamma]`` D_k.
    """
    return joint / torch.cumprod(marginal, dim=-1)


def exact_chain_survival(p_tables: Sequence[Tensor], q_tables: Sequence[Tensor]) -> Tensor:
    """Exact Pr(J >= j+1) for chain verification by enumerating a small vocabulary.

    ``p_tables[k]`` and ``q_tables[k]`` have shape (V,)*(k+1): entry [z_0, ..., z_{k-1}, v] is
    the next-token probability of v after the prefix z_<k.  A draft token z at slot i is
    proposed with prob q(z) and kept with prob min(1, p(z)/q(z)), i.e. kept jointly with
    prob min(p, q)(z); so Pr(J >= j+1) = sum_{z_<=j} prod_{i<=j} min(p_i, q_i)(z_i | z_<i).
    Reference for the identity S_j = E_mu[prod_{i<=j} a_i] on target paths.

    The identity is the survival form of tau in paper Sec. 2.

    Parameters
    ----------
    p_tables : Sequence[Tensor]
        One table per slot k = 0..gamma-1, ``p_tables[k]`` of shape ``(V,)*(k+1)``: the target's
        next-token probabilities after every prefix z_<k.
    q_tables : Sequence[Tensor]
        The proposal's tables, same shapes.

    Returns
    -------
    Tensor
        ``[gamma]`` Pr(J >= j+1) for j = 0..gamma-1.
    """
    out = []
    acc: Tensor | None = None
    for p_k, q_k in zip(p_tables, q_tables, strict=True):
        m = torch.minimum(p_k, q_k)
        acc = m if acc is None else acc.unsqueeze(-1) * m
        out.append(acc.sum())
    return torch.stack(out)


def exact_chain_tau(p_tables: Sequence[Tensor], q_tables: Sequence[Tensor]) -> Tensor:
    """Exact tau = 1 + sum_j Pr(J >= j+1) for chain verification (see exact_chain_survival).

    This is the tau of paper Sec. 2, computed exactly on a small vocabulary.

    Parameters
    ----------
    p_tables, q_tables
        As in :func:`exact_chain_survival`.

    Returns
    -------
    Tensor
        Scalar tau.
    """
    return accepted_length(exact_chain_survival(p_tables, q_tables))


@dataclass(frozen=True)
class ServingSummary:
    """Population serving quantities with paired prompt-bootstrap intervals (Tables 7, 8).

    All entries share one resample, so every contrast is paired within the replicate.
    Per-slot entries have shape (gamma,); the tau entries are scalars.
    """

    free_risk: BootstrapResult  # R_k: Hajek mean of the path-mean TV
    serve_risk: BootstrapResult  # R^serve_k: ratio of population sums
    serve_minus_free: BootstrapResult  # R^serve_k - R_k
    joint_survival: BootstrapResult  # S_k
    marginal_acceptance: BootstrapResult  # E[a_k]
    dependence: BootstrapResult  # D_k
    tau: BootstrapResult  # 1 + sum_k S_k
    tau_independent: BootstrapResult  # 1 + sum_k prod_{i<=k} E[a_i]
    tau_gap: BootstrapResult  # tau - tau_independent


def serving_summary(a: Tensor, tv: Tensor, clusters: Tensor | Sequence[Hashable],
                    pi: Tensor | None = None, *, n_boot: int = DEFAULT_N_BOOT,
                    seed: int = DEFAULT_BOOT_SEED, level: float = 0.95) -> ServingSummary:
    """Aggregate per-path accept factors and TVs over anchors (App. F.1, F.2).

    ``a`` and ``tv`` are (n_anchors, M, gamma); ``clusters`` gives each anchor's prompt and
    ``pi`` its inclusion probability.  R^serve is the ratio of Hajek-weighted population sums
    of E[W_{k-1} TV_k] and E[W_{k-1}]; survival and marginals are Hajek means, and D_k and the
    two tau's are functions of those means computed replicate by replicate.

    Parameters
    ----------
    a : Tensor
        ``[n_anchors, M, gamma]`` accept factors a_i.
    tv : Tensor
        ``[n_anchors, M, gamma]`` per-path TV(p_k^(r), q_k^(r)).
    clusters : Tensor or Sequence[Hashable]
        ``[n_anchors]`` the prompt of each anchor; a prompt's anchors are resampled together.
    pi : Tensor or None, optional
        ``[n_anchors]`` inclusion probabilities; None weights anchors equally.
    n_boot : int, optional
        Number of bootstrap replicates B.
    seed : int, optional
        Seed of the resampling.
    level : float, optional
        Coverage of the percentile intervals.

    Returns
    -------
    ServingSummary
        R_k, R^serve_k, their difference, S_k, E[a_k], D_k, tau, tau under independence and
        their difference, each with its paired interval (``[gamma]`` per slot, scalars for tau).
    """
    if a.dim() != 3 or a.shape != tv.shape:
        raise ValueError("a and tv must both be (n_anchors, M, gamma)")
    rs = cluster_resample(clusters, n_boot, seed, dtype=a.dtype, device=a.device)
    boot = dict(pi=pi, level=level, return_replicates=True, resample=rs)
    sums = serving_risk_sums(a, tv)
    free = prompt_bootstrap(tv.mean(-2), clusters, **boot)
    serve = prompt_bootstrap(sums.num, clusters, den=sums.den, **boot)
    joint = prompt_bootstrap(joint_survival(a), clusters, **boot)
    marg = prompt_bootstrap(marginal_acceptance(a), clusters, **boot)
    dep = bootstrap_transform(dependence_ratio, joint, marg)
    tau = bootstrap_transform(accepted_length, joint)
    tau_ind = bootstrap_transform(independent_accepted_length, marg)
    return ServingSummary(free_risk=free, serve_risk=serve,
                          serve_minus_free=paired_difference(serve, free), joint_survival=joint,
                          marginal_acceptance=marg, dependence=dep, tau=tau,
                          tau_independent=tau_ind, tau_gap=paired_difference(tau, tau_ind))

