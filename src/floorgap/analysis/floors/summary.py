"""The floors summary: Hajek means over anchors with prompt-cluster bootstrap intervals, one
resample per scope ("all" or one domain) shared by every statistic of that scope (paper
Sec. B.2)."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from floorgap.analysis.floors.load import FloorRecords, Issue
from floorgap.analysis.floors.notes import NOTES
from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED, cluster_resample, prompt_bootstrap
from floorgap.estimators.concentration import (percentile_interval_finite, top_share,
                                               weighted_bootstrap, weighted_correlation,
                                               weighted_quantile)
from floorgap.errors import StageError

log = logging.getLogger("floorgap.floors")

SUMMARY_COLUMNS = ["statistic", "domain", "slot", "estimate", "lower", "upper", "n_anchors",
                   "note"]
#: Concentration (paper Sec. 3.1): floors below this count as negligible.
NEGLIGIBLE_FLOOR = 0.01
#: Concentration (paper Sec. 3.1): the top decile of anchors.
TOP_FRACTION = 0.1
#: K-median restart spread at or below this counts as zero (paper Sec. D.2).
ZERO_SPREAD = 1e-9

class _Scope:
    """Anchors of one scope ("all" or a domain) with their shared bootstrap resample."""

    def __init__(self, name: str, anchors: pd.DataFrame, table: pd.DataFrame, gamma: int,
                 n_boot: int, seed: int, level: float):
        self.name = name
        self.anchors = anchors.reset_index(drop=True)
        self.n = len(self.anchors)
        self.gamma = gamma
        self.level = level
        self.pi = torch.tensor(self.anchors["pi"].to_numpy(), dtype=torch.float64)
        self.clusters = self.anchors["prompt_id"].astype(str).tolist()
        self.n_prompts = len(set(self.clusters))
        self.rs = cluster_resample(self.clusters, n_boot, seed)
        ids = self.anchors["anchor_id"]
        self.table = table[table["anchor_id"].isin(set(ids))]
        self._pos = {a: i for i, a in enumerate(ids)}

    def matrix(self, column: str) -> torch.Tensor:
        """``[n, gamma]`` values of ``column`` (NaN where absent)."""
        out = torch.full((self.n, self.gamma), float("nan"), dtype=torch.float64)
        rows = torch.tensor(self.table["anchor_id"].map(self._pos).to_numpy(), dtype=torch.long)
        cols = torch.tensor(self.table["slot"].to_numpy(), dtype=torch.long)
        vals = torch.tensor(pd.to_numeric(self.table[column], errors="coerce")
                            .to_numpy(dtype=np.float64), dtype=torch.float64)
        out[rows, cols] = vals
        return out

    def ratio(self, num: torch.Tensor, den: torch.Tensor, mask: torch.Tensor):
        """Ratio of Hajek sums over the anchors in ``mask``, column by column, with the
        percentile interval of the finite replicates. Returns (est, lo, hi, n)."""
        num0 = torch.where(mask, num, torch.zeros_like(num))
        den0 = torch.where(mask, den, torch.zeros_like(den))
        res = prompt_bootstrap(num0, self.clusters, self.pi, den0, resample=self.rs,
                               level=self.level, return_replicates=True)
        lo, hi, _ = percentile_interval_finite(res.replicates, self.level)
        return res.estimate, lo, hi, mask.sum(0)

    def mean(self, y: torch.Tensor, mask: torch.Tensor | None = None):
        m = torch.isfinite(y) if mask is None else (mask & torch.isfinite(y))
        return self.ratio(torch.nan_to_num(y), torch.ones_like(y), m)

    def weighted(self, values: torch.Tensor, mask: torch.Tensor, stat):
        """A weighted statistic ``stat(values, weights)`` of the anchors in ``mask`` (1-d)."""
        idx = torch.nonzero(mask).flatten()
        if idx.numel() == 0:
            nan = torch.tensor(float("nan"), dtype=torch.float64)
            return nan, nan, nan, 0
        v = values[idx]
        res = weighted_bootstrap(lambda w: stat(v, w[..., idx]), self.rs, self.pi,
                                 level=self.level)
        return res.estimate, res.lower, res.upper, int(idx.numel())


def _emit(rows: list[dict], statistic: str, scope: str, slot: int, est, lo, hi, n,
          note: str | None = None, *, keep_nan: bool = False) -> None:
    est = float(est)
    if not keep_nan and (int(n) == 0 or not math.isfinite(est)):
        return
    rows.append({"statistic": statistic, "domain": scope, "slot": int(slot), "estimate": est,
                 "lower": float(lo), "upper": float(hi), "n_anchors": int(n),
                 "note": note if note is not None else NOTES.get(statistic, "")})


def _emit_slots(rows, statistic, scope, result, slots, note=None) -> None:
    est, lo, hi, n = result
    for k in slots:
        _emit(rows, statistic, scope, k, est[k], lo[k], hi[k], n[k], note)


def _count(rows, statistic, scope, slot, count, n_anchors, note=None) -> None:
    nan = float("nan")
    _emit(rows, statistic, scope, slot, float(count), nan, nan, n_anchors, note, keep_nan=True)


def _pooled(x: torch.Tensor, mask: torch.Tensor, slots: Sequence[int]) -> torch.Tensor:
    sl = list(slots)
    return torch.where(mask[:, sl], x[:, sl], torch.zeros_like(x[:, sl])).sum(1, keepdim=True)


def _floor_block(rows: list[dict], s: _Scope, reveal_paths: int) -> None:
    """Per-slot (and pooled) floor statistics of one scope.

    The headline T^(1) is the split-half grouping estimate (paper App. B.3). Its covered value
    is a ratio over covered path mass, sum_i w_i c_i T_cov,i / sum_i w_i c_i, so that the
    anchor means of the bounds satisfy lower = c T_cov and upper = c T_cov + 1 - c with the
    population covered mass c = sum_i w_i c_i / sum_i w_i (the paper's T = c T_cov +
    (1 - c) T_uncov). Its share removed compares T_cov with T^(0) on the same covered paths.
    The importance route is the independent second estimate (App. C.2).
    """
    g = s.gamma
    all_slots, deep = range(g), range(1, g)
    ok = s.matrix("t0").isfinite()
    t0, t0s, t0cov = s.matrix("t0"), s.matrix("t0_split"), s.matrix("t0_covered")
    tcov, c = s.matrix("t1_split_cov"), s.matrix("t1_covered_mass")
    lower, upper = s.matrix("t1_lower"), s.matrix("t1_upper")
    plugin, rw = s.matrix("t1_plugin"), s.matrix("t1_reweighted")
    ess_mean, ess_min = s.matrix("t1_reweighted_ess_mean"), s.matrix("t1_reweighted_ess_min")
    mid = lower + 0.5 * (upper - lower)
    covered = ok & (c > 0) & tcov.isfinite() & t0cov.isfinite()
    rw_ok = ok & rw.isfinite()
    c0 = torch.nan_to_num(c)

    _emit_slots(rows, "T0", s.name, s.mean(t0, ok), all_slots)
    _emit_slots(rows, "T0_split", s.name, s.mean(t0s, ok), all_slots)
    _emit_slots(rows, "T0_split_minus_T0", s.name, s.mean(t0s - t0, ok), all_slots)
    _emit_slots(rows, "T1_split_covered", s.name, s.ratio(c0 * tcov, c0, covered), all_slots)
    _emit_slots(rows, "T0_covered", s.name, s.ratio(c0 * t0cov, c0, covered), all_slots)
    _emit_slots(rows, "T1_covered_mass", s.name, s.mean(c, ok), all_slots)
    _emit_slots(rows, "T1_split_lower", s.name, s.mean(lower, ok), all_slots)
    _emit_slots(rows, "T1_split_upper", s.name, s.mean(upper, ok), all_slots)
    _emit_slots(rows, "T1_split_mid", s.name, s.mean(mid, ok), all_slots)
    _emit_slots(rows, "T1_plugin", s.name, s.mean(plugin, ok), all_slots)
    _emit_slots(rows, "T1_reweighted", s.name, s.mean(rw, rw_ok), deep)
    _emit_slots(rows, "T1_reweighted_ess_mean", s.name, s.mean(ess_mean, rw_ok), deep)
    _reveal_rows(rows, s, ok, rw_ok, ess_min, reveal_paths)

    shares = {
        "share_removed_split_covered": (c0 * t0cov, c0 * tcov, covered),
        "share_removed_reweighted": (t0, rw, rw_ok),
        "share_removed_split_mid": (t0, mid, ok),
        "share_removed_split_min": (t0, upper, ok),
        "share_removed_split_max": (t0, lower, ok),
    }
    for name, (base, t1, mask) in shares.items():
        _emit_slots(rows, name, s.name, s.ratio(base - t1, base, mask), deep)
        _emit_pooled(rows, name, s, base - t1, base, mask, NOTES[name])


def _emit_pooled(rows: list[dict], name: str, s: _Scope, num: torch.Tensor, den: torch.Tensor,
                 mask: torch.Tensor, note: str) -> None:
    """The ratio of ``num`` over ``den`` summed over slots 1..gamma-1 (slot -1)."""
    deep = range(1, s.gamma)
    est, lo, hi, n = s.ratio(_pooled(num, mask, deep), _pooled(den, mask, deep),
                             mask[:, list(deep)].any(1, keepdim=True))
    _emit(rows, name, s.name, -1, est[0], lo[0], hi[0], n[0],
          note + "; pooled over slots 1..gamma-1")


def _reveal_rows(rows: list[dict], s: _Scope, ok: torch.Tensor, rw_ok: torch.Tensor,
                 ess_min: torch.Tensor, reveal_paths: int) -> None:
    """The importance route's smallest ESS and its undefined revealed predecessors per slot."""
    undefined = torch.nan_to_num(s.matrix("t1_reweighted_undefined"))
    nan = float("nan")
    for k in range(1, s.gamma):
        m = rw_ok[:, k] & ess_min[:, k].isfinite()
        if bool(m.any()):
            _emit(rows, "T1_reweighted_ess_min", s.name, k, float(ess_min[m, k].min()), nan,
                  nan, int(m.sum()))
        n_cells = int(ok[:, k].sum())
        n_undef = int(undefined[ok[:, k], k].sum())
        _count(rows, "T1_reweighted_undefined", s.name, k, n_undef, n_cells)
        share = n_undef / (n_cells * reveal_paths) if n_cells and reveal_paths else nan
        _count(rows, "T1_reweighted_undefined_share", s.name, k, share, n_cells)
        _count(rows, "T1_reweighted_cells_undefined", s.name, k,
               int((ok[:, k] & ~rw_ok[:, k]).sum()), n_cells)


