"""Served accepted length and speedup (floorgap.estimators.served, paper App. H.3-H.4)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.served import (
    accepted_length_by_task,
    group_cells,
    run_time_shares,
    served_macro,
    speedup_by_task,
    task_row_counts,
)


def _hand_made():
    """Two tasks; cells (AR, drafter) at one setting. Task a: 2 rows, task b: 3 rows."""
    completion = [torch.tensor([[10.0, 20.0], [10.0, 20.0]]),
                  torch.tensor([[6.0, 6.0, 12.0], [6.0, 6.0, 12.0]])]
    verify = [torch.tensor([[10.0, 20.0], [4.0, 6.0]]),
              torch.tensor([[6.0, 6.0, 12.0], [2.0, 3.0, 3.0]])]
    latency = [torch.tensor([[1.0, 2.0], [0.5, 0.5]]),
               torch.tensor([[1.0, 1.0, 2.0], [0.25, 0.25, 0.5]])]
    wall = [torch.tensor([3.0, 1.0]), torch.tensor([4.0, 1.0])]
    return completion, verify, latency, wall


def test_accepted_length_is_the_ratio_of_sums_and_the_macro_the_equal_task_mean() -> None:
    completion, verify, *_ = _hand_made()
    counts = task_row_counts([2, 3], ["a", "b"], n_boot=200, seed=1)
    tau = accepted_length_by_task(completion, verify, counts)
    # by hand: task a drafter 30 / 10 = 3; task b drafter 24 / 8 = 3; AR cells 1
    torch.testing.assert_close(tau.estimate, torch.tensor([[1.0, 3.0], [1.0, 3.0]],
                                                          dtype=torch.float64))
    macro = served_macro(tau)
    torch.testing.assert_close(macro.estimate, torch.tensor([[1.0, 3.0]], dtype=torch.float64))
    # AR has tau = 1 in every replicate: its interval is a point
    assert torch.all(tau.replicates[:, :, 0] == 1.0)
    # a ratio of sums, not the mean of per-row ratios (task a's drafter rows give 2.5, 3.33)
    assert abs(float(tau.estimate[0, 1]) - (10 / 4 + 20 / 6) / 2) > 0.05


def test_speedup_uses_whole_run_wall_time_and_ar_is_its_own_baseline() -> None:
    completion, _, latency, wall = _hand_made()
    shares = [run_time_shares(w, lat) for w, lat in zip(wall, latency)]
    for s, w in zip(shares, wall):
        torch.testing.assert_close(s.sum(1), w.double())
    counts = task_row_counts([2, 3], ["a", "b"], n_boot=200, seed=1)
    speed = speedup_by_task(completion, shares, [0, 0], counts)
    # task a: AR 30 tokens / 3 s, drafter 30 / 1 s -> 3; task b: 24 / 4 vs 24 / 1 -> 4
    torch.testing.assert_close(speed.estimate, torch.tensor([[1.0, 3.0], [1.0, 4.0]],
                                                            dtype=torch.float64))
    assert torch.all(speed.replicates[:, :, 0] == 1.0)
    torch.testing.assert_close(served_macro(speed, tasks=[0, 1]).estimate[0, 1],
                               torch.tensor(3.5, dtype=torch.float64))


def test_groups_average_settings_within_a_task_before_tasks() -> None:
    """tau averaged over concurrencies within a task, then over tasks (H.3)."""
    completion = [torch.tensor([[8.0, 8.0], [9.0, 9.0], [12.0, 12.0]])]
    verify = [torch.tensor([[4.0, 4.0], [3.0, 3.0], [2.0, 2.0]])]
    tau = accepted_length_by_task(completion, verify, task_row_counts([2], ["t"], 50, 0))
    grouped = group_cells(tau, [[0, 1], [2]])
    torch.testing.assert_close(grouped.estimate, torch.tensor([[2.5, 6.0]], dtype=torch.float64))
    torch.testing.assert_close(served_macro(tau, groups=[[0, 1], [2]]).estimate,
                               grouped.estimate)


def test_task_draws_are_keyed_by_name_and_seed() -> None:
    a = task_row_counts([4, 5], ["gsm8k", "alpaca"], n_boot=30, seed=7)
    b = task_row_counts([5], ["alpaca"], n_boot=30, seed=7)
    assert torch.equal(a[1], b[0])
    assert not torch.equal(a[1], task_row_counts([5], ["alpaca"], 30, 8)[0])
    assert all(torch.all(c.sum(1) == n) for c, n in zip(a, [4, 5]))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 12), cells=st.integers(1, 4))
def test_intervals_contain_the_estimate_and_bound_the_row_range(seed: int, rows: int,
                                                               cells: int) -> None:
    """Property: a ratio of sums lies between the smallest and largest row ratio, in every
    replicate, and identical cells give identical replicates (the draw is shared)."""
    g = torch.Generator().manual_seed(seed)
    verify = torch.randint(1, 50, (cells, rows), generator=g).double()
    completion = verify * (1 + torch.rand(cells, rows, generator=g, dtype=torch.float64) * 6)
    completion = torch.cat([completion, completion[:1]])
    verify = torch.cat([verify, verify[:1]])
    tau = accepted_length_by_task([completion], [verify], task_row_counts([rows], ["t"], 100, seed))
    ratio = completion / verify
    lo, hi = ratio.min(1).values, ratio.max(1).values
    assert torch.all(tau.replicates[:, 0] >= lo - 1e-12)
    assert torch.all(tau.replicates[:, 0] <= hi + 1e-12)
    # the same draw for both (a matrix product may order the sums differently per column)
    torch.testing.assert_close(tau.replicates[:, 0, 0], tau.replicates[:, 0, -1], rtol=1e-12,
                               atol=0)
