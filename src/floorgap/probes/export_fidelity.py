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

With a reference the fault is also named (:func:`diagnose_folder`): the folder's config and
weights set beside the reference's (its input scale folded as the export folds it) say which
of the faults users meet it is: the block layout flipped, the target layers offset, the mask
rows fed as another token, the fusion's input columns permuted, or which weights differ.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from floorgap.estimators.barycentre import tv_distance
from floorgap.models.engine_formats import BLOCK_LAYOUTS, fold_input_scale
from floorgap.probes.drafter_eval import drafter_inputs
from floorgap.sampling import SamplingLaw

__all__ = ["FidelitySlot", "compare_drafters", "diagnose_folder", "proposals"]


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
    if (int(candidate.gamma), int(candidate.order)) != (int(reference.gamma), int(reference.order)):
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


def _mask(cfg: Any) -> str:
    return (f"a trained mask embedding (token {cfg.mask_token_id})" if cfg.mask_embedding
            else f"token {cfg.mask_token_id}'s embedding")


def diagnose_folder(reference: Any, folder_cfg: Any,
                    folder_state: Mapping[str, Tensor] | None = None) -> list[str]:
    """The faults by name that make a folder (its imported config ``folder_cfg`` and, when it
    imports, its drafter's ``folder_state``) read otherwise than ``reference`` (the trained
    drafter it was exported from): its block layout, target layers, mask rows, the permutation
    of the fusion's input columns (the taps' feature blocks), other weights that differ. Empty
    for a faithful export."""
    ref = reference.cfg
    out = []
    if ref.sample_from_anchor != folder_cfg.sample_from_anchor:
        out.append(f"block layout flipped: the folder reads as "
                   f"{BLOCK_LAYOUTS[folder_cfg.sample_from_anchor]}, the weights were trained "
                   f"{BLOCK_LAYOUTS[ref.sample_from_anchor]}")
    taps, ref_taps = list(folder_cfg.taps), list(ref.taps)
    shift = {t - r for t, r in zip(taps, ref_taps)} if len(taps) == len(ref_taps) else set()
    if taps != ref_taps:
        step = next(iter(shift)) if len(shift) == 1 else None
        out.append((f"target-layer index offset by {step:+d}" if step is not None
                    else "other target layers") + f": the folder taps layers {taps}, the "
                   f"weights were trained on {ref_taps}")
    if (ref.mask_token_id, ref.mask_embedding) != (folder_cfg.mask_token_id,
                                                   folder_cfg.mask_embedding):
        out.append(f"wrong mask token: the folder feeds the mask rows {_mask(folder_cfg)}, the "
                   f"weights were trained with {_mask(ref)}")
    if folder_state is None:
        return out
    _, expected = fold_input_scale(ref, reference.state_dict())
    differ = sorted(k for k, v in folder_state.items() if k in expected
                    and (v.shape != expected[k].shape
                         or not torch.allclose(v.float(), expected[k].float(), rtol=1e-5,
                                               atol=1e-7)))
    fc = next((k for k in differ if k.endswith("fc.weight")), None)
    if fc is not None:
        order = _column_blocks(expected[fc], folder_state[fc], len(ref_taps))
        if order is not None:
            out.append(f"fc input columns permuted: the folder's fusion reads the taps' feature "
                       f"blocks in the order {order} of the trained one")
            differ.remove(fc)
    if differ:
        out.append(f"weights differ from the reference: {', '.join(differ[:6])}"
                   + (f" and {len(differ) - 6} more" if len(differ) > 6 else ""))
    return out


def _column_blocks(expected: Tensor, found: Tensor, blocks: int) -> tuple[int, ...] | None:
    """The order of ``expected``'s column blocks that ``found`` holds, if it is a reordering."""
    if expected.shape != found.shape or expected.shape[-1] % blocks:
        return None
    width = expected.shape[-1] // blocks
    parts = expected.split(width, dim=-1)
    for order in itertools.permutations(range(blocks)):
        if order != tuple(range(blocks)) and torch.allclose(
                torch.cat([parts[i] for i in order], -1).float(), found.float()):
            return order
    return None
