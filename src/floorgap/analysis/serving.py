"""Served request records -> the serving summary (paper Table 1, App. H.3 Table 9, H.4 Table 11).

Reads the serving stage's records of every system of one target (AR decoding and the drafters)
and writes one long table, a row per statistic x system x task x temperature x concurrency:

* ``tau``: accepted length sum verified tokens / sum verify steps
  (:func:`floorgap.estimators.served.accepted_length_by_task`); concurrency ``0`` is the mean
  over the concurrency levels (the paper's per-task tau), task ``macro`` the equal task mean;
* ``speedup``: throughput against AR at the same temperature and concurrency, throughput being a
  task run's completion tokens over its client-side wall time
  (:func:`floorgap.estimators.served.speedup_by_task`); task ``macro`` the equal mean of the
  task ratios; the "sequential" speedup of Tables 1 and 9 is the concurrency-1 row;
* ``rows``: the rows per task (``estimate``), for the tables;
* with the serving_replay records of the drafters (App. H.3's served-vs-offline check), per
  system, task and temperature over the complete rounds of every concurrency (concurrency 0):
  ``tau_matched`` (served, sum (J_r + 1) / rounds) and ``tau_offline`` (the accept factors'
  prediction, sum tau_hat_r / rounds,
  :func:`floorgap.estimators.served.round_accepted_length`), with the same paired row
  bootstrap; and per system and temperature (task ``all``) the exact acceptance test of
  :func:`floorgap.estimators.served.acceptance_test`: ``accepted_observed``,
  ``accepted_expected``, ``accepted_sd``, ``acceptance_z`` (temperature > 0) and ``rounds``;
  at temperature 0, where verification is deterministic, ``greedy_agreement``: the share of
  rounds whose accepted drafts equal the replay's (the leading slots whose argmaxes agree);
  at temperature > 0 the lossless test of the returned tokens, ``lossless_z``
  (:func:`floorgap.estimators.served.lossless_z`).

Intervals: bootstrap over rows stratified by task, one draw shared by every system, temperature
and concurrency (paired). The records must cover the same rows for every system and setting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from floorgap.errors import StageError
from floorgap.estimators.served import (ServedEstimate, acceptance_test, accepted_length_by_task,
                                        group_cells, lossless_z, round_accepted_length,
                                        run_time_shares, served_macro, slot_acceptance_tests,
                                        speedup_by_task, task_row_counts)
from floorgap.records import read_table

AR = "ar"
REQUEST_COLUMNS = ("system", "task", "row_id", "temperature", "concurrency", "completion_tokens",
                   "verify_steps", "verified_tokens", "latency_s")
RUN_COLUMNS = ("system", "task", "temperature", "concurrency", "wall_s")
ROUND_COLUMNS = ("system", "task", "row_id", "temperature", "accepted", "complete", "p_tok",
                 "q_tok", "tv", "lossless_score", "lossless_var")


def _read_records(files: Sequence[str | Path], columns: Sequence[str], kind: str
                  ) -> list[pd.DataFrame]:
    """The record files, each checked for ``columns`` (a missing one names the file)."""
    frames = []
    for f in files:
        df = read_table(f)
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise StageError(f"{f}: not a {kind} record (missing {missing})")
        frames.append(df)
    return frames


def load_served(request_files: Sequence[str | Path], run_files: Sequence[str | Path]
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every system's request and run records, checked for their columns."""

    def read(files: Sequence[str | Path], columns: Sequence[str], kind: str) -> pd.DataFrame:
        frames = _read_records(files, columns, f"serving {kind}")
        if not frames:
            raise StageError(f"no serving {kind} records given")
        return pd.concat(frames, ignore_index=True)

    return (read(request_files, REQUEST_COLUMNS, "request"),
            read(run_files, RUN_COLUMNS, "run"))


def _cells(requests: pd.DataFrame) -> list[tuple[str, float, int]]:
    keys = requests[["system", "temperature", "concurrency"]].drop_duplicates()
    return sorted((str(s), float(t), int(c)) for s, t, c in keys.itertuples(index=False))


