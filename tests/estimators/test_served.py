"""Served accepted length and speedup (floorgap.estimators.served, paper App. H.3-H.4)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.served import (
    slot_acceptance_tests,
    acceptance_test,
    accepted_length_by_task,
    group_cells,
    lossless_z,
    round_accepted_length,
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


def test_round_accepted_length_closed_forms() -> None:
    gamma = 4
    one = torch.ones((1, gamma), dtype=torch.float64)
    # q >= p on every slot: every factor is 1 and the round returns gamma + 1
    assert float(round_accepted_length(one * 0.2, one * 0.3)[0]) == gamma + 1
    # factors 1/2 everywhere: 1 + 1/2 + 1/4 + 1/8 + 1/16
    assert float(round_accepted_length(one * 0.4, one * 0.2)[0]) == 1 + 15 / 16
    # a zero factor at slot 1 stops the sum there: 1 + a_0
    p = torch.tensor([[0.5, 0.5, 0.1, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.25, 0.0, 0.9, 0.9]], dtype=torch.float64)
    assert float(round_accepted_length(p, q)[0]) == 1.5


def test_acceptance_test_counts_the_trials_of_each_round() -> None:
    tv = torch.tensor([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3], [0.0, 0.0, 0.0]], dtype=torch.float64)
    accepted = torch.tensor([0, 2, 3])
    test = acceptance_test(accepted, tv)
    # round 0: slot 0 (failed); round 1: slots 0-2 (2 successes); round 2: all 3 slots
    assert test.trials == 1 + 3 + 3 and test.observed == 5
    assert abs(test.expected - (0.5 + 0.9 + 0.8 + 0.7 + 3.0)) < 1e-12
    assert abs(test.variance - (0.25 + 0.09 + 0.16 + 0.21)) < 1e-12


def _speculative_rounds(n_rounds: int, gamma: int, vocab: int, seed: int):
    """Chain speculative sampling on a toy target (a Markov chain on ``vocab`` tokens) with an
    order-0 proposal per slot, simulated directly: the engine's side (accepted drafts per
    round) and an independent target continuation scored by the accept factors."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(2.0 * torch.randn((vocab, vocab), generator=g), -1).double()
    q = torch.softmax(2.0 * torch.randn((gamma, vocab), generator=g), -1).double()
    accepted, tv_rows, p_rows, q_rows = [], [], [], []
    for _ in range(n_rounds):
        prev = int(torch.randint(vocab, (1,), generator=g))
        # the engine: draft x_j ~ q_j, accept with min(1, p/q), stop at the first rejection
        j, tvs, ctx = 0, [], prev
        while j < gamma:
            p = trans[ctx]
            tvs.append(0.5 * float((p - q[j]).abs().sum()))
            x = int(torch.multinomial(q[j], 1, generator=g))
            if float(torch.rand((), generator=g, dtype=torch.float64)) >= min(1.0, p[x] / q[j, x]):
                break
            ctx, j = x, j + 1
        accepted.append(j)
        tv_rows.append(tvs + [float("nan")] * (gamma - len(tvs)))
        # the offline side: a target path from the same committed token
        ctx, ps, qs = prev, [], []
        for k in range(gamma):
            y = int(torch.multinomial(trans[ctx], 1, generator=g))
            ps.append(float(trans[ctx, y]))
            qs.append(float(q[k, y]))
            ctx = y
        p_rows.append(ps)
        q_rows.append(qs)
    as_t = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731
    return torch.tensor(accepted), as_t(tv_rows), as_t(p_rows), as_t(q_rows)


def test_simulated_speculative_sampling_matches_both_offline_predictions() -> None:
    """Independent check by simulation: the served accepted drafts agree with the exact trial
    probabilities (|z| small) and their mean length with the accept factors' prediction on
    target paths (within 4 standard errors)."""
    accepted, tv, p_tok, q_tok = _speculative_rounds(4000, gamma=4, vocab=6, seed=3)
    test = acceptance_test(accepted, tv)
    assert abs(test.z) < 4
    served = accepted.double() + 1
    offline = round_accepted_length(p_tok, q_tok)
    se = (served.var() / len(served) + offline.var() / len(offline)).sqrt()
    assert abs(float(served.mean() - offline.mean())) < 4 * float(se)
    # and it has power: acceptance probabilities 0.15 too low per trial are flagged
    wrong = acceptance_test(accepted, (tv + 0.15).clamp(max=1.0))
    assert wrong.z > 4


def test_lossless_z_is_standard_for_target_draws_and_flags_biased_ones() -> None:
    """Tokens drawn from each position's p give |z| small; tokens drawn from another law q
    (a drafter-biased engine) give z far below 0. Scores and variances from their definitions
    (log p(y) + H(p) and Var_p[log p]) on random laws."""
    g = torch.Generator().manual_seed(5)
    n, vocab = 3000, 12
    p = torch.softmax(2.0 * torch.randn((n, vocab), generator=g), -1).double()
    q = torch.softmax(2.0 * torch.randn((n, vocab), generator=g), -1).double()
    logp = p.log()
    h = -(p * logp).sum(-1)
    var = (p * logp * logp).sum(-1) - h * h

    def z(law: torch.Tensor) -> float:
        y = torch.multinomial(law, 1, generator=g)[:, 0]
        return lossless_z(logp.gather(-1, y[:, None])[:, 0] + h, var)

    assert abs(z(p)) < 4
    assert z(q) < -10
    # a NaN round (temperature 0) is skipped
    assert lossless_z(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 4.0])) == 0.5


def test_slot_tests_count_each_slot_and_add_up_to_the_acceptance_test() -> None:
    tv = torch.tensor([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3], [0.0, 0.0, 0.0]], dtype=torch.float64)
    accepted = torch.tensor([0, 2, 3])
    slots = slot_acceptance_tests(accepted, tv)
    # slot 0 reached by all three rounds (2 accepted), slot 1 by two, slot 2 by two
    assert [s.trials for s in slots] == [3, 2, 2] and [s.observed for s in slots] == [2, 2, 1]
    assert abs(slots[1].expected - (0.8 + 1.0)) < 1e-12
    whole = acceptance_test(accepted, tv)
    assert sum(s.trials for s in slots) == whole.trials
    for field in ("observed", "expected", "variance"):
        assert abs(sum(getattr(s, field) for s in slots) - getattr(whole, field)) < 1e-12


def test_slot_tests_hold_for_speculative_sampling_and_see_a_shifted_count() -> None:
    """Simulated chains: the per-slot counts agree with the trial probabilities (|z| < 4 at
    every slot); counts read one slot over (slot k's count reported at k - 1, as an engine that
    accepts at slot k what the weights predict for k + 1) are far off at some slot."""
    accepted, tv, _, _ = _speculative_rounds(4000, gamma=4, vocab=6, seed=5)
    slots = slot_acceptance_tests(accepted, tv)
    assert all(abs(s.z) < 4 for s in slots)
    counts = torch.tensor([s.observed for s in slots])
    shifted = torch.cat([counts[1:], counts[:1] * 0])
    assert max(abs(s.z) for s in slot_acceptance_tests(accepted, tv, shifted)) > 4