def check_reveal_undefined(summary: pd.DataFrame, max_share: float) -> None:
    """:class:`StageError` naming the slots where the share of revealed predecessors with
    all-zero importance weights exceeds ``max_share`` (config ``analysis.reveal_undefined_max``):
    the importance route then averages over a population chosen by the law's support."""
    rows = summary[(summary["statistic"] == "T1_reweighted_undefined_share")
                   & (summary["domain"] == "all") & (summary["estimate"] > max_share)]
    if len(rows):
        where = ", ".join(f"slot {int(r.slot)}: {r.estimate:.1%}" for r in rows.itertuples())
        raise StageError(
            f"revealed predecessors with all-zero importance weight exceed "
            f"analysis.reveal_undefined_max={max_share:g} ({where}); the sampling law's "
            "truncation leaves them outside the other paths' support. Raise rollouts.paths, "
            "or raise analysis.reveal_undefined_max to accept the importance route on the "
            "defined ones")


def _support_block(rows: list[dict], s: _Scope, M: int) -> None:
    """Effective support per slot and its correlation with the order-0 floor."""
    t0, neff = s.matrix("t0"), s.matrix("n_eff")
    nan = float("nan")
    for k in range(1, s.gamma):
        m = neff[:, k].isfinite() & (neff[:, k] > 0)
        y = torch.nan_to_num(neff[:, k], nan=1.0)
        _emit(rows, "neff_median", s.name, k,
              *s.weighted(y, m, lambda v, w: weighted_quantile(v, w, 0.5)))
        _emit(rows, "neff_p90", s.name, k,
              *s.weighted(y, m, lambda v, w: weighted_quantile(v, w, 0.9)))
        est, lo, hi, n = s.mean(neff[:, [k]], m.unsqueeze(1))
        _emit(rows, "neff_mean", s.name, k, est[0], lo[0], hi[0], n[0])
        if bool(m.any()):
            _emit(rows, "neff_min", s.name, k, float(y[m].min()), nan, nan, int(m.sum()))
            _emit(rows, "neff_max", s.name, k, float(y[m].max()), nan, nan, int(m.sum()))
        at_cap = (s.matrix("n_distinct_prefixes")[:, [k]] == M).to(torch.float64)
        est, lo, hi, n = s.mean(at_cap, m.unsqueeze(1))
        _emit(rows, "neff_at_cap_share", s.name, k, est[0], lo[0], hi[0], n[0])
        both = m & t0[:, k].isfinite()
        x = torch.nan_to_num(t0[:, k])
        _emit(rows, "corr_log_neff_T0", s.name, k,
              *s.weighted(torch.log(y), both,
                          lambda v, w, x=x[both]: weighted_correlation(v, x, w)))
        _emit(rows, "corr_neff_T0", s.name, k,
              *s.weighted(y, both, lambda v, w, x=x[both]: weighted_correlation(v, x, w)))


