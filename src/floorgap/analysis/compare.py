"""Two finished runs of the workflow side by side (``floorgap compare RUN_A RUN_B``).

Three questions, each answered from the runs' own files:

* **Records** (:func:`compare_records`): per stage and target, is every record file of A the same
  as B's? Each pair of files is *equal* (every value and the settings in its metadata bit for
  bit), *close* (numbers within ``rtol``/``atol``; the largest difference is kept) or *different*
  (the first differing file, column or key is named). Wall times, speedups and other timings
  are set apart (:data:`TIMING`): they are listed, never counted.
* **Numbers** (:func:`compare_numbers`): every estimate of the runs' long-format summaries that
  carries an interval (the paper's numbers), and whether A's and B's differ by more than their
  intervals allow (each estimate outside the other's interval).
* **Conclusions** (:func:`compare_claims`): every finding of the paper whose verdict on A is
  not its verdict on B (``paper/tables/claims.csv``).

Runs of different configs are refused by name: the settings their records carry
(:func:`setting_differences`) must agree.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from floorgap.errors import StageError
from floorgap.records import read_metadata, read_table

__all__ = ["FileComparison", "NumberComparison", "RunComparison", "TIMING", "compare_runs",
           "compare_records", "compare_numbers", "compare_claims", "setting_differences",
           "run_targets"]

#: Fields that time a run (wall times, throughput, the speedups computed from them, the run's
#: own folder): set apart, not compared.
TIMING = re.compile(r"(^|_)(wall|seconds|secs|elapsed|duration|speedup|throughput|latency|ttft|"
                    r"tokens_per_s|time|started|finished|created|host|pid|run_dir|cwd)(_s)?$",
                    re.I)
#: Record files compared, by suffix.
SUFFIXES = (".parquet", ".pt", ".json", ".jsonl")
#: Metadata keys that are settings (a run of another config differs in them).
SETTING_KEYS = ("law", "rollouts", "anchors", "gamma", "analysis", "seed", "paths_per_anchor",
                "store_top_k", "reveal_paths", "domain", "target", "dtype", "prompts", "mi",
                "top_k", "paths")


@dataclass(frozen=True)
class FileComparison:
    """One record file of both runs: ``status`` equal, close, different, only in A, only in B;
    ``detail`` names the first difference or the largest one within tolerance."""

    path: str
    stage: str
    target: str
    status: str
    detail: str = ""
    max_diff: float = 0.0
    timing: tuple[str, ...] = ()


@dataclass(frozen=True)
class NumberComparison:
    """One estimate with an interval in both runs' summaries."""

    summary: str
    key: str
    a: float
    b: float
    moved: bool   # each outside the other's interval


@dataclass
class RunComparison:
    """Everything :func:`compare_runs` found; :attr:`outcome` is identical, same conclusions
    or a number moved."""

    a: Path
    b: Path
    files: list[FileComparison] = field(default_factory=list)
    numbers: list[NumberComparison] = field(default_factory=list)
    claims: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(f.status == "equal" for f in self.files)

    @property
    def moved(self) -> list[NumberComparison]:
        return [n for n in self.numbers if n.moved]

    @property
    def outcome(self) -> str:
        if self.identical:
            return "identical"
        return "a number moved" if self.moved or self.claims else "same conclusions"


def run_targets(run: Path) -> list[str]:
    """The targets of a finished run (``results/<target>/manifest.json``); a folder that is not
    a run is refused in one line."""
    results = run / "results"
    targets = sorted(p.parent.name for p in results.glob("*/manifest.json")) if results.is_dir() \
        else []
    if not targets:
        raise StageError(f"{run} is not a finished run of the workflow (no "
                         "results/<target>/manifest.json); give the folder snakemake ran in")
    return targets


def _stage(rel: str) -> tuple[str, str]:
    """(target, stage) of a record file ``results/<target>/<stage>/...`` (a file directly in
    the target's folder counts as the stage of its name)."""
    parts = Path(rel).parts
    return parts[1], parts[2] if len(parts) > 3 else Path(parts[2]).stem


def _records(run: Path, target: str) -> dict[str, Path]:
    root = run / "results" / target
    return {str(p.relative_to(run)): p for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix in SUFFIXES and p.name != "manifest.json"}


def _settings(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: meta[k] for k in SETTING_KEYS if k in meta}


