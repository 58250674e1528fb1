"""The probes' record rows, one dataclass per parquet row kind: what the rollout probe
(:mod:`floorgap.probes.rollouts`) and the evaluation probe (:mod:`floorgap.probes.drafter_eval`)
write, and whose fields the analyses read as columns. Kept apart from the probes so an analysis
reads them without importing torch's model code or transformers."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PathRecord", "SlotFloorRecord", "PathSlotRecord", "SlotRiskRecord"]


@dataclass(frozen=True)
class PathRecord:
    """One sampled path at an anchor: realised tokens, their log-probabilities log p_k(Z_k),
    the top-K read of p_k at every slot (flattened slot-major) and its residual mass."""

    anchor_id: str
    path: int
    tokens: list[int]
    logp: list[float]
    topk_ids: list[int]
    topk_probs: list[float]
    residual: list[float]


@dataclass(frozen=True)
class SlotFloorRecord:
    """Floors at one anchor and slot, computed from the full-vocabulary p_k^(r) on the device.

    t0 / t0_split: T^(0) in-sample and split-half; t1_*: split-half T^(1) by predecessor
    grouping (covered floor T_cov, covered mass c, bounds c T_cov <= T <= c T_cov + 1 - c,
    uncovered paths) and its in-sample plug-in; t0_covered: the in-sample order-0 floor's mean
    per-path TV over the same covered paths (T^(0) on the population of T_cov);
    t1_reweighted: mean over the revealed predecessors whose importance weights are not all
    zero of the importance-reweighted floor, with the smallest and mean Kish ESS over them;
    t1_reweighted_undefined: how many of the J revealed predecessors had all-zero weights
    (possible under truncated laws; they are left out of the mean, and the cell is NaN only
    when all J are); n_eff: effective support of the k-token block prefixes (1 at slot 0).
    """

    anchor_id: str
    slot: int
    t0: float
    t0_split: float
    t0_covered: float
    t1_split_cov: float
    t1_covered_mass: float
    t1_lower: float
    t1_upper: float
    t1_uncovered_paths: int
    t1_plugin: float
    t1_reweighted: float
    t1_reweighted_ess_min: float
    t1_reweighted_ess_mean: float
    t1_reweighted_undefined: int
    n_eff: float


@dataclass(frozen=True)
class PathSlotRecord:
    """One path at one slot. ``q_tok`` and ``accept`` use the oracle proposal at order 1;
    ``self_token``/``q_self_tok``/``tv_self`` describe the drafter's own chain (order 1 only:
    -1/NaN at order 0, where the proposal does not depend on the chain)."""

    anchor_id: str
    path: int
    slot: int
    committed_token: int
    token: int
    p_tok: float
    q_tok: float
    tv: float
    accept: float
    self_token: int
    q_self_tok: float
    tv_self: float


@dataclass(frozen=True)
class SlotRiskRecord:
    """Risks at one anchor and slot: ``risk`` is R_k (order 0) or R_k^oracle (order 1);
    ``risk_oracle`` and ``risk_self`` equal ``risk`` at order 0 (its proposal ignores the
    chain); ``exposure`` = R^self - R^oracle. ``logp_mismatches`` counts paths whose recomputed
    p_k(Z_k) differs from the stored one by more than ``LOGP_ATOL``; ``logp_max_abs_diff`` is
    the largest difference."""

    anchor_id: str
    slot: int
    order: int
    risk: float
    risk_oracle: float
    risk_self: float
    exposure: float
    logp_mismatches: int
    logp_max_abs_diff: float
