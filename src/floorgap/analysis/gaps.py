"""Gap-half analysis: model gaps, exposure, serving risk, dependence and best responses.

Inputs are the floors stage's per anchor x slot table of one target (T0 in-sample; T1 by the
importance route, column ``t1_reweighted``, which at slot 0 is T0; the anchor's prompt, domain and inclusion
probability) and every drafter evaluation shard of every variant (per anchor x path x slot:
p(Z_k), q(Z_k), TV, accept factor and the self chain; per anchor x slot: R, R^oracle, R^self,
exposure). The statistics (paper Secs. 3.3, 3.5, 4, App. E, F.1-F.6, H.5):

* order 0 (DFlash): ``R``, ``T0``, ``G0`` = R - T0 and ``G0_share`` = G0 / R;
* order 1 (DSpark, ours): ``R_oracle``, ``T1``, ``G1`` = R^oracle - T1, ``G1_share`` =
  G1 / R^oracle, ``R_self``, ``exposure`` = R^self - R^oracle;
* every variant: ``R_free`` (Hajek mean of the path-mean TV), ``R_serve`` (ratio of population
  sums E[W_{k-1} TV_k] / E[W_{k-1}]) and ``R_serve_minus_free``; ``S`` (joint survival),
  ``marginal`` (E[a_k]), ``D`` (S_k over the product of marginals), ``tau``,
  ``tau_independent`` and ``tau_gap``; single-slot best-response gains ``dtau_br``
  (cross-fitted on two folds by path parity), ``dtau_br_in_sample`` and ``dtau_br_optimism``
  (in-sample minus held-out); coordinate sweeps ``sweep_forward`` (0 -> gamma-1),
  ``sweep_backward`` (gamma-1 -> 0), ``sweep_isolated_sum`` (sum of the isolated gains on the
  same split), ``sweep_forward_minus_isolated`` / ``sweep_backward_minus_isolated`` and
  ``sweep_forward_ratio`` / ``sweep_backward_ratio`` (sweep over isolated sum);
* contrasts (variant ``"<a>-<b>"``, e.g. ours - the order-1 baseline) on the anchors both evaluated:
  ``diff_T1``, ``diff_R_oracle``, ``diff_R_self``, ``diff_G1``, ``diff_exposure`` per slot and
  ``gap_reduction`` = (G1_b - G1_a) / G1_b (per slot; the last slot is the paper's number);
  ``diff_tau`` (every pair, any order): the paired difference of accepted lengths.

Every statistic is a Hajek ratio of sums (weights 1/pi) with a prompt-cluster percentile
bootstrap; within one variant and scope ("all" or a domain) every statistic uses the same
resample, so differences are paired within anchors and ratios are ratios of replicate sums.
A cell whose value is missing (a floor the probe could not compute) drops out of that cell's
numerator and denominator only. Slot -1 marks scalar rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from floorgap.estimators.aggregate import (
    DEFAULT_BOOT_SEED,
    cluster_resample,
    prompt_bootstrap,
)
from floorgap.estimators.best_response import (
    coordinate_sweep,
    expected_length,
    single_slot_gain,
)
from floorgap.estimators.serving import serving_summary
from floorgap.errors import RecordMismatch
from floorgap.records import read_metadata, read_table

__all__ = [
    "SUMMARY_COLUMNS",
    "GapRecords",
    "RecordMismatch",
    "VariantRecords",
    "load_records",
    "summarise",
]

log = logging.getLogger("floorgap.gaps")

SUMMARY_COLUMNS = ["statistic", "variant", "domain", "slot", "estimate", "lower", "upper",
                   "n_anchors", "note"]
PATH_FIELDS = ["anchor_id", "path", "slot", "committed_token", "token", "p_tok", "q_tok", "tv",
               "accept", "self_token", "q_self_tok", "tv_self"]
SLOT_FIELDS = ["anchor_id", "slot", "order", "risk", "risk_oracle", "risk_self", "exposure"]
FLOOR_FIELDS = ["anchor_id", "prompt_id", "domain", "pi", "slot", "t0", "t1_reweighted"]
#: Contrast pairs (a, b) reported as a - b when both variants are present.

NOTES = {
    "R": "R_k = E[TV(p_k, q_k)] (order 0)",
    "T0": "order-0 floor, in-sample (floors stage)",
    "G0": "G0 = R - T0, paired within anchors",
    "G0_share": "G0 / R, ratio of population sums",
    "R_oracle": "R^oracle_k: predecessor fed from the target path",
    "T1": "order-1 floor, importance route (floors stage t1_reweighted)",
    "G1": "G1 = R^oracle - T1, paired within anchors",
    "G1_share": "G1 / R^oracle, ratio of population sums",
    "R_self": "R^self_k: the drafter's own chain",
    "exposure": "R^self - R^oracle",
    "R_free": "free risk: Hajek mean of the path-mean TV",
    "R_serve": "E[W_{k-1} TV_k] / E[W_{k-1}], ratio of population sums",
    "R_serve_minus_free": "R^serve - R (paired)",
    "S": "joint survival E[prod_{i<=k} a_i]",
    "marginal": "marginal acceptance E[a_k]",
    "D": "D_k = S_k / prod_{i<=k} E[a_i]",
    "tau": "1 + sum_k S_k",
    "tau_independent": "1 + sum_k prod_{i<=k} E[a_i]",
    "tau_gap": "tau - tau_independent (paired)",
    "dtau_br": "single-slot best-response gain, two-fold cross-fitted (path parity)",
    "dtau_br_in_sample": "single-slot best-response gain fitted and scored on all paths",
    "dtau_br_optimism": "in-sample minus held-out gain",
    "sweep_forward": "coordinate sweep 0 -> gamma-1, held out",
    "sweep_backward": "coordinate sweep gamma-1 -> 0, held out",
    "sweep_isolated_sum": "sum over slots of the isolated held-out gains",
    "sweep_forward_minus_isolated": "forward sweep minus the sum of isolated gains",
    "sweep_backward_minus_isolated": "backward sweep minus the sum of isolated gains",
    "sweep_forward_ratio": "forward sweep over the sum of isolated gains, ratio of sums",
    "sweep_backward_ratio": "backward sweep over the sum of isolated gains, ratio of sums",
    "gap_reduction": "(G1_b - G1_a) / G1_b, ratio of population sums",
    "diff_tau": "tau_a - tau_b, paired within anchors",
}



@dataclass
class VariantRecords:
    """One variant's records, aligned to ``anchor_ids`` (complete anchors only).

    Per-path arrays are (A, M, gamma); ``slots`` holds one row per anchor x slot.
    """

    name: str
    order: int
    anchor_ids: list[str]
    committed: Tensor
    tokens: Tensor
    p_tok: Tensor
    q_tok: Tensor
    tv: Tensor
    accept: Tensor
    tv_self: Tensor
    risk: Tensor
    risk_oracle: Tensor
    risk_self: Tensor
    exposure: Tensor
    incomplete: list[str] = field(default_factory=list)


@dataclass
class GapRecords:
    """Floors and variants of one target. ``anchors``: anchor_id, prompt_id, domain, pi."""

    anchors: pd.DataFrame
    t0: pd.DataFrame  # anchor_id x slot
    t1: pd.DataFrame
    gamma: int
    variants: dict[str, VariantRecords]
    target: str | None


def _variant_of(path: Path, meta: dict[str, Any]) -> str:
    if meta.get("variant"):
        return str(meta["variant"])
    # results/<target>/drafter_eval/<variant>/<weights>/<domain>/paths-<shard>.parquet
    variant, weights = path.parent.parent.parent.name, path.parent.parent.name
    return variant if weights == "final" else f"{variant}@{weights}"


def _variant_records(name: str, paths: pd.DataFrame, slots: pd.DataFrame, gamma: int,
                     order: int, known: set[str]) -> VariantRecords:
    unknown = sorted(set(paths["anchor_id"]) - known)
    if unknown:
        raise RecordMismatch(f"variant {name}: anchors {unknown[:5]} have drafter records but "
                             "no floors row")
    paths = paths.drop_duplicates(["anchor_id", "path", "slot"], keep=False)
    M = int(paths["path"].max()) + 1 if len(paths) else 0
    counts = paths.groupby("anchor_id").size()
    complete = sorted(counts.index[counts == M * gamma])
    incomplete = sorted(set(counts.index) - set(complete))
    slot_ok = slots.drop_duplicates(["anchor_id", "slot"], keep=False)
    sc = slot_ok.groupby("anchor_id").size()
    complete = [a for a in complete if sc.get(a, 0) == gamma]
    incomplete = sorted(set(counts.index) - set(complete))
    p = paths[paths["anchor_id"].isin(complete)].sort_values(["anchor_id", "path", "slot"])
    A = len(complete)

    def arr(col: str, dtype=torch.float64) -> Tensor:
        return torch.tensor(p[col].to_numpy(), dtype=dtype).reshape(A, M, gamma)

    s = slot_ok[slot_ok["anchor_id"].isin(complete)].sort_values(["anchor_id", "slot"])

    def sarr(col: str) -> Tensor:
        return torch.tensor(s[col].to_numpy(float), dtype=torch.float64).reshape(A, gamma)

    tokens = arr("token", torch.long)
    committed = arr("committed_token", torch.long)[:, 0, 0] if A else torch.zeros(0, dtype=torch.long)
    return VariantRecords(
        name=name, order=order, anchor_ids=complete, committed=committed, tokens=tokens,
        p_tok=arr("p_tok"), q_tok=arr("q_tok"), tv=arr("tv"), accept=arr("accept"),
        tv_self=arr("tv_self"), risk=sarr("risk"), risk_oracle=sarr("risk_oracle"),
        risk_self=sarr("risk_self"), exposure=sarr("exposure"), incomplete=incomplete)


def load_records(anchor_slot: str | Path, paths_files: Sequence[str | Path],
                 slots_files: Sequence[str | Path],
                 labels: Mapping[str, str] | None = None) -> GapRecords:
    """Read the floors table and every drafter evaluation shard (variants from metadata;
    ``labels`` renames variants, e.g. a final drafter to ``<variant>@epoch-<E>``)."""
    labels = dict(labels or {})
    table = read_table(anchor_slot)
    missing = [c for c in FLOOR_FIELDS if c not in table]
    if missing:
        raise RecordMismatch(f"{anchor_slot} lacks columns {missing}")
    gamma = int(table["slot"].max()) + 1
    anchors = (table[["anchor_id", "prompt_id", "domain", "pi"]].drop_duplicates("anchor_id")
               .reset_index(drop=True))
    t0 = table.pivot(index="anchor_id", columns="slot", values="t0")
    t1 = table.pivot(index="anchor_id", columns="slot", values="t1_reweighted")
    # The importance route reveals a predecessor, so it has no value at slot 0; there every
    # path shares the committed token and the order-1 floor is the order-0 floor.
    t1[0] = t1[0].fillna(t0[0])
    known = set(anchors["anchor_id"])
    by_variant: dict[str, dict[str, list]] = {}
    target = read_metadata(anchor_slot).get("target")
    for kind, files in (("paths", paths_files), ("slots", slots_files)):
        for f in map(Path, files):
            meta = read_metadata(f)
            df = read_table(f)
            need = PATH_FIELDS if kind == "paths" else SLOT_FIELDS
            lack = [c for c in need if c not in df]
            if lack:
                raise RecordMismatch(f"{f} lacks columns {lack}")
            name = _variant_of(f, meta)
            name = labels.get(name, name)
            entry = by_variant.setdefault(name, {"paths": [], "slots": [], "order": set()})
            entry[kind].append(df)
            if meta.get("order") is not None:
                entry["order"].add(int(meta["order"]))
            if kind == "slots" and len(df):
                entry["order"].update(int(o) for o in df["order"].unique())
            if meta.get("target") and target and meta["target"] != target:
                raise RecordMismatch(f"{f} is of target {meta['target']}, the floors of {target}")
    variants = {}
    for name, entry in sorted(by_variant.items()):
        if len(entry["order"]) != 1:
            raise RecordMismatch(f"variant {name}: records disagree on the order {entry['order']}")
        if not entry["paths"] or not entry["slots"]:
            raise RecordMismatch(f"variant {name} lacks paths or slots records")
        paths = pd.concat(entry["paths"], ignore_index=True)
        slots = pd.concat(entry["slots"], ignore_index=True)
        variants[name] = _variant_records(name, paths, slots, gamma, entry["order"].pop(), known)
    return GapRecords(anchors=anchors, t0=t0, t1=t1, gamma=gamma, variants=variants,
                      target=target)


# -- aggregation --------------------------------------------------------------------------------

class _Scope:
    """One variant's anchors in one scope, with its shared prompt resample."""

    def __init__(self, name: str, ids: list[str], anchors: pd.DataFrame, n_boot: int, seed: int,
                 level: float):
        info = anchors.set_index("anchor_id").loc[ids]
        self.name = name
        self.ids = ids
        self.clusters = info["prompt_id"].astype(str).tolist()
        self.pi = torch.tensor(info["pi"].to_numpy(float), dtype=torch.float64)
        self.n_boot, self.seed, self.level = n_boot, seed, level
        self.rs = cluster_resample(self.clusters, n_boot, seed)

    def ratio(self, num: Tensor, den: Tensor | None = None, valid: Tensor | None = None):
        """Hajek ratio sum w num / sum w den over anchors (valid cells only) + interval."""
        if den is None:
            den = torch.ones_like(num)
        if valid is None:
            valid = num.isfinite() & den.isfinite()
        v = valid.to(num.dtype)
        n = torch.nan_to_num(num) * v
        d = torch.nan_to_num(den) * v
        res = prompt_bootstrap(n, self.clusters, self.pi, den=d, level=self.level, resample=self.rs)
        return res.estimate, res.lower, res.upper, valid.sum(0)