def _concentration_block(rows: list[dict], s: _Scope) -> None:
    """How the floor is spread over anchors (paper Sec. 3.1, D.1)."""
    t0 = s.matrix("t0")
    ok = t0.isfinite()
    for k in range(1, s.gamma):
        y = torch.nan_to_num(t0[:, k]).clamp(min=0)
        m = ok[:, k]
        _emit(rows, "T0_median", s.name, k,
              *s.weighted(y, m, lambda v, w: weighted_quantile(v, w, 0.5)))
        _emit(rows, "T0_topdecile_share", s.name, k,
              *s.weighted(y, m, lambda v, w: top_share(v, w, TOP_FRACTION)))
    below = (t0 < NEGLIGIBLE_FLOOR).to(torch.float64)
    deep = range(1, s.gamma)
    _emit_slots(rows, "T0_share_below_001", s.name, s.ratio(below, torch.ones_like(t0), ok),
                deep)
    _emit_slots(rows, "T0_below_001_share_of_total", s.name,
                s.ratio(torch.nan_to_num(t0) * below, torch.nan_to_num(t0), ok), deep)


def _topk_block(rows: list[dict], s: _Scope) -> None:
    t0, tk, band = s.matrix("t0"), s.matrix("t0_topk"), s.matrix("t0_topk_band")
    ok = t0.isfinite() & tk.isfinite()
    slots = range(s.gamma)
    _emit_slots(rows, "T0_topk", s.name, s.mean(tk, tk.isfinite()), slots)
    _emit_slots(rows, "T0_topk_band", s.name, s.mean(band, band.isfinite()), slots)
    _emit_slots(rows, "T0_full_minus_topk", s.name, s.mean(t0 - tk, ok), slots)
    _emit_slots(rows, "T0_full_minus_topk_abs", s.name, s.mean((t0 - tk).abs(), ok), slots)
    for k in slots:
        viol = ok[:, k] & ((t0[:, k] - tk[:, k]).abs() > band[:, k] + 1e-6)
        _count(rows, "topk_band_violations", s.name, k, int(viol.sum()), int(ok[:, k].sum()))
    t20, band20 = s.matrix("t0_top20"), s.matrix("t0_top20_band")
    ok20 = t0.isfinite() & t20.isfinite()
    if bool(ok20.any()):
        _emit_slots(rows, "T0_top20", s.name, s.mean(t20, t20.isfinite()), slots)
        _emit_slots(rows, "T0_top20_band", s.name, s.mean(band20, band20.isfinite()), slots)
        _emit_slots(rows, "T0_top20_minus_full", s.name, s.mean(t20 - t0, ok20), slots)
        _emit_slots(rows, "T0_top20_minus_full_abs", s.name, s.mean((t20 - t0).abs(), ok20),
                    slots)
        for k in slots:
            viol = ok20[:, k] & ((t0[:, k] - t20[:, k]).abs() > band20[:, k] + 1e-6)
            _count(rows, "top20_band_violations", s.name, k, int(viol.sum()),
                   int(ok20[:, k].sum()))


