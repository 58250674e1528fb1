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

Served against offline (App. H.3's check that the offline tau predicts the served one). A served
request is a sequence of verification rounds r; round r drafts gamma slots after the committed
prefix and accepts J_r of them. Replayed offline on the served continuation y (a draw from the
target's law, whatever the drafter), the accept factors a_{r,j} = min(1, q_j(y_j) / p_j(y_j))
give the offline prediction of the round's length,

    tau_hat_r = 1 + sum_k prod_{j<=k} a_{r,j},     E[tau_hat_r | prefix] = E[J_r + 1 | prefix],

and slot j of round r, reached when the slots before it were accepted, is accepted with
probability alpha_{r,j} = 1 - TV(p_j, q_j) exactly (speculative sampling). The acceptance test
compares the accepted drafts sum_r J_r with sum_r sum_{j <= min(J_r, gamma-1)} alpha_{r,j}, the
trials' expected successes; the rounds' outcomes are martingale differences, so
z = (observed - expected) / sqrt(sum alpha (1 - alpha)) is standard normal for a large count.

Lossless: every token the engine returns is a draw from the target's p_i under exact speculative
sampling, so s_i = log p_i(y_i) + H(p_i) has mean 0 and variance v_i = Var_{p_i}[log p_i];
z = sum s_i / sqrt(sum v_i) tests it (a drafter-biased engine returns tokens the target finds
unlikely, and z is far below 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from floorgap.seeds import derive_seed

from .aggregate import DEFAULT_BOOT_SEED, DEFAULT_N_BOOT, cluster_resample, percentile_interval

__all__ = ["AcceptanceTest", "ServedEstimate", "acceptance_test", "accepted_length_by_task",
           "group_cells", "lossless_z", "round_accepted_length", "run_time_shares", "served_macro",
           "slot_acceptance_tests", "speedup_by_task", "task_row_counts"]


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
    leaves the other tasks' draws as they were.

    Rows are the statistical unit of the served comparisons (paper App. H.3).

    Parameters
    ----------
    rows_per_task : Sequence[int]
        The number of rows of each task (at least 1 each).
    tasks : Sequence[str]
        The task names, one per entry of ``rows_per_task``; each keys its task's generator.
    n_boot : int, optional
        Number of bootstrap replicates B.
    seed : int, optional
        Base seed from which each task's seed is derived.

    Returns
    -------
    list[Tensor]
        One ``[B, rows_d]`` tensor per task: how many times each row is drawn in each replicate.
    """
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
    return ServedEstimate(estimate, replicates, *percentile_interval(replicates, level), level)


def accepted_length_by_task(completion: Sequence[Tensor], verify: Sequence[Tensor],
                            counts: Sequence[Tensor], level: float = 0.95) -> ServedEstimate:
    """tau_{d,c} = sum_r n_r^completion / sum_r n_r^verify per task d and cell c (App. H.3).
    ``completion``/``verify``: per task [cells, rows]; ``counts``: :func:`task_row_counts`.

    Parameters
    ----------
    completion : Sequence[Tensor]
        Per task, ``[cells, rows]`` completion tokens n_r^completion.
    verify : Sequence[Tensor]
        Per task, ``[cells, rows]`` verification steps n_r^verify; every cell needs a positive
        total.
    counts : Sequence[Tensor]
        Per task, ``[B, rows]`` bootstrap counts from :func:`task_row_counts`.
    level : float, optional
        Coverage of the percentile interval.

    Returns
    -------
    ServedEstimate
        tau ``[tasks, cells]``, its replicates ``[B, tasks, cells]`` and the interval bounds.
    """
    for v in verify:
        if (v.sum(1) <= 0).any():
            raise ValueError("a cell has no verification step: tau is undefined there")
    return _ratio_by_task(completion, verify, counts, level)


def run_time_shares(run_wall: Tensor, latency: Tensor) -> Tensor:
    """Each row's share w_r t_r of its run's wall time: the run's time [cells] split among its
    rows [cells, rows] in proportion to their request latencies (so the shares add up to the
    run's wall time).

    These shares make the throughput of a row resample well defined (paper App. H.4).

    Parameters
    ----------
    run_wall : Tensor
        ``[cells]`` wall time of each client-side run.
    latency : Tensor
        ``[cells, rows]`` request latency of each row in that run (same time unit); every run
        needs a positive total.

    Returns
    -------
    Tensor
        ``[cells, rows]`` float64 time shares w_r t_r; each row of the result sums to the run's
        wall time.
    """
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
    cell is its own baseline, S = 1). ``time_share`` from :func:`run_time_shares`.

    Parameters
    ----------
    completion, counts, level
        As in :func:`accepted_length_by_task`.
    time_share : Sequence[Tensor]
        Per task, ``[cells, rows]`` time shares w_r t_r.
    baseline : Sequence[int]
        For each cell c, the index of the AR cell at the same setting.

    Returns
    -------
    ServedEstimate
        S ``[tasks, cells]`` (1 at AR cells), its replicates ``[B, tasks, cells]`` and the
        interval bounds.
    """
    thr = _ratio_by_task(completion, time_share, counts, level)
    idx = torch.as_tensor(list(baseline), dtype=torch.long)
    est = thr.estimate / thr.estimate[:, idx]
    reps = thr.replicates / thr.replicates[:, :, idx]
    return ServedEstimate(est, reps, *percentile_interval(reps, level), level)


def served_macro(stat: ServedEstimate, groups: Sequence[Sequence[int]] | None = None,
                 tasks: Sequence[int] | None = None) -> ServedEstimate:
    """The equal mean over tasks (and, with ``groups``, over the cells of each group first, e.g.
    a drafter's concurrency levels: the paper averages tau over C within a task, then over
    tasks). Returns one row, [1, groups or cells].

    This is tau_macro and the macro speedup (paper App. H.3, H.4).

    Parameters
    ----------
    stat : ServedEstimate
        A per-task statistic, ``[tasks, cells]``.
    groups : Sequence[Sequence[int]] or None, optional
        Cell indices of each group, averaged within a task before the task mean; None keeps
        the cells as they are.
    tasks : Sequence[int] or None, optional
        Indices of the tasks to average; None takes every task.

    Returns
    -------
    ServedEstimate
        The macro mean ``[1, groups or cells]``, its replicates ``[B, 1, groups or cells]`` and
        the interval bounds.
    """
    if groups is not None:
        stat = group_cells(stat, groups)
    est, reps = stat.estimate, stat.replicates
    if tasks is not None:
        sel = torch.as_tensor(list(tasks), dtype=torch.long)
        est, reps = est[sel], reps[:, sel]
    est, reps = est.mean(0, keepdim=True), reps.mean(1, keepdim=True)
    return ServedEstimate(est, reps, *percentile_interval(reps, stat.level), stat.level)


def group_cells(stat: ServedEstimate, groups: Sequence[Sequence[int]]) -> ServedEstimate:
    """Per task, the mean over the cells of each group ([tasks, groups]).

    The paper averages tau over concurrency levels within a task this way (paper App. H.3).

    Parameters
    ----------
    stat : ServedEstimate
        A per-task statistic, ``[tasks, cells]``.
    groups : Sequence[Sequence[int]]
        Cell indices of each group.

    Returns
    -------
    ServedEstimate
        The group means ``[tasks, groups]``, replicates ``[B, tasks, groups]`` and the interval
        bounds.
    """
    est = torch.stack([stat.estimate[:, list(g)].mean(1) for g in groups], 1)
    reps = torch.stack([stat.replicates[:, :, list(g)].mean(2) for g in groups], 2)
    return ServedEstimate(est, reps, *percentile_interval(reps, stat.level), stat.level)


def round_accepted_length(p_tok: Tensor, q_tok: Tensor) -> Tensor:
    """tau_hat_r = 1 + sum_k prod_{j<=k} min(1, q_j(y_j) / p_j(y_j)) per round: ``p_tok`` and
    ``q_tok`` [rounds, gamma] are the target's and the proposal's probabilities of the served
    continuation's tokens -> [rounds] (module docstring).

    It is the offline tau of paper Sec. 2 on one round, the served-against-offline check of paper
    App. H.3.

    Parameters
    ----------
    p_tok : Tensor
        ``[rounds, gamma]`` the target's probabilities p_j(y_j) of the served tokens.
    q_tok : Tensor
        ``[rounds, gamma]`` the proposal's probabilities q_j(y_j) of the same tokens.

    Returns
    -------
    Tensor
        ``[rounds]`` float64 tau_hat_r, between 1 and gamma + 1.
    """
    from .serving import accept_factors, accepted_length, survival_products

    if p_tok.shape != q_tok.shape or p_tok.dim() != 2:
        raise ValueError("p_tok and q_tok must both be [rounds, gamma]")
    return accepted_length(survival_products(accept_factors(p_tok.double(), q_tok.double())))


@dataclass(frozen=True)
class AcceptanceTest:
    """Served accepted drafts against the exact acceptance probabilities of their trials."""

    trials: int
    observed: float          # sum_r J_r
    expected: float          # sum over trials of alpha_{r,j}
    variance: float          # sum over trials of alpha (1 - alpha)

    @property
    def z(self) -> float:
        return (self.observed - self.expected) / self.variance ** 0.5 if self.variance > 0 \
            else (0.0 if self.observed == self.expected else float("inf"))


def acceptance_test(accepted: Tensor, tv: Tensor) -> AcceptanceTest:
    """The module docstring's test from the served rounds' accepted drafts J_r ``accepted``
    [rounds] and TV(p_j, q_j) along the accepted prefix ``tv`` [rounds, gamma]: slot j of round
    r is a trial when j <= J_r (j < gamma), a success when j < J_r.

    It checks the served acceptances against the offline prediction (paper App. H.3).

    Parameters
    ----------
    accepted : Tensor
        ``[rounds]`` integer accepted drafts J_r, each in [0, gamma].
    tv : Tensor
        ``[rounds, gamma]`` TV(p_j, q_j) at each slot along the accepted prefix; entries after
        the last trial of a round are not read and may be NaN.

    Returns
    -------
    AcceptanceTest
        The number of trials, the observed and expected successes and the variance; its ``z``
        is the standardised difference.
    """
    acc = accepted.long()
    gamma = tv.shape[-1]
    if tv.dim() != 2 or acc.shape != tv.shape[:1]:
        raise ValueError("accepted must be [rounds] and tv [rounds, gamma]")
    if (acc < 0).any() or (acc > gamma).any():
        raise ValueError(f"accepted drafts must lie in [0, {gamma}]")
    slots = torch.arange(gamma)
    trial = slots[None, :] <= acc[:, None]
    alpha = (1.0 - tv.double()).clamp(0.0, 1.0)
    if torch.isnan(alpha[trial]).any():
        raise ValueError("a trial's TV is missing (NaN)")
    alpha = torch.where(trial, alpha, torch.zeros_like(alpha))
    return AcceptanceTest(trials=int(trial.sum()), observed=float(acc.sum()),
                          expected=float(alpha.sum()), variance=float((alpha * (1 - alpha)).sum()))



def slot_acceptance_tests(accepted: Tensor, tv: Tensor, observed: Tensor | None = None
                          ) -> list[AcceptanceTest]:
    """:func:`acceptance_test` slot by slot: slot k of round r is a trial when the round
    reached it (J_r >= k), a success when it was accepted (J_r > k), with probability
    alpha_{r,k} = 1 - TV(p_k, q_k). Summed over the slots, the trials, successes, expectations
    and variances are :func:`acceptance_test`'s.

    It sets an engine's count of accepted drafts per position (vLLM's
    ``num_accepted_tokens_per_pos``) against the offline prediction of the same rounds (paper
    App. H.3's served-vs-offline check, slot by slot).

    Parameters
    ----------
    accepted : Tensor
        ``[rounds]`` integer accepted drafts J_r, each in [0, gamma]: which rounds reached
        which slot.
    tv : Tensor
        ``[rounds, gamma]`` TV(p_k, q_k) along the accepted prefix (NaN after the last trial).
    observed : Tensor, optional
        ``[gamma]`` successes per slot as counted elsewhere (the engine's counters); default
        the rounds' own count #{r: J_r > k}.

    Returns
    -------
    list[AcceptanceTest]
        One per slot: its trials, observed and expected successes and variance (``z``).
    """
    acc = accepted.long()
    if tv.dim() != 2 or acc.shape != tv.shape[:1]:
        raise ValueError("accepted must be [rounds] and tv [rounds, gamma]")
    gamma = tv.shape[-1]
    counted = torch.stack([(acc > k).sum() for k in range(gamma)]).double()
    seen = counted if observed is None else observed.double()
    if seen.shape != (gamma,):
        raise ValueError(f"observed must be [gamma] = [{gamma}]")
    out = []
    for k in range(gamma):
        reached = acc >= k
        alpha = (1.0 - tv[reached, k].double()).clamp(0.0, 1.0)
        if torch.isnan(alpha).any():
            raise ValueError(f"a trial's TV at slot {k} is missing (NaN)")
        out.append(AcceptanceTest(trials=int(reached.sum()), observed=float(seen[k]),
                                  expected=float(alpha.sum()),
                                  variance=float((alpha * (1 - alpha)).sum())))
    return out


def lossless_z(score: Tensor, variance: Tensor) -> float:
    """z = sum s_i / sqrt(sum v_i) of the module docstring's lossless test from per-token (or
    per-round summed) scores s = log p(y) + H(p) and variances v = Var_p[log p]; NaN entries
    (rounds without a law, temperature 0) are skipped.

    It checks that the served engine samples the target's law (paper App. H.3).

    Parameters
    ----------
    score : Tensor
        Scores s = log p(y) + H(p) in nats, per token or summed per round; any shape.
    variance : Tensor
        The matching variances Var_p[log p], same shape as ``score``.

    Returns
    -------
    float
        z, approximately standard normal for a lossless engine; NaN when the total variance is
        not positive.
    """
    keep = ~(torch.isnan(score) | torch.isnan(variance))
    total = float(variance[keep].double().sum())
    if total <= 0:
        return float("nan")
    return float(score[keep].double().sum()) / total ** 0.5
