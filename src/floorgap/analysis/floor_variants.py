"""Summaries of the robustness variants of the floors (paper App. C.3, C.4, C.7): by law, M and
slot, the mean over the variant's anchors of T^(0) (in-sample), its split-half fit check, the
order-1 plug-in, and the split-half T^(1) on covered paths with the share of T^(0) it removes
(ratios of covered-mass-weighted sums, as the floors summary forms its headline share).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEYS = ["law", "paths", "slot"]


def summarise_variant(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (law, paths, slot): anchors, t0, t0_split, fit_diff (t0_split - t0), t1_plugin,
    t1_split (covered), covered_mass and share_removed."""
    out = []
    for key, g in rows.groupby(KEYS, sort=True):
        c = g["t1_covered_mass"].to_numpy(float)
        t1c = np.nan_to_num(g["t1_split_cov"].to_numpy(float))
        t0c = np.nan_to_num(g["t0_covered"].to_numpy(float))
        covered = c.sum()
        out.append({
            **dict(zip(KEYS, key)), "anchors": int(g["anchor_id"].nunique()),
            "t0": float(g["t0"].mean()), "t0_split": float(g["t0_split"].mean()),
            "fit_diff": float((g["t0_split"] - g["t0"]).mean()),
            "t1_plugin": float(g["t1_plugin"].mean()),
            "t1_split": float((c * t1c).sum() / covered) if covered > 0 else np.nan,
            "covered_mass": float(c.mean()),
            "share_removed": (1 - float((c * t1c).sum() / (c * t0c).sum())
                              if (c * t0c).sum() > 0 else np.nan)})
    return pd.DataFrame(out)
