"""Top-K vocabulary reads and their residual band (paper Sec. C.6).

A top-K read keeps the K largest target probabilities of each row; r = 1 - sum(kept) is the mass
outside the returned support. Renormalising the kept probabilities gives p~ = p_K / (1 - r), and
TV(p, p~) = r exactly. By the triangle inequality the floors of the full and the renormalised
families differ by at most the (weighted) mean residual: |T - T~| <= E[r].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from floorgap.estimators.barycentre import normalise_weights, tv_barycentre
from floorgap.estimators.floors import (alternating_split, floor_order0_split,
                                        floor_order1_plugin, floor_order1_split, order0_path_tv)

__all__ = ["TopK", "TruncatedFloor", "TruncatedSlotFloors", "topk_sparse", "renormalised_dense",
           "renormalised_family", "truncated_floor", "truncated_slot_floors"]


@dataclass(frozen=True)
class TopK:
    """A top-K read: token ``indices`` and raw probabilities ``values`` (``[..., K]``) and the
    residual mass ``residual = 1 - sum(values)`` (``[...]``, clamped at 0)."""

    indices: torch.Tensor
    values: torch.Tensor
    residual: torch.Tensor

    def __iter__(self):
        return iter((self.indices, self.values, self.residual))


@dataclass(frozen=True)
class TruncatedFloor:
    """Floor T~ of the renormalised top-K family and its band ``[value - band, value + band]``,
    where ``band`` = E[r], the (weighted) mean residual mass (paper Sec. C.6)."""

    value: torch.Tensor
    band: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor


def topk_sparse(P: torch.Tensor, K: int) -> TopK:
    """Top-K read of each row of ``P`` (``[..., V]``): indices, values, residual r = 1 - sum kept.

    See paper App. C.6 for the top-K reads.

    Parameters
    ----------
    P : torch.Tensor
        ``[..., V]`` probabilities.
    K : int
        Number of tokens kept per row (at most V are kept).

    Returns
    -------
    TopK
        ``indices`` and ``values`` ``[..., K]`` (largest first) and ``residual`` r ``[...]``.
    """
    K = min(int(K), P.shape[-1])
    values, indices = torch.topk(P, K, dim=-1)
    residual = (1 - values.sum(-1)).clamp(min=0)
    return TopK(indices, values, residual)


def renormalised_dense(indices: torch.Tensor, values: torch.Tensor, V: int) -> torch.Tensor:
    """Dense ``[..., V]`` rows holding values / sum(values) at ``indices`` and 0 elsewhere.

    These are the renormalised reads p~ = p_K / (1 - r) of paper App. C.6.

    Parameters
    ----------
    indices : torch.Tensor
        ``[..., K]`` token ids, no padding.
    values : torch.Tensor
        ``[..., K]`` raw probabilities of those tokens.
    V : int
        Vocabulary size of the dense rows (above every index).

    Returns
    -------
    torch.Tensor
        ``[..., V]`` p~ rows, each summing to 1.
    """
    dense = torch.zeros(indices.shape[:-1] + (V,), dtype=values.dtype, device=values.device)
    return dense.scatter(-1, indices, values / values.sum(-1, keepdim=True))


def truncated_floor(indices: torch.Tensor, values: torch.Tensor,
                    residual: torch.Tensor | None = None,
                    weights: torch.Tensor | None = None) -> TruncatedFloor:
    """Order-0 floor of a family of top-K reads, with its truncation band (paper Sec. C.6).

    ``indices``/``values``: ``[M, K]`` top-K reads of the M path distributions (raw target
    probabilities); ``residual``: ``[M]`` mass outside each read (default 1 - sum(values));
    ``weights``: optional path weights as in :func:`tv_barycentre`. The rows are renormalised
    and the barycentre is solved on the union of their supports (the other tokens are zero in
    every row, so the optimal q is zero there). Returns T~, the band E[r] and T~ -/+ E[r].

    Parameters
    ----------
    indices : torch.Tensor
        ``[M, K]`` token ids of the M top-K reads.
    values : torch.Tensor
        ``[M, K]`` raw target probabilities of those tokens.
    residual : torch.Tensor or None, optional
        ``[M]`` mass r outside each read; None computes 1 - sum(values).
    weights : torch.Tensor or None, optional
        ``[M]`` path weights; None weights the paths equally.

    Returns
    -------
    TruncatedFloor
        ``value`` T~, ``band`` E[r], ``lower`` T~ - E[r] and ``upper`` T~ + E[r] (0-d tensors).
    """
    if indices.dim() != 2 or indices.shape != values.shape:
        raise ValueError("indices and values must both have shape [M, K]")
    if residual is None:
        residual = (1 - values.sum(-1)).clamp(min=0)
    support, local = torch.unique(indices, return_inverse=True)
    dense = renormalised_dense(local, values, support.numel())
    value = tv_barycentre(dense, weights).value
    if weights is None:
        band = residual.to(values.dtype).mean()
    else:
        band = (normalise_weights(weights, dense) * residual.to(values.dtype)).sum(-1)
    return TruncatedFloor(value=value, band=band, lower=value - band, upper=value + band)


@dataclass(frozen=True)
class TruncatedSlotFloors:
    """Floors of one slot at one anchor from top-K reads of its M paths (paper Sec. C.6).

    Values are those of the renormalised family p~: ``t0`` the in-sample T~^(0), ``t0_split``
    its split-half fit check, ``t1_plugin`` the in-sample order-1 floor by predecessor
    grouping, ``t1_split_cov``/``t1_covered_mass`` the split-half T~^(1) on the covered paths
    and their mass c, ``t0_covered`` T~^(0)'s per-path share on those paths (so the two floors
    compare on one population). ``omitted`` is E[r], the mean mass outside the reads.

    Bounds. For any fixed q, |TV(p, q) - TV(p~, q)| <= TV(p, p~) = r, so every in-sample
    minimum moves by at most E[r]: ``t0_lower <= T^(0) <= t0_upper`` and the same for the
    order-1 plug-in (group by group), clipped to [0, 1]. The split-half values fit q on other
    rows, which the band does not cover; ``t1_lower``/``t1_upper`` are the covered-mass bounds
    c T~_cov <= T~^(1) <= c T~_cov + 1 - c widened by E[r], as the paper reports its held-out
    estimate with the band.
    """

    t0: float
    t0_split: float
    t0_lower: float
    t0_upper: float
    t1_plugin: float
    t1_plugin_lower: float
    t1_plugin_upper: float
    t1_split_cov: float
    t1_covered_mass: float
    t0_covered: float
    t1_lower: float
    t1_upper: float
    omitted: float


def renormalised_family(indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Dense ``[M, S]`` renormalised rows on the union support S of ``[M, K]`` reads.

    ``indices`` may pad short reads with -1 (their ``values`` must be 0), for an endpoint that
    returns fewer than K tokens on some rows (:func:`renormalised_dense` cannot take padding: it
    writes rather than adds). Tokens outside the union are zero in every row, so barycentres
    and TVs on S equal those on the vocabulary.

    It prepares the family p~ whose floor T~ paper App. C.6 compares with T.

    Parameters
    ----------
    indices : torch.Tensor
        ``[M, K]`` token ids of the M reads; -1 pads a short read.
    values : torch.Tensor
        ``[M, K]`` raw probabilities of those tokens; 0 at the padded entries.

    Returns
    -------
    torch.Tensor
        ``[M, S]`` renormalised rows over the S distinct ids (in increasing id order), each
        summing to 1.
    """
    if indices.dim() != 2 or indices.shape != values.shape:
        raise ValueError("indices and values must both have shape [M, K]")
    valid = indices >= 0
    if bool((values[~valid] != 0).any()):
        raise ValueError("padded entries (index -1) must have value 0")
    support, local = torch.unique(torch.where(valid, indices, indices.max() + 1),
                                  return_inverse=True)
    n_support = int(support.numel()) - int(bool((~valid).any()))
    dense = torch.zeros((indices.shape[0], n_support + 1), dtype=values.dtype)
    dense.scatter_add_(-1, local, values)
    dense = dense[:, :n_support]
    return dense / dense.sum(-1, keepdim=True)