def _flat(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, obj


def setting_differences(a: Path, b: Path) -> list[str]:
    """``key: A vs B`` of every setting two runs' records carry differently (their targets, then
    each summary's and probe record's settings), the config keys that differ."""
    ta, tb = run_targets(a), run_targets(b)
    if ta != tb:
        return [f"targets: {ta} vs {tb}"]
    found: dict[str, str] = {}
    for target in ta:
        ra, rb = _records(a, target), _records(b, target)
        for rel in sorted(set(ra) & set(rb)):
            if not rel.endswith(".parquet"):
                continue
            sa, sb = (dict(_flat(_settings(_metadata(p, rel)))) for p in (ra[rel], rb[rel]))
            for key in sorted(set(sa) | set(sb)):
                if sa.get(key) != sb.get(key) and key not in found:
                    found[key] = f"{key}: {sa.get(key)!r} vs {sb.get(key)!r} ({rel})"
    return list(found.values())


def _metadata(path: Path, rel: str) -> dict[str, Any]:
    try:
        return read_metadata(path)
    except Exception as exc:
        raise StageError(f"{rel} in {path.parents[len(Path(rel).parts) - 1]} cannot be read "
                         f"({type(exc).__name__}: {exc}); rerun the rule that writes it") from exc


def _read(path: Path, rel: str) -> Any:
    """A record file's content (a frame, tensors, parsed JSON); a corrupt one is named."""
    try:
        if path.suffix == ".parquet":
            return read_table(path)
        if path.suffix == ".pt":
            return torch.load(path, map_location="cpu", weights_only=False)
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return json.loads(path.read_text())
    except Exception as exc:
        raise StageError(f"{rel} cannot be read ({type(exc).__name__}: {exc}); the record is "
                         "corrupt: rerun the rule that writes it") from exc


def _compare_values(x: Any, y: Any, where: str, tol: tuple[float, float],
                    timing: list[str]) -> tuple[str, str, float]:
    """(status, detail, largest difference) of two parsed values, recursively; timing fields
    are appended to ``timing`` and skipped."""
    rtol, atol = tol
    if isinstance(x, Mapping) and isinstance(y, Mapping):
        worst = ("equal", "", 0.0)
        for k in sorted(set(x) | set(y), key=str):
            name = f"{where}.{k}" if where else str(k)
            if TIMING.search(str(k)):
                timing.append(name)
                continue
            if k not in x or k not in y:
                return "different", f"{name}: only in {'B' if k not in x else 'A'}", math.inf
            worst = _worse(worst, _compare_values(x[k], y[k], name, tol, timing))
            if worst[0] == "different":
                return worst
        return worst
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) \
            and not (x and isinstance(x[0], (int, float))):
        if len(x) != len(y):
            return "different", f"{where}: {len(x)} vs {len(y)} entries", math.inf
        worst = ("equal", "", 0.0)
        for i, (u, v) in enumerate(zip(x, y)):
            worst = _worse(worst, _compare_values(u, v, f"{where}[{i}]", tol, timing))
            if worst[0] == "different":
                return worst
        return worst
    if isinstance(x, torch.Tensor) or isinstance(x, (list, tuple, int, float, np.ndarray)):
        return _compare_arrays(x, y, where, rtol, atol)
    return ("equal", "", 0.0) if x == y else ("different", f"{where}: {x!r} vs {y!r}", math.inf)


def _compare_arrays(x: Any, y: Any, where: str, rtol: float, atol: float
                    ) -> tuple[str, str, float]:
    to = (lambda v: v.detach().float().numpy() if isinstance(v, torch.Tensor)
          else np.asarray(v))
    try:
        a, b = to(x), to(y)
    except (TypeError, ValueError):
        return ("equal", "", 0.0) if x == y else ("different", f"{where}", math.inf)
    if a.shape != b.shape:
        return "different", f"{where}: shape {a.shape} vs {b.shape}", math.inf
    if a.dtype.kind not in "fciub" or b.dtype.kind not in "fciub":
        same = bool(np.array_equal(a, b))
        return ("equal", "", 0.0) if same else ("different", f"{where}: values differ", math.inf)
    a, b = a.astype(np.float64), b.astype(np.float64)
    if np.array_equal(a, b, equal_nan=True):
        return "equal", "", 0.0
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    diff = np.abs(np.where(nan_a | nan_b, 0.0, a - b))
    worst = float(diff.max()) if diff.size else 0.0
    if (nan_a != nan_b).any() or not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
        first = np.argwhere((diff > atol + rtol * np.abs(b)) | (nan_a != nan_b))[0]
        return "different", f"{where}[{', '.join(map(str, first))}]: largest |diff| {worst:.3g}", \
            worst
    return "close", f"{where}: largest |diff| {worst:.3g}", worst


