"""Serving-risk reweighting, joint survival, tau and D_k (paper Sec. 3.5, App. F.1-F.2)."""

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.aggregate import hajek_mean, weighted_ratio
from floorgap.estimators.serving import (
    accept_factors,
    accepted_length,
    dependence_ratio,
    exact_chain_survival,
    exact_chain_tau,
    independent_accepted_length,
    joint_survival,
    marginal_acceptance,
    reach,
    serving_risk_sums,
    serving_summary,
    survival_products,
)

D = torch.float64


def _tables(v, gamma, seed, sharp=2.0):
    """Random next-token tables: tables[k][z_0, ..., z_{k-1}, :] is a distribution."""
    g = torch.Generator().manual_seed(seed)
    return [torch.softmax(sharp * torch.randn((v,) * (k + 1), dtype=D, generator=g), -1) for k in range(gamma)]


def _enumerate_paths(p_tables, q_tables, v, gamma):
    """All target blocks with their probabilities mu(z) and the realised-token p and q."""
    mus, ps, qs = [], [], []
    for z in itertools.product(range(v), repeat=gamma):
        p_tok = torch.stack([p_tables[k][z[: k + 1]] for k in range(gamma)])
        q_tok = torch.stack([q_tables[k][z[: k + 1]] for k in range(gamma)])
        mus.append(p_tok.prod())
        ps.append(p_tok)
        qs.append(q_tok)
    return torch.stack(mus), torch.stack(ps), torch.stack(qs)


def test_accept_factors_and_reach():
    p = torch.tensor([[0.5, 0.2, 0.0]], dtype=D)
    q = torch.tensor([[0.25, 0.4, 0.0]], dtype=D)
    a = accept_factors(p, q)
    torch.testing.assert_close(a, torch.tensor([[0.5, 1.0, 1.0]], dtype=D))
    torch.testing.assert_close(reach(a), torch.tensor([[1.0, 0.5, 0.5]], dtype=D))
    torch.testing.assert_close(survival_products(a), torch.tensor([[0.5, 0.5, 0.5]], dtype=D))


def test_serve_risk_slot0_equals_free_risk_and_ratio_of_sums():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(6, 32, 7, dtype=D, generator=g)
    tv = torch.rand(6, 32, 7, dtype=D, generator=g)
    s = serving_risk_sums(a, tv)
    torch.testing.assert_close(s.den[:, 0], torch.ones(6, dtype=D))
    torch.testing.assert_close(s.ratio[:, 0], tv[:, :, 0].mean(-1))
    w = reach(a)
    torch.testing.assert_close(s.num, (w * tv).mean(1))
    pi = torch.rand(6, dtype=D, generator=g) + 0.1
    pooled = weighted_ratio(s.num, s.den, pi)
    expect = (s.num / pi[:, None]).sum(0) / (s.den / pi[:, None]).sum(0)
    torch.testing.assert_close(pooled, expect)


def test_chain_identity_exact_enumeration():
    """Pr(J >= j+1) from the verification process equals E_mu[prod_{i<=j} a_i] on target paths."""
    v, gamma = 3, 4
    p_tables, q_tables = _tables(v, gamma, 0), _tables(v, gamma, 1, sharp=1.0)
    mu, p_tok, q_tok = _enumerate_paths(p_tables, q_tables, v, gamma)
    torch.testing.assert_close(mu.sum(), torch.tensor(1.0, dtype=D))
    a = accept_factors(p_tok, q_tok)
    weighted = (mu[:, None] * survival_products(a)).sum(0)
    exact = exact_chain_survival(p_tables, q_tables)
    torch.testing.assert_close(weighted, exact, rtol=0, atol=1e-12)
    torch.testing.assert_close(exact_chain_tau(p_tables, q_tables), 1 + weighted.sum(), rtol=0, atol=1e-12)
    # gamma = 1: tau = 1 + E[a_0] = 2 - TV(p_0, q_0)
    tv0 = 0.5 * (p_tables[0] - q_tables[0]).abs().sum()
    torch.testing.assert_close(exact_chain_tau(p_tables[:1], q_tables[:1]), 2 - tv0)


