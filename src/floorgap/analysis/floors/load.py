"""The floors analysis's records: the rollouts records of one target read, checked against
their anchors and against each other, and arranged as per anchor x slot cells and per anchor
path arrays (:func:`load_records`). Problems are counted per cell (:class:`Issue`), never
dropped silently; records that disagree on the run are an error naming the files."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from floorgap.errors import RecordMismatch
from floorgap.probes.record_types import SlotFloorRecord
from floorgap.records import read_metadata, read_table

log = logging.getLogger("floorgap.floors")

#: The probe's per anchor x slot values: the fields of floorgap.probes.rollouts.SlotFloorRecord
#: beyond its keys.
FLOOR_VALUES = [f.name for f in fields(SlotFloorRecord) if f.name not in ("anchor_id", "slot")]
PATH_FIELDS = ["anchor_id", "path", "tokens", "logp", "topk_ids", "topk_probs", "residual"]
ANCHOR_FIELDS = ["anchor_id", "prompt_id", "domain", "pi"]

#: Values may exceed [0, 1] by float rounding of the stored reads.
_TOL = 1e-5
#: Tolerance of the probability read check: sum(top-K) + residual = 1 (float32 reads).
_MASS_TOL = 1e-3


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
        return dict(Counter(issue.kind for issue in self.issues))


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
        frames.append(df.assign(anchors_file=str(f)))
    anchors = pd.concat(frames, ignore_index=True)
    dup = anchors["anchor_id"][anchors["anchor_id"].duplicated()].unique().tolist()
    if dup:
        files_of = anchors[anchors["anchor_id"].isin(dup)]["anchors_file"].unique().tolist()
        raise RecordMismatch(f"anchors {dup[:5]} appear more than once in {files_of}")
    if len(set(gammas.values())) > 1:
        raise RecordMismatch(f"anchors files disagree on gamma: {gammas}")
    bad_pi = ~((anchors["pi"] > 0) & (anchors["pi"] <= 1))
    if bool(bad_pi.any()):
        raise RecordMismatch(f"inclusion probabilities outside (0, 1] in "
                             f"{anchors[bad_pi]['anchors_file'].unique().tolist()}")
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
    issues += [Issue("path_missing", anchor_id, -1, r, "", "no record of this path")
               for r in sorted(set(range(M)) - seen)]
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
        cell_rows += [_floor_cell(a.anchor_id, k, by_slot.get(k, []), issues)
                      for k in range(gamma)]
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
