"""Summaries of the robustness variants of the floors (paper App. C.3, C.4, C.7): by law, M and
slot, the mean over the variant's anchors of T^(0) (in-sample), its split-half fit check, the
order-1 plug-in, and the split-half T^(1) on covered paths with the share of T^(0) it removes
(ratios of covered-mass-weighted sums, as the floors summary forms its headline share).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from floorgap.estimators.aggregate import weighted_ratio

KEYS = ["law", "paths", "slot"]


def covered_floor_ratios(covered_mass: object, t1_covered: object, t0_covered: object = None
                         ) -> tuple[float, float]:
    """The split-half T^(1) on covered paths over a set of anchors, sum c T_cov / sum c, and the
    share of T^(0) it removes there, 1 - sum c T_cov / sum c T0_cov (ratios of sums,
    :func:`~floorgap.estimators.aggregate.weighted_ratio`; a missing T_cov counts 0). NaN where
    a denominator is 0 (or ``t0_covered`` is not given)."""
    c = torch.tensor(np.asarray(covered_mass, dtype=float))
    t1 = torch.tensor(np.nan_to_num(np.asarray(t1_covered, dtype=float)))

    def ratio(den: torch.Tensor) -> float:
        return float(weighted_ratio(c * t1, den)) if float(den.sum()) > 0 else math.nan

    t1_value = ratio(c)
    if t0_covered is None:
        return t1_value, math.nan
    t0 = torch.tensor(np.nan_to_num(np.asarray(t0_covered, dtype=float)))
    return t1_value, 1 - ratio(c * t0)


def summarise_variant(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (law, paths, slot): anchors, t0, t0_split, fit_diff (t0_split - t0), t1_plugin,
    t1_split (covered), covered_mass and share_removed."""
    out = []
    for key, g in rows.groupby(KEYS, sort=True):
        t1_split, share_removed = covered_floor_ratios(g["t1_covered_mass"], g["t1_split_cov"],
                                                       g["t0_covered"])
        out.append({
            **dict(zip(KEYS, key)), "anchors": int(g["anchor_id"].nunique()),
            "t0": float(g["t0"].mean()), "t0_split": float(g["t0_split"].mean()),
            "fit_diff": float((g["t0_split"] - g["t0"]).mean()),
            "t1_plugin": float(g["t1_plugin"].mean()),
            "t1_split": t1_split, "covered_mass": float(g["t1_covered_mass"].mean()),
            "share_removed": share_removed})
    return pd.DataFrame(out)