def _emit(rows: list[dict], stat: str, variant: str, domain: str, est, lo, hi, n,
          slots: Sequence[int] | None = None, note: str | None = None) -> None:
    def f(x, k=None):
        t = torch.as_tensor(x, dtype=torch.float64)
        return float(t.reshape(-1)[k] if k is not None else t.reshape(-1)[0])

    text = NOTES.get(stat, "") if note is None else note
    if slots is None:
        rows.append({"statistic": stat, "variant": variant, "domain": domain, "slot": -1,
                         "estimate": f(est), "lower": f(lo), "upper": f(hi), "n_anchors": int(f(n)),
                         "note": text})
        return
    for k in slots:
        rows.append({"statistic": stat, "variant": variant, "domain": domain, "slot": int(k),
                         "estimate": f(est, k), "lower": f(lo, k), "upper": f(hi, k),
                         "n_anchors": int(f(n, k)), "note": text})


def _floor_matrix(frame: pd.DataFrame, ids: list[str], gamma: int) -> Tensor:
    m = frame.reindex(index=ids, columns=range(gamma)).to_numpy(float)
    return torch.tensor(m, dtype=torch.float64)


def _boot(res, n: int):
    return res.estimate, res.lower, res.upper, torch.full_like(res.estimate, n)


def _variant_block(rows: list[dict], v: VariantRecords, rec: GapRecords, s: _Scope,
                   idx: Tensor, sweeps: bool) -> None:
    g = rec.gamma
    slots = range(g)
    t0 = _floor_matrix(rec.t0, s.ids, g)
    t1 = _floor_matrix(rec.t1, s.ids, g)
    risk = v.risk[idx]
    dom = s.name
    emit = lambda stat, r, sl=slots: _emit(rows, stat, v.name, dom, *r, slots=sl)
    _emit(rows, "n_anchors", v.name, dom, len(s.ids), math.nan, math.nan, len(s.ids))
    _emit(rows, "n_prompts", v.name, dom, len(set(s.clusters)), math.nan, math.nan, len(s.ids))
    _emit(rows, "order", v.name, dom, v.order, math.nan, math.nan, len(s.ids))
    emit("T0", s.ratio(t0))
    emit("T1", s.ratio(t1))
    if v.order == 0:
        emit("R", s.ratio(risk))
        emit("G0", s.ratio(risk - t0, valid=t0.isfinite()))
        emit("G0_share", s.ratio(risk - t0, risk, valid=t0.isfinite()))
    else:
        ro, rs_, ex = v.risk_oracle[idx], v.risk_self[idx], v.exposure[idx]
        emit("R_oracle", s.ratio(ro))
        emit("R_self", s.ratio(rs_))
        emit("exposure", s.ratio(ex))
        emit("G1", s.ratio(ro - t1, valid=t1.isfinite()))
        emit("G1_share", s.ratio(ro - t1, ro, valid=t1.isfinite()))
    a, tv = v.accept[idx], v.tv[idx]
    n = len(s.ids)
    summ = serving_summary(a, tv, s.clusters, s.pi, n_boot=s.n_boot, seed=s.seed, level=s.level)
    for stat, res in (("R_free", summ.free_risk), ("R_serve", summ.serve_risk),
                      ("R_serve_minus_free", summ.serve_minus_free), ("S", summ.joint_survival),
                      ("marginal", summ.marginal_acceptance), ("D", summ.dependence)):
        emit(stat, _boot(res, n))
    for stat, res in (("tau", summ.tau), ("tau_independent", summ.tau_independent),
                      ("tau_gap", summ.tau_gap)):
        _emit(rows, stat, v.name, dom, *_boot(res, n))
    prev = v.committed[idx]
    br = single_slot_gain(v.p_tok[idx], v.q_tok[idx], v.tokens[idx], prev, order=v.order)
    emit("dtau_br", s.ratio(br.cross_fitted))
    emit("dtau_br_in_sample", s.ratio(br.in_sample))
    emit("dtau_br_optimism", s.ratio(br.optimism))
    _emit(rows, "tau_base", v.name, dom, *s.ratio(br.tau_base.unsqueeze(-1)))
    if sweeps:
        sw = coordinate_sweep(v.p_tok[idx], v.q_tok[idx], v.tokens[idx], prev, order=v.order)
        for stat, x in (("sweep_forward", sw.forward), ("sweep_backward", sw.backward),
                        ("sweep_isolated_sum", sw.isolated_sum),
                        ("sweep_forward_minus_isolated", sw.forward - sw.isolated_sum),
                        ("sweep_backward_minus_isolated", sw.backward - sw.isolated_sum)):
            _emit(rows, stat, v.name, dom, *s.ratio(x.unsqueeze(-1)))
        iso = sw.isolated_sum.unsqueeze(-1)
        _emit(rows, "sweep_forward_ratio", v.name, dom, *s.ratio(sw.forward.unsqueeze(-1), iso))
        _emit(rows, "sweep_backward_ratio", v.name, dom, *s.ratio(sw.backward.unsqueeze(-1), iso))