def truncated_slot_floors(indices: torch.Tensor, values: torch.Tensor, residual: torch.Tensor,
                          predecessor: torch.Tensor | None) -> TruncatedSlotFloors:
    """T~^(0), T~^(1) and their omitted-mass bounds at one slot (paper Sec. C.6).

    ``indices``/``values``: ``[M, K]`` token ids and raw probabilities of each path's top-K read
    (padded with -1/0); ``residual``: ``[M]`` mass outside each read; ``predecessor``: ``[M]``
    the realised tokens at slot k - 1 (None at slot 0: one group). See
    :class:`TruncatedSlotFloors` for what each bound covers: |T - T~| <= E[r] for the
    in-sample floors.

    Parameters
    ----------
    indices : torch.Tensor
        ``[M, K]`` token ids of each path's top-K read at slot k (-1 pads).
    values : torch.Tensor
        ``[M, K]`` raw target probabilities of those tokens (0 at the pads).
    residual : torch.Tensor
        ``[M]`` mass r outside each read.
    predecessor : torch.Tensor or None
        ``[M]`` realised tokens at slot k - 1; None at slot 0 (all paths in one group).

    Returns
    -------
    TruncatedSlotFloors
        The floors of the renormalised family and their bounds, as floats.
    """
    dense = renormalised_family(indices, values.double())
    band = float(residual.double().mean())
    path_tv0 = order0_path_tv(dense)  # its mean is T~^(0): one barycentre solve for both
    t0 = float(path_tv0.mean())
    t1p = float(floor_order1_plugin(dense, predecessor))
    split = floor_order1_split(dense, predecessor)
    covered = path_tv0[split.covered]

    def clip(x: float) -> float:
        return min(1.0, max(0.0, x))

    return TruncatedSlotFloors(
        t0=t0, t0_split=float(floor_order0_split(dense, alternating_split(dense.shape[0]))),
        t0_lower=clip(t0 - band), t0_upper=clip(t0 + band),
        t1_plugin=t1p, t1_plugin_lower=clip(t1p - band), t1_plugin_upper=clip(t1p + band),
        t1_split_cov=float(split.value_covered), t1_covered_mass=float(split.covered_mass),
        t0_covered=float(covered.mean()) if covered.numel() else float("nan"),
        t1_lower=clip(float(split.lower) - band), t1_upper=clip(float(split.upper) + band),
        omitted=band)