def _kmedian_block(rows: list[dict], s: _Scope, ks: Sequence[int]) -> None:
    """K-median objectives, shares of T0 removed and restart spread (paper Sec. D.2)."""
    g = s.gamma
    tk = s.matrix("t0_topk")
    deep = range(1, g)
    nan = float("nan")
    spreads, cell_anchor, means = [], [], []
    for K in ks:
        obj = s.matrix(f"kmedian_objective_k{K}")
        spread = s.matrix(f"kmedian_spread_k{K}")
        ok = obj.isfinite() & tk.isfinite()
        _emit_slots(rows, f"kmedian_objective_K{K}", s.name, s.mean(obj, ok), range(g),
                    NOTES["kmedian_objective"] + f"; K={K}")
        if K == 1:
            continue
        note = f"; K={K}"
        _emit_slots(rows, f"kmedian_share_removed_K{K}", s.name, s.ratio(tk - obj, tk, ok), deep,
                    NOTES["kmedian_share_removed"] + note)
        _emit_slots(rows, f"kmedian_share_removed_worst_K{K}", s.name,
                    s.ratio(tk - obj - spread, tk, ok), deep,
                    NOTES["kmedian_share_removed_worst"] + note)
        _emit_pooled(rows, f"kmedian_share_removed_K{K}", s, tk - obj, tk, ok,
                     NOTES["kmedian_share_removed"] + note)
        sm = s.mean(spread, ok)
        _emit_slots(rows, f"kmedian_spread_mean_K{K}", s.name, sm, deep,
                    NOTES["kmedian_spread_mean"] + note)
        for k in deep:
            m = ok[:, k]
            if bool(m.any()):
                _emit(rows, f"kmedian_spread_max_K{K}", s.name, k, float(spread[m, k].max()),
                      nan, nan, int(m.sum()), NOTES["kmedian_spread_max"] + note)
                means.append(float(sm[0][k]))
                spreads.append(spread[m, k])
                cell_anchor.append(torch.nonzero(m).flatten())
    if not spreads:
        return
    values = torch.cat(spreads)
    owner = torch.cat(cell_anchor)
    n_anchors = int(torch.unique(owner).numel())
    zero = (values <= ZERO_SPREAD).to(torch.float64)
    res = weighted_bootstrap(lambda w: (w[..., owner] * zero).sum(-1) / w[..., owner].sum(-1),
                             s.rs, s.pi, level=s.level)
    _emit(rows, "kmedian_spread_zero_share", s.name, -1, res.estimate, res.lower, res.upper,
          n_anchors)
    res = weighted_bootstrap(lambda w: weighted_quantile(values, w[..., owner], 0.9), s.rs, s.pi,
                             level=s.level)
    _emit(rows, "kmedian_spread_p90", s.name, -1, res.estimate, res.lower, res.upper, n_anchors)
    _emit(rows, "kmedian_spread_mean_max", s.name, -1, max(means), nan, nan, n_anchors)
    _emit(rows, "kmedian_spread_max", s.name, -1, float(values.max()), nan, nan, n_anchors,
          NOTES["kmedian_spread_max"] + "; over K >= 2 and slots >= 1")


