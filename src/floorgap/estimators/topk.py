"""Divergences between a proposal and a target known only through its stored top-K.

The training records keep p_k as its K most likely tokens; the mass 1 - sum p_K outside them is
known but not where it lies. Merging the other V - K tokens into one bucket gives a coarsened
pair of distributions whose KL and TV are computable exactly and bound the full ones from below.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["logsumexp_gather", "topk_divergences", "topk_tv"]


class _LogSumExpGather(torch.autograd.Function):
    """(logsumexp(z), z[ids]) in float32; d lse / dz = softmax(z), kept from the forward."""

    @staticmethod
    def forward(ctx, logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        # one fused pass gives q = softmax(z) in float32; log Z then follows from any entry,
        # log Z = z_j - log q_j, taken at the mode (max z, max q) where q_j >= 1/V is precise
        q = torch.softmax(logits, -1, dtype=torch.float32)
        lse = logits.amax(-1).float() - q.amax(-1).log()
        picked = logits.gather(-1, ids).float()
        ctx.save_for_backward(q, ids)
        ctx.dtype = logits.dtype
        return lse, picked

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lse: Tensor | None, g_picked: Tensor | None  # type: ignore[override]
                 ) -> tuple[Tensor, None]:
        q, ids = ctx.saved_tensors
        # autograd's own graph (float copy, sub, exp, mul, a dense scatter, a cast back) makes
        # about a dozen passes over [..., V]; this makes two, which matters because the rows
        # are the whole vocabulary and the loss is most of a drafter's training step
        grad = q.mul_(g_lse.unsqueeze(-1)) if g_lse is not None else q.zero_()
        if g_picked is not None:
            grad.scatter_add_(-1, ids, g_picked)
        return grad.to(ctx.dtype), None


def logsumexp_gather(logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(logsumexp(logits, -1), logits.gather(-1, ids))``, both float32, differentiable in
    ``logits`` with a fused backward (the gradient of the normaliser log Z of q = softmax(z) is
    q itself). ``logits`` [..., V] may be low precision; ``ids`` [..., K] are int64.

    It serves the top-K drafter loss and held-out risk (paper App. H.2, B.5).

    Parameters
    ----------
    logits : Tensor
        ``[..., V]`` logits z, any floating dtype.
    ids : Tensor
        ``[..., K]`` token indices to read (cast to int64).

    Returns
    -------
    lse : Tensor
        ``[...]`` float32 log Z = logsumexp(z).
    picked : Tensor
        ``[..., K]`` float32 logits at ``ids``.
    """
    return _LogSumExpGather.apply(logits, ids.long())


def _residuals(p_k: Tensor, q_k: Tensor) -> tuple[Tensor, Tensor]:
    """(r_p, r_q): the mass outside the stored tokens, r_q kept positive for KL's log."""
    return (1 - p_k.sum(-1)).clamp(min=0.0), (1 - q_k.sum(-1)).clamp(min=1e-12)


def topk_tv(p_k: Tensor, q_k: Tensor) -> Tensor:
    """TV(p, q) on the coarsening into the K stored tokens plus one residual bucket, from both
    distributions' masses at the stored tokens (what :func:`topk_divergences` reports as
    ``tv``, for a q known only there, e.g. a lookup table's; paper App. B.5, C.6).

    Parameters
    ----------
    p_k : Tensor
        ``[..., K]`` the target's stored probabilities.
    q_k : Tensor
        ``[..., K]`` the proposal's probabilities at the same tokens.

    Returns
    -------
    Tensor
        ``[...]`` 1/2 (sum_K |p_k - q_k| + |r_p - r_q|), a lower bound of the full TV.
    """
    r_p, r_q = _residuals(p_k, q_k)
    return 0.5 * ((p_k - q_k).abs().sum(-1) + (r_p - r_q).abs())


def topk_divergences(logits: Tensor, ids: Tensor, vals: Tensor, valid: Tensor | None = None
                     ) -> dict[str, Tensor]:
    """KL(p || q) and TV(p, q) per row ([...]) with q = softmax(logits [..., V]) and p given by
    its top-K ``ids``/``vals`` [..., K] (distinct ids), on the coarsening of
    the vocabulary into the K stored tokens plus one residual bucket (mass r_p = 1 - sum p_K
    against r_q = 1 - sum q_K). Both are lower bounds of the full divergences (data
    processing) and equal them when the stored top-K carries all of p's mass.

    ``valid`` [..., K] (bool) marks the stored tokens inside q's support when q lives on a
    trimmed draft vocabulary (``logits`` are then over that vocabulary and ``ids`` index it):
    q is exactly zero at the others, whose ids are ignored, and the residual bucket is the rest
    of the draft vocabulary. KL is infinite where p puts mass outside the support.

    These are the drafter training objectives and the top-K form of the risk TV(p_k, q_k)
    (paper App. H.2, B.5); r_p is the residual mass of a top-K read (paper App. C.6).

    Parameters
    ----------
    logits : Tensor
        ``[..., V]`` proposal logits; q = softmax(logits).
    ids : Tensor
        ``[..., K]`` distinct token ids of p's stored top-K.
    vals : Tensor
        ``[..., K]`` p's probabilities of those tokens.
    valid : Tensor or None, optional
        ``[..., K]`` bool, the stored tokens inside q's support; None when q covers the whole
        vocabulary.

    Returns
    -------
    dict[str, Tensor]
        ``"kl"``: KL(p || q) in nats and ``"tv"``: TV(p, q), each ``[...]`` float32 on the
        coarsened vocabulary.
    """
    # gather before normalising: one [..., V] pass (the logsumexp) instead of a full log q
    ids = ids if valid is None else torch.where(valid, ids, torch.zeros_like(ids))
    lse, picked = logsumexp_gather(logits, ids)
    logq_k = picked - lse.unsqueeze(-1)                                    # [..., K]
    if valid is not None:
        logq_k = logq_k.masked_fill(~valid, float("-inf"))
    q_k = logq_k.exp()
    p_k = vals.float()
    r_p, r_q = _residuals(p_k, q_k)
    plogp = torch.where(p_k > 0, p_k * p_k.clamp_min(1e-30).log(), torch.zeros_like(p_k))
    cross = torch.where(p_k > 0, p_k * logq_k, torch.zeros_like(p_k))
    kl = (plogp - cross).sum(-1)
    kl = kl + torch.where(r_p > 0, r_p * (r_p.clamp_min(1e-30).log() - r_q.log()),
                          torch.zeros_like(r_p))
    tv = topk_tv(p_k, q_k)
    return {"kl": kl, "tv": tv}
