"""Divergences between a proposal and a target known only through its stored top-K.

The training records keep p_k as its K most likely tokens; the mass 1 - sum p_K outside them is
known but not where it lies. Merging the other V - K tokens into one bucket gives a coarsened
pair of distributions whose KL and TV are computable exactly and bound the full ones from below.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["topk_divergences"]


def topk_divergences(logits: Tensor, ids: Tensor, vals: Tensor) -> dict[str, Tensor]:
    """KL(p || q) and TV(p, q) per row ([...]) with q = softmax(logits [..., V]) and p given by
    its top-K ``ids``/``vals`` [..., K] (distinct ids), on the coarsening of
    the vocabulary into the K stored tokens plus one residual bucket (mass r_p = 1 - sum p_K
    against r_q = 1 - sum q_K). Both are lower bounds of the full divergences (data
    processing) and equal them when the stored top-K carries all of p's mass."""
    # gather before normalising: one [..., V] pass (the logsumexp) instead of a full log q
    lse = torch.logsumexp(logits.float(), -1, keepdim=True)
    logq_k = logits.float().gather(-1, ids.long()) - lse                   # [..., K]
    q_k = logq_k.exp()
    p_k = vals.float()
    r_p = (1 - p_k.sum(-1)).clamp(min=0.0)
    r_q = (1 - q_k.sum(-1)).clamp(min=1e-12)
    plogp = torch.where(p_k > 0, p_k * p_k.clamp_min(1e-30).log(), torch.zeros_like(p_k))
    kl = (plogp - p_k * logq_k).sum(-1)
    kl = kl + torch.where(r_p > 0, r_p * (r_p.clamp_min(1e-30).log() - r_q.log()),
                          torch.zeros_like(r_p))
    tv = 0.5 * ((p_k - q_k).abs().sum(-1) + (r_p - r_q).abs())
    return {"kl": kl, "tv": tv}