def summarise(table: pd.DataFrame, records: FloorRecords, *, n_boot: int, level: float,
              kmedian_k: Sequence[int], seed: int = DEFAULT_BOOT_SEED) -> pd.DataFrame:
    """The long-format summary (``SUMMARY_COLUMNS``) of an :func:`anchor_slot_table`.

    Scopes: "all" and every domain; each draws its own prompt resample (B = ``n_boot``,
    ``seed``), shared by every statistic of the scope. Slot -1 marks pooled or scalar rows.
    """
    ks = sorted(int(k) for k in kmedian_k)
    g, M = records.gamma, records.paths_per_anchor
    anchors = records.anchors
    rows: list[dict] = []
    scopes = [("all", anchors)] + [(d, anchors[anchors["domain"] == d])
                                   for d in records.domains]
    issues_by_anchor: dict[str, list[Issue]] = {}
    for issue in records.issues:
        issues_by_anchor.setdefault(issue.anchor_id, []).append(issue)
    for name, sub in scopes:
        if not len(sub):
            continue
        s = _Scope(name, sub, table, g, n_boot, seed, level)
        _count(rows, "n_anchors", name, -1, s.n, s.n)
        _count(rows, "n_prompts", name, -1, s.n_prompts, s.n)
        found = [i for a in sub["anchor_id"] for i in issues_by_anchor.get(a, [])]
        corrupt = [i for i in found if i.kind.endswith(("_corrupt", "_duplicate"))]
        missing = [i for i in found if i.kind.endswith("_missing")]
        _count(rows, "records_corrupt", name, -1, len(corrupt), s.n,
               NOTES["records_corrupt"] + _issue_note(corrupt))
        _count(rows, "records_missing", name, -1, len(missing), s.n,
               NOTES["records_missing"] + _issue_note(missing))
        sub_cells = s.table
        _count(rows, "cells_excluded", name, -1, int(sub_cells["t0"].isna().sum()), s.n)
        _count(rows, "cells_excluded_paths", name, -1, int(sub_cells["t0_topk"].isna().sum()),
               s.n)
        both = sub_cells["n_eff"].notna() & sub_cells["n_eff_probe"].notna()
        mism = both & ~np.isclose(sub_cells["n_eff"], sub_cells["n_eff_probe"], rtol=1e-6)
        _count(rows, "neff_probe_mismatch", name, -1, int(mism.sum()), s.n)
        _floor_block(rows, s, records.reveal_paths)
        _support_block(rows, s, M)
        if name == "all":
            _count(rows, "paths_per_anchor", name, -1, M, s.n)
            _count(rows, "gamma", name, -1, g, s.n)
            _count(rows, "store_top_k", name, -1, records.top_k, s.n)
            _count(rows, "reveal_paths", name, -1, records.reveal_paths, s.n)
            _count(rows, "bootstrap_replicates", name, -1, n_boot, s.n)
            _concentration_block(rows, s)
            _topk_block(rows, s)
            _kmedian_block(rows, s, ks)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def log_record_problems(summary: pd.DataFrame) -> None:
    """Warn about the corrupt and missing records counted in the summary (all domains)."""
    for stat in ("records_corrupt", "records_missing"):
        row = summary[(summary["statistic"] == stat) & (summary["domain"] == "all")]
        if len(row) and row["estimate"].iloc[0] > 0:
            log.warning("%s: %d (%s)", stat, int(row["estimate"].iloc[0]), row["note"].iloc[0])


def _issue_note(issues: Sequence[Issue]) -> str:
    if not issues:
        return ""
    kinds = Counter(i.kind for i in issues)
    shown = "; ".join(f"{i.kind} {i.anchor_id} slot {i.slot} path {i.path}"
                      f" ({Path(i.source).name if i.source else '-'}): {i.detail}"
                      for i in issues[:5])
    more = f"; ... {len(issues) - 5} more" if len(issues) > 5 else ""
    return " [" + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) + "] " + shown + more