def test_chain_identity_against_simulated_verification():
    """Monte Carlo of draft-then-verify agrees with the exact accepted length."""
    v, gamma, n = 3, 3, 100_000
    p_tables, q_tables = _tables(v, gamma, 3), _tables(v, gamma, 4, sharp=1.0)
    g = torch.Generator().manual_seed(11)
    alive = torch.ones(n, dtype=torch.bool)
    prefix = torch.zeros(n, 0, dtype=torch.long)
    accepted = torch.zeros(n)
    for k in range(gamma):
        idx = tuple(prefix[:, i] for i in range(k))
        pk = p_tables[k][idx].expand(n, v)  # (n, v); slot 0 has no prefix to index by
        qk = q_tables[k][idx].expand(n, v)
        y = torch.multinomial(qk, 1, generator=g)[:, 0]
        ratio = (pk.gather(1, y[:, None]) / qk.gather(1, y[:, None]))[:, 0]
        keep = alive & (torch.rand(n, dtype=D, generator=g) < ratio.clamp(max=1))
        accepted += keep.to(accepted.dtype)
        alive = keep
        prefix = torch.cat([prefix, y[:, None]], 1)
    tau_mc = 1 + accepted.mean().item()
    tau = exact_chain_tau(p_tables, q_tables).item()
    assert abs(tau_mc - tau) < 0.02, (tau_mc, tau)


def test_dependence_and_independent_tau():
    g = torch.Generator().manual_seed(1)
    a = torch.rand(4, 64, 7, dtype=D, generator=g)
    joint, marg = joint_survival(a), marginal_acceptance(a)
    dep = dependence_ratio(joint, marg)
    torch.testing.assert_close(dep[:, 0], torch.ones(4, dtype=D))
    torch.testing.assert_close(independent_accepted_length(marg), 1 + torch.cumprod(marg, -1).sum(-1))
    # comonotone factors (a_i equal across slots on each path): joint >= product
    a_same = torch.rand(64, 1, dtype=D, generator=g).expand(64, 7)
    d2 = dependence_ratio(joint_survival(a_same), marginal_acceptance(a_same))
    assert torch.all(d2 >= 1 - 1e-12)


def test_perfect_drafter():
    p = torch.rand(3, 10, 7, dtype=D) + 0.01
    a = accept_factors(p, p)
    assert torch.all(a == 1)
    torch.testing.assert_close(accepted_length(joint_survival(a)), torch.full((3,), 8.0, dtype=D))


def test_serving_summary_consistency():
    g = torch.Generator().manual_seed(2)
    n_anchors, m, gamma = 30, 16, 7
    a = torch.rand(n_anchors, m, gamma, dtype=D, generator=g) ** 0.3
    tv = (1 - a) * torch.rand(n_anchors, m, gamma, dtype=D, generator=g)
    pi = torch.rand(n_anchors, dtype=D, generator=g) + 0.1
    clusters = torch.randint(0, 12, (n_anchors,), generator=g)
    out = serving_summary(a, tv, clusters, pi, n_boot=500, seed=4)
    sums = serving_risk_sums(a, tv)
    torch.testing.assert_close(out.serve_risk.estimate, weighted_ratio(sums.num, sums.den, pi))
    torch.testing.assert_close(out.free_risk.estimate, hajek_mean(tv.mean(1), pi))
    torch.testing.assert_close(out.serve_minus_free.estimate, out.serve_risk.estimate - out.free_risk.estimate)
    torch.testing.assert_close(out.dependence.estimate[0], torch.tensor(1.0, dtype=D))
    torch.testing.assert_close(out.tau.estimate, hajek_mean(accepted_length(joint_survival(a)), pi))
    torch.testing.assert_close(out.tau_gap.estimate, out.tau.estimate - out.tau_independent.estimate)
    assert out.tau.lower <= out.tau.estimate <= out.tau.upper
    assert out.serve_risk.replicates.shape == (500, gamma)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(1, 20), gamma=st.integers(1, 9))