def _worse(a: tuple[str, str, float], b: tuple[str, str, float]) -> tuple[str, str, float]:
    rank = {"equal": 0, "close": 1, "different": 2}
    if rank[b[0]] != rank[a[0]]:
        return b if rank[b[0]] > rank[a[0]] else a
    return b if b[2] > a[2] else a


def _frame_values(df: pd.DataFrame) -> dict[str, Any]:
    """A frame as column -> values (numbers as arrays, the rest as lists)."""
    return {c: (df[c].to_numpy() if df[c].dtype.kind in "fciub" else df[c].astype(str).tolist())
            for c in df.columns}


def compare_file(rel: str, pa: Path, pb: Path, tol: tuple[float, float]) -> FileComparison:
    """One record file of both runs (its content and, for a table, its metadata)."""
    target, stage = _stage(rel)
    timing: list[str] = []
    xa, xb = _read(pa, rel), _read(pb, rel)
    if isinstance(xa, pd.DataFrame):
        if list(xa.columns) != list(xb.columns) or len(xa) != len(xb):
            return FileComparison(rel, stage, target, "different",
                                  f"columns or rows differ ({xa.shape} vs {xb.shape})", math.inf)
        xa = {"rows": _frame_values(xa), "metadata": read_metadata(pa)}
        xb = {"rows": _frame_values(xb), "metadata": read_metadata(pb)}
    status, detail, worst = _compare_values(xa, xb, "", tol, timing)
    return FileComparison(rel, stage, target, status, detail, worst, tuple(sorted(set(timing))))


def compare_records(a: Path, b: Path, tol: tuple[float, float]) -> list[FileComparison]:
    """Every record file of either run, compared (:func:`compare_file`)."""
    out = []
    for target in run_targets(a):
        ra, rb = _records(a, target), _records(b, target)
        for rel in sorted(set(ra) | set(rb)):
            if rel not in rb or rel not in ra:
                out.append(FileComparison(rel, *reversed(_stage(rel)),
                                          "only in A" if rel not in rb else "only in B"))
                continue
            out.append(compare_file(rel, ra[rel], rb[rel], tol))
    return out


def compare_numbers(a: Path, b: Path) -> list[NumberComparison]:
    """Every estimate with an interval in both runs' long-format summaries (floors, gaps), and
    whether each run's estimate lies outside the other's interval."""
    out = []
    for target in run_targets(a):
        for rel in ("floors/summary.parquet", "gaps/summary.parquet"):
            pa, pb = (r / "results" / target / rel for r in (a, b))
            if not (pa.exists() and pb.exists()):
                continue
            keys = [c for c in ("statistic", "variant", "domain", "slot") if c in
                    read_table(pa).columns]
            da, db = (read_table(p).set_index(keys) for p in (pa, pb))
            both = da.add_suffix("_a").join(db.add_suffix("_b"), how="inner")
            bounds = both[["lower_a", "upper_a", "lower_b", "upper_b"]].to_numpy(float)
            both = both[np.isfinite(bounds).all(axis=1)]
            for key, r in both.iterrows():
                outside = not (r.lower_b <= r.estimate_a <= r.upper_b
                               and r.lower_a <= r.estimate_b <= r.upper_a)
                out.append(NumberComparison(f"{target}/{rel}", "/".join(map(str, key)),
                                            float(r.estimate_a), float(r.estimate_b), outside))
    return out


def compare_claims(a: Path, b: Path) -> list[tuple[str, str, str]]:
    """(claim, verdict on A, verdict on B) of every finding whose verdict differs."""
    tables = [r / "paper" / "tables" / "claims.csv" for r in (a, b)]
    if not all(t.exists() for t in tables):
        return []
    va, vb = (dict(pd.read_csv(t).drop_duplicates("claim")[["claim", "verdict"]].values)
              for t in tables)
    return [(c, va.get(c, "--"), vb.get(c, "--")) for c in sorted(set(va) | set(vb))
            if va.get(c) != vb.get(c)]


def compare_runs(a: Path, b: Path, *, rtol: float = 1e-6, atol: float = 1e-9) -> RunComparison:
    """Records, numbers and conclusions of two finished runs of one config; runs of different
    configs are refused naming the keys."""
    differ = setting_differences(a, b)
    if differ:
        raise StageError("the runs are of different configs: " + "; ".join(differ[:8])
                         + (f" (and {len(differ) - 8} more)" if len(differ) > 8 else ""))
    return RunComparison(a, b, compare_records(a, b, (rtol, atol)), compare_numbers(a, b),
                         compare_claims(a, b))
