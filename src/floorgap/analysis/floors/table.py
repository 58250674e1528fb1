"""The per anchor x slot table of the floors analysis (``anchor_slot.parquet``): the probe's
full-vocabulary floors beside what the stored top-K reads allow on the CPU (the top-K floor T~
with its band, the API read of App. C.6, the K-median objective, N_eff)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from floorgap.analysis.floors.load import FLOOR_VALUES, FloorRecords
from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED
from floorgap.estimators.kmedian import tv_kmedian
from floorgap.estimators.support import effective_support
from floorgap.estimators.truncation import renormalised_dense, truncated_floor
from floorgap.errors import StageError
from floorgap.seeds import derive_seed

log = logging.getLogger("floorgap.floors")

#: The probe's values as the table names them: the record's own N_eff is ``n_eff_probe``, beside
#: the table's N_eff from the stored paths (checked against each other).
PROBE_COLUMNS = {c: "n_eff_probe" if c == "n_eff" else c for c in FLOOR_VALUES}
ANCHOR_SLOT_COLUMNS = [  # the fixed part; K-median columns follow, one pair per K
    "anchor_id", "prompt_id", "domain", "stratum", "pi", "slot", "status",
    # the fields of the probe's record (SlotFloorRecord), in its order
    *PROBE_COLUMNS.values(),
    "t0_topk", "t0_topk_band", "t0_topk_lower", "t0_topk_upper", "t0_full_minus_topk",
    "t0_top20", "t0_top20_band", "topk_support", "n_eff", "n_distinct_prefixes",
]
#: The API read of App. C.6 (OpenAI-compatible endpoints cap top_logprobs at 20): the first 20
#: entries of the stored (sorted) top-K reads, their residual the rest of the mass.
API_TOP_K = 20


def _kmedian_columns(ks: Sequence[int]) -> list[str]:
    return [c for K in ks for c in (f"kmedian_objective_k{K}", f"kmedian_spread_k{K}")]


def anchor_slot_table(records: FloorRecords, *, kmedian_k: Sequence[int],
                      kmedian_restarts: int, seed: int = DEFAULT_BOOT_SEED,
                      max_iter: int = 100) -> pd.DataFrame:
    """One row per anchor x slot: the probe's values plus top-K, K-median and N_eff values.

    Top-K and K-median use the renormalised top-K reads of each slot, dense over the union of
    the M reads' supports. The K-median seeding of each (anchor, slot, K) draws from its own
    generator keyed by ``seed``, so the values do not depend on the order of the work.
    """
    ks = sorted(int(k) for k in kmedian_k)
    gamma = records.gamma
    derived: list[dict[str, Any]] = []
    for aid in records.anchors["anchor_id"]:
        arrays = records.paths[aid]
        for k in range(gamma):
            row: dict[str, Any] = {"anchor_id": aid, "slot": k}
            if arrays is None:
                derived.append(row)
                continue
            ids = torch.from_numpy(arrays["topk_ids"][:, k])
            vals = torch.from_numpy(arrays["topk_probs"][:, k])
            resid = torch.from_numpy(arrays["residual"][:, k]).clamp(min=0)
            tf = truncated_floor(ids, vals, resid)
            support, local = torch.unique(ids, return_inverse=True)
            dense = renormalised_dense(local, vals, support.numel())
            row.update(t0_topk=float(tf.value), t0_topk_band=float(tf.band),
                       t0_topk_lower=float(tf.lower), t0_topk_upper=float(tf.upper),
                       topk_support=int(support.numel()))
            if ids.shape[-1] >= API_TOP_K:
                top20 = truncated_floor(ids[:, :API_TOP_K], vals[:, :API_TOP_K],
                                        resid + vals[:, API_TOP_K:].sum(-1))
                row.update(t0_top20=float(top20.value), t0_top20_band=float(top20.band))
            for K in ks:
                gen = torch.Generator().manual_seed(derive_seed(seed, "kmedian", aid, k, K))
                km = tv_kmedian(dense, K, restarts=kmedian_restarts, generator=gen,
                                max_iter=max_iter)
                row[f"kmedian_objective_k{K}"] = float(km.objective)
                row[f"kmedian_spread_k{K}"] = float(km.spread)
            es = effective_support(torch.from_numpy(arrays["tokens"][:, :k]))
            row.update(n_eff=es.n_eff, n_distinct_prefixes=es.n_distinct)
            derived.append(row)
    cells = records.cells.rename(columns=PROBE_COLUMNS)
    out = cells.merge(pd.DataFrame(derived), on=["anchor_id", "slot"], how="left",
                      validate="one_to_one")
    meta = records.anchors[["anchor_id", "prompt_id", "domain", "stratum", "pi"]]
    out = out.merge(meta, on="anchor_id", how="left", validate="many_to_one")
    out["t0_full_minus_topk"] = out["t0"] - out["t0_topk"]
    for c in ANCHOR_SLOT_COLUMNS + _kmedian_columns(ks):
        if c not in out:
            out[c] = np.nan
    path_ok = out["anchor_id"].map(lambda a: records.paths[a] is not None)
    out.loc[~path_ok, "status"] = out.loc[~path_ok, "status"].map(
        lambda s: "paths_incomplete" if s == "ok" else f"{s};paths_incomplete")
    out["topk_support"] = out["topk_support"].astype("Int64")
    out["n_distinct_prefixes"] = out["n_distinct_prefixes"].astype("Int64")
    return out[ANCHOR_SLOT_COLUMNS + _kmedian_columns(ks)].reset_index(drop=True)


def check_anchor_slot_table(table: pd.DataFrame, kmedian_k: Sequence[int]) -> None:
    """Consistency of the anchor x slot values: the K-median objective at K = 1 is the top-K
    floor T~ (else :class:`StageError`); a stored N_eff that differs from the current
    estimator on the same tokens is logged (the summary uses the current one)."""
    if 1 in kmedian_k:
        diff = (table["kmedian_objective_k1"] - table["t0_topk"]).abs().max()
        if diff > 1e-9:
            raise StageError(f"K-median at K=1 differs from the top-K floor by {diff:.3g}")
    mism = (table["n_eff"] - table["n_eff_probe"]).abs() > 1e-6 * table["n_eff"].abs()
    if mism.any():
        log.warning("%d cells: the probe's stored N_eff differs from the current estimator "
                    "on the same tokens (e.g. %s slot %d: %.3f vs %.3f); the summary uses "
                    "the current estimator", int(mism.sum()),
                    table.loc[mism, "anchor_id"].iloc[0], table.loc[mism, "slot"].iloc[0],
                    table.loc[mism, "n_eff_probe"].iloc[0], table.loc[mism, "n_eff"].iloc[0])