def _arrays(requests: pd.DataFrame, runs: pd.DataFrame, tasks: list[str],
            cells: list[tuple[str, float, int]]) -> dict[str, list[torch.Tensor]]:
    """Per task, [cells, rows] arrays of the request columns, rows in one shared order."""
    out: dict[str, list[torch.Tensor]] = {k: [] for k in
                                          ("completion", "verify", "verified", "share")}
    for task in tasks:
        sub = requests[requests["task"] == task]
        row_ids = sorted(sub["row_id"].unique())
        cols: dict[str, list[list[float]]] = {k: [] for k in out}
        for system, temp, conc in cells:
            cell = sub[(sub["system"] == system) & (sub["temperature"] == temp)
                       & (sub["concurrency"] == conc)].set_index("row_id")
            if sorted(cell.index) != row_ids or cell.index.duplicated().any():
                raise StageError(f"task {task}: system {system} at T={temp:g}, C={conc} did not "
                                 "serve exactly the rows the other systems served")
            cell = cell.loc[row_ids]
            run = runs[(runs["system"] == system) & (runs["task"] == task)
                       & (runs["temperature"] == temp) & (runs["concurrency"] == conc)]
            if len(run) != 1:
                raise StageError(f"task {task}: {len(run)} run records for system {system} at "
                                 f"T={temp:g}, C={conc}; expected one")
            cols["completion"].append(cell["completion_tokens"].astype(float).tolist())
            cols["verify"].append(cell["verify_steps"].astype(float).tolist())
            cols["verified"].append(cell["verified_tokens"].astype(float).tolist())
            share = run_time_shares(torch.tensor([float(run["wall_s"].iloc[0])]),
                                    torch.tensor([cell["latency_s"].astype(float).tolist()]))
            cols["share"].append(share[0].tolist())
        for k in out:
            out[k].append(torch.tensor(cols[k], dtype=torch.float64))
    return out


def _emit(rows: list[dict[str, Any]], statistic: str, est: ServedEstimate, tasks: list[str],
          labels: list[tuple[str, float, int]]) -> None:
    for d, task in enumerate(tasks):
        for c, (system, temp, conc) in enumerate(labels):
            rows.append({"statistic": statistic, "system": system, "task": task,
                         "temperature": temp, "concurrency": conc,
                         "estimate": float(est.estimate[d, c]), "lower": float(est.lower[d, c]),
                         "upper": float(est.upper[d, c])})


def summarise_serving(requests: pd.DataFrame, runs: pd.DataFrame, *, n_boot: int, level: float,
                      seed: int, task_order: Sequence[str] | None = None) -> pd.DataFrame:
    """The serving summary (module docstring)."""
    present = list(dict.fromkeys(requests["task"]))
    tasks = [t for t in (task_order or present) if t in set(present)] + \
        [t for t in present if t not in set(task_order or present)]
    cells = _cells(requests)
    if not any(s == AR for s, _, _ in cells):
        raise StageError("the serving records hold no AR run: speedups need the `ar` system")
    arr = _arrays(requests, runs, tasks, cells)
    counts = task_row_counts([a.shape[1] for a in arr["completion"]], tasks, n_boot, seed)
    tau = accepted_length_by_task(arr["verified"], arr["verify"], counts, level)
    index = {cell: i for i, cell in enumerate(cells)}
    baseline = [index[(AR, t, c)] for _, t, c in cells]
    speed = speedup_by_task(arr["completion"], arr["share"], baseline, counts, level)
    rows: list[dict[str, Any]] = []
    _emit(rows, "tau", tau, tasks, cells)
    _emit(rows, "speedup", speed, tasks, cells)
    _emit(rows, "tau", served_macro(tau), ["macro"], cells)
    _emit(rows, "speedup", served_macro(speed), ["macro"], cells)
    # the paper's per-task tau: the mean over concurrency levels (labelled concurrency 0)
    groups: dict[tuple[str, float], list[int]] = {}
    for i, (system, temp, _) in enumerate(cells):
        groups.setdefault((system, temp), []).append(i)
    glabels = [(s, t, 0) for s, t in groups]
    _emit(rows, "tau", group_cells(tau, list(groups.values())), tasks, glabels)
    _emit(rows, "tau", served_macro(tau, groups=list(groups.values())), ["macro"], glabels)
    for d, task in enumerate(tasks):
        n = float(arr["completion"][d].shape[1])
        rows.append({"statistic": "rows", "system": "", "task": task, "temperature": 0.0,
                     "concurrency": 0, "estimate": n, "lower": n, "upper": n})
    return pd.DataFrame(rows)


