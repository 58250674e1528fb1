"""Does a checkpoint folder read as the weights it was exported from?

A drafter trained here and exported for an engine (:mod:`floorgap.models.engine_formats`) can
be checked against its trained weights before export: both are run on the same anchors (the
context, and for slot k > 0 the target's own block as the predecessors, as the evaluation
probe's oracle mode feeds them) and their proposals q_k compared slot by slot. A faithful
export reads back to the same q up to the folder's dtype; a folder written with the block rows
shifted by one (anchor rows read as mask rows), the wrong mask token, or the feature columns of
the taps permuted does not, and the difference shows at once, before any GPU time is spent
serving it. Without such a reference (a foreign folder) an export fault looks offline like a
poorly trained drafter; only serving the folder beside floorgap's import of it tells them apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from floorgap.estimators.barycentre import tv_distance
from floorgap.probes.drafter_eval import drafter_inputs
from floorgap.sampling import SamplingLaw

__all__ = ["FidelitySlot", "compare_drafters", "proposals"]


@dataclass(frozen=True)
class FidelitySlot:
    """Slot ``slot`` over ``blocks`` anchors: the largest |q_ref - q| of any token, the mean
    TV(q_ref, q) and the share of anchors whose most likely token is the same."""

    slot: int
    blocks: int
    max_abs_dq: float
    mean_tv: float
    argmax_agreement: float


@torch.inference_mode()
def proposals(target: Any, drafter: Any, context_ids: list[int], block: Tensor,
              law: SamplingLaw) -> Tensor:
    """q_k [G, V] of ``drafter`` at one anchor, the target's ``block`` [G] as predecessors."""
    feats, committed, mask = drafter_inputs(target, drafter, context_ids)
    rows = block.long().view(1, -1).to(feats.device)
    return law.probs(drafter.propose_paths(feats, committed, rows, mask)[0].double())


def compare_drafters(target: Any, reference: Any, candidate: Any,
                     contexts: Sequence[list[int]], blocks: Sequence[Tensor], *,
                     law: SamplingLaw) -> list[FidelitySlot]:
    """The candidate's proposals against the reference's at every slot, over the anchors
    ``contexts`` with their target blocks ``blocks`` (each [G]). Raises ValueError when the two
    do not draft the same slots or orders (a structural mismatch, itself a layout fault)."""
    if int(candidate.gamma) != int(reference.gamma) or int(candidate.order) != int(
            reference.order):
        raise ValueError(f"the folder drafts {candidate.gamma} slots of order {candidate.order}, "
                         f"the reference {reference.gamma} of order {reference.order}")
    if not contexts:
        raise ValueError("no anchors to compare the drafters on")
    gamma = int(reference.gamma)
    dq, tv, agree = [], [], []
    for context, block in zip(contexts, blocks, strict=True):
        q_ref = proposals(target, reference, context, block[:gamma], law)
        q = proposals(target, candidate, context, block[:gamma], law)
        dq.append((q_ref - q).abs().amax(-1))
        tv.append(tv_distance(q_ref, q, dim=-1))
        agree.append((q_ref.argmax(-1) == q.argmax(-1)).double())
    dq_, tv_, agree_ = torch.stack(dq), torch.stack(tv), torch.stack(agree)
    return [FidelitySlot(slot=k, blocks=len(contexts), max_abs_dq=float(dq_[:, k].max()),
                         mean_tv=float(tv_[:, k].mean()),
                         argmax_agreement=float(agree_[:, k].mean())) for k in range(gamma)]