def _contrast_block(rows: list[dict], va: VariantRecords, vb: VariantRecords, rec: GapRecords,
                    s: _Scope) -> None:
    g = rec.gamma
    ia = torch.tensor([va.anchor_ids.index(x) for x in s.ids])
    ib = torch.tensor([vb.anchor_ids.index(x) for x in s.ids])
    name = f"{va.name}-{vb.name}"
    note = f"{va.name} minus {vb.name}, paired within anchors"
    _emit(rows, "n_anchors", name, s.name, len(s.ids), math.nan, math.nan, len(s.ids))
    _emit(rows, "diff_tau", name, s.name,
          *s.ratio((expected_length(va.accept[ia]) - expected_length(vb.accept[ib]))[:, None]),
          note=note)
    if va.order != 1 or vb.order != 1:
        return  # the oracle, self and exposure contrasts are of order-1 drafters
    t1 = _floor_matrix(rec.t1, s.ids, g)
    ok = t1.isfinite()
    pairs = {
        "diff_T1": (t1, t1),
        "diff_R_oracle": (va.risk_oracle[ia], vb.risk_oracle[ib]),
        "diff_R_self": (va.risk_self[ia], vb.risk_self[ib]),
        "diff_G1": (va.risk_oracle[ia] - t1, vb.risk_oracle[ib] - t1),
        "diff_exposure": (va.exposure[ia], vb.exposure[ib]),
    }
    for stat, (xa, xb) in pairs.items():
        valid = ok if stat in ("diff_T1", "diff_G1") else None
        _emit(rows, stat, name, s.name, *s.ratio(xa - xb, valid=valid), slots=range(g),
              note=note)
    ga, gb = pairs["diff_G1"]
    _emit(rows, "gap_reduction", name, s.name, *s.ratio(gb - ga, gb, valid=ok), slots=range(g))