def test_survival_monotone_and_tau_bounds(seed, m, gamma):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(2, m, gamma, dtype=D, generator=g) + 1e-3
    q = torch.rand(2, m, gamma, dtype=D, generator=g) * torch.randint(0, 2, (2, m, gamma), generator=g)
    a = accept_factors(p, q)
    s = joint_survival(a)
    assert torch.all(s[..., 1:] <= s[..., :-1] + 1e-15)
    tau = accepted_length(s)
    assert torch.all(tau >= 1) and torch.all(tau <= gamma + 1)
    tau_ind = independent_accepted_length(marginal_acceptance(a))
    assert torch.all(tau_ind >= 1) and torch.all(tau_ind <= gamma + 1)


# ------------------------------------------------------------------- App. F.3 serving bounds

import pytest  # noqa: E402

from floorgap.estimators.serving import (  # noqa: E402
    largest_risk_lower_bound,
    risk_bound_accepted_length,
)


def test_one_speculative_token_gives_the_first_slots_risk() -> None:
    """gamma = 1: tau = 1 + E[a_0] exactly, so r_min = 2 - tau (the paper's 1.82 -> 0.18)."""
    assert largest_risk_lower_bound(1.82, 1) == pytest.approx(0.18)
    assert largest_risk_lower_bound(2.0, 1) == 0.0
    assert largest_risk_lower_bound(1.0, 1) == pytest.approx(1.0)


def test_closed_form_pieces() -> None:
    # gamma = 3, r = 0.2: 1 + 0.8 + 0.6 + 0.4 = 2.8
    assert risk_bound_accepted_length(0.2, 3) == pytest.approx(2.8)
    assert largest_risk_lower_bound(2.8, 3) == pytest.approx(0.2)
    # r = 0.4: only two terms positive: 1 + 0.6 + 0.2 = 1.8
    assert largest_risk_lower_bound(1.8, 3) == pytest.approx(0.4)
    assert largest_risk_lower_bound(8.0, 7) == 0.0
    with pytest.raises(ValueError):
        largest_risk_lower_bound(0.5, 7)


@settings(max_examples=60, deadline=None)
@given(tau=st.floats(1.0, 9.0), gamma=st.integers(1, 8))
def test_the_bound_inverts_the_accepted_length_floor(tau: float, gamma: int) -> None:
    """r_min is the least r whose guaranteed accepted length does not exceed tau (bisection)."""
    r = largest_risk_lower_bound(tau, gamma)
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if risk_bound_accepted_length(mid, gamma) <= tau else (mid, hi)
    assert r == pytest.approx(hi, abs=1e-9)
    # any drafter whose per-slot risks are all below r_min would have a larger tau
    if r > 1e-6:
        assert risk_bound_accepted_length(r * (1 - 1e-6), gamma) > tau - 1e-9


def test_the_bound_holds_for_exact_chains() -> None:
    """Exact chain tau of random context-dependent tables is at least the bound at the largest
    free-rollout risk R_k = E_mu[TV(p_k, q_k)] (prefixes drawn from the target)."""
    from floorgap.estimators.serving import exact_chain_tau

    g = torch.Generator().manual_seed(0)
    V, gamma = 4, 3
    for _ in range(20):
        p = [torch.softmax(torch.randn((V,) * (k + 1), generator=g) * 2, -1).double()
             for k in range(gamma)]
        q = [torch.softmax(torch.randn((V,) * (k + 1), generator=g) * 2, -1).double()
             for k in range(gamma)]
        risks, reach = [], torch.ones((), dtype=torch.float64)  # Pr_mu(prefix)
        for k in range(gamma):
            tv = 0.5 * (p[k] - q[k]).abs().sum(-1)
            risks.append(float((reach * tv).sum()))
            reach = reach.unsqueeze(-1) * p[k]
        tau = float(exact_chain_tau(p, q))
        assert tau >= risk_bound_accepted_length(max(risks), gamma) - 1e-9
        assert max(risks) >= largest_risk_lower_bound(tau, gamma) - 1e-9