def load_rounds(files: Sequence[str | Path]) -> pd.DataFrame | None:
    """The serving_replay records (None when none is given or all are empty)."""
    frames = [df for df in _read_records(files, ROUND_COLUMNS, "serving_replay") if len(df)]
    return pd.concat(frames, ignore_index=True) if frames else None


def _matrix(values: pd.Series) -> torch.Tensor:
    return torch.tensor([list(v) for v in values], dtype=torch.float64)


def summarise_replay(rounds: pd.DataFrame, *, n_boot: int, level: float, seed: int,
                     tasks: Sequence[str]) -> pd.DataFrame:
    """The served-vs-offline rows of the module docstring from the complete replayed rounds.
    ``tasks``: the summary's task order (the bootstrap draws are keyed by task name and row
    order, so they pair with the served rows')."""
    done = rounds[rounds["complete"].astype(bool)].copy()
    if done.empty:
        raise StageError("the replayed rounds hold no complete round (every completion is "
                         "shorter than one block): raise serving.max_tokens")
    done["tau_hat"] = round_accepted_length(_matrix(done["p_tok"]),
                                            _matrix(done["q_tok"])).numpy()
    done["tau_served"] = done["accepted"].astype(float) + 1.0
    cells = sorted({(str(s), float(t)) for s, t in
                    done[["system", "temperature"]].itertuples(index=False)})
    present = [t for t in tasks if t in set(done["task"])]
    served, offline, ones = [], [], []
    for task in present:
        sub = done[done["task"] == task]
        row_ids = sorted(sub["row_id"].unique())
        per = sub.groupby(["system", "temperature", "row_id"])[["tau_served", "tau_hat"]]
        sums, n = per.sum(), per.size()
        grid = [[(s, t, r) for r in row_ids] for s, t in cells]
        pick = lambda frame: torch.tensor([[float(frame.get(k, 0.0)) for k in line]  # noqa: E731
                                           for line in grid], dtype=torch.float64)
        served.append(pick(sums["tau_served"]))
        offline.append(pick(sums["tau_hat"]))
        ones.append(pick(n))
    counts = task_row_counts([o.shape[1] for o in ones], present, n_boot, seed)
    labels = [(s, t, 0) for s, t in cells]
    rows: list[dict[str, Any]] = []
    for name, num in (("tau_matched", served), ("tau_offline", offline)):
        est = accepted_length_by_task(num, ones, counts, level)
        _emit(rows, name, est, present, labels)
        _emit(rows, name, served_macro(est), ["macro"], labels)
    for system, temp in cells:
        sub = done[(done["system"] == system) & (done["temperature"] == temp)]
        accepted = torch.tensor(sub["accepted"].astype(int).tolist())
        tv = _matrix(sub["tv"])
        test = acceptance_test(accepted, tv)
        stats = [("accepted_observed", test.observed), ("accepted_expected", test.expected),
                 ("accepted_sd", test.variance ** 0.5), ("rounds", float(len(sub)))]
        if temp > 0:
            every = rounds[(rounds["system"] == system) & (rounds["temperature"] == temp)]
            stats += [("acceptance_z", test.z),
                      ("lossless_z", lossless_z(torch.tensor(every["lossless_score"].tolist()),
                                                torch.tensor(every["lossless_var"].tolist())))]
        else:
            predicted = torch.tensor([greedy_accepts(t) for t in sub["tv"]])
            stats.append(("greedy_agreement", float((predicted == accepted).double().mean())))
        for stat, value in stats:
            rows.append({"statistic": stat, "system": system, "task": "all",
                         "temperature": temp, "concurrency": 0, "estimate": value,
                         "lower": value, "upper": value})
    return pd.DataFrame(rows)


def greedy_accepts(tv: Sequence[float]) -> int:
    """The drafts a greedy round accepts by the replay: the leading slots whose argmaxes agree
    (TV 0)."""
    return ([float(x) == 0.0 for x in tv] + [False]).index(False)


