"""Drafter risks, model gaps and exposure (paper Secs. 2, 3.3, App. B.5, E).

Notation: slot k, paths r = 1..M at a fixed anchor, p_k^(r) the target's next-token
distribution on path r, q_k^(r) the drafter's proposal evaluated on the same path.

    TV(p, q) = 1/2 sum_v |p(v) - q(v)|,       alpha(p, q) = 1 - TV(p, q)
    R_k(x)   = 1/M sum_r TV(p_k^(r), q_k^(r))                         (B.5)
    G_k^(m)  = R_k - T_k^(m)                   (paired within the anchor)
    E_k      = R_k^self - R_k^oracle                                   (exposure)
    R_k^self = T_k^(1) + G_k^(1) + E_k,   G_k^(1) = R_k^oracle - T_k^(1)   (eq. in 3.3)

R^oracle and R^self are the same path average; they differ only in which q is passed in
(the head fed the target's realised predecessor vs the drafter's own sampled predecessor).

Proposals are compared with the target under the *same* sampling law; ``warp_logits`` and
``warp_probs`` apply temperature, top-k and top-p to either side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from floorgap.estimators.barycentre import tv_distance

__all__ = [
    "SelfRiskDecomposition",
    "acceptance",
    "anchor_risk",
    "decompose_self_risk",
    "exposure",
    "model_gap",
    "oracle_risk",
    "self_risk",
    "tv_distance",
    "warp_logits",
    "warp_probs",
]


def acceptance(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """Pairwise acceptance alpha(p, q) = sum_v min(p(v), q(v)) = 1 - TV(p, q) (Sec. 2).

    Its complement 1 - alpha is the per-slot rejection probability that R_k averages (paper Sec. 2,
    App. A.1).

    Parameters
    ----------
    p : Tensor
        Target distribution p_k, ``[..., V]``.
    q : Tensor
        Proposal q_k, broadcastable against ``p``.
    dim : int, optional
        The vocabulary dimension that is summed over.

    Returns
    -------
    Tensor
        alpha(p, q) in [0, 1]: the broadcast shape without ``dim``.
    """
    return torch.minimum(p, q).sum(dim)


def anchor_risk(p: Tensor, q: Tensor, path_dim: int = -2) -> Tensor:
    """Free-rollout risk at an anchor, R_k(x) = 1/M sum_r TV(p_k^(r), q_k^(r)) (B.5).

    ``p`` and ``q`` are (..., M, V) with paths on ``path_dim`` and the vocabulary last;
    ``q`` broadcasts (an order-0 proposal that is one row for all paths may be (..., 1, V)).

    This is the per-anchor drafter risk of paper App. B.5, the R_k of paper Sec. 2.

    Parameters
    ----------
    p : Tensor
        ``[..., M, V]`` the target's next-token distributions p_k^(r) on the M paths.
    q : Tensor
        The proposals q_k^(r) on the same paths, broadcastable against ``p``.
    path_dim : int, optional
        The path dimension; it must not be the last (vocabulary) one.

    Returns
    -------
    Tensor
        R_k(x), the path mean of the TVs: the broadcast shape without the path and vocabulary
        dimensions, e.g. ``[...]``.
    """
    p, q = torch.broadcast_tensors(p, q)
    d = path_dim % p.dim()
    if d == p.dim() - 1:
        raise ValueError("path_dim must differ from the vocabulary dim (the last one)")
    # the vocabulary dim is reduced first; ``d`` counts from the front so it is unchanged
    return tv_distance(p, q, dim=-1).mean(dim=d)


def oracle_risk(p: Tensor, q_oracle: Tensor, path_dim: int = -2) -> Tensor:
    """R_k^oracle = E[TV(p_k, q_{D,k}(. | X, Z_{k-1}))]: q fed the target's realised predecessor.

    Defined in paper Sec. 3.3 (estimated as in paper App. E.2); the path average is that of
    :func:`anchor_risk`.

    Parameters
    ----------
    p, path_dim
        As in :func:`anchor_risk`.
    q_oracle : Tensor
        The drafter's proposal at slot k when fed the target's realised predecessor Z_{k-1},
        broadcastable against ``p``.

    Returns
    -------
    Tensor
        R_k^oracle at each anchor, ``[...]``.
    """
    return anchor_risk(p, q_oracle, path_dim)


def self_risk(p: Tensor, q_self: Tensor, path_dim: int = -2) -> Tensor:
    """R_k^self: q fed the drafter's own sampled predecessor, scored against the target's p_k.

    Defined with the decomposition of paper Sec. 3.3 (estimated as in paper App. E.2); the path
    average is that of :func:`anchor_risk`.

    Parameters
    ----------
    p, path_dim
        As in :func:`anchor_risk`.
    q_self : Tensor
        The drafter's proposal at slot k when fed its own sampled predecessor, broadcastable
        against ``p``.

    Returns
    -------
    Tensor
        R_k^self at each anchor, ``[...]``.
    """
    return anchor_risk(p, q_self, path_dim)


def model_gap(risk: Tensor, floor: Tensor) -> Tensor:
    """Model gap G_k^(m) = R_k - T_k^(m), formed within each anchor (paired).

    See paper Sec. 2 (definition) and Sec. 3.3 (the paired estimates).

    Parameters
    ----------
    risk : Tensor
        Drafter risk per anchor: R_k, or R_k^oracle for the order-1 gap G_k^(1).
    floor : Tensor
        Information floor T_k^(m) on the same anchors, broadcastable against ``risk``.

    Returns
    -------
    Tensor
        G_k^(m) per anchor, the broadcast shape.
    """
    return risk - floor


def exposure(r_self: Tensor, r_oracle: Tensor) -> Tensor:
    """Exposure difference E_k^expo = R_k^self - R_k^oracle.

    It is the third term of the decomposition of R_k^self in paper Sec. 3.3 (App. E.2).

    Parameters
    ----------
    r_self : Tensor
        R_k^self per anchor (drafter fed its own sampled predecessor).
    r_oracle : Tensor
        R_k^oracle on the same anchors, broadcastable against ``r_self``.

    Returns
    -------
    Tensor
        E_k^expo per anchor, the broadcast shape.
    """
    return r_self - r_oracle


@dataclass(frozen=True)
class SelfRiskDecomposition:
    """R^self = floor + gap + exposure, elementwise per anchor (and slot)."""

    floor: Tensor
    gap: Tensor
    exposure: Tensor
    total: Tensor


def decompose_self_risk(r_self: Tensor, r_oracle: Tensor, floor: Tensor) -> SelfRiskDecomposition:
    """R_k^self = T_k^(1) + G_k^(1) + E_k^expo with G^(1) = R^oracle - T^(1) (eq. in Sec. 3.3).

    The identity is exact by construction; components are per anchor so they can be
    aggregated (and bootstrapped) before rounding.

    See also paper App. E.2 and H.5 for the reported decompositions.

    Parameters
    ----------
    r_self : Tensor
        R_k^self per anchor (and slot).
    r_oracle : Tensor
        R_k^oracle on the same anchors.
    floor : Tensor
        The order-1 floor T_k^(1) on the same anchors.

    Returns
    -------
    SelfRiskDecomposition
        ``floor``, ``gap`` (G_k^(1)), ``exposure`` (E_k^expo) and their sum ``total``, which
        equals ``r_self`` up to rounding; elementwise per anchor.
    """
    gap = model_gap(r_oracle, floor)
    exp = exposure(r_self, r_oracle)
    return SelfRiskDecomposition(floor=floor, gap=gap, exposure=exp, total=floor + gap + exp)


def _truncate(probs: Tensor, top_p: float, top_k: int | None) -> Tensor:
    """Zero out tokens outside top-k and outside the top-p nucleus, then renormalise (``probs``
    itself when neither truncates)."""
    v = probs.shape[-1]
    if top_p >= 1.0 and (top_k is None or top_k <= 0 or top_k >= v):
        return probs
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k is not None and 0 < top_k < v:
        # ties with the k-th largest are kept, as the usual logit-threshold rule does
        kth = torch.topk(probs, top_k, dim=-1).values[..., -1:]
        keep &= probs >= kth
    if top_p < 1.0:
        masked = torch.where(keep, probs, torch.zeros_like(probs))
        masked = masked / masked.sum(-1, keepdim=True)
        srt, order = torch.sort(masked, dim=-1, descending=True)
        # keep a token while the mass strictly before it is below top_p (the top token always)
        before = torch.cumsum(srt, dim=-1) - srt
        keep_sorted = before < top_p
        keep_sorted[..., 0] = True
        nucleus = torch.zeros_like(keep).scatter(-1, order, keep_sorted)
        keep &= nucleus
    out = torch.where(keep, probs, torch.zeros_like(probs))
    return out / out.sum(-1, keepdim=True)


def _check_law(temperature: float, top_p: float) -> None:
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    if not 0.0 < top_p <= 1.0:
        raise ValueError("top_p must lie in (0, 1]")


def warp_logits(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0,
                top_k: int | None = None) -> Tensor:
    """Probabilities of the sampling law (temperature, then top-k, then top-p) from logits.

    At temperature 1 with top_p = 1 and no top_k it is exactly the softmax.  Applied to the
    target and to the proposal alike, so TV, R and floors are measured under one law (C.7).

    See paper App. C.7 for the sampling laws compared.

    Parameters
    ----------
    logits : Tensor
        ``[..., V]`` unnormalised log-probabilities.
    temperature : float, optional
        Temperature T > 0; the logits are divided by it.
    top_p : float, optional
        Nucleus mass in (0, 1]; 1 keeps every token.
    top_k : int or None, optional
        Number of most likely tokens kept (ties with the k-th are kept too); None, 0 or at
        least V keeps every token.

    Returns
    -------
    Tensor
        ``[..., V]`` probabilities of the warped law, zero outside the kept tokens.
    """
    _check_law(temperature, top_p)
    # x / 1 == x exactly: at temperature 1 the division (a pass over [..., V]) is skipped
    probs = torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
    return _truncate(probs, top_p, top_k)


def warp_probs(probs: Tensor, temperature: float = 1.0, top_p: float = 1.0,
               top_k: int | None = None) -> Tensor:
    """The same warp on probabilities: p^(1/T) renormalised, then top-k and top-p.

    Zero-probability tokens stay at zero; equals ``warp_logits(log p, ...)``.

    Used like :func:`warp_logits` to put both sides under one sampling law (paper App. C.7).

    Parameters
    ----------
    probs : Tensor
        ``[..., V]`` probabilities (rows need not be exactly normalised).
    temperature : float, optional
        Temperature T > 0; p is raised to the power 1/T and renormalised.
    top_p, top_k
        As in :func:`warp_logits`.

    Returns
    -------
    Tensor
        ``[..., V]`` probabilities of the warped law, zero outside the kept tokens.
    """
    _check_law(temperature, top_p)
    if temperature == 1.0:
        out = probs / probs.sum(-1, keepdim=True)
    else:
        # through log space so large 1/T does not underflow every coordinate
        out = torch.softmax(torch.log(probs) / temperature, dim=-1)
    return _truncate(out, top_p, top_k)

