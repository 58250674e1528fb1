"""Accepted length and speedup measured in a serving engine (paper App. H.3, H.4).

A served benchmark is a set of tasks d, each with rows r (prompts) answered by every system s
(AR decoding or a drafter) at every setting c (temperature, concurrency). Per request the engine
reports the completion tokens n_r^completion and the verification steps n_r^verify (target
forwards that returned tokens). The accepted length of a task is a ratio of sums over its rows,

    tau_d = sum_r n_r^completion / sum_r n_r^verify,      tau_macro = (1/|D|) sum_d tau_d,

and a task's throughput is its completion tokens over the wall time of the whole client-side
run; the speedup of s over AR at the same setting is the ratio of the two throughputs,
S_d = thr_d(s) / thr_d(AR), and the macro speedup is the equal mean of the task ratios.

Intervals come from a bootstrap over rows stratified by task: every replicate redraws the rows
of each task with replacement, the same draw for every system and setting (the contrasts are
paired). For the speedup a run's wall time is shared among its rows in proportion to their
request latencies, so the shares add up to the run's wall time and a resample's throughput is
sum w_r n_r / sum w_r t_r.

Arrays: per task, ``[cells, rows]`` with one cell per (system, setting) and the task's rows in
a fixed order shared by all cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregate import DEFAULT_BOOT_SEED, DEFAULT_N_BOOT, cluster_resample, percentile_interval

__all__ = ["ServedEstimate", "accepted_length_by_task", "group_cells", "run_time_shares",
           "served_macro", "speedup_by_task", "task_row_counts"]


@dataclass(frozen=True)
class ServedEstimate:
    """A statistic per task and cell with its bootstrap replicates, and the interval."""

    estimate: Tensor         # [tasks, cells]
    replicates: Tensor       # [B, tasks, cells]
    lower: Tensor
    upper: Tensor
    level: float


def task_row_counts(rows_per_task: Sequence[int], tasks: Sequence[str],
                    n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_BOOT_SEED) -> list[Tensor]:
    """The bootstrap counts of every task's rows, [B, rows_d] each: task d's rows are redrawn
    with replacement from a generator keyed by (seed, task name), so adding or dropping a task
    leaves the other tasks' draws as they were."""
    from floorgap.seeds import derive_seed

    if len(rows_per_task) != len(tasks):
        raise ValueError("one row count per task name")
    counts = []
    for name, n in zip(tasks, rows_per_task, strict=True):
        if n < 1:
            raise ValueError(f"task {name!r} has no rows")
        counts.append(cluster_resample(list(range(n)), n_boot,
                                       derive_seed(seed, "served-rows", name)).counts)
    return counts


def _ratio_by_task(num: Sequence[Tensor], den: Sequence[Tensor], counts: Sequence[Tensor],
                   level: float) -> ServedEstimate:
    if not len(num) == len(den) == len(counts):
        raise ValueError("one numerator, denominator and count matrix per task")
    est, reps = [], []
    for n, d, c in zip(num, den, counts, strict=True):
        n, d = n.double(), d.double()
        if n.shape != d.shape or c.shape[1] != n.shape[1]:
            raise ValueError("a task's arrays must be [cells, rows] with one count per row")
        est.append(n.sum(1) / d.sum(1))
        c = c.double()
        reps.append((c @ n.T) / (c @ d.T))                                  # [B, cells]
    estimate, replicates = torch.stack(est), torch.stack(reps, 1)
    lo, hi = percentile_interval(replicates, level)
    return ServedEstimate(estimate, replicates, lo, hi, level)


def accepted_length_by_task(completion: Sequence[Tensor], verify: Sequence[Tensor],
                            counts: Sequence[Tensor], level: float = 0.95) -> ServedEstimate:
    """tau_{d,c} = sum_r n_r^completion / sum_r n_r^verify per task d and cell c (App. H.3).
    ``completion``/``verify``: per task [cells, rows]; ``counts``: :func:`task_row_counts`."""
    for v in verify:
        if (v.sum(1) <= 0).any():
            raise ValueError("a cell has no verification step: tau is undefined there")
    return _ratio_by_task(completion, verify, counts, level)


def run_time_shares(run_wall: Tensor, latency: Tensor) -> Tensor:
    """Each row's share w_r t_r of its run's wall time: the run's time [cells] split among its
    rows [cells, rows] in proportion to their request latencies (so the shares add up to the
    run's wall time)."""
    lat = latency.double()
    total = lat.sum(1, keepdim=True)
    if (total <= 0).any():
        raise ValueError("a run whose requests took no time")
    return run_wall.double().unsqueeze(1) * lat / total


def speedup_by_task(completion: Sequence[Tensor], time_share: Sequence[Tensor],
                    baseline: Sequence[int], counts: Sequence[Tensor],
                    level: float = 0.95) -> ServedEstimate:
    """S_{d,c} = thr_{d,c} / thr_{d,baseline[c]}, throughput thr = sum n_r / sum w_r t_r per
    task d (App. H.4): ``baseline[c]`` is the cell of AR decoding at cell c's setting (an AR
    cell is its own baseline, S = 1). ``time_share`` from :func:`run_time_shares`."""
    thr = _ratio_by_task(completion, time_share, counts, level)
    idx = torch.as_tensor(list(baseline), dtype=torch.long)
    est = thr.estimate / thr.estimate[:, idx]
    reps = thr.replicates / thr.replicates[:, :, idx]
    lo, hi = percentile_interval(reps, level)
    return ServedEstimate(est, reps, lo, hi, level)


def served_macro(stat: ServedEstimate, groups: Sequence[Sequence[int]] | None = None,
                 tasks: Sequence[int] | None = None) -> ServedEstimate:
    """The equal mean over tasks (and, with ``groups``, over the cells of each group first, e.g.
    a drafter's concurrency levels: the paper averages tau over C within a task, then over
    tasks). Returns one row, [1, groups or cells]."""
    if groups is not None:
        stat = group_cells(stat, groups)
    est, reps = stat.estimate, stat.replicates
    if tasks is not None:
        sel = torch.as_tensor(list(tasks), dtype=torch.long)
        est, reps = est[sel], reps[:, sel]
    est, reps = est.mean(0, keepdim=True), reps.mean(1, keepdim=True)
    lo, hi = percentile_interval(reps, stat.level)
    return ServedEstimate(est, reps, lo, hi, stat.level)


def group_cells(stat: ServedEstimate, groups: Sequence[Sequence[int]]) -> ServedEstimate:
    """Per task, the mean over the cells of each group ([tasks, groups])."""
    est = torch.stack([stat.estimate[:, list(g)].mean(1) for g in groups], 1)
    reps = torch.stack([stat.replicates[:, :, list(g)].mean(2) for g in groups], 2)
    lo, hi = percentile_interval(reps, stat.level)
    return ServedEstimate(est, reps, lo, hi, stat.level)