def first_divergent_round(rounds: pd.DataFrame) -> dict[str, Any] | None:
    """The first complete round at temperature 0, in the records' order, whose served accepted
    drafts differ from the replay's (the leading slots whose argmaxes agree): where an engine or
    layout fault first shows; None when every greedy round is reproduced."""
    done = rounds[rounds["complete"].astype(bool) & (rounds["temperature"] == 0.0)]
    for r in done.itertuples():
        if greedy_accepts(r.tv) != int(r.accepted):
            return {"task": str(r.task), "row_id": str(r.row_id), "round": int(r.round),
                    "served": int(r.accepted), "replayed": greedy_accepts(r.tv)}
    return None


#: The engine's counters (probes.engine_counts.EngineCounts) and the request columns they count.
COUNTED = {"drafts": "verify_steps", "draft_tokens": "draft_tokens",
           "accepted": "accepted_drafts"}


def record_counts(requests: pd.DataFrame, gamma: int) -> dict[str, Any]:
    """The per-request records' sums in the terms of the engine's counters: rounds, drafted and
    accepted tokens, and per slot k the rounds whose slot k was accepted (J_r > k)."""
    steps = [int(a) for s in requests["step_accepted"] for a in s]
    out: dict[str, Any] = {k: int(requests[c].sum()) for k, c in COUNTED.items()}
    out["accepted_per_pos"] = [sum(1 for a in steps if a > k) for k in range(gamma)]
    return out


def engine_counts(runs: pd.DataFrame) -> dict[float, dict[str, Any] | None]:
    """The engine's own counts of every temperature, summed over its runs (None where a run
    holds none: the counters were not read)."""
    out: dict[float, dict[str, Any] | None] = {}
    for temp, group in runs.groupby("temperature"):
        counts = list(group["engine_counts"]) if "engine_counts" in group else [None]
        if any(c is None or (isinstance(c, float) and math.isnan(c)) for c in counts):
            out[float(temp)] = None
            continue
        total = {k: sum(int(c[k]) for c in counts) for k in COUNTED}
        total["accepted_per_pos"] = [int(sum(v)) for v in zip(*[list(c["accepted_per_pos"])
                                                                for c in counts])]
        out[float(temp)] = total
    return out


def engine_reading(requests: pd.DataFrame, runs: pd.DataFrame, rounds: pd.DataFrame,
                   gamma: int) -> dict[float, dict[str, Any]]:
    """By temperature, what the engine counted itself beside the per-request records' sums
    (``differs``: the counters where the two are not equal, a fault of the reading), and at
    temperature > 0 the per-slot test of the engine-counted acceptances against the replay
    (:func:`floorgap.estimators.served.slot_acceptance_tests` over the complete rounds: the
    engine's count at slot k less that of the incomplete rounds, which the records hold)."""
    out: dict[float, dict[str, Any]] = {}
    for temp, counted in engine_counts(runs).items():
        records = record_counts(requests[requests["temperature"] == temp], gamma)
        entry: dict[str, Any] = {"engine": counted, "records": records}
        if counted is not None:
            entry["differs"] = [k for k in records if list(np.atleast_1d(counted[k]))
                                != list(np.atleast_1d(records[k]))]
            here = rounds[rounds["temperature"] == temp]
            complete = here["complete"].astype(bool)
            done, cut_accepted = here[complete], here.loc[~complete, "accepted"].astype(int)
            cut = [int((cut_accepted > k).sum()) for k in range(gamma)]
            if temp > 0 and len(done):
                observed = torch.tensor([float(e - c) for e, c in
                                         zip(counted["accepted_per_pos"], cut)])
                tests = slot_acceptance_tests(torch.tensor(done["accepted"].astype(int).tolist()),
                                              _matrix(done["tv"]), observed)
                entry["slots"] = [{"slot": k, "trials": t.trials, "observed": t.observed,
                                   "expected": t.expected, "z": t.z}
                                  for k, t in enumerate(tests)]
        out[temp] = entry
    return out


