"""Effective support of the target's block-prefix distribution (paper Sec. B.6, D.1).

The collision-equivalent effective support is N_eff^(2) = 1 / sum_z p(z)^2 over j-token prefixes
z. With M sampled paths grouped into classes c of identical prefixes of sizes n_c, the unbiased
collision estimator is lambda_hat = sum_c n_c (n_c - 1) / (M (M - 1)), and N_eff = 1 / lambda_hat.
As in the paper (Sec. B.6, D.1), the value M is recorded only when no pair of paths collides
(lambda_hat = 0, where 1 / lambda_hat is undefined); with at least one collision N_eff is
1 / lambda_hat, which can exceed M (a single colliding pair gives M (M - 1) / 2): M paths that
barely collide are evidence of a support much larger than M, and capping it would bias the
upper quantiles and the correlation of log N_eff with the floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["EffectiveSupport", "effective_support", "effective_support_by_depth"]


@dataclass(frozen=True)
class EffectiveSupport:
    """``n_eff`` = N_eff = 1 / lambda_hat (M when no pair collides), ``collision`` =
    lambda_hat, ``n_distinct`` = number of distinct prefixes, ``n_paths`` = M."""

    n_eff: float
    collision: float
    n_distinct: int
    n_paths: int


def effective_support(paths: torch.Tensor) -> EffectiveSupport:
    """N_eff = M (M - 1) / sum_c n_c (n_c - 1) over identical prefixes (paper Sec. B.6).

    ``paths``: ``[M, j]`` integer tokens, one j-token prefix per sampled path (M >= 2; j = 0
    means the empty prefix, shared by all paths, giving N_eff = 1). Returns M when no two
    paths share a prefix.

    Parameters
    ----------
    paths : torch.Tensor
        ``[M, j]`` integer tokens of the M sampled prefixes; a 1-D ``[M]`` is read as j = 1.

    Returns
    -------
    EffectiveSupport
        ``n_eff`` (N_eff), ``collision`` (lambda_hat), ``n_distinct`` (distinct prefixes) and
        ``n_paths`` (M).
    """
    if paths.dim() == 1:
        paths = paths.unsqueeze(-1)
    if paths.dim() != 2:
        raise ValueError("paths must have shape [M, j]")
    M = paths.shape[0]
    if M < 2:
        raise ValueError("effective support needs at least two paths")
    if paths.shape[1] == 0:
        counts = torch.tensor([M])
    else:
        _, counts = torch.unique(paths, dim=0, return_counts=True)
    counts = counts.to(torch.float64)
    pairs = float((counts * (counts - 1)).sum())
    collision = pairs / (M * (M - 1))
    n_eff = float(M) if pairs == 0 else M * (M - 1) / pairs
    return EffectiveSupport(n_eff=n_eff, collision=collision, n_distinct=int(counts.numel()),
                            n_paths=M)


def effective_support_by_depth(paths: torch.Tensor) -> list[EffectiveSupport]:
    """:func:`effective_support` of the j-token prefixes for j = 1..gamma of ``[M, gamma]`` paths.

    This gives the depth profile used in paper App. D.1 (estimator of paper App. B.6).

    Parameters
    ----------
    paths : torch.Tensor
        ``[M, gamma]`` integer tokens of the M sampled blocks.

    Returns
    -------
    list[EffectiveSupport]
        gamma entries; entry j - 1 is the effective support of the j-token prefixes.
    """
    return [effective_support(paths[:, :j]) for j in range(1, paths.shape[1] + 1)]
