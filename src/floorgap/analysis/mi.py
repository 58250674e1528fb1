"""MI locality analysis (Table 4, App. D.3): rho_{k,m} by slot, pooled and under ESS gates.

Reads the MI records of one target (``results/<target>/mi/<domain>.parquet``, every domain),
keeps the screened-in anchors and, for every slot k and order m < k, the anchor's
n = C_{k,0} - C_{k,m} and d = C_{k,0} - C_{k,k}. rho_{k,m} is the ratio of Hajek sums of n and
d (paper B.2), per slot and pooled over slots, with prompt-cluster percentile intervals; ESS
gates (the configured thresholds and M/2) give the sensitivity rows of App. C.5, and each
domain gets its own pooled point estimate.

:func:`summarise_locality` returns a :class:`MILocality`; the report item
(:mod:`floorgap.reports.mi_items`) only formats it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED
from floorgap.estimators.mi import (RecoveryBootstrap, RecoveryEstimate, ess_gate_sensitivity,
                                    recovery_bootstrap, recovery_fraction)
from floorgap.records import read_metadata, read_table

#: Run settings every MI record file of one table must share.
CONFIG_KEYS = ("target", "mi", "law", "gamma", "forward_batch")


@dataclass(frozen=True)
class MIArrays:
    """Screened-in anchors as arrays: n (A, K, J), d (A, K), ess (A, K, J) over slots
    ``slots`` (K) and ``orders`` (J); ``mask`` marks the cells with m < k; ``pi`` (A,),
    ``prompts`` (A,) the cluster of each anchor."""

    n: torch.Tensor
    d: torch.Tensor
    ess: torch.Tensor
    mask: torch.Tensor
    pi: torch.Tensor
    prompts: list[str]
    domains: list[str]
    slots: list[int]
    orders: list[int]


@dataclass(frozen=True)
class MILocality:
    """The Table 4 summary.

    ``table`` holds one row per statistic: ``section`` is ``slot`` (rho_{k,m} of slot k with
    its bootstrap interval; NaN where m >= k), ``pooled`` (pooled over slots, with interval),
    ``ess_gate`` (pooled over the cells with ESS >= ``ess_gate``) or ``domain:<name>`` (pooled
    over that domain's anchors); ``cells`` counts the anchor x slot cells in each statistic.
    ``per_order`` (indexed by m) holds the range of the per-slot point estimates
    (``slot_min``, ``slot_max``), the median ESS of the pooled cells (``ess_median``) and the
    range of the pooled estimate without a gate and under every gate (``gate_rho_min``,
    ``gate_rho_max``); a range is NaN when no value is finite.
    """

    table: pd.DataFrame
    per_order: pd.DataFrame
    gates: list[tuple[float, list[str]]]
    slots: list[int]
    orders: list[int]
    n_anchors: int
    n_kept: int
    n_prompts: int
    mi_config: dict[str, Any]
    n_boot: int
    level: float


def load_records(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Concatenate MI record files; check that they were measured with one configuration."""
    frames, metas = [read_table(p) for p in paths], [read_metadata(p) for p in paths]
    if not frames:

        raise ValueError("no MI record files given")
    first = {k: metas[0].get(k) for k in CONFIG_KEYS}
    for p, meta in zip(paths, metas):
        if {k: meta.get(k) for k in CONFIG_KEYS} != first:
            raise ValueError(f"{p} was measured with a different configuration than {paths[0]}")
    return pd.concat(frames, ignore_index=True), dict(first, files=[str(p) for p in paths])


def records_to_arrays(frame: pd.DataFrame) -> MIArrays:
    """Arrays of the screened-in anchors (sorted by anchor id; slots >= 1)."""
    kept = frame[frame["screened"].astype(bool)].copy()
    if kept.empty:
        raise ValueError("no anchor passed the screen; nothing to aggregate")
    anchors = sorted(kept["anchor_id"].unique())
    slots = sorted(int(s) for s in kept["slot"].unique())
    orders = sorted(int(m) for m in kept["order"].unique())
    a_ix = {a: i for i, a in enumerate(anchors)}
    k_ix = {k: i for i, k in enumerate(slots)}
    m_ix = {m: i for i, m in enumerate(orders)}
    A, K, J = len(anchors), len(slots), len(orders)
    nan = float("nan")
    n = torch.full((A, K, J), nan, dtype=torch.float64)
    d = torch.full((A, K), nan, dtype=torch.float64)
    ess = torch.full((A, K, J), nan, dtype=torch.float64)
    ai = torch.tensor(kept["anchor_id"].map(a_ix).to_numpy())
    ki = torch.tensor(kept["slot"].map(k_ix).to_numpy())
    mi = torch.tensor(kept["order"].map(m_ix).to_numpy())
    col = lambda name: torch.tensor(kept[name].to_numpy(float))  # noqa: E731
    n[ai, ki, mi] = col("c_k0") - col("c_km")
    d[ai, ki] = col("c_k0") - col("c_kk")
    ess[ai, ki, mi] = col("ess")
    mask = torch.tensor([[m < k for m in orders] for k in slots]).expand(A, K, J)
    per_anchor = kept.drop_duplicates("anchor_id").set_index("anchor_id").loc[anchors]
    return MIArrays(n=n, d=d, ess=ess, mask=mask.clone(),
                    pi=torch.tensor(per_anchor["pi"].to_numpy(float)),
                    prompts=[str(p) for p in per_anchor["prompt_id"]],
                    domains=[str(x) for x in per_anchor["domain"]], slots=slots, orders=orders)


def ess_thresholds(gates: Sequence[float], paths: int) -> list[tuple[float, str]]:
    """The sensitivity thresholds: the configured gates and M/2, each once, with macro keys."""
    named: dict[float, list[str]] = {}
    for g in gates:
        named.setdefault(float(g), []).append(f"{float(g):g}".replace(".", "p"))
    named.setdefault(paths / 2.0, []).append("HalfPaths")
    return [(t, keys) for t, keys in sorted(named.items())]  # type: ignore[misc]


def _shown_slots(arr: MIArrays) -> list[tuple[int, int]]:
    """``(index, k)`` of the slots with at least one order m < k (the table's slot rows)."""
    return [(ki, k) for ki, k in enumerate(arr.slots) if any(m < k for m in arr.orders)]


def _statistic_rows(arr: MIArrays, boot: RecoveryBootstrap,
                    sens: list[tuple[float, RecoveryEstimate]],
                    cells_mask: torch.Tensor) -> list[dict[str, Any]]:
    """The slot, pooled and ESS-gate rows of rho_{k,m} (all anchors)."""
    ps, pl = boot.per_slot, boot.pooled
    rows: list[dict[str, Any]] = []
    for ki, k in _shown_slots(arr):
        for j, m in enumerate(arr.orders):
            ok = m < k
            rows.append({"section": "slot", "slot": k, "ess_gate": 0.0, "order": m,
                         "rho": float(ps.estimate[ki, j]) if ok else float("nan"),
                         "lower": float(ps.lower[ki, j]) if ok else float("nan"),
                         "upper": float(ps.upper[ki, j]) if ok else float("nan"),
                         "cells": int(cells_mask[:, ki, j].sum())})
    for j, m in enumerate(arr.orders):
        rows.append({"section": "pooled", "slot": -1, "ess_gate": 0.0, "order": m,
                     "rho": float(pl.estimate[j]), "lower": float(pl.lower[j]),
                     "upper": float(pl.upper[j]), "cells": int(cells_mask[:, :, j].sum())})
    for t, res in sens[1:]:
        for j, m in enumerate(arr.orders):
            rows.append({"section": "ess_gate", "slot": -1, "ess_gate": t, "order": m,
                         "rho": float(res.pooled[j]), "lower": float("nan"),
                         "upper": float("nan"), "cells": int(res.n_cells_pooled[j])})
    for row in rows:
        row.update(anchors=len(arr.prompts), prompts=len(set(arr.prompts)))
    return rows


def _domain_rows(arr: MIArrays) -> list[dict[str, Any]]:
    """The pooled rho_{k,m} of each domain's anchors (point estimates, no interval)."""
    rows: list[dict[str, Any]] = []
    for dom in sorted(set(arr.domains)):
        pick = [i for i, x in enumerate(arr.domains) if x == dom]
        sel = torch.tensor(pick)
        res = recovery_fraction(arr.n[sel], arr.d[sel], arr.pi[sel], arr.mask[sel])
        for j, m in enumerate(arr.orders):
            rows.append({"section": f"domain:{dom}", "slot": -1, "ess_gate": 0.0, "order": m,
                         "rho": float(res.pooled[j]), "lower": float("nan"),
                         "upper": float("nan"), "cells": int(res.n_cells_pooled[j]),
                         "anchors": len(pick),
                         "prompts": len({arr.prompts[i] for i in pick})})
    return rows


def _finite_range(values: Sequence[float]) -> tuple[float, float]:
    """Min and max of the finite ``values``; NaN for both when none is finite."""
    finite = [x for x in values if math.isfinite(x)]
    return (min(finite), max(finite)) if finite else (float("nan"), float("nan"))


def _per_order(arr: MIArrays, est: RecoveryEstimate, sens: list[tuple[float, RecoveryEstimate]],
               cells_mask: torch.Tensor) -> pd.DataFrame:
    """Per order m: range of the per-slot rho, median ESS of the pooled cells, and the range
    of the pooled rho over the ESS gates (no gate included)."""
    rows = []
    for j, m in enumerate(arr.orders):
        slot_min, slot_max = _finite_range(
            [float(est.per_slot[ki, j]) for ki, k in _shown_slots(arr) if m < k])
        gate_min, gate_max = _finite_range([float(res.pooled[j]) for _, res in sens])
        e = arr.ess[:, :, j][cells_mask[:, :, j]]
        rows.append({"order": m, "slot_min": slot_min, "slot_max": slot_max,
                     "ess_median": float(e.median()) if e.numel() else float("nan"),
                     "gate_rho_min": gate_min, "gate_rho_max": gate_max})
    return pd.DataFrame(rows).set_index("order")


def summarise_locality(frame: pd.DataFrame, meta: Mapping[str, Any], *,
                       ess_gates: Sequence[float], n_boot: int, level: float,
                       seed: int = DEFAULT_BOOT_SEED) -> MILocality:
    """Table 4 from the concatenated MI records: rho_{k,m} per slot and pooled with
    prompt-bootstrap intervals, the ESS-gate sensitivity (App. C.5) and per-domain rho."""
    paths = int(meta["mi"]["paths"])
    arr = records_to_arrays(frame)
    n, d, pi, mask = arr.n, arr.d, arr.pi, arr.mask
    est = recovery_fraction(n, d, pi, mask)
    boot = recovery_bootstrap(n, d, arr.prompts, pi, mask, n_boot=n_boot, seed=seed,
                              level=level)
    gates = ess_thresholds(ess_gates, paths)
    sens = ess_gate_sensitivity(n, d, arr.ess, [0.0] + [t for t, _ in gates], pi, mask)
    # The cells that enter a sum: m < k, with finite n and d (as in the estimator).
    cells_mask = mask & torch.isfinite(n) & torch.isfinite(d).unsqueeze(-1)
    table = pd.DataFrame(_statistic_rows(arr, boot, sens, cells_mask) + _domain_rows(arr))
    table["paths"] = paths
    return MILocality(table=table, per_order=_per_order(arr, est, sens, cells_mask),
                      gates=gates, slots=[k for _, k in _shown_slots(arr)], orders=arr.orders,
                      n_anchors=frame["anchor_id"].nunique(), n_kept=len(arr.prompts),
                      n_prompts=len(set(arr.prompts)), mi_config=dict(meta["mi"]),
                      n_boot=n_boot, level=level)