def summarise(rec: GapRecords, *, n_boot: int, level: float, seed: int = DEFAULT_BOOT_SEED,
              contrasts: Sequence[Sequence[str]] = (),
              sweeps: bool = True) -> pd.DataFrame:
    """The long-format summary (``SUMMARY_COLUMNS``) over "all" and every domain."""
    rows: list[dict] = []
    dom_of = rec.anchors.set_index("anchor_id")["domain"]
    domains = list(dict.fromkeys(rec.anchors["domain"]))
    for v in rec.variants.values():
        _emit(rows, "anchors_incomplete", v.name, "all", len(v.incomplete), math.nan, math.nan,
              len(v.anchor_ids), note="anchors whose drafter records are incomplete (dropped)")
        for scope in ["all", *domains]:
            ids = [a for a in v.anchor_ids if scope == "all" or dom_of[a] == scope]
            if not ids:
                continue
            idx = torch.tensor([v.anchor_ids.index(a) for a in ids])
            s = _Scope(scope, ids, rec.anchors, n_boot, seed, level)
            _variant_block(rows, v, rec, s, idx, sweeps)
    for a_name, b_name in contrasts:
        if a_name not in rec.variants or b_name not in rec.variants:
            continue
        va, vb = rec.variants[a_name], rec.variants[b_name]
        common = [a for a in va.anchor_ids if a in set(vb.anchor_ids)]
        for scope in ["all", *domains]:
            ids = [a for a in common if scope == "all" or dom_of[a] == scope]
            if ids:
                _contrast_block(rows, va, vb, rec, _Scope(scope, ids, rec.anchors, n_boot, seed,
                                                          level))
    out = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    out["estimate"] = out["estimate"].astype(float)
    return out


def per_anchor_floor_check(rec: GapRecords, tol: float = 1e-6) -> pd.DataFrame:
    """Cells where R^oracle < T1 - tol (order-1 variants): a floor above a risk is a bug or a
    noisy importance route; listed for the log."""
    out = []
    for v in rec.variants.values():
        if v.order != 1:
            continue
        t1 = _floor_matrix(rec.t1, v.anchor_ids, rec.gamma)
        bad = (v.risk_oracle < t1 - tol).nonzero().tolist()
        for i, k in bad:
            out.append({"variant": v.name, "anchor_id": v.anchor_ids[i], "slot": k,
                        "risk_oracle": float(v.risk_oracle[i, k]), "t1": float(t1[i, k])})
    return pd.DataFrame(out, columns=["variant", "anchor_id", "slot", "risk_oracle", "t1"])

