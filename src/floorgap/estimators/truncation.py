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

__all__ = ["TopK", "TruncatedFloor", "topk_sparse", "renormalised_dense", "truncated_floor"]


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
    """Top-K read of each row of ``P`` (``[..., V]``): indices, values, residual r = 1 - sum kept."""
    K = min(int(K), P.shape[-1])
    values, indices = torch.topk(P, K, dim=-1)
    residual = (1 - values.sum(-1)).clamp(min=0)
    return TopK(indices, values, residual)


def renormalised_dense(indices: torch.Tensor, values: torch.Tensor, V: int) -> torch.Tensor:
    """Dense ``[..., V]`` rows holding values / sum(values) at ``indices`` and 0 elsewhere."""
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
