"""API floors: per anchor and slot, T~^(0) and T~^(1) from the endpoint's top-K reads with their
omitted-mass bounds, the matched-path check against the full vocabulary, and the summary by slot
(paper Sec. 3.4, App. C.6; tableC6_api_floors).

An anchor-slot cell is *complete* when every one of its M paths reached the slot (a path an
endpoint stops early, at an end-of-sequence token, ends its record); incomplete cells are
counted and left out, as the paper's frontier sample counts the anchors with a complete slot-6
record. Tokens are the endpoint's keys, mapped to integers per anchor.

A cell's full-vocabulary value is *contained* when it lies in the band ``[lower - tol,
upper + tol]``; ``tol`` is the numerical resolution of two engines computing the same
probabilities (float32 vLLM and transformers differ in their last bits; App. C.1 treats 1e-3
as the floor estimators' resolution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
import torch

from floorgap.analysis.floor_variants import covered_floor_ratios
from floorgap.estimators.truncation import truncated_slot_floors

#: the floors compared on the same paths: the in-sample T^(0) and the order-1 plug-in, whose
#: omitted-mass bands are exact (see TruncatedSlotFloors)
MATCHED = ("t0", "t1_plugin")


def reads_table(reads: Mapping[str, Sequence[Any]], anchors: pd.DataFrame) -> pd.DataFrame:
    """One row per (anchor, path) of the reads (``PathRead`` objects), in the anchors' order."""
    rows = []
    for a in anchors.itertuples(index=False):
        for r in reads[a.anchor_id]:
            rows.append({"anchor_id": a.anchor_id, "domain": a.domain, **asdict(r)})
    return pd.DataFrame(rows)


def _anchor_arrays(paths: pd.DataFrame, k: int, top_k: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Slot k's reads of one anchor as (indices [M, K], probs, residual [M], predecessor ids).

    Only the ``top_k`` largest entries of each read are kept: an endpoint that appends the
    sampled token when it lies outside the top K would otherwise give paths with the same
    distribution different supports (and a spurious floor at slot 0)."""
    keys: dict[str, int] = {}

    def ids(seq: Sequence[str]) -> list[int]:
        return [keys.setdefault(t, len(keys)) for t in seq]

    idx = torch.full((len(paths), top_k), -1, dtype=torch.long)
    val = torch.zeros((len(paths), top_k), dtype=torch.float64)
    for i, (toks, lp) in enumerate(zip(paths["top_tokens"], paths["top_logp"])):
        logp = np.asarray(lp[k], dtype=np.float64)
        keep = np.argsort(-logp, kind="stable")[:top_k]
        idx[i, :len(keep)] = torch.tensor(ids([toks[k][j] for j in keep]), dtype=torch.long)
        val[i, :len(keep)] = torch.from_numpy(np.exp(logp[keep]))
    residual = (1 - val.sum(-1)).clamp(min=0)
    pred = None if k == 0 else torch.tensor(ids([t[k - 1] for t in paths["tokens"]]))
    return idx, val, residual, pred


def anchor_slot_floors(reads: pd.DataFrame, gamma: int, top_k: int,
                       full: pd.DataFrame | None = None, tolerance: float = 1e-3
                       ) -> pd.DataFrame:
    """T~^(0), T~^(1), their bounds and E[r] for every anchor and slot (NaN when incomplete);
    with ``full`` (columns anchor_id, slot, t0, t1_plugin, t1_split_cov, t1_covered_mass: the
    full-vocabulary floors on the same paths) also ``full_*`` and the containment flags."""
    rows = []
    for anchor_id, paths in reads.groupby("anchor_id", sort=False):
        paths = paths.sort_values("path")
        lengths = paths["tokens"].map(len)
        for k in range(gamma):
            row: dict[str, Any] = {"anchor_id": anchor_id, "domain": paths["domain"].iloc[0],
                                   "slot": k, "paths": len(paths),
                                   "complete": bool((lengths > k).all())}
            if row["complete"]:
                row.update(asdict(truncated_slot_floors(*_anchor_arrays(paths, k, top_k))))
            rows.append(row)
    out = pd.DataFrame(rows)
    if full is None:
        return out
    renamed = full.rename(columns={c: f"full_{c}" for c in full.columns
                                   if c not in ("anchor_id", "slot")})
    out = out.merge(renamed, on=["anchor_id", "slot"], how="left", validate="one_to_one")
    for name in MATCHED:
        lower, upper = out[f"{name}_lower"], out[f"{name}_upper"]
        value = out[f"full_{name}"]
        out[f"{name}_contained"] = ((value >= lower - tolerance) & (value <= upper + tolerance)
                                    ).where(out["complete"])
    return out


def summarise(floors: pd.DataFrame) -> pd.DataFrame:
    """By slot (scope ``all`` and each domain): complete anchors, mean T~^(0) with its bounds,
    split-half T~^(0), the order-1 plug-in with its bounds, the held-out T~^(1) on covered paths
    and the share of T~^(0) it removes there (covered-mass-weighted ratios), the mean omitted
    mass, and with the matched check the full-vocabulary means and containment counts."""
    rows = []
    scopes = [("all", floors)] + [(d, g) for d, g in floors.groupby("domain", sort=True)]
    for scope, df in scopes:
        for k, cells in df.groupby("slot", sort=True):
            ok = cells[cells["complete"]]
            row: dict[str, Any] = {
                "scope": scope, "slot": int(k), "anchors": int(len(ok)),
                "incomplete": int((~cells["complete"]).sum())}
            for col in ("t0", "t0_lower", "t0_upper", "t0_split", "t1_plugin", "t1_plugin_lower",
                        "t1_plugin_upper", "t1_lower", "t1_upper", "omitted"):
                row[col] = float(ok[col].mean()) if len(ok) else float("nan")
            # the held-out T~^(1) on covered paths and the share of T~^(0) it removes there:
            # ratios of covered-mass-weighted sums, as the floors summary forms its headline
            row["t1_held_out"], row["t1_removed_share"] = covered_floor_ratios(
                ok["t1_covered_mass"], ok["t1_split_cov"], ok["t0_covered"])
            for name in MATCHED:
                if f"full_{name}" in ok:
                    row[f"full_{name}"] = float(ok[f"full_{name}"].mean()) if len(ok) else np.nan
                    row[f"{name}_max_abs_diff"] = (float((ok[f"full_{name}"] - ok[name]).abs()
                                                         .max()) if len(ok) else np.nan)
                    row[f"{name}_contained"] = int(ok[f"{name}_contained"].astype(bool).sum())
            rows.append(row)
    return pd.DataFrame(rows)
