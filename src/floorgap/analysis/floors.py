"""Floors analysis: per anchor x slot values and their Hajek/bootstrap summary.

Inputs are the rollouts records of one target (``paths-<shard>.parquet`` and
``floors-<shard>.parquet`` of every domain) and its anchors files. The probe already computed
the full-vocabulary floors at every anchor and slot (T^(0) in-sample and split-half, T^(1) by
split-half predecessor grouping with its covered mass and bounds, the in-sample plug-in and the
importance route); this stage adds what the stored top-K reads allow on the CPU:

* the top-K order-0 floor T~ of the renormalised reads with its band E[r] (paper Sec. C.6) and
  the full-minus-top-K difference;
* the oracle-routed K-median objective for every K, with the restart spread (paper Sec. D.2),
  on the renormalised top-K reads, dense over the union of their supports (K = 1 is T~);
* the effective support N_eff of the k-token block prefixes (paper Sec. B.6, D.1), recomputed
  from the path tokens with the current estimator (the probe's value is kept beside it).

The headline order-1 floor is the split-half grouping estimate with its covered mass and
bounds (paper App. B.3); the importance route is reported beside it as the independent second
estimate with its ESS (App. C.2). Shares of T^(0) removed compare both floors on one
population of paths (see :func:`_floor_block`).

:func:`summarise` then aggregates anchors with Hajek weights 1/pi and prompt-cluster bootstrap
intervals (paper Sec. B.2), one resample per scope ("all" or one domain) shared by every
statistic of that scope, so all of them are paired.

Record problems are counted, never dropped silently: a malformed, duplicated or missing floor
row makes that anchor x slot cell unusable for the probe's values; a malformed, duplicated or
missing path row makes the anchor's top-K, K-median and N_eff values unusable (they need all M
paths). Both are listed with their file. An anchor without any floor record or without any
path record, records of anchors that no anchors file lists, and record files that disagree on
the run are an error naming the files (:class:`RecordMismatch`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED, cluster_resample, prompt_bootstrap
from floorgap.estimators.concentration import (
    percentile_interval_finite,
    top_share,
    weighted_bootstrap,
    weighted_correlation,
    weighted_quantile,
)
from floorgap.estimators.kmedian import tv_kmedian
from floorgap.estimators.support import effective_support
from floorgap.estimators.truncation import renormalised_dense, truncated_floor
from floorgap.errors import RecordMismatch, StageError
from floorgap.records import read_metadata, read_table
from floorgap.seeds import derive_seed

__all__ = [
    "ANCHOR_SLOT_COLUMNS",
    "SUMMARY_COLUMNS",
    "FloorRecords",
    "Issue",
    "RecordMismatch",
    "anchor_slot_table",
    "check_reveal_undefined",
    "load_records",
    "summarise",
]

log = logging.getLogger("floorgap.floors")

#: The probe's per anchor x slot values (floorgap.probes.rollouts.SlotFloorRecord).
FLOOR_VALUES = ["t0", "t0_split", "t0_covered", "t1_split_cov", "t1_covered_mass", "t1_lower",
                "t1_upper", "t1_uncovered_paths", "t1_plugin", "t1_reweighted",
                "t1_reweighted_ess_min", "t1_reweighted_ess_mean", "t1_reweighted_undefined",
                "n_eff"]
PATH_FIELDS = ["anchor_id", "path", "tokens", "logp", "topk_ids", "topk_probs", "residual"]
ANCHOR_FIELDS = ["anchor_id", "prompt_id", "domain", "pi"]
SUMMARY_COLUMNS = ["statistic", "domain", "slot", "estimate", "lower", "upper", "n_anchors",
                   "note"]
ANCHOR_SLOT_COLUMNS = [  # the fixed part; K-median columns follow, one pair per K
    "anchor_id", "prompt_id", "domain", "stratum", "pi", "slot", "status",
    "t0", "t0_split", "t0_covered", "t1_split_cov", "t1_covered_mass", "t1_lower", "t1_upper",
    "t1_uncovered_paths", "t1_plugin", "t1_reweighted", "t1_reweighted_ess_min",
    "t1_reweighted_ess_mean", "t1_reweighted_undefined", "n_eff_probe",
    "t0_topk", "t0_topk_band", "t0_topk_lower", "t0_topk_upper", "t0_full_minus_topk",
    "t0_top20", "t0_top20_band", "topk_support", "n_eff", "n_distinct_prefixes",
]
#: The API read of App. C.6 (OpenAI-compatible endpoints cap top_logprobs at 20): the first 20
#: entries of the stored (sorted) top-K reads, their residual the rest of the mass.
API_TOP_K = 20

#: Values may exceed [0, 1] by float rounding of the stored reads.
_TOL = 1e-5
#: Tolerance of the probability read check: sum(top-K) + residual = 1 (float32 reads).
_MASS_TOL = 1e-3
#: Concentration (paper Sec. 3.1): floors below this count as negligible.
NEGLIGIBLE_FLOOR = 0.01
#: Concentration (paper Sec. 3.1): the top decile of anchors.
TOP_FRACTION = 0.1
#: K-median restart spread at or below this counts as zero (paper Sec. D.2).
ZERO_SPREAD = 1e-9
#: Largest share of revealed predecessors at one slot whose importance weights may all be zero
#: (config ``analysis.reveal_undefined_max``); above it the importance route fails by name.
REVEAL_UNDEFINED_MAX = 0.05


@dataclass(frozen=True)
class Issue:
    """One corrupt, duplicated or missing record row. ``slot``/``path`` are -1 when n/a."""

    kind: str
    anchor_id: str
    slot: int
    path: int
    source: str
    detail: str


@dataclass
class FloorRecords:
    """Validated records of one target.

    ``anchors``: one row per anchor (domain order, then anchor id); ``cells``: one row per
    anchor x slot with the probe's values (NaN where the cell's record is unusable) and a
    ``status``; ``paths``: per anchor the path arrays, or None when its path records are
    incomplete; ``domains``: per domain its stand-in facts.
    """

    anchors: pd.DataFrame
    cells: pd.DataFrame
    paths: dict[str, dict[str, np.ndarray] | None]
    gamma: int
    paths_per_anchor: int
    top_k: int
    reveal_paths: int
    target: str | None
    domains: dict[str, dict[str, Any]]
    issues: list[Issue] = field(default_factory=list)
    #: ``chat`` or ``plain`` (a base model's prompts, no chat template); None in older records
    prompts: str | None = None

    def issue_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for issue in self.issues:
            out[issue.kind] = out.get(issue.kind, 0) + 1
        return out


# -- loading and validation ---------------------------------------------------------------------

def _domain_facts(meta: dict[str, Any], anchors: pd.DataFrame) -> dict[str, Any]:
    prov = meta.get("provenance") or {}
    stand_in = meta.get("stand_in_for")
    if not stand_in and "stand_in_for" in anchors:
        vals = [v for v in anchors["stand_in_for"].dropna().unique() if str(v)]
        stand_in = str(vals[0]) if vals else None
    dataset = prov.get("dataset")
    return {"stand_in_for": stand_in or None,
            "dataset": dataset,
            "dataset_short": str(dataset).split(" (")[0] if dataset else None,
            "paper_dataset": prov.get("paper_dataset")}


def _read_checked(f: Path, columns: Sequence[str], kind: str) -> pd.DataFrame:
    """The table of ``f``; :class:`RecordMismatch` when it lacks any of ``columns``."""
    df = read_table(f)
    missing = [c for c in columns if c not in df]
    if missing:
        raise RecordMismatch(f"{f} lacks {kind} columns {missing}")
    return df


def _read_anchors(files: Sequence[Path]) -> tuple[pd.DataFrame, dict[str, dict], int | None]:
    frames, domains, gammas = [], {}, {}
    for f in files:
        df = _read_checked(f, ANCHOR_FIELDS, "anchor")
        meta = read_metadata(f)
        if meta.get("gamma") is not None:
            gammas[str(f)] = int(meta["gamma"])
        names = df["domain"].unique().tolist()
        if len(names) != 1:
            raise RecordMismatch(f"{f} mixes domains {names}")
        domains[names[0]] = _domain_facts(meta, df)
        df = df.assign(anchors_file=str(f))
        frames.append(df)
    anchors = pd.concat(frames, ignore_index=True)
    dup = anchors["anchor_id"][anchors["anchor_id"].duplicated()].unique().tolist()
    if dup:
        files_of = anchors[anchors["anchor_id"].isin(dup)]["anchors_file"].unique().tolist()
        raise RecordMismatch(f"anchors {dup[:5]} appear more than once in {files_of}")
    if len(set(gammas.values())) > 1:
        raise RecordMismatch(f"anchors files disagree on gamma: {gammas}")
    if not bool(((anchors["pi"] > 0) & (anchors["pi"] <= 1)).all()):
        bad = anchors[~((anchors["pi"] > 0) & (anchors["pi"] <= 1))]
        raise RecordMismatch(f"inclusion probabilities outside (0, 1] in "
                             f"{bad['anchors_file'].unique().tolist()}")
    if "stratum" not in anchors:
        anchors["stratum"] = ""
    gamma = next(iter(gammas.values())) if gammas else None
    return anchors, domains, gamma


def _run_facts(files: Sequence[Path]) -> dict[str, Any]:
    """gamma, M, K, J, target and its prompt format from the record files' metadata; they must
    agree."""
    facts: dict[str, dict[str, Any]] = {}
    for f in files:
        meta = read_metadata(f)
        roll = meta.get("rollouts") or {}
        facts[str(f)] = {"gamma": meta.get("gamma"), "paths": roll.get("paths"),
                         "store_top_k": roll.get("store_top_k"),
                         "reveal_paths": roll.get("reveal_paths"), "target": meta.get("target"),
                         "prompts": meta.get("prompts")}
    for key in ("gamma", "paths", "store_top_k", "reveal_paths", "target", "prompts"):
        seen = {str(v[key]) for v in facts.values()}
        if len(seen) > 1:
            detail = {f: v[key] for f, v in facts.items()}
            raise RecordMismatch(f"record files disagree on {key}: {detail}")
    first = next(iter(facts.values()))
    if first["gamma"] is None or first["paths"] is None:
        raise RecordMismatch(f"record files {list(facts)} lack gamma / rollouts.paths metadata")
    return first


def _floor_row_problem(row: Any, gamma: int, reveal: int) -> str | None:
    """Why a floor record row is unusable, or None."""
    slot = row.slot
    if not (isinstance(slot, (int, np.integer)) and 0 <= slot < gamma):
        return f"slot {slot!r} outside 0..{gamma - 1}"

    def unit(name: str, allow_nan: bool = False) -> str | None:
        v = getattr(row, name)
        try:
            v = float(v)
        except (TypeError, ValueError):
            return f"{name} is not a number ({v!r})"
        if math.isnan(v):
            return None if allow_nan else f"{name} is NaN"
        if not (-_TOL <= v <= 1 + _TOL):
            return f"{name}={v!r} outside [0, 1]"
        return None

    for name in ("t0", "t0_split", "t1_covered_mass", "t1_lower", "t1_upper", "t1_plugin"):
        problem = unit(name)
        if problem:
            return problem
    c = float(row.t1_covered_mass)
    for name in ("t1_split_cov", "t0_covered"):
        problem = unit(name, allow_nan=c == 0)
        if problem:
            return problem
    try:
        undefined = float(row.t1_reweighted_undefined)
    except (TypeError, ValueError):
        undefined = math.nan
    if not (math.isfinite(undefined) and undefined == int(undefined)
            and 0 <= undefined <= max(reveal, 0)):
        return f"t1_reweighted_undefined={row.t1_reweighted_undefined!r} outside 0..{reveal}"
    if float(row.t1_lower) > float(row.t1_upper) + _TOL:
        return "t1_lower exceeds t1_upper"
    problem = unit("t1_reweighted", allow_nan=True)
    if problem:
        return problem
    if slot == 0 and float(row.t0) > _TOL:
        return f"t0={float(row.t0)!r} at slot 0, where every path shares the context"
    for name in ("t1_reweighted_ess_min", "t1_reweighted_ess_mean"):
        v = float(getattr(row, name))
        if not math.isnan(v) and v < 0:
            return f"{name}={v!r} is negative"
    try:
        n_eff = float(row.n_eff)
    except (TypeError, ValueError):
        return f"n_eff is not a number ({row.n_eff!r})"
    if not (math.isfinite(n_eff) and n_eff >= 1 - _TOL):
        return f"n_eff={n_eff!r} below 1"
    return None


def _path_arrays(rows: pd.DataFrame, gamma: int, M: int, source: dict[int, str],
                 anchor_id: str) -> tuple[dict[str, np.ndarray] | None, list[Issue]]:
    """Stack one anchor's path rows into arrays; any bad, duplicated or missing row -> None."""
    issues: list[Issue] = []
    good: dict[int, tuple] = {}
    width = None
    lengths = [len(v) for v in rows["topk_ids"] if hasattr(v, "__len__")]
    if lengths:
        width = max(set(lengths), key=lengths.count)
    seen: set[int] = set()
    for pos, row in enumerate(rows.itertuples(index=False)):
        src = source[pos]
        try:
            r = int(row.path)
        except (TypeError, ValueError):
            issues.append(Issue("path_corrupt", anchor_id, -1, -1, src, f"path index {row.path!r}"))
            continue
        if r in seen:
            issues.append(Issue("path_duplicate", anchor_id, -1, r, src, "path index repeated"))
            good.pop(r, None)
            continue
        seen.add(r)
        problem = None
        try:
            tokens = np.asarray(row.tokens, dtype=np.int64)
            logp = np.asarray(row.logp, dtype=np.float64)
            ids = np.asarray(row.topk_ids, dtype=np.int64)
            probs = np.asarray(row.topk_probs, dtype=np.float64)
            resid = np.asarray(row.residual, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            problem = f"unreadable arrays ({exc})"
        if problem is None:
            if not 0 <= r < M:
                problem = f"path index {r} outside 0..{M - 1}"
            elif tokens.shape != (gamma,) or logp.shape != (gamma,) or resid.shape != (gamma,):
                problem = (f"tokens/logp/residual lengths {tokens.shape}/{logp.shape}/"
                           f"{resid.shape}, expected {gamma}")
            elif width is None or width % gamma or ids.shape != (width,) or probs.shape != (width,):
                problem = f"top-K arrays of length {ids.shape}/{probs.shape}, expected {width}"
            elif (tokens < 0).any() or (ids < 0).any():
                problem = "negative token id"
            elif not (np.isfinite(probs).all() and np.isfinite(resid).all()):
                problem = "non-finite probability read"
            elif (probs < -_TOL).any() or (probs > 1 + _TOL).any():
                problem = "top-K probability outside [0, 1]"
            elif (resid < -_TOL).any() or (resid > 1 + _TOL).any():
                problem = "residual outside [0, 1]"
            elif np.isnan(logp).any() or (logp > _TOL).any():
                problem = "log-probability NaN or positive"
            else:
                K = width // gamma
                mass = probs.reshape(gamma, K).sum(-1) + resid
                if np.abs(mass - 1).max() > _MASS_TOL:
                    problem = f"top-K mass + residual = {mass.round(4).tolist()}, not 1"
        if problem is not None:
            issues.append(Issue("path_corrupt", anchor_id, -1, r, src, problem))
            continue
        good[r] = (tokens, ids, probs, resid)
    missing = sorted(set(range(M)) - seen)
    for r in missing:
        issues.append(Issue("path_missing", anchor_id, -1, r, "", "no record of this path"))
    if issues or len(good) != M:
        return None, issues
    K = width // gamma
    order = range(M)
    return {
        "tokens": np.stack([good[r][0] for r in order]),
        "topk_ids": np.stack([good[r][1].reshape(gamma, K) for r in order]),
        "topk_probs": np.stack([good[r][2].reshape(gamma, K) for r in order]),
        "residual": np.stack([good[r][3] for r in order]),
    }, issues


def _check_file_lists(anchors_files: Sequence[Path], paths_files: Sequence[Path],
                      floors_files: Sequence[Path]) -> None:
    """Every kind of record is given, and no file is given twice."""
    if not anchors_files or not paths_files or not floors_files:
        raise RecordMismatch("need anchors, paths and floors files")
    for kind, files in (("anchors", anchors_files), ("paths", paths_files),
                        ("floors", floors_files)):
        repeated = sorted({str(f) for f in files if files.count(f) > 1})
        if repeated:
            raise RecordMismatch(f"{kind} files given more than once: {repeated}")


def _read_record_files(files: Sequence[Path], columns: Sequence[str], kind: str) -> pd.DataFrame:
    """The rows of ``files`` concatenated, each tagged with its ``source`` file."""
    return pd.concat([_read_checked(f, columns, kind).assign(source=str(f)) for f in files],
                     ignore_index=True)


def _check_coverage(anchors: pd.DataFrame, kind: str, df: pd.DataFrame,
                    files: Sequence[Path], anchors_files: Sequence[Path]) -> None:
    """The ``kind`` records cover exactly the anchors, each anchor from a single file."""
    known = set(anchors["anchor_id"])
    stray = df[~df["anchor_id"].isin(known)]
    if len(stray):
        raise RecordMismatch(
            f"{kind} records of anchors {sorted(stray['anchor_id'].unique())[:5]} in "
            f"{sorted(stray['source'].unique())} are not in the anchors files "
            f"{[str(f) for f in anchors_files]}")
    # An anchor's records come from one shard file.
    per_anchor = df.groupby("anchor_id")["source"].nunique()
    split = per_anchor[per_anchor > 1].index.tolist()
    if split:
        srcs = sorted(df[df["anchor_id"].isin(split)]["source"].unique())
        raise RecordMismatch(f"{kind} records of anchors {split[:5]} are spread over {srcs}")
    absent = anchors[~anchors["anchor_id"].isin(set(df["anchor_id"]))]
    if len(absent):
        raise RecordMismatch(
            f"anchors {absent['anchor_id'].tolist()[:5]} ({len(absent)} in all) of "
            f"{sorted(absent['anchors_file'].unique())} have no {kind} records in "
            f"{[str(f) for f in files]}")


def _floor_rows_by_slot(anchor_id: str, rows: pd.DataFrame | None, gamma: int, reveal: int,
                        issues: list[Issue]) -> dict[int, list]:
    """An anchor's floor rows grouped by slot; a corrupt row counts as ``None`` (and an issue)."""
    by_slot: dict[int, list] = {}
    if rows is None:
        return by_slot
    for row in rows.itertuples(index=False):
        problem = _floor_row_problem(row, gamma, reveal)
        if problem is not None:
            slot = int(row.slot) if isinstance(row.slot, (int, np.integer)) else -1
            issues.append(Issue("floor_corrupt", anchor_id, slot, -1, row.source, problem))
            by_slot.setdefault(slot, []).append(None)
            continue
        by_slot.setdefault(int(row.slot), []).append(row)
    return by_slot


def _floor_cell(anchor_id: str, k: int, entries: list, issues: list[Issue]) -> dict[str, Any]:
    """The anchor x slot cell: its status and, when exactly one sound row exists, its values."""
    values = {c: float("nan") for c in FLOOR_VALUES}
    if not entries:
        status = "floor_missing"
        issues.append(Issue("floor_missing", anchor_id, k, -1, "",
                            "no floor record of this slot"))
    elif len(entries) > 1:
        status = "floor_duplicate"
        src = next((e.source for e in entries if e is not None), "")
        issues.append(Issue("floor_duplicate", anchor_id, k, -1, src,
                            f"{len(entries)} floor records of this slot"))
    elif entries[0] is None:
        status = "floor_corrupt"
    else:
        status = "ok"
        values = {c: float(getattr(entries[0], c)) for c in FLOOR_VALUES}
    return {"anchor_id": anchor_id, "slot": k, "status": status, **values}


def _floor_cells(anchors: pd.DataFrame, floors_df: pd.DataFrame, gamma: int, reveal: int,
                 issues: list[Issue]) -> pd.DataFrame:
    """One row per anchor x slot ``k < gamma`` with its status and floor values."""
    cell_rows = []
    floors_by_anchor = dict(tuple(floors_df.groupby("anchor_id", sort=False)))
    for a in anchors.itertuples(index=False):
        by_slot = _floor_rows_by_slot(a.anchor_id, floors_by_anchor.get(a.anchor_id), gamma,
                                      reveal, issues)
        for k in range(gamma):
            cell_rows.append(_floor_cell(a.anchor_id, k, by_slot.get(k, []), issues))
    return pd.DataFrame(cell_rows)


def _anchor_path_arrays(anchors: pd.DataFrame, paths_df: pd.DataFrame, gamma: int, M: int,
                        top_k: int, issues: list[Issue]
                        ) -> tuple[dict[str, dict[str, np.ndarray] | None], int]:
    """Each anchor's path arrays (``None`` when unusable) and the stored top-K width."""
    path_arrays: dict[str, dict[str, np.ndarray] | None] = {}
    paths_by_anchor = dict(tuple(paths_df.groupby("anchor_id", sort=False)))
    for aid in anchors["anchor_id"]:
        rows = paths_by_anchor.get(aid)
        if rows is None:
            path_arrays[aid] = None
            issues.append(Issue("path_missing", aid, -1, -1, "", f"no path records (M={M})"))
            continue
        rows = rows.reset_index(drop=True)
        arrays, found = _path_arrays(rows, gamma, M, dict(enumerate(rows["source"])), aid)
        path_arrays[aid] = arrays
        issues += found
        if arrays is not None:
            top_k = arrays["topk_ids"].shape[-1]
    return path_arrays, top_k


def _sort_by_domain(anchors: pd.DataFrame, domains: Sequence[str]) -> pd.DataFrame:
    """Anchors in the domains' order, then by id."""
    order = {d: i for i, d in enumerate(domains)}
    return (anchors.assign(_d=anchors["domain"].map(order))
            .sort_values(["_d", "anchor_id"], kind="stable").drop(columns="_d")
            .reset_index(drop=True))


def load_records(anchors_files: Sequence[str | Path], paths_files: Sequence[str | Path],
                 floors_files: Sequence[str | Path]) -> FloorRecords:
    """Read and validate one target's anchors and rollouts records.

    Raises :class:`RecordMismatch` (naming the files) when the anchors and the records do not
    cover the same anchors or the record files disagree on the run (gamma, M, K, J, target).
    Corrupt, duplicated or missing rows of anchors that are present are recorded as
    :class:`Issue` s.
    """
    anchors_files = [Path(f) for f in anchors_files]
    paths_files = [Path(f) for f in paths_files]
    floors_files = [Path(f) for f in floors_files]
    _check_file_lists(anchors_files, paths_files, floors_files)
    anchors, domains, anchors_gamma = _read_anchors(anchors_files)
    facts = _run_facts(paths_files + floors_files)
    gamma, M = int(facts["gamma"]), int(facts["paths"])
    if anchors_gamma is not None and anchors_gamma != gamma:
        raise RecordMismatch(f"anchors {[str(f) for f in anchors_files]} were drawn for "
                             f"gamma={anchors_gamma}, the records {[str(f) for f in floors_files]}"
                             f" hold gamma={gamma}")
    floors_df = _read_record_files(floors_files, ["anchor_id", "slot", *FLOOR_VALUES], "floor")
    paths_df = _read_record_files(paths_files, PATH_FIELDS, "path")
    _check_coverage(anchors, "floor", floors_df, floors_files, anchors_files)
    _check_coverage(anchors, "path", paths_df, paths_files, anchors_files)

    issues: list[Issue] = []
    reveal = int(facts["reveal_paths"] or 0)
    cells = _floor_cells(anchors, floors_df, gamma, reveal, issues)
    path_arrays, top_k = _anchor_path_arrays(anchors, paths_df, gamma, M,
                                             int(facts["store_top_k"] or 0), issues)
    for issue in issues:
        log.warning("record problem: %s anchor %s slot %d path %d in %s: %s", issue.kind,
                    issue.anchor_id, issue.slot, issue.path, issue.source or "-", issue.detail)
    return FloorRecords(anchors=_sort_by_domain(anchors, domains), cells=cells,
                        paths=path_arrays, gamma=gamma, paths_per_anchor=M, top_k=top_k,
                        reveal_paths=reveal, target=facts.get("target"), domains=domains,
                        issues=issues, prompts=facts.get("prompts"))


# -- per anchor x slot values -------------------------------------------------------------------

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
    cells = records.cells.rename(columns={"n_eff": "n_eff_probe"})
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


# -- summary ------------------------------------------------------------------------------------

NOTES = {
    "T0": "Hajek mean of the in-sample full-vocabulary order-0 floor",
    "T0_split": "Hajek mean of the split-half order-0 floor (fit on one half, score on the other)",
    "T0_split_minus_T0": "Hajek mean of split-half minus in-sample order-0 floor (fit check, C.3)",
    "T1_split_covered": "headline order-1 floor: covered split-half floor T_cov (grouping by "
                        "the realised predecessor, fit on one half, score on the other), "
                        "weighted by covered path mass: sum w c T_cov / sum w c",
    "T0_covered": "in-sample order-0 floor on the same covered paths: sum w c T0_cov / sum w c",
    "T1_covered_mass": "Hajek mean of the covered path mass c of the split-half order-1 floor",
    "T1_split_lower": "Hajek mean of the lower bound c*T_cov of the order-1 floor",
    "T1_split_upper": "Hajek mean of the upper bound c*T_cov + 1 - c of the order-1 floor",
    "T1_split_mid": "Hajek mean of the midpoint c*T_cov + (1 - c)/2 of the order-1 bounds",
    "T1_plugin": "Hajek mean of the in-sample order-1 plug-in (grouping, fit = score)",
    "T1_reweighted": "second estimate: Hajek mean of the importance-route order-1 floor (mean "
                     "over the revealed predecessors of each anchor with some weight)",
    "T1_reweighted_ess_mean": "Hajek mean of the per-anchor mean Kish ESS of the importance "
                              "weights",
    "T1_reweighted_ess_min": "smallest Kish ESS of the importance weights over anchors and "
                             "revealed predecessors (no interval)",
    "T1_reweighted_undefined": "count of revealed predecessors whose importance weights are "
                               "all zero; they are left out of their anchor's mean",
    "T1_reweighted_undefined_share": "share of the slot's revealed predecessors whose "
                                     "importance weights are all zero",
    "T1_reweighted_cells_undefined": "count of cells where every revealed predecessor is "
                                     "undefined; they are left out of T1_reweighted",
    "share_removed_reweighted": "1 - T1/T0 with T1 = importance route; ratio of Hajek sums",
    "share_removed_split_covered": "headline share removed: 1 - T_cov/T0_cov on the covered "
                                   "paths, ratio of covered-mass-weighted Hajek sums",
    "share_removed_split_mid": "1 - T1/T0 with T1 = midpoint of the split-half bounds "
                               "c*T_cov + (1 - c)/2; ratio of Hajek sums",
    "share_removed_split_min": "1 - T1/T0 with T1 = upper split-half bound (least share "
                               "removed the bounds allow)",
    "share_removed_split_max": "1 - T1/T0 with T1 = lower split-half bound (largest share "
                               "removed the bounds allow)",
    "T0_topk": "Hajek mean of the order-0 floor of the renormalised top-K reads",
    "T0_topk_band": "Hajek mean of the truncation band E[r] (mean residual mass), C.6",
    "T0_full_minus_topk": "Hajek mean of full-vocabulary minus top-K order-0 floor",
    "T0_full_minus_topk_abs": "Hajek mean of |full-vocabulary - top-K order-0 floor|",
    "topk_band_violations": "count of cells where |full - top-K| exceeds the band E[r] "
                            "(+1e-6); the band is a theorem, so this should be 0",
    "T0_top20": "Hajek mean of the order-0 floor of the first 20 entries of the top-K reads "
                "(the API read, App. C.6)",
    "T0_top20_band": "Hajek mean of the top-20 band E[r]",
    "T0_top20_minus_full": "Hajek mean of the paired difference top-20 - full vocabulary",
    "T0_top20_minus_full_abs": "Hajek mean of |top-20 - full vocabulary| order-0 floor",
    "top20_band_violations": "count of cells where |full - top-20| exceeds its band (+1e-6)",
    "T0_median": "Hajek-weighted median of the order-0 floor (averaged inverse CDF)",
    "T0_topdecile_share": "share of the slot's Hajek-weighted total floor carried by the top "
                          "decile of anchor mass",
    "T0_share_below_001": "Hajek share of anchors with order-0 floor < 0.01",
    "T0_below_001_share_of_total": "share of the slot's total floor from anchors with floor "
                                   "< 0.01",
    "neff_median": "Hajek median of N_eff of the k-token block prefixes (slot k); at the last "
                   "slot these are the (gamma-1)-token prefixes",
    "neff_p90": "Hajek 90th percentile of N_eff of the k-token block prefixes",
    "neff_mean": "Hajek mean of N_eff of the k-token block prefixes",
    "neff_min": "smallest N_eff over anchors (no interval)",
    "neff_max": "largest N_eff over anchors (no interval)",
    "neff_at_cap_share": "Hajek share of anchors where no two paths share a prefix (N_eff "
                         "recorded as M)",
    "neff_probe_mismatch": "count of cells where the probe's stored N_eff differs from the "
                           "current estimator on the same tokens (the analysis uses the latter)",
    "corr_log_neff_T0": "Hajek-weighted Pearson correlation of log N_eff (k-token prefixes) "
                        "with the order-0 floor at slot k",
    "corr_neff_T0": "Hajek-weighted Pearson correlation of N_eff (raw scale) with the order-0 "
                    "floor at slot k",
    "kmedian_objective": "Hajek mean of the best-restart K-median objective on the renormalised "
                         "top-K reads",
    "kmedian_share_removed": "1 - (K-median objective)/(K=1 objective = top-K T0) on the same "
                             "reads, best restart; ratio of Hajek sums",
    "kmedian_share_removed_worst": "as kmedian_share_removed, with the worst restart's "
                                   "objective (best + spread)",
    "kmedian_spread_mean": "Hajek mean of the restart spread (max - min objective)",
    "kmedian_spread_max": "largest restart spread over anchors (no interval)",
    "kmedian_spread_zero_share": "Hajek share of (anchor, slot >= 1, K >= 2) cell mass whose "
                                 "restart spread is zero (<= 1e-9)",
    "kmedian_spread_p90": "Hajek 90th percentile of the restart spread over (anchor, slot >= 1, "
                          "K >= 2) cells",
    "kmedian_spread_mean_max": "largest Hajek-mean restart spread over (K >= 2, slot) pairs",
    "n_anchors": "anchors in the scope",
    "n_prompts": "prompts (bootstrap clusters) in the scope",
    "paths_per_anchor": "M, target paths per anchor",
    "gamma": "block length",
    "store_top_k": "K of the stored top-K reads",
    "reveal_paths": "J, revealed predecessors per anchor of the importance route",
    "bootstrap_replicates": "B, prompt-bootstrap replicates",
    "records_corrupt": "count of corrupt or duplicated record rows (floor rows and path rows); "
                       "the affected cells are left out and listed in the log",
    "records_missing": "count of missing record rows (anchor x slot floor rows, paths); the "
                       "affected cells are left out and listed in the log",
    "cells_excluded": "anchor x slot cells left out of the probe's floor statistics",
    "cells_excluded_paths": "anchor x slot cells left out of the top-K, K-median and N_eff "
                            "statistics (incomplete path records)",
}


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
        num, den = base - t1, base
        _emit_slots(rows, name, s.name, s.ratio(num, den, mask), deep)
        est, lo, hi, n = s.ratio(_pooled(num, mask, deep), _pooled(den, mask, deep),
                                 mask[:, list(deep)].any(1, keepdim=True))
        _emit(rows, name, s.name, -1, est[0], lo[0], hi[0], n[0],
              NOTES[name] + "; pooled over slots 1..gamma-1")


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
        est, lo, hi, n = s.ratio(_pooled(tk - obj, ok, deep), _pooled(tk, ok, deep),
                                 ok[:, list(deep)].any(1, keepdim=True))
        _emit(rows, f"kmedian_share_removed_K{K}", s.name, -1, est[0], lo[0], hi[0], n[0],
              NOTES["kmedian_share_removed"] + note + "; pooled over slots 1..gamma-1")
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
    out = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return out


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


def log_record_problems(summary: pd.DataFrame) -> None:
    """Warn about the corrupt and missing records counted in the summary (all domains)."""
    for stat in ("records_corrupt", "records_missing"):
        row = summary[(summary["statistic"] == stat) & (summary["domain"] == "all")]
        if len(row) and row["estimate"].iloc[0] > 0:
            log.warning("%s: %d (%s)", stat, int(row["estimate"].iloc[0]), row["note"].iloc[0])


def _issue_note(issues: Sequence[Issue]) -> str:
    if not issues:
        return ""
    kinds: dict[str, int] = {}
    for i in issues:
        kinds[i.kind] = kinds.get(i.kind, 0) + 1
    shown = "; ".join(f"{i.kind} {i.anchor_id} slot {i.slot} path {i.path}"
                      f" ({Path(i.source).name if i.source else '-'}): {i.detail}"
                      for i in issues[:5])
    more = f"; ... {len(issues) - 5} more" if len(issues) > 5 else ""
    return " [" + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) + "] " + shown + more