def hypothesis_tests(rounds: pd.DataFrame) -> dict[str, dict[float, dict[str, float]]]:
    """By named fault (the replay's ``hypotheses_tv``) and temperature, the served rounds'
    tests against the rounds replayed under that fault: the acceptance z at T > 0, the share of
    greedy rounds reproduced at T = 0 (complete rounds, as for the faithful replay)."""
    done = rounds[rounds["complete"].astype(bool)]
    if "hypotheses_tv" not in done or done.empty:
        return {}
    parsed = [json.loads(x) for x in done["hypotheses_tv"]]
    names = sorted(set().union(*parsed)) if parsed else []
    out: dict[str, dict[float, dict[str, float]]] = {}
    temps = done["temperature"].astype(float).tolist()
    accepted = done["accepted"].astype(int).tolist()
    # the faithful replay's greedy verdict per round, once for every named fault it is paired with
    faithful = [greedy_accepts(tv) == a for tv, a in zip(done["tv"], accepted)]
    for name in names:
        out[name] = {}
        for temp in sorted(set(temps)):
            idx = [i for i, t in enumerate(temps) if t == temp and name in parsed[i]]
            tv = torch.tensor([parsed[i][name] for i in idx], dtype=torch.float64)
            acc = torch.tensor([accepted[i] for i in idx])
            if temp > 0:
                out[name][temp] = {"acceptance_z": acceptance_test(acc, tv).z}
            else:
                agree = [greedy_accepts(row) == int(a) for row, a in zip(tv.tolist(), acc)]
                out[name][temp] = {"greedy_agreement": sum(agree) / max(1, len(agree)),
                                   **greedy_sign_test(agree, [faithful[i] for i in idx])}
    return out


def greedy_sign_test(named: Sequence[bool], own: Sequence[bool]) -> dict[str, float]:
    """The greedy rounds a named fault's replay reproduces against those the faithful replay
    does, paired by round: ``greedy_gain`` (rounds only the fault reproduces less rounds only
    the faithful one does) and the one-sided sign test's ``sign_p`` on the discordant rounds
    (small: the engine ran the fault's reading, not the faithful one)."""
    from scipy.stats import binomtest

    only_named = sum(1 for a, b in zip(named, own) if a and not b)
    only_own = sum(1 for a, b in zip(named, own) if b and not a)
    n = only_named + only_own
    p = binomtest(only_named, n, 0.5, alternative="greater").pvalue if n else 1.0
    return {"greedy_gain": float(only_named - only_own), "sign_p": float(p)}


def served_check(rounds: pd.DataFrame, *, tasks: Sequence[str], n_boot: int, level: float,
                 seed: int, served: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                 gamma: int | None = None) -> dict[str, Any]:
    """One checked drafter's served rounds against their replay (``floorgap check``): by
    temperature the served and the replay-predicted tau (task macro with its interval) and the
    rounds; the acceptance and lossless z at temperature > 0; the greedy agreement and the first
    divergent round at temperature 0 (see :func:`summarise_replay`); with ``served`` (its
    request and run records) and ``gamma``, what the engine counted itself
    (:func:`engine_reading`, under ``engine_reading``)."""
    table = summarise_replay(rounds, n_boot=n_boot, level=level, seed=seed, tasks=tasks)
    out: dict[str, Any] = {"by_temperature": {}, "first_divergent": first_divergent_round(rounds)}
    out["hypotheses"] = hypothesis_tests(rounds)
    if served is not None:
        out["engine_reading"] = engine_reading(*served, rounds, int(gamma or 0))
    for temp in sorted(set(table["temperature"].astype(float))):
        rows = table[table["temperature"] == temp]

        def pick(stat: str, task: str = "all") -> list[float]:
            hit = rows[(rows["statistic"] == stat) & (rows["task"] == task)]
            return [float(hit[f].iloc[0]) for f in ("estimate", "lower", "upper")] \
                if len(hit) else [float("nan")] * 3

        out["by_temperature"][temp] = {
            "tau_served": pick("tau_matched", "macro"),
            "tau_offline": pick("tau_offline", "macro"),
            **{s: pick(s)[0] for s in ("rounds", "acceptance_z", "lossless_z",
                                       "greedy_agreement", "accepted_observed",
                                       "accepted_expected")}}
    done = rounds[rounds["complete"].astype(bool) & (rounds["temperature"] == 0.0)]
    if len(done):
        # greedy rounds where the engine or the replay accepts any draft: the others agree on
        # nothing accepted whatever the folder holds, so they cannot show a fault
        predicted = [greedy_accepts(tv) for tv in done["tv"]]
        active = sum(1 for a, b in zip(done["accepted"], predicted) if int(a) > 0 or b > 0)
        out["by_temperature"][0.0]["active_rounds"] = float(active)
        out["by_temperature"][0.0]["served_active_rounds"] = float(
            (done["accepted"].astype(int) > 0).sum())
    return out
